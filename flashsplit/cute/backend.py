"""``backend="cute"``: the CuTeDSL split kernel and combine on Hopper (sm_90a).

This module imports neither cutlass nor the kernels at import time; the first call that needs
them compiles (once per :class:`~flashsplit.cute.configs.SplitConfig` /
:class:`~flashsplit.cute.configs.CombineConfig`) and caches. Launches take raw pointers and
Int32/Int64 sizes and strides, read no tensor values on the host and run on the current torch
stream, so ``decode`` is CUDA-graph capturable.
"""

from __future__ import annotations

import importlib.util

import torch

from ..plan import choose_num_splits, device_num_sms, tokens_per_split
from ..problem import FP8_DTYPES, DecodeProblem
from ..registry import Backend
from ..workspace import ARRIVALS, Workspace, stream_key
from . import configs, launch_args

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
_OUT_DTYPE_NAMES = {**_DTYPE_NAMES, torch.float32: "float32"}  # the combine may write fp32
_FP8_NAMES = {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}


def cutlass_available() -> bool:
    return importlib.util.find_spec("cutlass") is not None


def _dense_16bit_d128(problem: DecodeProblem) -> bool:
    """A dense (not paged) cache in q's 16-bit dtype at d = 128: where the measured dispatch rules
    for the two-CTA tile apply."""
    return problem.head_dim == 128 and problem.cache_dtype == problem.dtype and not problem.paged


def _fits_one_wave(ctas: int, units_per_sm: int, device_type: str) -> bool:
    """Whether ``ctas`` CTAs run in one wave at ``units_per_sm`` per SM of the device."""
    return ctas <= units_per_sm * device_num_sms(device_type)


def _planned_split(problem: DecodeProblem, units: int, units_per_sm: int) -> tuple[int, int]:
    """(splits, keys per split) the shared plan gives ``problem``'s ``units`` work units at
    ``units_per_sm`` CTAs per SM: what the dispatch rules below judge a tile choice by."""
    splits = choose_num_splits(units, problem.seqlen_k, device_num_sms(problem.device_type), units_per_sm)[0]
    return splits, tokens_per_split(problem.seqlen_k, splits)


