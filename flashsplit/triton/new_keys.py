"""Triton device code for a call's new keys (``k``/``v``): the split kernel writes them into the
cache itself, so an appending decode step is one launch.

Device code only, called by :func:`flashsplit.triton.split_kernel.split_kv_kernel`. New token
``t`` of row ``b`` is key ``n = cache_seqlens[b] + t``. Each program whose split covers key ``n``
writes it (every program of the row tile, each for its KV head: the same bytes) at the row's
cache slot, dense or through ``block_table[b, n // page_size]``, rotated by the rotary tables
and, for an fp8 cache, as ``k / k_descale`` rounded to the cache's format; then a barrier of the
program orders those stores before its own loads, and it attends the slot like any cached key.
No other program reads that slot. Split 0 also writes the new keys no split covers (before the
first key a window leaves visible).

Wrong lengths or page ids (unchecked without a host sync) give a wrong row, never a stray write:
keys past the capacity are not written, page ids are clamped into the cache.
"""

import torch
import triton
import triton.language as tl

from .rotary import load_rotated_rows

#: fp8 cache formats: (smallest normal exponent, mantissa bits, largest finite value), the
#: constexprs of :func:`round_to_fp8`.
FP8_FORMATS = {torch.float8_e4m3fn: (-6, 3, 448.0), torch.float8_e5m2: (-14, 2, 57344.0)}
ROUNDING_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2^23: x + it - it rounds |x| < 2^22 to an integer, ties to even


