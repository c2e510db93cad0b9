"""Triton MLA split kernel: one program per (row block, split, batch row). Device code only;
:mod:`flashsplit.mla.triton_backend` validates, allocates and launches.

Every q head of every query token attends the one latent KV head, so the ``seqlen_q x H_q``
packed rows (``r = m * H_q + h``, q head fastest) form the rows of one tile and each key tile is
loaded once per row block: its 512 latent features are both the first 512 columns of K and all
of V, its 64 rotary features the rest of K. Scores are ``q_lat . k_lat + q_rope . k_rope``.
"""

import triton
import triton.language as tl

from ..triton.split_rule import load_seqlen, row_split_range

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def key_rows(BLOCK_TABLE, b, n0, offs_n, mask_n, stride_kb, stride_kn, stride_btb, num_pages,
             PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Element offsets (int64) of keys ``offs_n = n0 + [0, BLOCK_N)`` of row ``b``: dense ``b *
    stride_kb + n * stride_kn``; paged through ``BLOCK_TABLE[b, n // PAGE_SIZE]``, clamped into
    the cache (a wrong id reads a wrong page, never stray memory). Where whole tiles fit in a
    page (tiles start on multiples of BLOCK_N) a tile reads one page id, else one per key under
    the key mask; either way only ids of pages holding the row's keys are read."""
    if PAGED:
        if PAGE_SIZE % BLOCK_N == 0:
            page = tl.load(BLOCK_TABLE + b * stride_btb + n0 // PAGE_SIZE)
            page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
            return page * stride_kb + (n0 % PAGE_SIZE + tl.arange(0, BLOCK_N)).to(tl.int64) * stride_kn
        else:
            page = tl.load(BLOCK_TABLE + b * stride_btb + offs_n // PAGE_SIZE, mask=mask_n, other=0)
            page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
            return page * stride_kb + (offs_n % PAGE_SIZE).to(tl.int64) * stride_kn
    else:
        return b * stride_kb + offs_n.to(tl.int64) * stride_kn


@triton.jit
def load_key_tile(KV, KV_F32, KV_16, rows, mask_n, dtype, DV: tl.constexpr, D_ROPE: tl.constexpr,
                  TILE_SCALED: tl.constexpr, SCALE_TILE: tl.constexpr):
    """``(latent [BLOCK_N, DV], rope [BLOCK_N, D_ROPE])`` in ``dtype`` of the keys at element
    offsets ``rows`` (masked loads: slots past the split's end may hold NaN and are never read).

    A 16-bit or fp8 cache holds 576 values a key (fp8 -> 16 bits is exact). TILE_SCALED:
    FlashMLA's 656-byte fp8 token, ``rows`` in bytes: 512 e4m3 latent values, 4 fp32 scales (one
    per SCALE_TILE values: value = e4m3 x scale), 64 rotary values in q's dtype; ``KV_F32`` and
    ``KV_16`` are the same cache read as fp32 and as q's dtype."""
    cols = tl.arange(0, DV)
    latent = tl.load(KV + rows[:, None] + cols[None, :], mask=mask_n[:, None], other=0.0)
    if TILE_SCALED:
        scale = tl.load(KV_F32 + (rows // 4)[:, None] + DV // 4 + (cols // SCALE_TILE)[None, :],
                        mask=mask_n[:, None], other=0.0)
        latent = (latent.to(tl.float32) * scale).to(dtype)
        rope_at = (rows // 2)[:, None] + (DV + 4 * (DV // SCALE_TILE)) // 2
        rope = tl.load(KV_16 + rope_at + tl.arange(0, D_ROPE)[None, :], mask=mask_n[:, None], other=0.0)
    else:
        latent = latent.to(dtype)
        rope = tl.load(KV + rows[:, None] + DV + tl.arange(0, D_ROPE)[None, :], mask=mask_n[:, None], other=0.0)
    return latent, rope.to(dtype)


@triton.jit
def attend_keys(q_lat, q_rope, KV, KV_F32, KV_16, BLOCK_TABLE, b, n0, end, last_visible, m_i, l_i, acc,
                qk_scale_log2, stride_kb, stride_kn, stride_btb, num_pages,
                BLOCK_N: tl.constexpr, DV: tl.constexpr, D_ROPE: tl.constexpr, PAGED: tl.constexpr,
                PAGE_SIZE: tl.constexpr, CAUSAL: tl.constexpr, TILE_SCALED: tl.constexpr,
                SCALE_TILE: tl.constexpr):
    """Online-softmax update of (max, sum, acc) with keys ``[n0, n0 + BLOCK_N)`` of a split
    ending at ``end``; with CAUSAL, row ``r`` sees keys ``n <= last_visible[r]``. Scores are in
    log2 units (``qk_scale_log2`` holds log2(e) and an fp8 cache's scale)."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_n = offs_n < end
    rows = key_rows(BLOCK_TABLE, b, n0, offs_n, mask_n, stride_kb, stride_kn, stride_btb, num_pages, PAGED,
                    PAGE_SIZE, BLOCK_N)
    latent, rope = load_key_tile(KV, KV_F32, KV_16, rows, mask_n, q_lat.dtype, DV, D_ROPE, TILE_SCALED, SCALE_TILE)
    s = tl.dot(q_lat, tl.trans(latent)) + tl.dot(q_rope, tl.trans(rope))
    s = s * qk_scale_log2
    visible = mask_n[None, :]
    if CAUSAL:
        visible = visible & (offs_n[None, :] <= last_visible[:, None])
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no visible key yet: no -inf - -inf
    alpha = tl.exp2(m_i - m_shift)
    p = tl.exp2(s - m_shift[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(q_lat.dtype), latent)
    return m_new, l_i, acc


@triton.jit
def mla_split_kernel(
    Q, KV, KV_F32, KV_16, SEQLENS, BLOCK_TABLE, KV_DESCALE, OUT_PARTIAL, LSE_PARTIAL, OUT, LSE,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_btb,
    stride_ops, stride_opb, stride_opm, stride_oph,
    stride_lps, stride_lpb, stride_lph,
    stride_ob, stride_om, stride_oh,
    stride_lb, stride_lh,
    seqlen_q, num_heads, capacity, num_splits, num_pages, qk_scale_log2,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DV: tl.constexpr,
    D_ROPE: tl.constexpr,
    GRANULE: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_DESCALE: tl.constexpr,
    WRITE_PARTIALS: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    RUNTIME_BOUND_WHILE: tl.constexpr,
    TILE_SCALED: tl.constexpr = False,
    SCALE_TILE: tl.constexpr = 128,
):
    """Attention of one split of row ``b``'s keys for BLOCK_M packed rows.

    Query ``m`` of a row of ``n`` keys sits at position ``n - seqlen_q + m`` and, with CAUSAL
    (bottom-right aligned), sees keys up to it. The split's keys follow
    :func:`flashsplit.plan.split_bounds` (GRANULE). WRITE_PARTIALS: fp32 ``OUT_PARTIAL[split, b,
    m, h, :]`` and ``LSE_PARTIAL[split, b, h, m]`` (natural log, -inf for no visible key); else
    (one split) the final ``OUT[b, m, h, :]`` (q's dtype) and, with WRITE_LSE, ``LSE[b, h, m]``;
    a row that sees no key gets 0 and -inf. HAS_DESCALE: an fp8 cache whose values times
    ``KV_DESCALE[0]`` are the keys and values. TILE_SCALED: FlashMLA's 656-byte fp8 tokens
    (:func:`load_key_tile`; strides in bytes).
    """
    row_block, split, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    offs_r = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_r = offs_r < seqlen_q * num_heads
    offs_m = offs_r // num_heads
    offs_h = offs_r % num_heads
    q_rows = Q + b * stride_qb + offs_m[:, None].to(tl.int64) * stride_qm + offs_h[:, None].to(tl.int64) * stride_qh
    q_lat = tl.load(q_rows + tl.arange(0, DV)[None, :], mask=mask_r[:, None], other=0.0)
    q_rope = tl.load(q_rows + DV + tl.arange(0, D_ROPE)[None, :], mask=mask_r[:, None], other=0.0)
    scale = qk_scale_log2
    if HAS_DESCALE:
        descale = tl.load(KV_DESCALE)
        scale = scale * descale

    seqlen = load_seqlen(SEQLENS, b, capacity, 0)
    start, end = row_split_range(seqlen, 0, split, num_splits, GRANULE, False)
    last_visible = seqlen - seqlen_q + offs_m
    if CAUSAL:
        # Keys past what the tile's last real query sees are never read.
        last_m = tl.minimum((row_block * BLOCK_M + BLOCK_M - 1) // num_heads, seqlen_q - 1)
        end = tl.minimum(end, seqlen - seqlen_q + last_m + 1)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV], tl.float32)
    if RUNTIME_BOUND_WHILE:
        # The CPU interpreter cannot take a loaded length as a range() bound (triton 3.6).
        n0 = start
        while n0 < end:
            m_i, l_i, acc = attend_keys(q_lat, q_rope, KV, KV_F32, KV_16, BLOCK_TABLE, b, n0, end, last_visible, m_i,
                                        l_i, acc, scale, stride_kb, stride_kn, stride_btb, num_pages, BLOCK_N, DV,
                                        D_ROPE, PAGED, PAGE_SIZE, CAUSAL, TILE_SCALED, SCALE_TILE)
            n0 += BLOCK_N
    else:
        for n0 in range(start, end, BLOCK_N):
            m_i, l_i, acc = attend_keys(q_lat, q_rope, KV, KV_F32, KV_16, BLOCK_TABLE, b, n0, end, last_visible, m_i,
                                        l_i, acc, scale, stride_kb, stride_kn, stride_btb, num_pages, BLOCK_N, DV,
                                        D_ROPE, PAGED, PAGE_SIZE, CAUSAL, TILE_SCALED, SCALE_TILE)

    has_keys = l_i > 0.0
    safe_l = tl.where(has_keys, l_i, 1.0)
    lse = tl.where(has_keys, (m_i + tl.log2(safe_l)) * LN2, float("-inf"))
    out = acc / safe_l[:, None]
    if HAS_DESCALE:
        out = out * descale  # V is the same scaled cache
    offs_d = tl.arange(0, DV)
    if WRITE_PARTIALS:
        split64 = split.to(tl.int64)
        op = (OUT_PARTIAL + split64 * stride_ops + b * stride_opb + offs_m[:, None].to(tl.int64) * stride_opm
              + offs_h[:, None].to(tl.int64) * stride_oph + offs_d[None, :])
        tl.store(op, out, mask=mask_r[:, None])
        tl.store(LSE_PARTIAL + split64 * stride_lps + b * stride_lpb + offs_h * stride_lph + offs_m, lse, mask=mask_r)
    else:
        o = (OUT + b * stride_ob + offs_m[:, None].to(tl.int64) * stride_om + offs_h[:, None].to(tl.int64) * stride_oh
             + offs_d[None, :])
        tl.store(o, out.to(OUT.dtype.element_ty), mask=mask_r[:, None])
        if WRITE_LSE:
            tl.store(LSE + b * stride_lb + offs_h * stride_lh + offs_m, lse, mask=mask_r)
