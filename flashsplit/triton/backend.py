"""The Triton backend: allocates partials and launches the split and combine kernels.

Portable (any GPU Triton supports) and, with no CUDA device, exact on the CPU through the
Triton interpreter. Inputs arrive validated by :func:`flashsplit.validation.check_decode_inputs`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
import triton

from ..plan import (BATCH_INVARIANT_MIN_SPLIT, BATCH_INVARIANT_SPLITS, DEFAULT_NUM_SMS, SPLIT_GRANULE, cdiv,
                    device_num_sms, planned_span, splits_used, tokens_per_split)
from ..call import DecodeTensors, cache_capacity
from ..problem import FP8_DTYPES, DecodeProblem, Variant
from ..registry import Backend
from ..workspace import ARRIVALS, Workspace, stream_key
from . import INTERPRETER_OFF, interpreter_active
from .combine_kernel import combine_kernel
from .launch import Relaunch, descale_strides, fast_relaunch_available, launch, strides_or_zeros
from .new_keys import FP8_FORMATS
from .programs import PROGRAMS_PER_SM, programs_per_sm
from .split_kernel import LOG2E, split_kv_kernel


@dataclass(frozen=True)
class TritonTiles:
    """Compile-time tile shape of the split kernel for one problem."""

    block_m: int
    block_n: int
    block_d: int
    num_warps: int
    num_stages: int


def choose_tiles(packed_rows: int, head_dim: int, num_splits: int = 0, programs: int = 0,
                 split_keys: int = 0, fp8_cache: bool = False,
                 num_sms: int = DEFAULT_NUM_SMS) -> TritonTiles:
    """Tiles for ``packed_rows`` rows (L_q x group) of head dim ``head_dim``; ``split_keys`` is the
    longest split's key count (the plan's, at the cache capacity).

    Rows: the smallest power of two >= the packed rows, at least 16 (``tl.dot``'s minimum) and
    at most 64 (more rows take more row blocks). Keys: 64 per tile, 32 when every split is a
    single 128-key granule (H200 sweep, B = 1, 4k keys, 32 splits: 10.6 us with 32-key tiles vs
    11.2 with 64: four pipelined tiles instead of two); both divide the split granule, so a
    split never starts inside a tile. Stages: 3, but 2 for a single-split
    launch of more programs than ``PROGRAMS_PER_SM`` per SM hold (``num_sms``): 2 stages leave room for a third
    program per SM. H200, 32/8 heads, one split: B = 64 x 4k (512 programs) 239-245 us with 2
    stages vs 278-284 with 3; up to one wave of two per SM 3 stages hide more latency: B = 32 x
    4k (256 programs) 123.8 vs 137.5, 16k 480.9 vs 532.0, B = 16 x 4k 76 vs 109, B = 1 x 128k
    2271 vs 2958 (docs/architecture.md). An fp8 cache takes 128-key tiles
    once a split holds 2048 keys or more (the same bytes in flight as 64 16-bit keys; H200,
    B = 1, 128k: 108.7 us vs 117.3 with 64; B = 16, 128k: 1389 vs 1557; 512-key splits of
    B = 1, 16k stay faster with 64: 20.4 vs 22.4), dense or paged: with V read in pairs
    (``TritonBackend.fp8_v_pairs``), pages of 16, e4m3, 128 vs 64 keys: B = 1 x 128k 78.7 vs
    97.7 us, B = 16 x 128k 1204.8 vs 1548.3, 16k 156.8 vs 200.8 (before pairs, 64 was faster
    paged: 150.8 vs 192.0 at B = 1 x 128k).
    """
    block_m = min(64, max(16, triton.next_power_of_2(packed_rows)))
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_n = 32 if 0 < split_keys <= SPLIT_GRANULE and num_splits > 1 else 64
    if fp8_cache and split_keys >= 2048:
        block_n = 128
    return TritonTiles(block_m=block_m, block_n=block_n, block_d=block_d, num_warps=4,
                       num_stages=2 if num_splits == 1 and programs > PROGRAMS_PER_SM * num_sms else 3)


#: Launches of at least this many KV heads and batch rows run their split programs KV heads
#: first (``TritonBackend.heads_first``). H200, bf16, d = 128, splits first -> KV heads first,
#: us: 32/32 heads B = 64 x 1k / 4k / 16k 253.2 / 984.5 / 3923.5 -> 246.6 / 958.2 / 3841.6; but
#: B = 16 x 4k 242.2 -> 244.7, and with 8 KV heads within 0.3% either way (B = 64 x 4k / 16k).
HEADS_FIRST_MIN_KV_HEADS = 32
HEADS_FIRST_MIN_BATCH = 64


def launches_heads_first(num_heads_kv: int, batch: int) -> bool:
    """Whether a launch runs its split programs KV heads first: wide key rows (many KV heads)
    read by many batch rows at once (``HEADS_FIRST_MIN_KV_HEADS``, ``HEADS_FIRST_MIN_BATCH``)."""
    return num_heads_kv >= HEADS_FIRST_MIN_KV_HEADS and batch >= HEADS_FIRST_MIN_BATCH


def new_key_tile(seqlen_new: int, block_n: int) -> int:
    """Keys per tile as the split kernel writes a call's new keys into the cache: enough for
    ``seqlen_new`` (a decode step's 1-16 take one tile), at least 16, at most the cache tiles'
    ``block_n``. A tile is loaded, rotated and rounded in fp32 registers, so a 64-key tile for
    one new key would hold 4x the registers for nothing.

    >>> new_key_tile(1, 64), new_key_tile(16, 64), new_key_tile(100, 64)
    (16, 16, 64)
    """
    return min(block_n, max(16, triton.next_power_of_2(max(seqlen_new, 1))))


class TritonBackend(Backend):
    name = "triton"
    priority = 0

    #: Up to this many splits, the split kernel's last program per row tile merges the partials
    #: (one launch per decode step, no combine kernel); more take a combine kernel, launched early
    #: as a programmatic dependent, whose many programs read the partials at once. H200, graph
    #: replay, merged vs combine kernel (docs/architecture.md): 2 splits 66.9 vs 69.1 us (B = 16,
    #: 4k) and 245.7 vs 247.6 (16k); 7-8 splits 24.4 vs 23.5 (B = 4, 4k), 68.8 vs 67.8 (16k);
    #: 29-32 splits 16.4 vs 10.6 (B = 1, 4k), 133.1 vs 128.2 (128k). 0: never merge.
    merge_max_splits = 4
    #: fp8 caches: tiles wholly inside a split's visible keys load and score without masks (a
    #: second, unmasked loop body). H200, 32/8 heads, e4m3, one run, off -> on: B = 1 x 128k
    #: 94.1 -> 87.3 us, 16k 19.7 -> 17.5; B = 16 x 16k 181.2 -> 162.0, 128k
    #: 1375.5 -> 1247.8; B = 64 x 16k 801.3 -> 656.4. Not for 16-bit caches: there the second body
    #: cost registers and occupancy (B = 64 x 4k, one split: 244 -> 301 us) and gained nothing.
    full_tiles_fp8 = True
    #: fp8 V caches read as int16 pairs of adjacent columns (:func:`_v_pairs`): 16-byte copies and
    #: a transposing ``ldmatrix`` instead of a byte-wise gather of V's fp8 tile before ``P @ V``.
    #: Only for 16-row tiles whose scores need no window or causal mask (:func:`_pairs_for_tile`).
    fp8_v_pairs = True
    #: Warps per combine program; 0: :func:`combine_warps`.
    combine_num_warps = 0
    #: Launch order of the split programs: False, splits fastest (grid ``(splits, B, H_kv x
    #: row blocks)``: the programs running together are mostly one KV head's, each reading its
    #: ``D``-wide slice of every key row); True, KV heads fastest (grid ``(H_kv x row blocks,
    #: splits, B)``: the programs of one batch row's heads read the same key rows side by side);
    #: None: :func:`launches_heads_first` decides per launch.
    heads_first: bool | None = None

    def __init__(self) -> None:
        #: The per-stream partials buffer and the in-kernel merge's arrival counters: what the
        #: prepared launchers (:class:`PreparedDecode`) take memory from.
        self.workspace = Workspace()
        self.arrivals = ARRIVALS

    def supports(self, problem: DecodeProblem) -> str | None:
        if problem.device_type == "cuda":
            return None
        if problem.device_type == "cpu":
            if interpreter_active():
                return None
            return f"tensors are on the CPU and {INTERPRETER_OFF}"
        return f"tensors are on {problem.device_type!r}; the Triton backend needs CUDA (or the CPU interpreter)"

    def block_m(self, problem: DecodeProblem) -> int:
        return choose_tiles(problem.packed_rows, problem.head_dim).block_m

    def units_per_sm(self, problem: DecodeProblem) -> int:
        return programs_per_sm(problem, self.block_m(problem))

    # -- launches -------------------------------------------------------------------------------

    def launch_split(self, q, k_cache, v_cache, cache_seqlens, num_splits, softmax_scale, causal,
                     out_partial, lse_partial, out, lse, final_for_single_split_rows: bool,
                     block_table=None, k_descale=None, v_descale=None, arrivals=None, sinks=None,
                     variant: Variant = Variant(), cache_leftpad=None, cache_batch_idx=None,
                     rotary_cos=None, rotary_sin=None, k_new=None, v_new=None) -> Relaunch | None:
        """The split kernel; with ``arrivals`` (:meth:`arrivals_for`) its last program per row
        merges the partials into ``out``/``lse`` (no combine kernel follows). ``variant``: the
        window, softcap, sinks, fixed split length, appended keys, left padding and cache rows
        (``sinks`` ``[H_q]``, ``cache_leftpad`` / ``cache_batch_idx`` int32 ``[B]`` when it has
        them).
        ``rotary_cos``/``rotary_sin`` ``[L_ro, rotary_dim / 2]``: q (and the new keys) are rotated as the
        variant says. ``k_new``/``v_new`` ``[B, L_new, H_kv, D]`` (with ``variant.seqlen_new`` = L_new):
        each program writes the new keys its split covers into the cache (an fp8 cache: ``k_new /
        k_descale`` rounded to its format), then attends them there, in the same launch."""
        batch, seqlen_q, num_heads, head_dim = q.shape
        num_heads_kv = k_cache.shape[2]
        rotary = variant.rotary_dim > 0
        seqlen_k = cache_capacity(k_cache, block_table)
        page_size = k_cache.shape[1] if block_table is not None else 0
        group = num_heads // num_heads_kv
        block_m = choose_tiles(seqlen_q * group, head_dim).block_m
        row_blocks = cdiv(seqlen_q * group, block_m)
        span = planned_span(seqlen_k, seqlen_q, variant.window_left)
        # Batch-invariant: tiles (keys and stages) that follow neither the capacity nor the batch (a
        # row's split length does not either).
        if variant.batch_invariant:
            tiles = choose_tiles(seqlen_q * group, head_dim, split_keys=BATCH_INVARIANT_MIN_SPLIT,
                                 fp8_cache=k_descale is not None)
        else:
            tiles = choose_tiles(seqlen_q * group, head_dim, num_splits, num_splits * batch * num_heads_kv * row_blocks,
                                 tokens_per_split(span, num_splits), k_descale is not None,
                                 device_num_sms(q.device.type, q.device.index))
        heads_first = launches_heads_first(num_heads_kv, batch) if self.heads_first is None else self.heads_first
        if heads_first:
            grid = (num_heads_kv * row_blocks, num_splits, batch)
        else:
            grid = (num_splits, batch, num_heads_kv * row_blocks)
        window_right = 0 if causal else variant.window_right
        right_bound = 0 <= window_right < seqlen_q - 1  # some query cannot see every key
        v_pairs = (self.fp8_v_pairs and v_cache.dtype in FP8_DTYPES and _v_pairs(v_cache)
                   and _pairs_for_tile(tiles.block_m, variant.window_left >= 0, right_bound))
        v_arg = v_cache.view(torch.int16) if v_pairs else v_cache  # the same address: replays pass v_cache's
        tensors = (q, k_cache, v_arg, cache_seqlens, block_table, k_descale, v_descale,
                   out_partial, lse_partial, out, lse, arrivals, sinks if variant.has_sinks else None,
                   cache_leftpad if variant.has_leftpad else None, cache_batch_idx if variant.has_batch_idx else None,
                   *((rotary_cos, rotary_sin) if rotary else (None, None)), k_new, v_new)
        tail = (
            *q.stride()[:3], *k_cache.stride()[:3], *v_arg.stride()[:3],
            *strides_or_zeros(out_partial, 4), *strides_or_zeros(lse_partial, 3),
            *strides_or_zeros(out, 3), *strides_or_zeros(lse, 2),
            *strides_or_zeros(block_table, 1), *descale_strides(k_descale), *descale_strides(v_descale),
            rotary_cos.stride(0) if rotary else 0, *strides_or_zeros(k_new, 3), *strides_or_zeros(v_new, 3),
            # group and head_dim are runtime values (masks, index math): fewer compiled variants. The
            # page size is a constexpr (one variant per page size): no integer division per key.
            seqlen_q, seqlen_k, num_splits, row_blocks, group, head_dim, page_size, k_cache.shape[0],
            softmax_scale * LOG2E, variant.window_left, window_right, variant.softcap * LOG2E,
            rotary_cos.shape[0] if rotary else 1, rotary_cos.shape[1] if rotary else 0,
            # constexprs, in the kernel's order (a Relaunch passes every argument positionally)
            tiles.block_m, tiles.block_n, tiles.block_d, SPLIT_GRANULE,
            cache_seqlens is not None,  # HAS_SEQLENS
            out_partial is not None,  # HAS_PARTIALS
            block_table is not None,  # PAGED
            k_descale is not None,  # HAS_DESCALE
            right_bound,  # RIGHT_BOUND
            final_for_single_split_rows,
            lse is not None,  # WRITE_LSE
            interpreter_active(),  # RUNTIME_BOUND_WHILE
            # LAUNCH_DEPENDENTS: a combine kernel follows (partials, an output, no in-kernel merge)
            out_partial is not None and arrivals is None and out is not None and _pdl(q),
            *_page_chunk(page_size, tiles.block_n),  # CHUNK_TILES, CHUNK_PAGES
            arrivals is not None,  # MERGE_IN_LAST_SPLIT
            *dataclasses.astuple(merge_tiles(seqlen_q * group, head_dim, num_splits)),  # MERGE_ROWS/_SPLITS/_CHUNK
            k_descale is not None and self.full_tiles_fp8,  # FULL_TILES
            tiles.block_d == head_dim,  # EVEN_D
            v_pairs,  # V_PAIRS
            v_cache.dtype == torch.float8_e5m2,  # V_E5M2
            v_pairs and _pairs_ptx(v_cache),  # PAIRS_PTX
            variant.window_left >= 0,  # LEFT_BOUND
            variant.softcap > 0,  # SOFTCAP
            variant.has_sinks,  # HAS_SINKS
            variant.batch_invariant,  # INVARIANT
            variant.seqlen_new,  # SEQLEN_ADD
            variant.has_leftpad,  # HAS_LEFTPAD
            variant.has_batch_idx,  # HAS_BATCH_IDX
            rotary,  # ROTARY
            variant.rotary_interleaved,  # ROTARY_INTERLEAVED
            variant.rotary_q_per_token and seqlen_q > 1,  # ROTARY_PER_TOKEN (one query: one position)
            *FP8_FORMATS.get(k_cache.dtype, (0, 0, 0.0)),  # FP8_EMIN, FP8_MBITS, FP8_MAX
            new_key_tile(variant.seqlen_new, tiles.block_n),  # NEW_BLOCK_N
            heads_first,  # HEADS_FIRST
        )
        options = dict(num_warps=tiles.num_warps, num_stages=tiles.num_stages)
        return launch(split_kv_kernel, grid, tensors, tail, options)

    def launch_combine(self, out_partial, lse_partial, cache_seqlens, out, lse, skip_single_split_rows: bool,
                       seqlen_k: int = 0, after_split: bool = False, sinks=None,
                       variant: Variant = Variant(), cache_leftpad=None, column_blocks: int = 1) -> Relaunch | None:
        """``seqlen_k`` (the cache capacity) clamps ``cache_seqlens`` when rows are skipped.
        ``after_split``: launched right behind the split kernel, as its programmatic dependent.
        ``variant``: where skipped rows' splits start (its window) and their length (fixed
        splits); with sinks, ``sinks`` ``[H_q]`` joins each row's softmax here; appended keys and
        ``cache_leftpad`` as in :meth:`launch_split`. ``column_blocks``: programs per output row,
        each merging a block of its columns (a power of two: wide rows, few of them)."""
        num_splits, batch, seqlen_q, num_heads, head_dim = out_partial.shape
        block_d = max(16, triton.next_power_of_2(head_dim) // column_blocks)
        block_s = max(16, triton.next_power_of_2(num_splits))
        pdl = after_split and _pdl(out)
        grid = (batch * seqlen_q * num_heads, triton.cdiv(head_dim, block_d), 1)
        tensors = (out_partial, lse_partial, cache_seqlens, out, lse, sinks if variant.has_sinks else None,
                   cache_leftpad if variant.has_leftpad else None)
        # CHUNK_S: all splits in one chunk (one memory round trip) up to 64 fp32 registers a thread;
        # fixed splits (batch-invariant) walk chunks of 16 on 4 warps, whatever the split count.
        invariant = variant.batch_invariant
        if invariant:  # at most BATCH_INVARIANT_SPLITS splits, always merged on the same tile
            block_s = BATCH_INVARIANT_SPLITS
        chunk_s = block_s if invariant else min(block_s, max(8, 8192 // block_d))
        tail = (
            *out_partial.stride()[:4], *lse_partial.stride()[:3],
            *out.stride()[:3], *strides_or_zeros(lse, 2),
            seqlen_q, seqlen_k, num_heads, num_splits, variant.window_left,
            head_dim, block_d, block_s, chunk_s,
            SPLIT_GRANULE, skip_single_split_rows, lse is not None,
            pdl,  # WAIT_FOR_PRIOR_GRID
            variant.window_left >= 0,  # LEFT_BOUND
            variant.batch_invariant,  # INVARIANT
            variant.has_sinks,  # HAS_SINKS
            variant.seqlen_new,  # SEQLEN_ADD
            variant.has_leftpad,  # HAS_LEFTPAD
        )
        num_warps = combine_warps(block_s, block_d) if invariant else (self.combine_num_warps
                                                                         or combine_warps(block_s, block_d))
        return launch(combine_kernel, grid, tensors, tail, dict(num_warps=num_warps, launch_pdl=pdl))

    def arrivals_for(self, q: torch.Tensor) -> torch.Tensor:
        """Zeroed int32 counters, one per split-kernel row tile (``ArrivalCounters.for_queries``)."""
        return self.arrivals.for_queries(q)

    def alloc_partials(self, q: torch.Tensor, num_splits: int, scratch: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """``out_partial`` ``[S, B, L_q, H, D]`` and ``lse_partial`` ``[S, B, H, L_q]``, fp32, both
        contiguous views of one buffer: with ``scratch``, the stream's reusable workspace."""
        batch, seqlen_q, num_heads, head_dim = q.shape
        rows, numel = _partials_size(q, num_splits)
        buffer = self.workspace.get(q.device, numel) if scratch else torch.empty(numel, dtype=torch.float32,
                                                                                   device=q.device)
        out_partial = buffer[: rows * head_dim].view(num_splits, batch, seqlen_q, num_heads, head_dim)
        lse_partial = buffer[rows * head_dim: numel].view(num_splits, batch, num_heads, seqlen_q)
        return out_partial, lse_partial

    # -- Backend interface ---------------------------------------------------------------------

    def prepare(self, problem: DecodeProblem, num_splits: int, softmax_scale: float):
        num_splits = _splits_launched(num_splits, problem)
        return PreparedDecode(self, num_splits, softmax_scale, problem.causal, problem.variant)

    def forward_partials(self, q, k_cache, v_cache, cache_seqlens, num_splits, softmax_scale, causal,
                         block_table=None, k_descale=None, v_descale=None, variant: Variant = Variant()):
        out_partial, lse_partial = self.alloc_partials(q, num_splits, scratch=False)
        self.launch_split(q, k_cache, v_cache, cache_seqlens, num_splits, softmax_scale, causal,
                          out_partial, lse_partial, None, None, final_for_single_split_rows=False,
                          block_table=block_table, k_descale=k_descale, v_descale=v_descale,
                          variant=variant._replace(has_sinks=False))  # sinks join in the combine
        return out_partial, lse_partial

    def combine(self, out_partial, lse_partial, out, lse, sinks=None) -> None:
        # The interpreter truncates fp32 to bfloat16 (a GPU rounds to nearest even): on the CPU a
        # bfloat16 output is merged in fp32 and rounded by torch.
        merged = torch.empty(out.shape, dtype=torch.float32) if out.dtype == torch.bfloat16 and not out.is_cuda else out
        self.launch_combine(out_partial, lse_partial, None, merged, lse, skip_single_split_rows=False, sinks=sinks,
                            variant=Variant(has_sinks=sinks is not None))
        if merged is not out:
            out.copy_(merged)


class PreparedDecode:
    """Decode for one static configuration (the api caches one per call signature).

    The first call launches through Triton and keeps :class:`~flashsplit.triton.launch.Relaunch`
    handles; later calls replay them with the new tensors, and take the partial buffers from
    the stream's workspace (a fresh allocation while a CUDA graph is being captured). A call's
    new keys (``k``/``v``) go into the cache in the split kernel's launch.
    """

    def __init__(self, backend: TritonBackend, num_splits: int, softmax_scale: float, causal: bool,
                 variant: Variant = Variant()):
        self.backend = backend
        self.num_splits = num_splits  # as launched (see _splits_launched)
        self.softmax_scale = softmax_scale
        self.causal = causal
        self.variant = variant
        # Fixed per prepared launch (its compiled kernel). Fixed splits (batch-invariant) always take
        # the combine kernel: one reduction order, whatever the split count.
        self.merge = num_splits <= backend.merge_max_splits and not variant.batch_invariant
        self.split: Relaunch | None = None
        self.combine: Relaunch | None = None
        # The partials' workspace size (fp32 elements) and lse_partial's byte offset in it, set on
        # the first replay (the call signature fixes q's shape).
        self._partials_numel = self._lse_offset = 0

    def __call__(self, tensors: DecodeTensors) -> None:
        (q, k_cache, v_cache, out, lse, cache_seqlens, block_table, k_descale, v_descale, sinks,
         k_new, v_new, cos, sin, batch_idx, leftpad) = tensors
        num_splits, variant = self.num_splits, self.variant
        if k_new is None and leftpad is None and batch_idx is None and cos is None:
            rows = _NO_ROWS  # the usual call: four comparisons instead of six calls (sin comes with cos)
        else:
            rows = (_address(leftpad), _address(batch_idx), _address(cos), _address(sin), _address(k_new),
                    _address(v_new))
        if num_splits == 1:
            if self.split is not None:
                self.split((q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), _address(cache_seqlens),
                            _address(block_table), _address(k_descale), _address(v_descale), None, None,
                            out.data_ptr(), _address(lse), None, _address(sinks), *rows))
            else:
                self.split = self.backend.launch_split(
                    q, k_cache, v_cache, cache_seqlens, 1, self.softmax_scale, self.causal, None, None, out, lse,
                    final_for_single_split_rows=True, block_table=block_table, k_descale=k_descale,
                    v_descale=v_descale, sinks=sinks, variant=variant, cache_leftpad=leftpad,
                    cache_batch_idx=batch_idx, rotary_cos=cos, rotary_sin=sin, k_new=k_new, v_new=v_new)
            return
        # Rows whose live keys fit in one split skip the partials, and the merge skips them.
        shortcut = cache_seqlens is not None
        merge = self.merge
        if self.split is not None and (merge or self.combine is not None):
            # The workspace holds out_partial then lse_partial (the layout alloc_partials views).
            # The stream is read once for it and both launches (a Relaunch launches on the current
            # device's stream, as Triton does: q's device but by misuse).
            if not self._partials_numel:
                self._size_partials(q)
            if q.is_cuda:
                key = stream_key(q.get_device())
                buffer = self.backend.workspace.stream_buffer(key, self._partials_numel)
                stream = key[1] if key[0] == self.split.device else None
            else:  # the interpreter never gets here (no Relaunch) but tests with fakes do
                key, stream = None, None
                buffer = self.backend.workspace.buffer(q.device, self._partials_numel)
            op = buffer.data_ptr()
            lp = op + self._lse_offset
            # (each address inline: this is the eager decode step's hot path)
            seqlens = None if cache_seqlens is None else cache_seqlens.data_ptr()
            out_ptr, lse_ptr = out.data_ptr(), None if lse is None else lse.data_ptr()
            sinks_ptr = None if sinks is None else sinks.data_ptr()
            arrivals = self.backend.arrivals.address_for(key, q) if merge else None
            self.split((q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), seqlens,
                        None if block_table is None else block_table.data_ptr(),
                        None if k_descale is None else k_descale.data_ptr(),
                        None if v_descale is None else v_descale.data_ptr(), op, lp, out_ptr, lse_ptr, arrivals,
                        sinks_ptr, *rows), stream)
            if not merge:
                self.combine((op, lp, seqlens, out_ptr, lse_ptr, sinks_ptr, rows[0]), stream)
            return
        out_partial, lse_partial = self.backend.alloc_partials(q, num_splits)
        arrivals = self.backend.arrivals_for(q) if merge else None
        self.split = self.backend.launch_split(
            q, k_cache, v_cache, cache_seqlens, num_splits, self.softmax_scale, self.causal, out_partial,
            lse_partial, out, lse, final_for_single_split_rows=shortcut, block_table=block_table,
            k_descale=k_descale, v_descale=v_descale, arrivals=arrivals, sinks=sinks, variant=variant,
            cache_leftpad=leftpad, cache_batch_idx=batch_idx, rotary_cos=cos, rotary_sin=sin, k_new=k_new,
            v_new=v_new)
        if not merge:
            self.combine = self.backend.launch_combine(
                out_partial, lse_partial, cache_seqlens, out, lse, skip_single_split_rows=shortcut,
                seqlen_k=cache_capacity(k_cache, block_table), after_split=True, sinks=sinks, variant=variant,
                cache_leftpad=leftpad)

    def host_program(self, tensors: DecodeTensors):
        """This replay as a native host program (:func:`~flashsplit.triton.host_program.host_program`)
        for calls like ``tensors``: None before the first launch, False where there is none."""
        if self.split is None:
            return None if fast_relaunch_available() else False
        from .host_program import host_program

        return host_program(self, tensors) or False

    def partials_layout(self, q: torch.Tensor) -> tuple[int, int]:
        """(fp32 elements, byte offset of lse_partial) of the partials in the stream's workspace
        for calls with ``q``'s shape (``__call__`` reads the same two fields inline)."""
        if not self._partials_numel:
            self._size_partials(q)
        return self._partials_numel, self._lse_offset

    def _size_partials(self, q: torch.Tensor) -> None:
        rows, self._partials_numel = _partials_size(q, self.num_splits)
        self._lse_offset = rows * q.shape[3] * 4


