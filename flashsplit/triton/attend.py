"""Triton device code for the split kernel's key tiles: addresses, masked and unmasked loads,
the online softmax update.

Device code only, called by :mod:`flashsplit.triton.split_kernel`.
"""

import triton
import triton.language as tl

LOG2E_F = tl.constexpr(1.4426950408889634)


@triton.jit
def token_offsets(offs_n, page_ids, first_page, num_pages, stride_kb, stride_kn, stride_vb, stride_vn,
                  PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, CHUNK_PAGES: tl.constexpr):
    """int64 element offsets of keys ``offs_n`` of one row in K and in V (head offset excluded).

    Dense: dim 0 is the batch row (already in the base pointer), so the key's offset is
    ``n * stride_n``. Paged: dim 0 is the page; key n lives in page ``block_table[b, n // PAGE_SIZE]``
    at slot ``n % PAGE_SIZE``; ``page_ids`` holds the chunk's table entries from ``first_page`` on
    (loaded once per chunk, so no address here waits on a load: Triton pipelines the K/V loads
    as in the dense case).
    """
    if PAGED:
        local = tl.minimum(offs_n // PAGE_SIZE - first_page, CHUNK_PAGES - 1)  # masked keys: any entry
        page = tl.gather(page_ids, local, 0).to(tl.int64)
        # A wrong page id (unchecked without a host sync: flashsplit.check_inputs) reads a wrong
        # page, never memory outside the cache.
        page = tl.minimum(tl.maximum(page, 0), num_pages - 1)
        slot = (offs_n % PAGE_SIZE).to(tl.int64)
        return page * stride_kb + slot * stride_kn, page * stride_vb + slot * stride_vn
    else:
        return offs_n.to(tl.int64) * stride_kn, offs_n.to(tl.int64) * stride_vn


@triton.jit
def chunk_page_ids(bt_row, c0, seqlen, PAGE_SIZE: tl.constexpr, CHUNK_PAGES: tl.constexpr):
    """The block-table entries of the pages holding keys from ``c0`` on: ``(first_page, ids)``.
    Entries past the row's last page are never read (masked, 0)."""
    first_page = c0 // PAGE_SIZE
    idx = first_page + tl.arange(0, CHUNK_PAGES)
    ids = tl.load(bt_row + idx, mask=idx < tl.cdiv(seqlen, PAGE_SIZE), other=0)
    return first_page, ids


@triton.jit
def fp8_pairs_to_fp16(v16, E5M2: tl.constexpr, PTX: tl.constexpr):
    """int16 ``[N, D/2]`` holding pairs of fp8 values of adjacent head-dim columns (an fp8 cache
    read as int16) -> their fp16 values ``(even columns, odd columns)``, exact.

    Why pairs: ``P @ V`` takes V as the transposed (key-major) operand, and fp8 has no
    transposing shared-memory load, so Triton gathers an fp8 V tile byte by byte (``ld.shared.b8``,
    8-byte copies into shared memory). As 16-bit elements, V gets 16-byte copies and
    ``ldmatrix.trans``; one ``cvt.rn.f16x2`` per pair then yields both columns (PTX; sm_89+).
    sm_90 SASS of the unmasked loop per 128-key tile: 706 instructions vs 1028, 168 registers vs
    232 (H200: B = 1 x 128k e4m3 88.7 -> 72.0 us). The integer path (the CPU interpreter, GPUs
    before sm_89) computes the same values with Triton casts; in a standalone sm_90 loop it
    was no better than the byte gather (796 vs 784 instructions per tile; ``cvt``: 603).
    """
    if PTX:
        cvt: tl.constexpr = "cvt.rn.f16x2.e5m2x2" if E5M2 else "cvt.rn.f16x2.e4m3x2"
        return tl.inline_asm_elementwise("{ .reg .b32 t; " + cvt + " t, $2; mov.b32 {$0, $1}, t; }",
                                         "=h,=h,h", [v16], dtype=(tl.float16, tl.float16), is_pure=True, pack=1)
    else:
        fp8: tl.constexpr = tl.float8e5 if E5M2 else tl.float8e4nv
        u = v16.to(tl.uint16, bitcast=True)
        lo = u.to(tl.uint8)  # the lower address: the even column (little endian)
        hi = (u >> 8).to(tl.uint8)
        return lo.to(fp8, bitcast=True).to(tl.float16), hi.to(fp8, bitcast=True).to(tl.float16)


@triton.jit
def attend_tile(q, k_base, v_base, page_ids, first_page, num_pages, stride_kb, stride_kn, stride_vb, stride_vn,
                n0, end, last_visible, first_visible, m_i, l_i, acc, acc_odd, qk_scale_log2, softcap_log2, head_dim,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, RIGHT_BOUND: tl.constexpr, LEFT_BOUND: tl.constexpr,
                SOFTCAP: tl.constexpr, PAGED: tl.constexpr,
                PAGE_SIZE: tl.constexpr, CHUNK_PAGES: tl.constexpr, FULL: tl.constexpr, EVEN_D: tl.constexpr,
                V_PAIRS: tl.constexpr, V_E5M2: tl.constexpr, PAIRS_PTX: tl.constexpr):
    """Online-softmax update of (max, sum, acc) with keys [n0, n0 + BLOCK_N) of a split ending at end.

    Row ``r`` sees keys ``first_visible[r] <= n <= last_visible[r]`` (RIGHT_BOUND / LEFT_BOUND: a
    causal or windowed bound applies; else the split's ``end`` alone bounds the keys). SOFTCAP:
    scores ``s`` (log2 units) become ``softcap_log2 * tanh(s / softcap_log2)`` before the mask.

    FULL: every key of the tile is below ``end`` and visible to every row (the caller's
    ``full_lo``/``full_limit``), so the loads and scores need no key mask; with EVEN_D (BLOCK_D ==
    head_dim) no column mask either. Masks cost a predicate select per 16-byte copy and per score,
    which an fp8 tile (twice the keys per byte) cannot hide behind its loads.

    fp8 caches are converted to q's dtype in registers (exact for e4m3/e5m2 into fp16), q being
    fp16 then (:func:`q_for_fp16_dots`, with ``qk_scale_log2`` a ``[BLOCK_M, 1]`` row scale);
    their scales are folded into ``qk_scale_log2`` (K) and applied to the output (V).

    V_PAIRS: ``v_base`` is the fp8 V cache read as int16 (strides in int16 elements); ``acc``
    and ``acc_odd`` ``[BLOCK_M, BLOCK_D / 2]`` hold the even and odd output columns
    (:func:`fp8_pairs_to_fp16`). Otherwise ``acc`` is ``[BLOCK_M, BLOCK_D]`` and ``acc_odd`` unused.
    """
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k_tok, v_tok = token_offsets(offs_n, page_ids, first_page, num_pages, stride_kb, stride_kn, stride_vb,
                                 stride_vn, PAGED, PAGE_SIZE, CHUNK_PAGES)
    k_ptrs = k_base + k_tok[None, :] + offs_d[:, None]
    mask_n = offs_n < end
    if LEFT_BOUND:  # keys before the first one any query sees (first_visible's least) are never read
        mask_n = mask_n & (offs_n >= tl.min(first_visible, axis=0))
    mask_d = offs_d < head_dim
    if V_PAIRS:
        offs_v = tl.arange(0, BLOCK_D // 2)  # pairs of columns (2j, 2j + 1); head_dim is even
        mask_v = offs_v * 2 < head_dim
    else:
        offs_v = offs_d
        mask_v = mask_d
    v_ptrs = v_base + v_tok[:, None] + offs_v[None, :]
    if FULL and EVEN_D:
        kt = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    elif FULL:
        kt = tl.load(k_ptrs, mask=mask_d[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=mask_v[None, :], other=0.0)
    else:
        # Masked loads: cache slots past the row's end may hold NaN and are never read.
        kt = tl.load(k_ptrs, mask=mask_n[None, :] & mask_d[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=mask_n[:, None] & mask_v[None, :], other=0.0)
    s = tl.dot(q, kt.to(q.dtype)) * qk_scale_log2
    if SOFTCAP:  # softcap * tanh(x / softcap), tanh(y) = 1 - 2 / (e^2y + 1): exact limits at +-inf
        s = softcap_log2 * (1.0 - 2.0 / (tl.exp2(s * (2.0 * LOG2E_F / softcap_log2)) + 1.0))
    if not FULL:
        visible = mask_n[None, :]
        if RIGHT_BOUND:
            visible = visible & (offs_n[None, :] <= last_visible[:, None])
        if LEFT_BOUND:
            visible = visible & (offs_n[None, :] >= first_visible[:, None])
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row that has seen no visible key yet keeps max -inf; shift by 0 so no -inf - -inf.
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_shift)
    p = tl.exp2(s - m_shift[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if V_PAIRS:
        v_even, v_odd = fp8_pairs_to_fp16(v, V_E5M2, PAIRS_PTX)
        p16 = p.to(tl.float16)
        acc = acc * alpha[:, None] + tl.dot(p16, v_even)
        acc_odd = acc_odd * alpha[:, None] + tl.dot(p16, v_odd)
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype))
    return m_new, l_i, acc, acc_odd


@triton.jit
def attend_range(q, k_base, v_base, page_ids, first_page, num_pages, stride_kb, stride_kn, stride_vb, stride_vn,
                 lo, hi, end, full_lo, full_limit, last_visible, first_visible, m_i, l_i, acc, acc_odd, qk_scale_log2,
                 softcap_log2, head_dim,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, RIGHT_BOUND: tl.constexpr, LEFT_BOUND: tl.constexpr,
                 SOFTCAP: tl.constexpr, PAGED: tl.constexpr,
                 PAGE_SIZE: tl.constexpr, CHUNK_PAGES: tl.constexpr, RUNTIME_BOUND_WHILE: tl.constexpr,
                 FULL_TILES: tl.constexpr, EVEN_D: tl.constexpr, V_PAIRS: tl.constexpr, V_E5M2: tl.constexpr,
                 PAIRS_PTX: tl.constexpr):
    """:func:`attend_tile` over the tiles starting in ``[lo, hi)`` (keys past ``end`` masked).

    ``hi`` is ``end`` or ``lo`` plus whole tiles. With FULL_TILES, the tiles whose keys all lie in
    ``[full_lo, full_limit)`` (visible to every row of the tile: ``full_lo`` is ``lo`` unless a
    left window bound hides keys from some row, ``full_limit`` is ``end`` or, for causal rows, the
    first key some row cannot see) run unmasked in one pipelined loop, the rest (the window's
    first tiles, the last tile, the causal diagonal) masked; without, every tile is masked (one
    loop body: fewer registers).
    """
    full_start = lo
    full_hi = lo
    if FULL_TILES:
        if LEFT_BOUND:
            full_start = tl.minimum(hi, lo + tl.cdiv(tl.maximum(full_lo - lo, 0), BLOCK_N) * BLOCK_N)
            full_hi = tl.maximum(full_start, tl.minimum(hi, full_start + tl.maximum(full_limit - full_start, 0)
                                                        // BLOCK_N * BLOCK_N))
        else:
            full_hi = tl.minimum(hi, lo + tl.maximum(full_limit - lo, 0) // BLOCK_N * BLOCK_N)
    if RUNTIME_BOUND_WHILE:
        # The CPU interpreter cannot take a loaded length as a range() bound (triton 3.6).
        n0 = lo
        while n0 < hi:
            if n0 >= full_start and n0 < full_hi:
                m_i, l_i, acc, acc_odd = attend_tile(
                    q, k_base, v_base, page_ids, first_page, num_pages, stride_kb, stride_kn, stride_vb, stride_vn, n0,
                    end, last_visible, first_visible, m_i, l_i, acc, acc_odd, qk_scale_log2, softcap_log2, head_dim,
                    BLOCK_N, BLOCK_D, RIGHT_BOUND, LEFT_BOUND, SOFTCAP, PAGED, PAGE_SIZE, CHUNK_PAGES, True, EVEN_D,
                    V_PAIRS, V_E5M2, PAIRS_PTX)
            else:
                m_i, l_i, acc, acc_odd = attend_tile(
                    q, k_base, v_base, page_ids, first_page, num_pages, stride_kb, stride_kn, stride_vb, stride_vn, n0,
                    end, last_visible, first_visible, m_i, l_i, acc, acc_odd, qk_scale_log2, softcap_log2, head_dim,
                    BLOCK_N, BLOCK_D, RIGHT_BOUND, LEFT_BOUND, SOFTCAP, PAGED, PAGE_SIZE, CHUNK_PAGES, False, EVEN_D,
                    V_PAIRS, V_E5M2, PAIRS_PTX)
            n0 += BLOCK_N
    elif FULL_TILES:
        if LEFT_BOUND:  # the window's first tiles, which some rows cannot fully see
            for n0 in tl.range(lo, full_start, BLOCK_N, num_stages=1):
                m_i, l_i, acc, acc_odd = attend_tile(
                    q, k_base, v_base, page_ids, first_page, num_pages, stride_kb, stride_kn, stride_vb, stride_vn, n0,
                    end, last_visible, first_visible, m_i, l_i, acc, acc_odd, qk_scale_log2, softcap_log2, head_dim,
                    BLOCK_N, BLOCK_D, RIGHT_BOUND, LEFT_BOUND, SOFTCAP, PAGED, PAGE_SIZE, CHUNK_PAGES, False, EVEN_D,
                    V_PAIRS, V_E5M2, PAIRS_PTX)
        for n0 in range(full_start, full_hi, BLOCK_N):
            m_i, l_i, acc, acc_odd = attend_tile(
                q, k_base, v_base, page_ids, first_page, num_pages, stride_kb, stride_kn, stride_vb, stride_vn, n0,
                end, last_visible, first_visible, m_i, l_i, acc, acc_odd, qk_scale_log2, softcap_log2, head_dim,
                BLOCK_N, BLOCK_D, RIGHT_BOUND, LEFT_BOUND, SOFTCAP, PAGED, PAGE_SIZE, CHUNK_PAGES, True, EVEN_D,
                V_PAIRS, V_E5M2, PAIRS_PTX)
        # The tail: not software-pipelined (usually one tile; its loads wait either way).
        for n0 in tl.range(full_hi, hi, BLOCK_N, num_stages=1):
            m_i, l_i, acc, acc_odd = attend_tile(
                q, k_base, v_base, page_ids, first_page, num_pages, stride_kb, stride_kn, stride_vb, stride_vn, n0,
                end, last_visible, first_visible, m_i, l_i, acc, acc_odd, qk_scale_log2, softcap_log2, head_dim,
                BLOCK_N, BLOCK_D, RIGHT_BOUND, LEFT_BOUND, SOFTCAP, PAGED, PAGE_SIZE, CHUNK_PAGES, False, EVEN_D,
                V_PAIRS, V_E5M2, PAIRS_PTX)
    else:
        for n0 in range(lo, hi, BLOCK_N):
            m_i, l_i, acc, acc_odd = attend_tile(
                q, k_base, v_base, page_ids, first_page, num_pages, stride_kb, stride_kn, stride_vb, stride_vn, n0,
                end, last_visible, first_visible, m_i, l_i, acc, acc_odd, qk_scale_log2, softcap_log2, head_dim,
                BLOCK_N, BLOCK_D, RIGHT_BOUND, LEFT_BOUND, SOFTCAP, PAGED, PAGE_SIZE, CHUNK_PAGES, False, EVEN_D,
                V_PAIRS, V_E5M2, PAIRS_PTX)
    return m_i, l_i, acc, acc_odd


@triton.jit
def q_for_fp16_dots(q, qk_scale_log2):
    """q ``[BLOCK_M, BLOCK_D]`` in fp16 for an fp8 cache's dots, and the ``[BLOCK_M, 1]`` score
    scale that undoes its row scaling.

    The dots of an fp8 cache run in fp16 whatever q's dtype: fp8 -> fp16 is one conversion per
    pair of values, fp8 -> bf16 two more per value (sm_90 PTX), in the loop's hot path. Each q
    row is multiplied by a power of two (exact) that brings its largest magnitude into
    (2^13, 2^14]: no bf16 value overflows fp16, and small rows keep fp16's 11-bit precision.
    """
    qf = q.to(tl.float32)
    row_max = tl.maximum(tl.max(tl.abs(qf), axis=1), 1e-30)  # an all-zero (masked) row: any shift
    shift = 14 - tl.ceil(tl.log2(row_max)).to(tl.int32)
    pow2 = ((shift + 127) << 23).to(tl.float32, bitcast=True)  # 2^shift, exactly
    return (qf * pow2[:, None]).to(tl.float16), (qk_scale_log2 / pow2)[:, None]
