"""Triton split-KV kernel: one program per (split, batch row, KV head x row block).

Device code only; :mod:`flashsplit.triton.backend` validates, allocates and launches.

GQA packing: the ``group`` q heads of one KV head and the ``L_q`` query positions form the rows
of one tile (packed row ``r = m * group + h``, q head fastest), so each K/V tile is read once
per KV head instead of once per q head.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from .attend import attend_range, chunk_page_ids, q_for_fp16_dots
from .new_keys import row_cache_bases, row_descales, write_new_keys
from .rotary import load_rotated_rows, load_rows_rotated_at
from .split_rule import (add_sink, load_leftpad, load_seqlen, padded_row_first_key, row_first_key, row_split_range,
                         row_splits_used)

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def program_work(HEADS_FIRST: tl.constexpr):
    """This program's ``(split, b, z, tile_index)``: its split, batch row (int64), KV head x row
    block ``z``, and its row tile's index ``b * Z + z`` (``Z = H_kv x row_blocks``: the arrival
    counter of the last-split merge). Programs ``(split, b, z)`` of a grid ``(splits, B, Z)``;
    with HEADS_FIRST, ``(z, split, b)`` of a grid ``(Z, splits, B)``, so the programs of one batch
    row's KV heads are launched side by side and read the same key rows together."""
    if HEADS_FIRST:
        z, split, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
        tile_index = b * tl.num_programs(0) + z
    else:
        split, b, z = tl.program_id(0), tl.program_id(1).to(tl.int64), tl.program_id(2)
        tile_index = b * tl.num_programs(2) + z
    return split, b, z, tile_index


@triton.jit
def store_final(OUT, LSE, sink, out, lse, b, offs_m, offs_hq, offs_d, mask_out, mask_r,
                stride_ob, stride_om, stride_oh, stride_lb, stride_lh, WRITE_LSE: tl.constexpr,
                HAS_SINKS: tl.constexpr):
    """Write a finished tile: ``OUT[b, m, hq, :]`` in OUT's dtype and ``LSE[b, hq, m]``; with
    HAS_SINKS, after adding each row's sink ``sink`` (fp32, its q head's, :func:`load_row_sinks`)
    to the softmax (:func:`add_sink`)."""
    if HAS_SINKS:
        lse, factor = add_sink(lse, sink)
        out = out * factor[:, None]
    out_ptrs = OUT + b * stride_ob + offs_m[:, None] * stride_om + offs_hq[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=mask_out)
    if WRITE_LSE:
        tl.store(LSE + b * stride_lb + offs_hq * stride_lh + offs_m, lse, mask=mask_r)


@triton.jit
def load_row_sinks(SINKS, kvh, row_block, seqlen_q, group, BLOCK_M: tl.constexpr, ROWS: tl.constexpr,
                   HAS_SINKS: tl.constexpr):
    """The sinks ``SINKS[hq]`` (fp32) of a row tile's first ROWS packed rows; zeros without HAS_SINKS.
    Loaded with q, ahead of the keys: the final store then waits on no load of its own."""
    offs_r = row_block * BLOCK_M + tl.arange(0, ROWS)
    sink = tl.zeros([ROWS], tl.float32)
    if HAS_SINKS:
        sink = tl.load(SINKS + kvh * group + offs_r % group, mask=offs_r < seqlen_q * group, other=0.0).to(tl.float32)
    return sink


@triton.jit
def store_partial(OUT_PARTIAL, LSE_PARTIAL, out, lse, split, b, offs_m, offs_hq, offs_d, mask_out, mask_r,
                  stride_ops, stride_opb, stride_opm, stride_oph, stride_lps, stride_lpb, stride_lph):
    """Write one split's tile: fp32 ``OUT_PARTIAL[split, b, m, hq, :]`` and ``LSE_PARTIAL[split, b, hq, m]``."""
    split64 = split.to(tl.int64)
    op_ptrs = (
        OUT_PARTIAL + split64 * stride_ops + b * stride_opb
        + offs_m[:, None] * stride_opm + offs_hq[:, None] * stride_oph + offs_d[None, :]
    )
    tl.store(op_ptrs, out, mask=mask_out)
    tl.store(LSE_PARTIAL + split64 * stride_lps + b * stride_lpb + offs_hq * stride_lph + offs_m, lse, mask=mask_r)