@dataclass(frozen=True)
class MergeTiles:
    """Compile-time shape of the last split's merge (:func:`~flashsplit.triton.split_kernel.merge_splits`)."""

    rows: int  # packed rows merged per tile (a power of two)
    splits: int  # next power of two >= num_splits
    chunk: int  # splits per loaded chunk


def merge_tiles(packed_rows: int, head_dim: int, num_splits: int) -> MergeTiles:
    """The merge's tiles for ``packed_rows`` (L_q x group) rows: the real rows only (a power of two,
    at most the split kernel's row tile), and as many splits per chunk as fit 64 fp32 registers a
    thread (8192 values in a 128-thread program).

    >>> merge_tiles(4, 128, 32)       # Llama-3-8B decode: 4 q heads per KV head, 32 splits
    MergeTiles(rows=4, splits=32, chunk=16)
    """
    tiles = choose_tiles(packed_rows, head_dim)
    rows = min(tiles.block_m, triton.next_power_of_2(packed_rows))
    splits = max(2, triton.next_power_of_2(num_splits))
    return MergeTiles(rows, splits, min(splits, max(1, 8192 // (rows * tiles.block_d))))


def _partials_size(q: torch.Tensor, num_splits: int) -> tuple[int, int]:
    """(rows, fp32 elements) of one launch's partials for ``q`` ``[B, L_q, H, D]``: the
    ``S x B x L_q x H`` output rows of ``D`` values, then one LSE per row, in one buffer."""
    batch, seqlen_q, num_heads, head_dim = q.shape
    rows = num_splits * batch * seqlen_q * num_heads
    return rows, rows * (head_dim + 1)


def combine_warps(block_s: int, block_d: int) -> int:
    """Warps per combine program: one while a lane can hold its share of every split's partial
    (``block_s x block_d`` values, at most 64 per lane), else 4 (2 for head dims under 128).

    H200, graph replay, 32/8 heads, d = 128, two runs of each in one process: 8 splits
    B = 4 x 4k 22.75 / 22.74 us with 4 warps, 21.94 / 21.88 with one; 16k 66.70 / 66.62 vs
    65.85 / 65.86. At 32 splits (B = 1) one warp would hold 128 values a lane: 4k 10.26 / 10.63
    with 4 warps vs 10.61 / 10.67 (16k 22.65 / 22.75 vs 22.16 / 22.14), so B = 1 keeps 4.

    >>> combine_warps(16, 128), combine_warps(32, 128), combine_warps(32, 64), combine_warps(16, 256)
    (1, 4, 1, 4)
    """
    if block_s * block_d <= 32 * 64:
        return 1
    return 4 if block_d >= 128 else 2


def _splits_launched(num_splits: int, problem: DecodeProblem) -> int:
    """1 when every row is full (no ``cache_seqlens``) and fits in one split: the same result,
    without partials or a combine; else ``num_splits``."""
    if not problem.has_cache_seqlens and splits_used(problem.seqlen_k, num_splits, seqlen_q=problem.seqlen_q,
                                                     window_left=problem.window_left,
                                                     invariant=problem.batch_invariant) <= 1:
        return 1
    return num_splits


def _address(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


#: The addresses of absent cache_leftpad, cache_batch_idx, rotary_cos/sin and k/v (the split kernel's last pointers).
_NO_ROWS = (None,) * 6


def _page_chunk(page_size: int, block_n: int) -> tuple[int, int]:
    """(tiles per chunk, page-table entries per chunk) of a paged launch; (0, 0) for a dense one.

    The split kernel loads a chunk's page ids once (a power-of-two block covering any alignment
    of the chunk's keys to pages) and runs the chunk's tiles without a load in their addresses.
    Chunks of 2048 keys (512 for pages under 8 keys, whose tables are longer) keep the table in
    a few registers per thread and drain Triton's load pipeline once per 2048 keys.
    """
    if page_size == 0:
        return 0, 0
    keys = 2048 if page_size >= 8 else 512
    tiles = max(1, keys // block_n)
    return tiles, triton.next_power_of_2(cdiv(tiles * block_n, page_size) + 1)


def _v_pairs(v_cache: torch.Tensor) -> bool:
    """Whether an fp8 V cache can be read as int16 pairs of adjacent head-dim columns: an even
    head dim, columns contiguous, even strides, and 16-byte aligned (the prepared-call key
    records that alignment, so every replay of the launch meets it too)."""
    return (v_cache.shape[-1] % 2 == 0 and v_cache.stride(-1) == 1
            and all(s % 2 == 0 for s in v_cache.stride()[:-1]) and v_cache.data_ptr() % 16 == 0)


def _pairs_for_tile(block_m: int, left_bound: bool, right_bound: bool) -> bool:
    """Whether a launch may read fp8 V as pairs: 16-row tiles (one query per row and up to 16 q
    heads per KV head: the decode step, where the GPU test matrices cover it) whose scores take
    no left (window) or right (causal, window) bound. On 64-row tiles of head dim 64 with a
    window (L_q 16 x 5 q heads per KV head, window (40, 0)) the sm_90 build (triton 3.6) of the
    pairs path computed wrong outputs or read out of bounds, where the interpreter's run of the
    same kernel and the byte-wise V path were right. The launches left out read few keys (a
    window) or several queries per row (speculative decoding), where V's conversion is not
    what bounds the time."""
    return block_m == 16 and not (left_bound or right_bound)


def _compiled_for(t: torch.Tensor, capability: tuple[int, int]) -> bool:
    """Whether ``t``'s launch compiles for a GPU of at least ``capability`` (not the interpreter)."""
    return t.device.type == "cuda" and not interpreter_active() and _capability(t.device.index) >= capability


def _pairs_ptx(t: torch.Tensor) -> bool:
    """fp8 pairs converted by PTX ``cvt.rn.f16x2.e4m3x2``/``e5m2x2``: sm_89 and later."""
    return _compiled_for(t, (8, 9))


def _pdl(t: torch.Tensor) -> bool:
    """Programmatic dependent launch of the combine: Hopper (sm_90) and later."""
    return _compiled_for(t, (9, 0))


@functools.lru_cache(maxsize=None)
def _capability(index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)