@triton.jit
def round_to_fp8(y, FP8_EMIN: tl.constexpr, FP8_MBITS: tl.constexpr, FP8_MAX: tl.constexpr):
    """fp32 ``y`` rounded to the nearest value of an fp8 format (ties to even), saturated at its
    largest finite value ``FP8_MAX``; the result converts to the format exactly.

    The format has FP8_MBITS mantissa bits and smallest normal exponent FP8_EMIN: the spacing of
    its values around ``y`` is ``2^(max(exponent(y), FP8_EMIN) - FP8_MBITS)``, a power of two,
    so scaling by it is exact and one fp32 add rounds to the grid. Written out rather than
    left to the conversion, whose rounding differs between the GPU (``cvt.rn.satfinite``) and
    the CPU interpreter (not ties-to-even, subnormals flushed): the stored value is the same
    everywhere.
    """
    y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
    bits = y.to(tl.int32, bitcast=True)
    spacing = tl.maximum(((bits >> 23) & 0xFF) - 127, FP8_EMIN) - FP8_MBITS
    step = ((spacing + 127) << 23).to(tl.float32, bitcast=True)
    inv_step = ((127 - spacing) << 23).to(tl.float32, bitcast=True)
    rounded = ((tl.abs(y) * inv_step + ROUNDING_MAGIC) - ROUNDING_MAGIC) * step
    # The sign goes back on as a bit, so -0.0 stays -0.0: a select of -rounded lost it on the H200
    # (the compiled select treats the zeros as equal), where the interpreter kept it.
    sign = bits & -2147483648
    return (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def new_rows(NEW, stride_nt, offs_t, mask_t, positions, COS, SIN, stride_cos, seqlen_ro, rotary_half, head_dim,
             offs_d, scale, ROTATE: tl.constexpr, INTERLEAVED: tl.constexpr, FP8: tl.constexpr,
             FP8_EMIN: tl.constexpr, FP8_MBITS: tl.constexpr, FP8_MAX: tl.constexpr):
    """fp32 ``[BLOCK_N, BLOCK_D]``: new tokens ``offs_t`` of one row and KV head (``NEW`` points at
    token 0's first feature) as the cache stores them. ROTATE: rotated at ``positions``; FP8:
    ``x / scale`` rounded to the cache's format (an fp8 value, exact in fp16)."""
    rows = NEW + offs_t.to(tl.int64) * stride_nt
    if ROTATE:
        x = load_rotated_rows(rows, mask_t, positions, COS, SIN, stride_cos, seqlen_ro, rotary_half, head_dim, offs_d,
                              INTERLEAVED)
    else:
        x = tl.load(rows[:, None] + offs_d[None, :], mask=mask_t[:, None] & (offs_d < head_dim)[None, :],
                    other=0.0).to(tl.float32)
    if FP8:
        x = round_to_fp8(tl.div_rn(x, scale), FP8_EMIN, FP8_MBITS, FP8_MAX)
    return x


@triton.jit
def row_cache_bases(K, V, BATCH_IDX, b, kvh, num_pages, stride_kb, stride_kh, stride_vb, stride_vh,
                    PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr):
    """``(k_base, v_base)`` of row ``b`` and KV head ``kvh``: PAGED, the cache's head (dim 0 is the
    page, found per key through the row's page table); dense, the row's (cache row
    ``BATCH_IDX[b]`` with HAS_BATCH_IDX, clamped like a page id: a wrong index reads and writes a
    wrong row, never stray memory)."""
    if PAGED:
        k_base = K + kvh * stride_kh
        v_base = V + kvh * stride_vh
    else:
        cache_row = b
        if HAS_BATCH_IDX:
            cache_row = tl.minimum(tl.maximum(tl.load(BATCH_IDX + b), 0), num_pages - 1).to(tl.int64)
        k_base = K + cache_row * stride_kb + kvh * stride_kh
        v_base = V + cache_row * stride_vb + kvh * stride_vh
    return k_base, v_base


@triton.jit
def row_descales(K_DESCALE, V_DESCALE, b, kvh, stride_kdb, stride_kdh, stride_vdb, stride_vdh,
                 HAS_DESCALE: tl.constexpr):
    """``(k_scale, v_scale)`` of row ``b`` and KV head ``kvh`` for an fp8 cache (HAS_DESCALE:
    ``[b * stride_b + kvh * stride_h]``, strides 0 for one scale); 1.0, 1.0 otherwise."""
    k_scale = 1.0
    v_scale = 1.0
    if HAS_DESCALE:
        k_scale = tl.load(K_DESCALE + b * stride_kdb + kvh * stride_kdh)
        v_scale = tl.load(V_DESCALE + b * stride_vdb + kvh * stride_vdh)
    return k_scale, v_scale


@triton.jit
def slot_offsets(offs_n, mask_n, bt_row, num_pages, stride_b, stride_n, PAGED: tl.constexpr,
                 PAGE_SIZE: tl.constexpr):
    """int64 offsets ``[BLOCK_N]`` of keys ``offs_n`` in a cache (dense: from the row's base;
    paged: through the row's page table ``bt_row``, page ids clamped into the cache)."""
    if PAGED:
        page = tl.load(bt_row + offs_n // PAGE_SIZE, mask=mask_n, other=0)
        page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
        return page * stride_b + (offs_n % PAGE_SIZE).to(tl.int64) * stride_n
    else:
        return offs_n.to(tl.int64) * stride_n


@triton.jit
def write_new_keys(K_NEW, V_NEW, k_base, v_base, bt_row, lo, hi, first_token, rot_position, k_scale, v_scale,
                   num_pages, stride_knt, stride_vnt, stride_kb, stride_kn, stride_vb, stride_vn, COS, SIN,
                   stride_cos, seqlen_ro, rotary_half, head_dim,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr,
                   ROTARY: tl.constexpr, INTERLEAVED: tl.constexpr, FP8: tl.constexpr, V_PAIRS: tl.constexpr,
                   V_E5M2: tl.constexpr, FP8_EMIN: tl.constexpr, FP8_MBITS: tl.constexpr, FP8_MAX: tl.constexpr):
    """Store keys ``[lo, hi)`` of one row and KV head, new token ``n - first_token`` each, into the
    cache (``K_NEW``/``V_NEW``: the row's and head's token 0; ``k_base``/``v_base``: the cache's row
    and head, or its head when PAGED). Keys rotate at ``rot_position`` plus their token index.
    V_PAIRS: ``v_base`` is the fp8 V cache viewed as int16, stored through an fp8 pointer at
    twice its offsets."""
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    n0 = lo
    while n0 < hi:  # one tile for a decode step's 1-16 new keys
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        offs_t = offs_n - first_token
        mask = mask_n[:, None] & mask_d[None, :]
        k = new_rows(K_NEW, stride_knt, offs_t, mask_n, rot_position + offs_t, COS, SIN, stride_cos, seqlen_ro,
                     rotary_half, head_dim, offs_d, k_scale, ROTARY, INTERLEAVED, FP8, FP8_EMIN, FP8_MBITS, FP8_MAX)
        k_slots = slot_offsets(offs_n, mask_n, bt_row, num_pages, stride_kb, stride_kn, PAGED, PAGE_SIZE)
        tl.store(k_base + k_slots[:, None] + offs_d[None, :], k.to(k_base.dtype.element_ty), mask=mask)
        v = new_rows(V_NEW, stride_vnt, offs_t, mask_n, offs_t, COS, SIN, stride_cos, seqlen_ro, rotary_half,
                     head_dim, offs_d, v_scale, False, INTERLEAVED, FP8, FP8_EMIN, FP8_MBITS, FP8_MAX)
        v_slots = slot_offsets(offs_n, mask_n, bt_row, num_pages, stride_vb, stride_vn, PAGED, PAGE_SIZE)
        if V_PAIRS:
            fp8: tl.constexpr = tl.float8e5 if V_E5M2 else tl.float8e4nv
            v_bytes = v_base.to(tl.pointer_type(fp8))
            tl.store(v_bytes + 2 * v_slots[:, None] + offs_d[None, :], v.to(fp8), mask=mask)
        else:
            tl.store(v_base + v_slots[:, None] + offs_d[None, :], v.to(v_base.dtype.element_ty), mask=mask)
        n0 += BLOCK_N