@triton.jit
def merge_splits(OUT_PARTIAL, LSE_PARTIAL, OUT, LSE, sink, b, kvh, row_block, seqlen_q, group, head_dim,
                 num_splits, stride_ops, stride_opb, stride_opm, stride_oph, stride_lps, stride_lpb, stride_lph,
                 stride_ob, stride_om, stride_oh, stride_lb, stride_lh,
                 BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, MERGE_ROWS: tl.constexpr, MERGE_SPLITS: tl.constexpr,
                 MERGE_CHUNK: tl.constexpr, WRITE_LSE: tl.constexpr, HAS_SINKS: tl.constexpr):
    """Merge a row tile's ``num_splits`` partials (what the combine kernel computes) and write
    ``OUT``/``LSE`` (with HAS_SINKS, ``sink`` ``[MERGE_ROWS]`` joins each row's softmax).

    Only the tile's first MERGE_ROWS packed rows (the real ones, a power of two >= L_q x group
    when that is under BLOCK_M) are merged, in chunks of MERGE_CHUNK splits: a chunk's LSEs
    ``[MERGE_CHUNK, MERGE_ROWS]`` and outputs ``[MERGE_CHUNK, MERGE_ROWS, BLOCK_D]`` (64 fp32
    registers a thread) are loaded together, one L2 round trip per chunk instead of one per split,
    and folded into a running (max, sum, output) rescaled when the max grows. A split with
    ``lse_s = -inf`` (no visible key) weighs 0 and its output is not read; a row where every split
    is empty gets O = 0 and LSE = -inf. The partials were written by other SMs: loaded through
    L2 (``.cg``).
    """
    offs_r = row_block * BLOCK_M + tl.arange(0, MERGE_ROWS)
    offs_m = offs_r // group
    offs_hq = kvh * group + offs_r % group
    offs_d = tl.arange(0, BLOCK_D)
    mask_r = offs_r < seqlen_q * group
    row_part = b * stride_lpb + offs_hq * stride_lph + offs_m  # [MERGE_ROWS] offsets into LSE_PARTIAL
    o_row = b * stride_opb + offs_m[:, None] * stride_opm + offs_hq[:, None] * stride_oph + offs_d[None, :]
    mask_rd = mask_r[:, None] & (offs_d < head_dim)[None, :]
    m = tl.full([MERGE_ROWS], float("-inf"), tl.float32)  # running max of the LSEs seen
    total = tl.zeros([MERGE_ROWS], tl.float32)  # sum of exp(lse_s - m)
    acc = tl.zeros([MERGE_ROWS, BLOCK_D], tl.float32)  # sum of exp(lse_s - m) * O_s
    for c0 in tl.static_range(0, MERGE_SPLITS, MERGE_CHUNK):
        offs_c = c0 + tl.arange(0, MERGE_CHUNK)
        in_range = (offs_c[:, None] < num_splits) & mask_r[None, :]
        # A chunk's LSEs and outputs are loaded together (no load waits for another).
        lse_c = tl.load(LSE_PARTIAL + offs_c[:, None].to(tl.int64) * stride_lps + row_part[None, :],
                        mask=in_range, other=float("-inf"), cache_modifier=".cg")
        o = tl.load(OUT_PARTIAL + offs_c[:, None, None].to(tl.int64) * stride_ops + o_row[None, :, :],
                    mask=in_range[:, :, None] & mask_rd[None, :, :], other=0.0, cache_modifier=".cg")
        m_new = tl.maximum(m, tl.max(lse_c, axis=0))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # no -inf - -inf
        rescale = tl.exp(m - shift)  # 0 while nothing was seen
        live = lse_c > float("-inf")  # an empty split's output is garbage: dropped by a select
        weight = tl.where(live, tl.exp(lse_c - shift[None, :]), 0.0)
        total = total * rescale + tl.sum(weight, axis=0)
        acc = acc * rescale[:, None] + tl.sum(tl.where(live[:, :, None], weight[:, :, None] * o, 0.0), axis=0)
        m = m_new
    has_keys = total > 0.0
    safe_total = tl.where(has_keys, total, 1.0)
    lse = tl.where(has_keys, m + tl.log(safe_total), float("-inf"))
    acc = acc / safe_total[:, None]
    store_final(OUT, LSE, sink, acc, lse, b, offs_m, offs_hq, offs_d, mask_rd, mask_r,
                stride_ob, stride_om, stride_oh, stride_lb, stride_lh, WRITE_LSE, HAS_SINKS)


