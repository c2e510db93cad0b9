"""``backend="cute"``: the CuTeDSL split kernel and combine on Hopper (sm_90a).

This module imports neither cutlass nor the kernels at import time; the first call that needs
them compiles (once per :class:`~flashsplit.cute.configs.SplitConfig` /
:class:`~flashsplit.cute.configs.CombineConfig`) and caches. Which kernel variant a launch runs
is :mod:`flashsplit.cute.choice`'s rule; :mod:`flashsplit.cute.launcher` launches it.
"""

from __future__ import annotations

import importlib.util

import torch

from ..plan import device_num_sms
from ..problem import FP8_DTYPES, DecodeProblem, check_decode_inputs
from ..registry import Backend
from . import choice, configs
from .launcher import CuteLauncher, PreparedCuteDecode, compact_strides, raw_stream

_DTYPE_NAMES = (torch.float16, torch.bfloat16)


def cutlass_available() -> bool:
    return importlib.util.find_spec("cutlass") is not None


class CuteBackend(Backend):
    name = "cute"
    priority = 10
    #: Launches of 2..merge_max_splits splits merge in the split kernel's tail
    #: (``choice.MERGE_MAX_SPLITS``, where the measurement is).
    merge_max_splits = choice.MERGE_MAX_SPLITS

    def __init__(self) -> None:
        #: Builds the launches and owns the workspace and merge counters they share.
        self.launcher = CuteLauncher()

    # ------------------------------------------------------------------ capability
    def supports(self, problem: DecodeProblem) -> str | None:
        if problem.head_dim not in configs.HEAD_DIMS:
            return f"head_dim {problem.head_dim} is not one of {configs.HEAD_DIMS}"
        if problem.dtype not in _DTYPE_NAMES:
            return f"dtype {problem.dtype} is not float16 or bfloat16"
        if not problem.aligned_16b:
            return "q/k_cache/v_cache/out need 16-byte aligned pointers and strides (TMA, vector stores)"
        if problem.cache_dtype != problem.dtype and problem.cache_dtype not in FP8_DTYPES:
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
        return choice.BLOCK_M

    def preference(self, problem: DecodeProblem) -> tuple[int, str]:
        # Measured on the H200 (docs/benchmarks.md; 32/8 heads, d = 128): paged 16-bit caches
        # run at dense speed here, whole-tile pages (128: 1.00x dense) and sub-tile pages alike
        # (16: 1.00-1.01x), but 1.06-1.22x slower in Triton; dense 16-bit caches are faster here
        # where the swapped-operand kernel runs in one wave, one CTA per SM or the work units
        # fill the machine (flashsplit.cute.choice; B = 1 x 4k: 9.7 vs 10.2 us); fp8 caches are
        # 1.06-1.11x slower here than in Triton.
        if problem.paged and not configs.tma_pages(problem.page_size, problem.head_dim):
            # H200, B = 1, 32/8 heads, d = 128: pages of 1 and 48 take 1.7-2.4x the dense time
            # here (one bulk copy per key row), 1.11-1.18x in Triton.
            return -5, "paged KV gathered row by row: measured 1.7-2.4x slower than triton (H200)"
        if problem.paged and problem.cache_dtype not in FP8_DTYPES:
            return 20, "paged 16-bit KV: the cute TMA kernel reads pages at dense speed (H200)"
        if choice.one_cta_per_sm(problem, _num_sms(problem)):
            # H200: see choice.ONE_PER_SM_MIN_KEYS.
            return 5, "dense 16-bit KV in one wave of one CTA per SM: measured faster than triton (H200)"
        if self.cute_measured_faster(problem):
            return 3, ("dense 16-bit KV with 1-8 q rows per KV head in one wave (swapped operands), or GQA filling "
                       "the machine or in long splits: measured faster than triton (H200)")
        return -10, "cute supports it but was measured slower than triton here (H200)"

    def cute_measured_faster(self, problem: DecodeProblem) -> bool:
        """Where the cute kernel (two CTAs per SM) was measured faster than Triton's on a dense
        16-bit cache at d = 128 (:func:`flashsplit.cute.choice.measured_faster`)."""
        return choice.measured_faster(problem, _num_sms(problem))

    def units_per_sm(self, problem: DecodeProblem) -> int:
        return choice.units_per_sm(problem, _num_sms(problem))

    # ------------------------------------------------------------------ launches
    def prepare(self, problem: DecodeProblem, num_splits: int, softmax_scale: float, causal: bool):
        tile = choice.choose(problem, num_splits, _num_sms(problem), self.merge_max_splits)
        return PreparedCuteDecode(self.launcher, tile, num_splits, softmax_scale, causal)

    def decode(self, q, k_cache, v_cache, cache_seqlens, num_splits, softmax_scale, causal, out, lse,
               block_table=None, k_descale=None, v_descale=None) -> None:
        """One decode with ``num_splits`` splits on the two-CTA tile, merged in the kernel or by
        the combine and with swapped operands as the rules say (the api goes through
        :meth:`prepare`, which also applies the one-CTA-per-SM and one-wave rules)."""
        problem = check_decode_inputs(q, k_cache, v_cache, cache_seqlens, causal, num_splits, out, block_table,
                                      k_descale, v_descale)
        tile = choice.choose(problem, num_splits, _num_sms(problem), self.merge_max_splits, one_per_sm=False,
                             one_wave=False)
        PreparedCuteDecode(self.launcher, tile, num_splits, softmax_scale, causal)(
            q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, out, lse)

    def forward_partials(self, q, k_cache, v_cache, cache_seqlens, num_splits, softmax_scale, causal,
                         block_table=None, k_descale=None, v_descale=None):
        problem = check_decode_inputs(q, k_cache, v_cache, cache_seqlens, causal, num_splits, None, block_table,
                                      k_descale, v_descale)
        swap = choice.choose(problem, num_splits, _num_sms(problem), one_per_sm=False, one_wave=False).swap
        batch, seqlen_q, num_heads, head_dim = q.shape
        out_partial = torch.empty((num_splits, batch, seqlen_q, num_heads, head_dim), dtype=torch.float32,
                                  device=q.device)
        lse_partial = torch.empty((num_splits, batch, num_heads, seqlen_q), dtype=torch.float32, device=q.device)
        launch = self.launcher.split_launch(q, k_cache, v_cache, cache_seqlens, block_table, num_splits,
                                            softmax_scale, causal, out_partial, lse_partial, True, k_descale,
                                            v_descale, swap=swap)
        launch.launch(q, k_cache, v_cache, out_partial.data_ptr(), lse_partial.data_ptr(), cache_seqlens,
                      block_table, k_descale, v_descale, None, raw_stream(q))
        return out_partial, lse_partial

    def combine(self, out_partial, lse_partial, out, lse) -> None:
        batch, seqlen_q, num_heads, _ = out.shape
        lse_buf = lse if lse is not None else torch.empty((batch, num_heads, seqlen_q), dtype=torch.float32,
                                                          device=out.device)
        if lse_buf.stride() != compact_strides(lse_buf.shape):
            raise ValueError(f"lse: expected a contiguous [B, H, L_q] tensor, got strides {lse_buf.stride()}")
        self.launcher.combine_launch(out_partial, lse_partial, out).launch(
            out_partial.data_ptr(), lse_partial.data_ptr(), out.data_ptr(), lse_buf.data_ptr(), raw_stream(out))


def _num_sms(problem: DecodeProblem) -> int:
    """The SM count the rules plan ``problem`` for: its device's (132, an H200's, without CUDA)."""
    return device_num_sms(problem.device_type)


def compile_cache_size() -> int:
    """Number of compiled CuTe kernels in this process (0 before any cute launch)."""
    import sys

    mod = sys.modules.get("flashsplit.cute.compile")
    return 0 if mod is None else mod.cache_size()
