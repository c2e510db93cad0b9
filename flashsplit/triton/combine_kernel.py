"""Triton combine kernel: merge per-split partials by their log-sum-exp.

Device code only. One program per (batch row, query position, q head) and block of BLOCK_D
output columns (grid dim 1: one block up to BLOCK_D columns; MLA's 512 in four)::

    lse = log(sum_s exp(lse_s))            computed as max + log(sum exp(lse_s - max))
    out = sum_s exp(lse_s - lse) * O_s     O_s of a split with lse_s = -inf is never read
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from .split_rule import add_sink, load_leftpad, load_seqlen, padded_row_first_key, row_first_key, row_splits_used


@triton.jit
def combine_kernel(
    OUT_PARTIAL, LSE_PARTIAL, SEQLENS, OUT, LSE, SINKS, LEFTPAD,
    stride_ops, stride_opb, stride_opm, stride_oph,
    stride_lps, stride_lpb, stride_lph,
    stride_ob, stride_om, stride_oh,
    stride_lb, stride_lh,
    seqlen_q, seqlen_k, num_heads, num_splits, window_left,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    CHUNK_S: tl.constexpr,
    GRANULE: tl.constexpr,
    SKIP_SINGLE_SPLIT_ROWS: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    WAIT_FOR_PRIOR_GRID: tl.constexpr = False,
    LEFT_BOUND: tl.constexpr = False,
    INVARIANT: tl.constexpr = False,
    HAS_SINKS: tl.constexpr = False,
    SEQLEN_ADD: tl.constexpr = 0,
    HAS_LEFTPAD: tl.constexpr = False,
):
    """Writes ``OUT[b, m, h, :]`` (OUT's dtype) and ``LSE[b, h, m]`` (fp32, natural log).

    A row where every split is empty gets O = 0 and LSE = -inf (or, HAS_SINKS, LSE = ``SINKS[h]``:
    the sink joins every softmax once, here). With SKIP_SINGLE_SPLIT_ROWS, batch rows whose keys
    fit in one split were finished by the split kernel and are skipped (the split rule's
    LEFT_BOUND / INVARIANT / HAS_LEFTPAD say where a row's splits start and how long they are;
    a row holds ``SEQLENS[b] + SEQLEN_ADD`` keys, as in the split kernel). A
    batch-invariant decode launches at most BATCH_INVARIANT_SPLITS splits and merges them on one
    fixed BLOCK_S = CHUNK_S tile, so a row's reduction order never depends on the launch.
    """
    pid = tl.program_id(0)
    h = pid % num_heads
    m = (pid // num_heads) % seqlen_q
    b = (pid // (num_heads * seqlen_q)).to(tl.int64)
    if SKIP_SINGLE_SPLIT_ROWS:
        seqlen = load_seqlen(SEQLENS, b, seqlen_k, SEQLEN_ADD)
        if HAS_LEFTPAD:
            span = seqlen - padded_row_first_key(seqlen, load_leftpad(LEFTPAD, b, seqlen), seqlen_q, window_left,
                                                 GRANULE, LEFT_BOUND)
        else:
            span = seqlen - row_first_key(seqlen, seqlen_q, window_left, GRANULE, LEFT_BOUND)
        if row_splits_used(span, num_splits, GRANULE, INVARIANT) <= 1:
            return
    if HAS_SINKS:  # an input, written before the split kernel started: loaded before the wait
        sink = tl.load(SINKS + h).to(tl.float32)
    if WAIT_FOR_PRIOR_GRID:
        # Launched as a programmatic dependent of the split kernel: wait until its partials are
        # written and visible (a no-op without programmatic dependence). The lengths above were
        # written before the split kernel started, so reading them before the wait is safe and
        # overlaps that load with the wait.
        gdc_wait()

    lse_base = LSE_PARTIAL + b * stride_lpb + h * stride_lph + m
    o_base = OUT_PARTIAL + b * stride_opb + m * stride_opm + h * stride_oph
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    offs_s = tl.arange(0, BLOCK_S)
    # The partials are loaded without waiting for the LSEs (a live-split mask would make the
    # second load wait for the first): one memory round trip when the splits fit one chunk.
    # Slices of empty splits hold garbage (never written) and are dropped by a select below.
    # The outputs come first in program order: loaded after the LSEs, ptxas (sm_90a)
    # issued them only after the LSE max and sum, a second round trip behind the first.
    if BLOCK_S == CHUNK_S:
        o_first = tl.load(
            o_base + offs_s[:, None].to(tl.int64) * stride_ops + offs_d[None, :],
            mask=(offs_s < num_splits)[:, None] & mask_d[None, :],
            other=0.0,
        )
    lse_s = tl.load(lse_base + offs_s.to(tl.int64) * stride_lps, mask=offs_s < num_splits, other=float("-inf"))
    lse_max = tl.max(lse_s, axis=0)
    shift = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    total = tl.sum(tl.exp(lse_s - shift), axis=0)
    has_keys = total > 0.0
    lse = tl.where(has_keys, shift + tl.log(tl.where(has_keys, total, 1.0)), float("-inf"))
    weight_shift = tl.where(has_keys, lse, 0.0)  # no -inf - -inf for a row without keys

    if BLOCK_S == CHUNK_S:
        live = lse_s > float("-inf")
        weight = tl.where(live, tl.exp(lse_s - weight_shift), 0.0)
        # Select, then multiply: an empty split's garbage may be inf (0 * inf: NaN, which the interpreter warns of).
        acc = tl.sum(weight[:, None] * tl.where(live[:, None], o_first, 0.0), axis=0)
    else:
        acc = tl.zeros([BLOCK_D], tl.float32)
        for s0 in range(0, BLOCK_S, CHUNK_S):  # static bound: BLOCK_S >= num_splits
            offs_c = s0 + tl.arange(0, CHUNK_S)
            lse_c = tl.load(lse_base + offs_c.to(tl.int64) * stride_lps, mask=offs_c < num_splits,
                            other=float("-inf"))
            live = lse_c > float("-inf")
            weight = tl.where(live, tl.exp(lse_c - weight_shift), 0.0)
            o = tl.load(
                o_base + offs_c[:, None].to(tl.int64) * stride_ops + offs_d[None, :],
                mask=live[:, None] & mask_d[None, :],
                other=0.0,
            )
            acc += tl.sum(weight[:, None] * o, axis=0)
    if HAS_SINKS:
        lse, factor = add_sink(lse, sink)
        acc = acc * factor
    tl.store(OUT + b * stride_ob + m * stride_om + h * stride_oh + offs_d, acc.to(OUT.dtype.element_ty), mask=mask_d)
    if WRITE_LSE:
        if tl.program_id(1) == 0:  # one column block writes the row's LSE
            tl.store(LSE + b * stride_lb + h * stride_lh + m, lse)