class CuteBackend(Backend):
    name = "cute"
    priority = 10
    #: Launches of 2..merge_max_splits splits merge in the split kernel's tail (one launch), more
    #: keep the combine kernel. H200, 32/8 heads, d = 128,
    #: same runs (fifth session), merged vs combine kernel: 2 splits 67.7 vs 68.9 us (B = 16, 4k),
    #: 8 splits 23.4 vs 24.7 (B = 4, 4k), 16 splits 15.4 vs 16.1 (B = 2, 4k) and 38.3 vs 39.0
    #: (16k); 32 splits 13.1 vs 12.7 (B = 1, 4k) and 126.1 vs 125.5 (128k): one warp per row walks
    #: 32 splits in two register chunks, where the combine's 32 CTAs take one round trip each.
    merge_max_splits = 16

    def __init__(self) -> None:
        self._full_seqlens: dict[tuple, torch.Tensor] = {}
        self._workspace = Workspace()
        self._arrivals = ARRIVALS

    # ------------------------------------------------------------------ capability
    def supports(self, problem: DecodeProblem) -> str | None:
        if problem.head_dim not in configs.HEAD_DIMS:
            return f"head_dim {problem.head_dim} is not one of {configs.HEAD_DIMS}"
        if problem.dtype not in _DTYPE_NAMES:
            return f"dtype {problem.dtype} is not float16 or bfloat16"
        if not problem.aligned_16b:
            return "q/k_cache/v_cache/out need 16-byte aligned pointers and strides (TMA, vector stores)"
        if problem.cache_dtype != problem.dtype and problem.cache_dtype not in _FP8_NAMES:
            return f"{problem.cache_dtype} caches are not implemented in the cute backend yet"
        if not cutlass_available():
            return "nvidia-cutlass-dsl is not installed"
        if problem.device_type != "cuda":
            return f"needs a CUDA device, got {problem.device_type}"
        if not torch.cuda.is_available():
            return "CUDA is not available"
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) != (9, 0):
            return f"needs compute capability 9.0 (Hopper, sm_90a), got {major}.{minor}"
        return None

    def block_m(self, problem: DecodeProblem) -> int:
        return 64

    def preference(self, problem: DecodeProblem) -> tuple[int, str]:
        # Measured on the H200 (docs/performance.md, 32/8 heads, d = 128): paged 16-bit caches
        # run at dense speed here, whole-tile pages (128: 1.00x dense) and sub-tile pages alike
        # (16: 1.00-1.01x), but 1.06-1.22x slower in Triton; dense 16-bit caches are faster here
        # where the swapped-operand kernel runs in one wave, one CTA per SM or the work units
        # fill the machine (below; B = 1 x 4k: 9.7 vs 10.2 us since the eleventh session); fp8
        # caches are 1.06-1.11x slower here than in Triton (sixth session).
        if problem.paged and not configs.tma_pages(problem.page_size, problem.head_dim):
            # H200, B = 1, 32/8 heads, d = 128 (fourth session): pages of 1 and 48 take 1.7-2.4x
            # the dense time here (one bulk copy per key row), 1.11-1.18x in Triton.
            return -5, "paged KV gathered row by row: measured 1.7-2.4x slower than triton (H200)"
        if problem.paged and problem.cache_dtype not in FP8_DTYPES:
            return 20, "paged 16-bit KV: the cute TMA kernel reads pages at dense speed (H200)"
        if self.one_cta_per_sm(problem):
            # H200, same runs (fifth session, calls 6-9): see one_per_sm_min_keys.
            return 5, "dense 16-bit KV in one wave of one CTA per SM: measured faster than triton (H200)"
        if self.cute_measured_faster(problem):
            return 3, ("dense 16-bit KV with 1-8 q rows per KV head in one wave (swapped operands), or GQA filling "
                       "the machine or in long splits: measured faster than triton (H200)")
        return -10, "cute supports it but was measured slower than triton here (H200)"

    #: ``cute_measured_faster`` holds from this many work units (batch rows x KV heads x row
    #: blocks: 4 or fewer splits per unit), or from this many keys per split. H200, 32/8 heads,
    #: d = 128, bf16, same runs (sixth session, calls 1-6, padding warps skipping the softmax), us, cute vs Triton:
    #: B = 8 x 4k (64 units, 4 splits) 38.0 vs 38.9, 38.1 vs 39.0; B = 16 x 128k (128 units, 2
    #: splits) 1908.6 vs 1921.1, 1857.3 vs 1876.0, 1871.4 vs 1884.5, 1912.5 vs 1925.7; B = 32 x 4k
    #: 123.2 vs 137.9; B = 64 (512 units, 1 split) 4k 237.4 vs 238.3, 237.8 vs 238.8, 16k 938.1 vs
    #: 940.8, 939.2 vs 943.4, 128k 7477.6 vs 7520.6, 7503.1 vs 7526.3; B = 1 x 128k (32 splits of
    #: 4096 keys) 126.5 vs 126.9, 123.9 vs 124.7, 124.3 vs 125.0, 124.1 vs 124.9, 126.5 vs 127.3.
    #: Splits of 512-2048 keys since the tenth session's one-wave stages and fast-math merge (call
    #: 7, two runs): B = 1 x 16k (32 splits of 512) 22.36 vs 22.71, 22.47-22.50 vs 22.66-22.72;
    #: B = 4 x 4k (8 of 512) 21.84 vs 22.10, 21.86-21.89 vs 21.94-22.01; B = 4 x 16k (8 of 2048)
    #: tied: 66.21 vs 66.14, 65.88-65.89 vs 65.85-65.94. Without the swapped-operand kernel Triton
    #: leads below 512 keys per split (B = 1 x 4k, 32 splits of 128: 10.24 vs 11.48), and with one
    #: packed row per KV head in two waves (32/32 heads, B = 16 x 16k: 935.6 vs 957.7, 960.3 vs
    #: 977.8; eleventh session 959.4 vs 979.3).
    fill_units = 64
    long_split_keys = 512
    min_packed_rows = 4

    def swaps(self, packed_rows: int, kv_dtype: str, page_size: int | None, head_dim: int, ctas: int,
              units_per_sm: int, device_type: str = "cuda") -> bool:
        """Whether a launch of ``ctas`` CTAs (``units_per_sm`` per SM) takes the swapped-operand
        kernel: ``configs.swap_ab_applies``, and one wave. H200, 32/8 heads, d = 128,
        bf16, same runs (eleventh session, call 7), us, swapped / 64 rows / Triton: one wave, B = 1
        x 4k 9.69 / 10.80 / 10.29, 16k 21.30 / 22.03 / 22.82, B = 4 x 4k 21.31 / 21.65 / 22.18, B = 16
        x 128k 1906.5 / 1917.5 / 1906.3 (32/32 heads: B = 1 x 4k 20.65 / 21.42 / 21.48, B = 4 x 4k
        62.6 / 63.8 / 65.6); two waves, where each CTA streams its keys and the tensor work hides
        behind the loads anyway: B = 64 x 4k 245.3 / 244.9 / 243.9, 16k 962.0 / 961.4 / 962.5."""
        if not configs.swap_ab_applies(packed_rows, kv_dtype, page_size, head_dim):
            return False
        return _fits_one_wave(ctas, units_per_sm, device_type)

    def merges(self, num_splits: int) -> bool:
        """Whether a launch of ``num_splits`` splits merges them in the split kernel's tail
        (2..``merge_max_splits``) instead of a combine."""
        return 1 < num_splits <= self.merge_max_splits

    def cute_measured_faster(self, problem: DecodeProblem) -> bool:
        """A dense 16-bit cache at d = 128 that takes the swapped-operand kernel in one wave
        (``swaps``: 1-8 packed rows, any split length), or with >= ``min_packed_rows`` packed rows
        per KV head whose work units fill the machine (>= ``fill_units``) or whose splits are long
        (>= ``long_split_keys`` keys as the plan splits it): where the cute kernel (two CTAs per
        SM) was measured faster than Triton's."""
        if not _dense_16bit_d128(problem):
            return False
        units = problem.work_units(self.block_m(problem))
        per_sm = configs.split_tile(128)[2]
        splits, keys = _planned_split(problem, units, per_sm)
        if self.swaps(problem.packed_rows, "same", None, 128, units * splits, per_sm, problem.device_type):
            return True
        if problem.packed_rows < self.min_packed_rows:
            return False
        return units >= self.fill_units or keys >= self.long_split_keys

    def units_per_sm(self, problem: DecodeProblem) -> int:
        if self.one_cta_per_sm(problem):
            return configs.ONE_PER_SM_TILE[2]
        return configs.split_tile(problem.head_dim)[2] if problem.head_dim in configs.HEAD_DIMS else 1

    #: Keys per CTA (as the plan splits at one CTA per SM) that ``one_cta_per_sm`` takes: one
    #: split of 2k-32k keys, or several of 16k-32k. H200, same runs (fifth session, calls 6-9), us:
    #: won at one split (B = 16 x 4k 64.4-64.6 vs 66.3-67.4 for Triton, B = 16 x 16k 238.9-240.8 vs
    #: 241.8-246.0; 32/32 heads, B = 4 x 4k/16k 63.9/238.0 vs 64.8/239.7) and at 4 splits of 32k
    #: (B = 4 x 128k 469.9-476.7 vs 475.1-485.1); lost at one split of 131k keys (B = 16 x 128k
    #: 1950.0-1974.3 vs two CTAs per SM 1920.4-1923.2) and was mixed at 4-16 splits of 4k-8k keys
    #: (B = 1 x 128k 126.1-126.7 vs 124.9-127.3, B = 4 x 16k 67.7-67.8 vs 66.7-68.0).
    one_per_sm_min_keys = 2048
    one_per_sm_max_keys = 32768
    one_per_sm_min_split_keys = 16384

    def one_cta_per_sm(self, problem: DecodeProblem) -> bool:
        """Whether the one-CTA-per-SM tile (``configs.ONE_PER_SM_TILE``) serves ``problem``: a
        dense 16-bit cache at d = 128 whose (batch row, KV head, row block) units fit one wave of
        one CTA per SM, split as the plan splits them there into one split of
        ``one_per_sm_min_keys``..``one_per_sm_max_keys`` keys per CTA, or several of
        ``one_per_sm_min_split_keys``..``one_per_sm_max_keys`` (where it was measured faster)."""
        if problem.head_dim != 128 or problem.cache_dtype != problem.dtype:
            return False
        if problem.paged and not configs.tma_pages(problem.page_size, 128):
            return False
        units = problem.work_units(self.block_m(problem))
        if not _fits_one_wave(units, configs.ONE_PER_SM_TILE[2], problem.device_type):
            return False
        splits, keys = _planned_split(problem, units, configs.ONE_PER_SM_TILE[2])
        least = self.one_per_sm_min_keys if splits == 1 else self.one_per_sm_min_split_keys
        return least <= keys <= self.one_per_sm_max_keys

    def one_wave_merge(self, problem: DecodeProblem, num_splits: int) -> bool:
        """Whether a launch of ``num_splits`` splits takes ``configs.ONE_WAVE_STAGES``: a dense
        16-bit cache at d = 128 on the two-CTA tile, whose 2..``merge_max_splits`` splits merge
        in the kernel and whose CTAs fit one wave at two per SM (where 3 stages measured faster)."""
        if not (_dense_16bit_d128(problem) and self.merges(num_splits)) or self.one_cta_per_sm(problem):
            return False
        ctas = problem.work_units(self.block_m(problem)) * num_splits
        return _fits_one_wave(ctas, configs.split_tile(128)[2], problem.device_type)

    # ------------------------------------------------------------------ launches
    def prepare(self, problem: DecodeProblem, num_splits: int, softmax_scale: float, causal: bool):
        # (tests prepare without a problem)
        one_per_sm = problem is not None and self.one_cta_per_sm(problem)
        one_wave = problem is not None and self.one_wave_merge(problem, num_splits)
        return PreparedCuteDecode(self, num_splits, softmax_scale, causal, one_per_sm, one_wave)

    def decode(self, q, k_cache, v_cache, cache_seqlens, num_splits, softmax_scale, causal, out, lse,
               block_table=None, k_descale=None, v_descale=None) -> None:
        """One decode with ``num_splits`` splits on the two-CTA tile (the api goes through
        :meth:`prepare`, which also applies the one-CTA-per-SM and one-wave rules)."""
        PreparedCuteDecode(self, num_splits, softmax_scale, causal)(
            q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, out, lse)

    def forward_partials(self, q, k_cache, v_cache, cache_seqlens, num_splits, softmax_scale, causal,
                         block_table=None, k_descale=None, v_descale=None):
        out_partial, lse_partial = self._alloc_partials(q, num_splits)
        self._launch_split(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, softmax_scale, causal,
                           out_partial, lse_partial, True, k_descale, v_descale)
        return out_partial, lse_partial

    def combine(self, out_partial, lse_partial, out, lse) -> None:
        lse_buf = lse if lse is not None else self._lse_scratch(out)
        if lse_buf.stride() != _compact_strides(lse_buf.shape):
            raise ValueError(f"lse: expected a contiguous [B, H, L_q] tensor, got strides {lse_buf.stride()}")
        self._combine_launch(out_partial, lse_partial, out).launch(
            out_partial.data_ptr(), lse_partial.data_ptr(), out.data_ptr(), lse_buf.data_ptr(), _raw_stream(out))

    def _combine_launch(self, out_partial, lse_partial, out) -> _CombineLaunch:
        """The compiled combine for these shapes and its static raw arguments (sizes, strides)."""
        from .compile import compile_combine

        num_splits, batch, seqlen_q, num_heads, head_dim = out_partial.shape
        config = configs.CombineConfig(_OUT_DTYPE_NAMES[out.dtype], head_dim)
        static = dict(
            num_splits=num_splits, batch=batch, seqlen_q=seqlen_q, num_heads=num_heads,
            **dict(zip(("op_stride_s", "op_stride_b", "op_stride_l", "op_stride_h"), out_partial.stride()[:4])),
            **dict(zip(("lp_stride_s", "lp_stride_b", "lp_stride_h", "lp_stride_l"), lse_partial.stride())),
            **dict(zip(("o_stride_b", "o_stride_l", "o_stride_h"), out.stride()[:3])),
        )
        return _CombineLaunch(compile_combine(config), static, launch_args.combine_elements(config))

    # ------------------------------------------------------------------ helpers
    def _launch_split(self, q, k, v, cache_seqlens, block_table, num_splits, scale, causal, o, lse,
                      write_partials, k_descale=None, v_descale=None) -> None:
        launch = self._split_launch(q, k, v, cache_seqlens, block_table, num_splits, scale, causal, o, lse,
                                    write_partials, k_descale, v_descale)
        launch.launch(q, k, v, o.data_ptr(), lse.data_ptr(), cache_seqlens, block_table, k_descale, v_descale,
                      None, _raw_stream(q))

    def _split_launch(self, q, k, v, cache_seqlens, block_table, num_splits, scale, causal, o, lse,
                      write_partials, k_descale=None, v_descale=None, out=None, one_per_sm=False,
                      one_wave=False, swap=None) -> _SplitLaunch:
        """The compiled split kernel for this call's static facts and its static raw arguments;
        with ``out`` (partials only), the kernel's last CTA per row tile merges into it; with
        ``one_per_sm``, the one-CTA-per-SM tile; with ``one_wave``, ``configs.ONE_WAVE_STAGES``;
        the swapped-operand kernel where :meth:`swaps` (``swap`` None) or ``swap`` says."""
        import math

        from .compile import compile_split

        batch, seqlen_q, num_heads, head_dim = q.shape
        cache_rows, cache_len, num_heads_kv = k.shape[:3]
        paged = block_table is not None
        if paged:
            # The capacity of a row is its page table's span; the kernel reads only the entries
            # of the tiles it loads (never past a row's last page).
            max_pages = block_table.shape[1]
            seqlen_k = max_pages * cache_len
        else:
            seqlen_k, max_pages = cache_len, 1
        kv_dtype = _FP8_NAMES.get(k.dtype, "same")
        tile_units = configs.ONE_PER_SM_TILE[2] if one_per_sm else configs.split_tile(head_dim)[2]
        if swap is None:
            swap = self.swaps(seqlen_q * (num_heads // num_heads_kv), kv_dtype, cache_len if paged else None,
                              head_dim, batch * num_heads_kv * num_splits, tile_units, q.device.type)
        config = configs.split_config(_DTYPE_NAMES[q.dtype], head_dim, causal, write_partials, paged, kv_dtype,
                                      cache_len if paged else None, merge=out is not None, one_per_sm=one_per_sm,
                                      one_wave=one_wave, swap_rows=configs.SWAP_AB_ROWS if swap else 0)
        if lse.stride() != _compact_strides(lse.shape):
            raise ValueError(f"lse: expected a contiguous tensor, got strides {lse.stride()}")
        o_strides = o.stride()[:4] if write_partials else (0, *o.stride()[:3])
        static = dict(
            batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, num_heads=num_heads, num_heads_kv=num_heads_kv,
            num_splits=num_splits, cache_rows=cache_rows, cache_len=cache_len, max_pages=max_pages,
            block_table_stride_b=block_table.stride(0) if paged else 0,
            softmax_scale_log2=scale * math.log2(math.e),
        )
        for name, t in (("q", q), ("k", k), ("v", v)):
            static.update(zip((f"{name}_stride_b", f"{name}_stride_l", f"{name}_stride_h"), t.stride()[:3]))
        static.update(zip(("o_stride_s", "o_stride_b", "o_stride_l", "o_stride_h"), o_strides))
        # fp8 descales: one element (strides 0) or [B, H_kv]; a 16-bit launch passes lse (never read).
        for name, t in (("k_descale", k_descale), ("v_descale", v_descale)):
            strides = (0, 0) if t is None or t.numel() == 1 else (t.stride(0), t.stride(1))
            static.update(zip((f"{name}_stride_b", f"{name}_stride_h"), strides))
        static.update(zip(("out_stride_b", "out_stride_l", "out_stride_h"),
                          (0, 0, 0) if out is None else out.stride()[:3]))
        full = self._full_length(q.device, batch, seqlen_k) if cache_seqlens is None else None
        return _SplitLaunch(compile_split(config), static, launch_args.split_elements(config), full)

    def _full_length(self, device, batch: int, seqlen_k: int) -> torch.Tensor:
        """A cached ``[batch]`` tensor of ``seqlen_k`` (cache_seqlens=None: every slot is live)."""
        key = (device, batch, seqlen_k)
        t = self._full_seqlens.get(key)
        if t is None:
            t = torch.full((batch,), seqlen_k, dtype=torch.int32, device=device)
            self._full_seqlens[key] = t
        return t

    @staticmethod
    def _lse_scratch(q: torch.Tensor) -> torch.Tensor:
        batch, seqlen_q, num_heads, _ = q.shape
        return torch.empty((batch, num_heads, seqlen_q), dtype=torch.float32, device=q.device)

    @staticmethod
    def _alloc_partials(q: torch.Tensor, num_splits: int):
        batch, seqlen_q, num_heads, head_dim = q.shape
        out_partial = torch.empty(
            (num_splits, batch, seqlen_q, num_heads, head_dim), dtype=torch.float32, device=q.device
        )
        lse_partial = torch.empty((num_splits, batch, num_heads, seqlen_q), dtype=torch.float32, device=q.device)
        return out_partial, lse_partial


class PreparedCuteDecode:
    """Decode for one static configuration (the api caches one per call signature).

    The first call compiles (or finds) the split and combine kernels and computes their static
    raw arguments (sizes, strides, scale); every call then only gathers the tensors' addresses,
    takes the partials (and an lse scratch when none is asked for) from the stream's reusable
    workspace (a fresh tensor while a CUDA graph is being captured) and launches through the
    kernels' FastLaunchers. Workspace layout (fp32): ``out_partial`` ``[S, B, L_q, H, D]``,
    ``lse_partial`` ``[S, B, H, L_q]`` (S > 1 only), then the lse scratch ``[B, H, L_q]``.
    A launch of 2 to ``CuteBackend.merge_max_splits`` splits merges in the split kernel's tail
    (``SplitConfig.merge``, one launch; its arrival counters come from
    :class:`~flashsplit.workspace.ArrivalCounters`); otherwise the combine kernel merges. The
    kernel: the two-CTA tile, or ``one_per_sm`` / ``one_wave`` (what :meth:`CuteBackend.prepare`
    chose), with swapped operands where ``CuteBackend.swaps`` (``swap`` None) or ``swap`` says.
    """

    def __init__(self, backend: CuteBackend, num_splits: int, softmax_scale: float, causal: bool,
                 one_per_sm: bool = False, one_wave: bool = False, swap: bool | None = None):
        self.backend = backend
        self.num_splits = num_splits
        self.softmax_scale = softmax_scale
        self.causal = causal
        self.one_per_sm = one_per_sm  # configs.ONE_PER_SM_TILE (the plan counted one CTA per SM)
        self.split: _SplitLaunch | None = None
        self.combine: _CombineLaunch | None = None
        # Fixed per prepared launch (its compiled kernel).
        self.merge = backend.merges(num_splits)
        self.one_wave = one_wave and self.merge  # configs.ONE_WAVE_STAGES (merging launches only)
        self.swap = swap

    def __call__(self, q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, out, lse) -> None:
        batch, seqlen_q, num_heads, head_dim = q.shape
        splits = self.num_splits
        rows = batch * seqlen_q * num_heads
        partial_rows = splits * rows if splits > 1 else 0
        scratch_lse = lse is None
        numel = partial_rows * (head_dim + 1) + rows * scratch_lse or 1
        if q.is_cuda:  # one read of the stream for the workspace and the launches
            key = stream_key(q.get_device())
            stream, buffer = key[1], self.backend._workspace.stream_buffer(key, numel)
        else:
            stream, buffer = 0, self.backend._workspace.buffer(q.device, numel)
        op = buffer.data_ptr()
        lp = op + partial_rows * head_dim * 4
        lse_ptr = lp + partial_rows * 4 if scratch_lse else lse.data_ptr()
        out_ptr = out.data_ptr()
        if self.split is None:
            self._first_launch_setup(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, out, lse,
                                     buffer, partial_rows, rows)
        # One split writes the final outputs; several write the partials, which the split
        # kernel's last CTAs (merge) or the combine merge.
        if splits == 1:
            self.split.launch(q, k_cache, v_cache, out_ptr, lse_ptr, cache_seqlens, block_table, k_descale,
                              v_descale, None, stream)
        elif self.merge:
            arrivals = self.backend._arrivals.for_queries(q).data_ptr()
            self.split.launch(q, k_cache, v_cache, op, lp, cache_seqlens, block_table, k_descale, v_descale,
                              (out_ptr, lse_ptr, arrivals), stream)
        else:
            self.split.launch(q, k_cache, v_cache, op, lp, cache_seqlens, block_table, k_descale, v_descale,
                              None, stream)
            self.combine.launch(op, lp, out_ptr, lse_ptr, stream)

    def _first_launch_setup(self, q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, out, lse,
                            buffer, partial_rows, rows) -> None:
        """Compile/find the kernels and their static arguments, from views of the workspace."""
        batch, seqlen_q, num_heads, head_dim = q.shape
        splits = self.num_splits
        if lse is None:
            start = partial_rows * (head_dim + 1)
            lse = buffer[start: start + rows].view(batch, num_heads, seqlen_q)
        elif lse.stride() != _compact_strides(lse.shape):
            raise ValueError(f"lse: expected a contiguous [B, H, L_q] tensor, got strides {lse.stride()}")
        if splits == 1:
            self.split = self.backend._split_launch(q, k_cache, v_cache, cache_seqlens, block_table, 1,
                                                    self.softmax_scale, self.causal, out, lse, False, k_descale,
                                                    v_descale, one_per_sm=self.one_per_sm, swap=self.swap)
            return
        out_partial = buffer[: partial_rows * head_dim].view(splits, batch, seqlen_q, num_heads, head_dim)
        lse_partial = buffer[partial_rows * head_dim: partial_rows * (head_dim + 1)].view(
            splits, batch, num_heads, seqlen_q)
        self.split = self.backend._split_launch(q, k_cache, v_cache, cache_seqlens, block_table, splits,
                                                self.softmax_scale, self.causal, out_partial, lse_partial, True,
                                                k_descale, v_descale, out if self.merge else None,
                                                one_per_sm=self.one_per_sm, one_wave=self.one_wave,
                                                swap=self.swap)
        if not self.merge:
            self.combine = self.backend._combine_launch(out_partial, lse_partial, out)


class _SplitLaunch:
    """One split-kernel launch configuration: the compiled kernel and the raw arguments that do
    not change between calls with the same static facts (sizes, strides, scale), by the names of
    :data:`~flashsplit.cute.launch_args.SPLIT_ARGS`."""

    __slots__ = ("elements", "full_seqlens", "kernel", "static")

    def __init__(self, kernel, static: dict, elements: dict[str, str], full_seqlens):
        self.kernel, self.elements, self.full_seqlens = kernel, elements, full_seqlens
        self.static = tuple(static[name] for name in _SPLIT_STATIC)  # KeyError: a missing argument
        if len(static) != len(_SPLIT_STATIC):
            raise ValueError(f"static: unknown arguments {sorted(set(static) - set(_SPLIT_STATIC))}")

    def raw(self, q, k, v, o_ptr: int, lse_ptr: int, cache_seqlens, block_table, k_descale, v_descale,
            merge_into: tuple | None, stream: int) -> tuple:
        """Every argument of the compiled host function as a plain value, in its order: the
        addresses, the static part, the stream. ``o_ptr``/``lse_ptr`` address the partial
        buffers or the final outputs; ``merge_into`` is ``(out, lse, arrival counters)``
        addresses for a merging kernel. Arguments a configuration never reads get placeholders:
        a dense launch passes ``cache_seqlens`` as its block table, a 16-bit one the lse address
        as its descales, a launch that does not merge ``o_ptr``/``lse_ptr`` as the merge's."""
        seqlens = (self.full_seqlens if cache_seqlens is None else cache_seqlens).data_ptr()
        merge_out, merge_lse, arrivals = merge_into or (o_ptr, lse_ptr, lse_ptr)
        return _pack_split(
            self.static, q_ptr=q.data_ptr(), k_ptr=k.data_ptr(), v_ptr=v.data_ptr(), o_ptr=o_ptr, lse_ptr=lse_ptr,
            seqlens_ptr=seqlens, block_table_ptr=seqlens if block_table is None else block_table.data_ptr(),
            k_descale_ptr=lse_ptr if k_descale is None else k_descale.data_ptr(),
            v_descale_ptr=lse_ptr if v_descale is None else v_descale.data_ptr(),
            out_ptr=merge_out, out_lse_ptr=merge_lse, arrivals_ptr=arrivals, stream=stream,
        )

    def launch(self, q, k, v, o_ptr: int, lse_ptr: int, cache_seqlens, block_table, k_descale, v_descale,
               merge_into: tuple | None, stream: int) -> None:
        """Launch the split kernel with :meth:`raw`'s arguments."""
        raw = self.raw(q, k, v, o_ptr, lse_ptr, cache_seqlens, block_table, k_descale, v_descale, merge_into,
                       stream)
        _run(self.kernel, raw, lambda: launch_args.cute_args(launch_args.SPLIT_ARGS, self.elements, raw))


class _CombineLaunch:
    """One combine launch configuration: the compiled kernel and its static raw arguments by the
    names of :data:`~flashsplit.cute.launch_args.COMBINE_ARGS`."""

    __slots__ = ("elements", "kernel", "static")

    def __init__(self, kernel, static: dict, elements: dict[str, str]):
        self.kernel, self.elements = kernel, elements
        self.static = tuple(static[name] for name in _COMBINE_STATIC)
        if len(static) != len(_COMBINE_STATIC):
            raise ValueError(f"static: unknown arguments {sorted(set(static) - set(_COMBINE_STATIC))}")

    def launch(self, op: int, lp: int, out_ptr: int, lse_ptr: int, stream: int) -> None:
        """Merge the partials at ``op``/``lp`` into ``out_ptr`` and ``lse_ptr``."""
        raw = _pack_combine(self.static, op_ptr=op, lp_ptr=lp, o_ptr=out_ptr, lse_ptr=lse_ptr, stream=stream)
        _run(self.kernel, raw, lambda: launch_args.cute_args(launch_args.COMBINE_ARGS, self.elements, raw))


_SPLIT_STATIC = launch_args.static_names(launch_args.SPLIT_ARGS)
_COMBINE_STATIC = launch_args.static_names(launch_args.COMBINE_ARGS)
_pack_split = launch_args.packer(launch_args.SPLIT_ARGS)
_pack_combine = launch_args.packer(launch_args.COMBINE_ARGS)


def compile_cache_size() -> int:
    """Number of compiled CuTe kernels in this process (0 before any cute launch)."""
    import sys

    mod = sys.modules.get("flashsplit.cute.compile")
    return 0 if mod is None else mod.cache_size()


def _compact_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for extent in reversed(shape):
        strides.append(acc)
        acc *= extent
    return tuple(reversed(strides))


_LAUNCHERS: dict = {}  # compiled kernel -> FastLauncher, or None where one cannot be built


def _run(kernel, raw: tuple, library_args) -> None:
    """Launch ``kernel`` with ``raw`` (plain ints/floats: addresses, sizes, strides, scale, stream)
    through a cached :class:`~flashsplit.cute.fastcall.FastLauncher` (a few microseconds), or,
    where none can be built, through CuteDSL's own call with ``library_args()``."""
    launcher = _LAUNCHERS.get(kernel, False)
    if launcher is False:
        from .fastcall import FastLauncher

        try:
            launcher = FastLauncher.from_raw(kernel, raw)
        except Exception:  # noqa: BLE001  (not a compiled CuteDSL function, unknown internals: the plain call)
            launcher = None
        _LAUNCHERS[kernel] = launcher
    if launcher is not None:
        launcher.launch(*raw)
    else:
        kernel(*library_args())


def _raw_stream(t: torch.Tensor) -> int:
    return stream_key(t.get_device())[1] if t.is_cuda else 0