@triton.jit
def store_partial_and_merge(OUT_PARTIAL, LSE_PARTIAL, OUT, LSE, ARRIVALS, tile_index, merge_sink, out, lse, split, b, kvh,
                            row_block,
                            offs_m, offs_hq, offs_d, mask_out, mask_r, seqlen_q, group, head_dim, num_splits,
                            stride_ops, stride_opb, stride_opm, stride_oph, stride_lps, stride_lpb, stride_lph,
                            stride_ob, stride_om, stride_oh, stride_lb, stride_lh,
                            BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, WRITE_LSE: tl.constexpr,
                            MERGE_IN_LAST_SPLIT: tl.constexpr, MERGE_ROWS: tl.constexpr, MERGE_SPLITS: tl.constexpr,
                            MERGE_CHUNK: tl.constexpr, HAS_SINKS: tl.constexpr):
    """:func:`store_partial`; with MERGE_IN_LAST_SPLIT, the row tile's last split to arrive (on
    its counter ``ARRIVALS[tile_index]``) then merges every split's partial (:func:`merge_splits`,
    ``merge_sink`` its rows' sinks) into ``OUT``/``LSE``."""
    store_partial(OUT_PARTIAL, LSE_PARTIAL, out, lse, split, b, offs_m, offs_hq, offs_d, mask_out, mask_r,
                  stride_ops, stride_opb, stride_opm, stride_oph, stride_lps, stride_lpb, stride_lph)
    if MERGE_IN_LAST_SPLIT:
        # Every thread's partial stores come before the count (bar.sync; the atomic is a gpu-scope
        # release), and the last program's reads come after it (acquire): it sees every split.
        tl.debug_barrier()
        arrivals = ARRIVALS + tile_index
        if tl.atomic_add(arrivals, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
            tl.store(arrivals, 0)  # every program of this row tile has counted: reset for the next launch
            merge_splits(OUT_PARTIAL, LSE_PARTIAL, OUT, LSE, merge_sink, b, kvh, row_block, seqlen_q, group, head_dim,
                         num_splits, stride_ops, stride_opb, stride_opm, stride_oph, stride_lps, stride_lpb, stride_lph,
                         stride_ob, stride_om, stride_oh, stride_lb, stride_lh,
                         BLOCK_M, BLOCK_D, MERGE_ROWS, MERGE_SPLITS, MERGE_CHUNK, WRITE_LSE, HAS_SINKS)


@triton.jit
def split_kv_kernel(
    Q, K, V, SEQLENS, BLOCK_TABLE, K_DESCALE, V_DESCALE,
    OUT_PARTIAL, LSE_PARTIAL, OUT, LSE, ARRIVALS, SINKS, LEFTPAD, BATCH_IDX, COS, SIN, K_NEW, V_NEW,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ops, stride_opb, stride_opm, stride_oph,
    stride_lps, stride_lpb, stride_lph,
    stride_ob, stride_om, stride_oh,
    stride_lb, stride_lh,
    stride_btb, stride_kdb, stride_kdh, stride_vdb, stride_vdh, stride_cos,
    stride_knb, stride_knt, stride_knh, stride_vnb, stride_vnt, stride_vnh,
    seqlen_q, seqlen_k, num_splits, row_blocks, group, head_dim, PAGE_SIZE: tl.constexpr, num_pages, qk_scale_log2,
    window_left, window_right, softcap_log2, seqlen_ro, rotary_half,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GRANULE: tl.constexpr,
    HAS_SEQLENS: tl.constexpr,
    HAS_PARTIALS: tl.constexpr,
    PAGED: tl.constexpr,
    HAS_DESCALE: tl.constexpr,
    RIGHT_BOUND: tl.constexpr,
    FINAL_FOR_SINGLE_SPLIT_ROWS: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    RUNTIME_BOUND_WHILE: tl.constexpr,
    LAUNCH_DEPENDENTS: tl.constexpr = False,
    CHUNK_TILES: tl.constexpr = 0,
    CHUNK_PAGES: tl.constexpr = 0,
    MERGE_IN_LAST_SPLIT: tl.constexpr = False,
    MERGE_ROWS: tl.constexpr = 16,
    MERGE_SPLITS: tl.constexpr = 16,
    MERGE_CHUNK: tl.constexpr = 16,
    FULL_TILES: tl.constexpr = False,
    EVEN_D: tl.constexpr = False,
    V_PAIRS: tl.constexpr = False,
    V_E5M2: tl.constexpr = False,
    PAIRS_PTX: tl.constexpr = False,
    LEFT_BOUND: tl.constexpr = False,
    SOFTCAP: tl.constexpr = False,
    HAS_SINKS: tl.constexpr = False,
    INVARIANT: tl.constexpr = False,
    SEQLEN_ADD: tl.constexpr = 0,
    HAS_LEFTPAD: tl.constexpr = False,
    HAS_BATCH_IDX: tl.constexpr = False,
    ROTARY: tl.constexpr = False,
    ROTARY_INTERLEAVED: tl.constexpr = True,
    ROTARY_PER_TOKEN: tl.constexpr = False,
    FP8_EMIN: tl.constexpr = 0,
    FP8_MBITS: tl.constexpr = 0,
    FP8_MAX: tl.constexpr = 0.0,
    NEW_BLOCK_N: tl.constexpr = 16,
    HEADS_FIRST: tl.constexpr = False,
):
    """Attention of one split of one row's keys for one tile of packed (query, q head) rows.

    Query ``m`` of a row of ``seqlen`` keys sits at position ``pos = seqlen - seqlen_q + m``
    (bottom-right aligned) and sees keys ``pos - window_left <= n <= pos + window_right``:
    RIGHT_BOUND (causal: ``window_right`` 0) and LEFT_BOUND switch each bound on. The row's
    splits cover only the keys some query sees (:func:`row_first_key`). SOFTCAP caps the scores
    (``softcap_log2`` = softcap * log2(e)); HAS_SINKS adds ``SINKS[hq]`` to each finished softmax;
    INVARIANT splits each row by its own length (batch-invariant decode).

    A row holds ``SEQLENS[b] + SEQLEN_ADD`` keys: with SEQLEN_ADD, the call's new keys and values
    ``K_NEW``/``V_NEW`` ``[B, SEQLEN_ADD, H_kv, D]`` follow the cache's (the lengths are not
    updated); a program whose split covers some of them writes them into the cache, in tiles of
    NEW_BLOCK_N keys, before it reads its keys (:mod:`~flashsplit.triton.new_keys`; for an fp8
    cache ``FP8_EMIN``/``FP8_MBITS``/``FP8_MAX`` describe its format). HAS_LEFTPAD: its keys start at
    ``LEFTPAD[b]`` (masks are unchanged: a query's position and the keys' shift alike);
    HAS_BATCH_IDX: a dense row b reads cache row ``BATCH_IDX[b]``. ROTARY: q is rotated by
    ``COS``/``SIN`` (:mod:`~flashsplit.triton.rotary`) at position ``SEQLENS[b] - LEFTPAD[b]``, plus
    the query's index with ROTARY_PER_TOKEN; new keys at the same position plus their token index.

    Writes the fp32 partial ``OUT_PARTIAL[split, b, m, hq, :]``, ``LSE_PARTIAL[split, b, hq, m]``
    (natural log, -inf when no key is visible). With FINAL_FOR_SINGLE_SPLIT_ROWS, a row whose
    keys fit in one split instead gets its final ``OUT[b, m, hq, :]`` (q dtype) and
    ``LSE[b, hq, m]`` from split 0, and the combine skips it.

    With MERGE_IN_LAST_SPLIT no combine kernel follows: each program counts itself in
    ``ARRIVALS[b, kv head x row block]`` (int32, zero between launches) once its partial is
    written, and the last of the row's ``num_splits`` programs merges all of them
    (:func:`merge_splits`), writes ``OUT``/``LSE`` and sets the count back to zero.

    Programs ``(split, b, z)`` of a grid ``(num_splits, B, H_kv x row_blocks)``, or with
    HEADS_FIRST ``(z, split, b)`` of a grid ``(H_kv x row_blocks, num_splits, B)``
    (:func:`program_work`).

    With V_PAIRS, ``V`` is an fp8 cache viewed as int16 (V_E5M2: its format), strides in int16
    elements (:func:`~flashsplit.triton.attend.fp8_pairs_to_fp16`; PAIRS_PTX: convert with PTX ``cvt``).
    """
    if LAUNCH_DEPENDENTS:
        # Programmatic dependent launch (sm_90+): once every program has started, the combine
        # may be scheduled; it waits (griddepcontrol.wait) for this grid's writes before reading.
        gdc_launch_dependents()
    split, b, z, tile_index = program_work(HEADS_FIRST)
    kvh = (z // row_blocks).to(tl.int64)
    row_block = z % row_blocks

    if HAS_SEQLENS:
        seqlen = load_seqlen(SEQLENS, b, seqlen_k, SEQLEN_ADD)
    else:
        seqlen = seqlen_k
    if HAS_LEFTPAD:
        first = padded_row_first_key(seqlen, load_leftpad(LEFTPAD, b, seqlen), seqlen_q, window_left, GRANULE,
                                     LEFT_BOUND)
    else:
        first = row_first_key(seqlen, seqlen_q, window_left, GRANULE, LEFT_BOUND)
    start, end = row_split_range(seqlen, first, split, num_splits, GRANULE, INVARIANT)
    write_final = False  # runtime: this row's keys fit in one split (decided by split 0)
    if HAS_PARTIALS and FINAL_FOR_SINGLE_SPLIT_ROWS:
        write_final = row_splits_used(seqlen - first, num_splits, GRANULE, INVARIANT) <= 1
        if write_final and split > 0:
            return

    offs_r = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_m = offs_r // group
    offs_hq = kvh * group + offs_r % group
    offs_d = tl.arange(0, BLOCK_D)
    mask_r = offs_r < seqlen_q * group
    mask_d = offs_d < head_dim

    rot_position = 0
    if ROTARY:  # at the row's old length (leftpad-relative), as the new keys
        rot_position = tl.load(SEQLENS + b)
        if HAS_LEFTPAD:
            rot_position -= tl.load(LEFTPAD + b)
        q_rows = Q + b * stride_qb + offs_m * stride_qm + offs_hq * stride_qh
        if ROTARY_PER_TOKEN:
            q = load_rotated_rows(q_rows, mask_r, rot_position + offs_m, COS, SIN, stride_cos, seqlen_ro,
                                  rotary_half, head_dim, offs_d, ROTARY_INTERLEAVED).to(Q.dtype.element_ty)
        else:  # one table row for the tile: fewer loads ahead of the first K tile
            q = load_rows_rotated_at(q_rows, mask_r, rot_position, COS, SIN, stride_cos, seqlen_ro, rotary_half,
                                     head_dim, offs_d, ROTARY_INTERLEAVED).to(Q.dtype.element_ty)
    else:
        q_ptrs = Q + b * stride_qb + offs_m[:, None] * stride_qm + offs_hq[:, None] * stride_qh + offs_d[None, :]
        q = tl.load(q_ptrs, mask=mask_r[:, None] & mask_d[None, :], other=0.0)

    sink = load_row_sinks(SINKS, kvh, row_block, seqlen_q, group, BLOCK_M, BLOCK_M, HAS_SINKS)
    merge_sink = load_row_sinks(SINKS, kvh, row_block, seqlen_q, group, BLOCK_M, MERGE_ROWS,
                                HAS_SINKS and MERGE_IN_LAST_SPLIT)

    # Bottom-right aligned: query m is token (seqlen - L_q + m) and sees keys up to it (causal)
    # or window_right past it, and from window_left before it.
    last_visible = seqlen - seqlen_q + offs_m + window_right
    first_visible = seqlen - seqlen_q + offs_m - window_left
    # Keys in [full_lo, full_limit) are visible to every query of the tile: no mask needed.
    full_limit = end
    if RIGHT_BOUND:
        full_limit = tl.minimum(end, seqlen - seqlen_q + window_right + 1)
    full_lo = seqlen - 1 - window_left

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max, log2 domain
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if V_PAIRS:  # even and odd output columns
        acc = tl.zeros([BLOCK_M, BLOCK_D // 2], tl.float32)
        acc_odd = tl.zeros([BLOCK_M, BLOCK_D // 2], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        acc_odd = tl.zeros([1], tl.float32)  # unused
    k_base, v_base = row_cache_bases(K, V, BATCH_IDX, b, kvh, num_pages, stride_kb, stride_kh, stride_vb, stride_vh,
                                     PAGED, HAS_BATCH_IDX)
    bt_row = BLOCK_TABLE  # the row's page table (PAGED)
    if PAGED:
        bt_row = BLOCK_TABLE + b * stride_btb
    k_scale, v_scale = row_descales(K_DESCALE, V_DESCALE, b, kvh, stride_kdb, stride_kdh, stride_vdb, stride_vdh,
                                    HAS_DESCALE)
    if HAS_DESCALE:  # fp8 cache: K's scale multiplies the scores, V's the output
        qk_scale_log2 = qk_scale_log2 * k_scale
        q, qk_scale_log2 = q_for_fp16_dots(q, qk_scale_log2)
    if SEQLEN_ADD != 0:
        # This split's new keys go into the cache first; the barrier orders those stores before the
        # program's loads of the same slots (every row tile writes the same bytes for itself). Split
        # 0 also writes the new keys no split covers (before a window's first key).
        new_token0 = tl.load(SEQLENS + b)  # the key of new token 0
        new_lo = tl.minimum(tl.maximum(new_token0, 0), seqlen)
        write_new_keys(K_NEW + b * stride_knb + kvh * stride_knh, V_NEW + b * stride_vnb + kvh * stride_vnh, k_base,
                       v_base, bt_row, tl.where(split == 0, new_lo, tl.maximum(start, new_lo)), end, new_token0,
                       rot_position, k_scale, v_scale, num_pages, stride_knt, stride_vnt, stride_kb, stride_kn,
                       stride_vb, stride_vn, COS, SIN, stride_cos, seqlen_ro, rotary_half, head_dim, NEW_BLOCK_N,
                       BLOCK_D, PAGED, PAGE_SIZE, ROTARY, ROTARY_INTERLEAVED, HAS_DESCALE, V_PAIRS, V_E5M2,
                       FP8_EMIN, FP8_MBITS, FP8_MAX)
        tl.debug_barrier()
    lo = start  # the first tile read
    if LEFT_BOUND:  # the tiles before the first key query 0 sees hold no key any query sees
        lo = tl.maximum(start, tl.maximum(seqlen - seqlen_q - window_left, 0) // BLOCK_N * BLOCK_N)
    if PAGED:
        # Chunks of CHUNK_TILES tiles: the chunk's page ids are loaded once, then its tiles run
        # like dense ones (the K/V addresses depend on no load inside the inner loop).
        c0 = lo
        while c0 < end:
            first_page, page_ids = chunk_page_ids(bt_row, c0, seqlen, PAGE_SIZE, CHUNK_PAGES)
            c1 = tl.minimum(c0 + CHUNK_TILES * BLOCK_N, end)
            m_i, l_i, acc, acc_odd = attend_range(q, k_base, v_base, page_ids, first_page, num_pages, stride_kb,
                                                  stride_kn, stride_vb, stride_vn, c0, c1, end, full_lo, full_limit,
                                                  last_visible, first_visible, m_i, l_i, acc, acc_odd, qk_scale_log2,
                                                  softcap_log2, head_dim, BLOCK_N, BLOCK_D, RIGHT_BOUND, LEFT_BOUND,
                                                  SOFTCAP, PAGED, PAGE_SIZE, CHUNK_PAGES, RUNTIME_BOUND_WHILE,
                                                  FULL_TILES, EVEN_D, V_PAIRS, V_E5M2, PAIRS_PTX)
            c0 = c1
    else:
        m_i, l_i, acc, acc_odd = attend_range(q, k_base, v_base, 0, 0, num_pages, stride_kb, stride_kn, stride_vb,
                                              stride_vn, lo, end, end, full_lo, full_limit, last_visible,
                                              first_visible, m_i, l_i, acc, acc_odd, qk_scale_log2, softcap_log2,
                                              head_dim, BLOCK_N, BLOCK_D, RIGHT_BOUND, LEFT_BOUND, SOFTCAP, PAGED,
                                              PAGE_SIZE, CHUNK_PAGES, RUNTIME_BOUND_WHILE, FULL_TILES, EVEN_D,
                                              V_PAIRS, V_E5M2, PAIRS_PTX)
    if V_PAIRS:  # interleave the even and odd columns back: [BLOCK_M, BLOCK_D / 2, 2] -> [BLOCK_M, BLOCK_D]
        acc = tl.reshape(tl.join(acc, acc_odd), [BLOCK_M, BLOCK_D])

    has_keys = l_i > 0.0
    lse = tl.where(has_keys, (m_i + tl.log2(tl.where(has_keys, l_i, 1.0))) * LN2, float("-inf"))
    out = acc * (v_scale / tl.where(has_keys, l_i, 1.0))[:, None]
    mask_out = mask_r[:, None] & mask_d[None, :]
    # Which store runs is static wherever it can be: OUT/LSE or the partial buffers may be
    # None, and the compiler builds every branch that is not pruned at compile time.
    if not HAS_PARTIALS:  # one split: no partial buffers exist
        store_final(OUT, LSE, sink, out, lse, b, offs_m, offs_hq, offs_d, mask_out, mask_r,
                    stride_ob, stride_om, stride_oh, stride_lb, stride_lh, WRITE_LSE, HAS_SINKS)
    elif not FINAL_FOR_SINGLE_SPLIT_ROWS:  # partials for every row (forward_partials: no OUT)
        store_partial_and_merge(OUT_PARTIAL, LSE_PARTIAL, OUT, LSE, ARRIVALS, tile_index, merge_sink, out, lse, split,
                                b, kvh, row_block, offs_m, offs_hq, offs_d, mask_out, mask_r, seqlen_q, group, head_dim,
                                num_splits, stride_ops, stride_opb, stride_opm, stride_oph, stride_lps, stride_lpb,
                                stride_lph, stride_ob, stride_om, stride_oh, stride_lb, stride_lh, BLOCK_M, BLOCK_D,
                                WRITE_LSE, MERGE_IN_LAST_SPLIT, MERGE_ROWS, MERGE_SPLITS, MERGE_CHUNK, HAS_SINKS)
    elif write_final:
        store_final(OUT, LSE, sink, out, lse, b, offs_m, offs_hq, offs_d, mask_out, mask_r,
                    stride_ob, stride_om, stride_oh, stride_lb, stride_lh, WRITE_LSE, HAS_SINKS)
    else:
        store_partial_and_merge(OUT_PARTIAL, LSE_PARTIAL, OUT, LSE, ARRIVALS, tile_index, merge_sink, out, lse, split,
                                b, kvh, row_block, offs_m, offs_hq, offs_d, mask_out, mask_r, seqlen_q, group, head_dim,
                                num_splits, stride_ops, stride_opb, stride_opm, stride_oph, stride_lps, stride_lpb,
                                stride_lph, stride_ob, stride_om, stride_oh, stride_lb, stride_lh, BLOCK_M, BLOCK_D,
                                WRITE_LSE, MERGE_IN_LAST_SPLIT, MERGE_ROWS, MERGE_SPLITS, MERGE_CHUNK, HAS_SINKS)
