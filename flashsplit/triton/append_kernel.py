"""Triton append kernel: write new keys and values into the cache (rotated, quantized).

Device code only; :mod:`flashsplit.triton.append` launches it, on the decode call's stream and
before the split kernel, which then sees ``cache_seqlens + L_new`` keys per row.

One program per (token ``t``, batch row ``b``, part): with ``t < L_new`` part 0 writes ``k[b, t]``
and part 1 ``v[b, t]`` (every KV head) at key ``n = cache_seqlens[b] + t`` of the row: dense at cache row
``b`` (or ``cache_batch_idx[b]``), paged through ``block_table[b, n // page_size]``. A key outside
``[0, capacity)`` (a wrong length: unchecked without a host sync) is not written, and page ids
and cache rows are clamped into the cache, so a wrong value gives a wrong row, never a stray
write. The parts run side by side.
"""

import triton
import triton.language as tl
from .rotary import rotary_factors

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
def load_rows(base, stride_h, h0, num_heads, head_dim, offs_d, cos, sin, partner,
              BLOCK_H: tl.constexpr, ROTATE: tl.constexpr):
    """fp32 ``[BLOCK_H, BLOCK_D]`` of heads ``h0..`` of one token at ``base`` (ROTATE: rotated by
    :func:`rotary_factors`' ``cos``, ``sin``, ``partner``), and its mask."""
    offs_h = h0 + tl.arange(0, BLOCK_H)
    mask = (offs_h < num_heads)[:, None] & (offs_d < head_dim)[None, :]
    rows = base + offs_h.to(tl.int64)[:, None] * stride_h
    x = tl.load(rows + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    if ROTATE:
        x_partner = tl.load(rows + partner[None, :], mask=mask, other=0.0).to(tl.float32)
        x = x * cos[None, :] + x_partner * sin[None, :]
    return x, offs_h, mask


@triton.jit
def store_new_keys(NEW, CACHE, DESCALE, b, t, key_offset, write, stride_nb, stride_nt, stride_nh, stride_ch,
                   stride_db, stride_dh, num_heads_kv, head_dim, offs_d, cos, sin, partner,
                   BLOCK_H: tl.constexpr, ROTATE: tl.constexpr, FP8: tl.constexpr, FP8_EMIN: tl.constexpr,
                   FP8_MBITS: tl.constexpr, FP8_MAX: tl.constexpr):
    """Write ``NEW[b, t]`` (every KV head; ROTATE: rotated) at ``CACHE + key_offset`` (the key's
    slot), unless ``write`` is False; FP8: as ``new / DESCALE[b, h]``, rounded to the cache's format."""
    for h0 in range(0, num_heads_kv, BLOCK_H):
        x, offs_h, mask = load_rows(NEW + b * stride_nb + t * stride_nt, stride_nh, h0, num_heads_kv, head_dim,
                                    offs_d, cos, sin, partner, BLOCK_H, ROTATE)
        if FP8:
            scale = tl.load(DESCALE + b * stride_db + offs_h * stride_dh, mask=offs_h < num_heads_kv, other=1.0)
            x = round_to_fp8(tl.div_rn(x, scale[:, None]), FP8_EMIN, FP8_MBITS, FP8_MAX)
        ptrs = CACHE + key_offset + offs_h.to(tl.int64)[:, None] * stride_ch + offs_d[None, :]
        tl.store(ptrs, x.to(CACHE.dtype.element_ty), mask=mask & (offs_h < tl.where(write, num_heads_kv, 0))[:, None])


@triton.jit
def append_kv_kernel(
    K_NEW, V_NEW, K_CACHE, V_CACHE, SEQLENS, LEFTPAD, BLOCK_TABLE, BATCH_IDX, COS, SIN, K_DESCALE, V_DESCALE,
    stride_knb, stride_knt, stride_knh, stride_vnb, stride_vnt, stride_vnh,
    stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
    stride_btb, stride_cos, stride_kdb, stride_kdh, stride_vdb, stride_vdh,
    seqlen_new, num_heads_kv, head_dim, capacity, num_pages, seqlen_ro, rotary_half,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    PAGED: tl.constexpr,
    HAS_LEFTPAD: tl.constexpr,
    HAS_BATCH_IDX: tl.constexpr,
    ROTARY: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    FP8: tl.constexpr,
    FP8_EMIN: tl.constexpr,
    FP8_MBITS: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    """Append token ``t = program_id(0)`` of row ``b = program_id(1)``, its keys or values by
    ``program_id(2)`` (see the module docstring).

    Rotary positions count from the row's first real key: new key ``t`` is at ``cache_seqlens[b] -
    leftpad[b] + t``. ``rotary_half`` pairs of features rotate (``rotary_dim / 2``, the tables'
    width); the split kernel rotates q.
    """
    t = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    part = tl.program_id(2)  # 0: the new keys, 1: the new values; side by side, not in turn
    start = tl.load(SEQLENS + b)
    position = start
    if HAS_LEFTPAD:
        position = start - tl.load(LEFTPAD + b)
    offs_d = tl.arange(0, BLOCK_D)
    n = start + t
    write = (n >= 0) & (n < capacity)
    slot = tl.minimum(tl.maximum(n, 0), capacity - 1)
    if PAGED:
        page = tl.load(BLOCK_TABLE + b * stride_btb + slot // PAGE_SIZE)
        row = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
        slot = slot % PAGE_SIZE
    elif HAS_BATCH_IDX:
        row = tl.minimum(tl.maximum(tl.load(BATCH_IDX + b), 0), num_pages - 1).to(tl.int64)
    else:
        row = b
    slot = slot.to(tl.int64)
    if part == 0:
        if ROTARY:
            cos, sin, partner = rotary_factors(COS, SIN, stride_cos, position + t, seqlen_ro, rotary_half,
                                               offs_d, INTERLEAVED)
        else:  # unused
            cos, sin, partner = offs_d, offs_d, offs_d
        store_new_keys(K_NEW, K_CACHE, K_DESCALE, b, t, row * stride_kb + slot * stride_kn, write, stride_knb,
                       stride_knt, stride_knh, stride_kh, stride_kdb, stride_kdh, num_heads_kv, head_dim,
                       offs_d, cos, sin, partner, BLOCK_H, ROTARY, FP8, FP8_EMIN, FP8_MBITS, FP8_MAX)
    else:
        store_new_keys(V_NEW, V_CACHE, V_DESCALE, b, t, row * stride_vb + slot * stride_vn, write, stride_vnb,
                       stride_vnt, stride_vnh, stride_vh, stride_vdb, stride_vdh, num_heads_kv, head_dim,
                       offs_d, offs_d, offs_d, offs_d, BLOCK_H, False, FP8, FP8_EMIN, FP8_MBITS, FP8_MAX)
