"""``backend="cute"``: the CuTeDSL split kernel and combine on Hopper (sm_90a).

Cache updates: new keys (and rotary) are written by the shared small Triton kernel of
:mod:`flashsplit.triton.cache_update` ahead of the split kernel; ``cache_leftpad`` is the split
kernel's own; ``cache_batch_idx`` reads a dense cache as one page per row.

This module imports neither cutlass nor the kernels at import time; the first call that needs
them compiles (once per :class:`~flashsplit.cute.configs.SplitConfig` /
:class:`~flashsplit.cute.configs.CombineConfig`) and caches. Which kernel variant a launch runs
is :mod:`flashsplit.cute.choice`'s rule; :mod:`flashsplit.cute.launcher` launches it.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import torch

from ..call import DecodeOptions, DecodeTensors
from ..problem import FP8_DTYPES, DecodeProblem, Variant
from ..registry import Backend
from ..validation import check_decode_inputs
from . import choice, configs
from .launcher import CuteLauncher, PreparedCuteDecode, compact_strides, raw_stream

_DTYPE_NAMES = (torch.float16, torch.bfloat16)


#: Why the backend cannot run without its CuteDSL compiler (an optional extra of flashsplit).
CUTLASS_MISSING = "nvidia-cutlass-dsl is not installed: pip install 'flashsplit[hopper]'"


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
        if problem.target is None:
            return f"needs a CUDA device, got {problem.device_type}"
        if not cutlass_available():
            return CUTLASS_MISSING
        if problem.target.capability != (9, 0):
            major, minor = problem.target.capability
            return f"needs compute capability 9.0 (Hopper, sm_90a), got {major}.{minor} ({problem.target.name})"
        return None

    def block_m(self, problem: DecodeProblem) -> int:
        return choice.BLOCK_M

    def units_per_sm(self, problem: DecodeProblem) -> int:
        return choice.units_per_sm(problem, problem.num_sms)

    def split_cap(self, problem: DecodeProblem) -> tuple[int, str] | None:
        cap = choice.cluster_split_cap(problem, problem.num_sms)
        return None if cap is None else (cap, f"each row tile's splits merge through one cluster of {cap} CTAs")

    # ------------------------------------------------------------------ launches
    def prepare(self, problem: DecodeProblem, num_splits: int, softmax_scale: float):
        if problem.has_batch_idx:  # launched as pages of the whole capacity (PreparedCuteDecode)
            problem = dataclasses.replace(problem, page_size=problem.seqlen_k)
        tile = choice.choose(problem, num_splits, problem.num_sms, self.merge_max_splits)
        return PreparedCuteDecode(self.launcher, tile, num_splits, softmax_scale, problem.causal, problem.variant)

    def decode(self, q, k_cache, v_cache, cache_seqlens, num_splits, softmax_scale, causal, out, lse,
               block_table=None, k_descale=None, v_descale=None, sinks=None, window_size=(-1, -1), softcap=0.0,
               batch_invariant=False) -> None:
        """One decode with ``num_splits`` splits on the two-CTA tile, merged in the kernel or by
        the combine and with swapped operands as the rules say (the api goes through
        :meth:`prepare`, which also applies the one-CTA-per-SM and one-wave rules);
        ``window_size``, ``softcap``, ``sinks``, ``batch_invariant`` as :func:`flashsplit.decode`
        takes them."""
        tensors = DecodeTensors(q, k_cache, v_cache, out, lse, cache_seqlens, block_table, k_descale, v_descale,
                                sinks)
        problem = check_decode_inputs(tensors, DecodeOptions(causal=causal, num_splits=num_splits,
                                                             window_size=window_size, softcap=softcap,
                                                             batch_invariant=batch_invariant))
        tile = choice.choose(problem, num_splits, problem.num_sms, self.merge_max_splits, one_per_sm=False,
                             one_wave=False)
        PreparedCuteDecode(self.launcher, tile, num_splits, softmax_scale, problem.causal, problem.variant)(tensors)

    def forward_partials(self, q, k_cache, v_cache, cache_seqlens, num_splits, softmax_scale, causal,
                         block_table=None, k_descale=None, v_descale=None, variant: Variant = Variant()):
        """Every split's partials (no sinks: they join in :meth:`combine`); ``variant``: the
        window, softcap and split rule (:class:`~flashsplit.problem.Variant`)."""
        variant = variant._replace(has_sinks=False)
        window = (variant.window_left, variant.window_right)
        if causal and window[1] >= 0:
            window = (window[0], 0)  # (a causal launch's right bound is 0, as validation normalizes it)
        problem = check_decode_inputs(DecodeTensors(q, k_cache, v_cache, None, None, cache_seqlens, block_table,
                                                    k_descale, v_descale),
                                      DecodeOptions(causal=causal, num_splits=0 if variant.batch_invariant else
                                                    num_splits, window_size=window, softcap=variant.softcap,
                                                    batch_invariant=variant.batch_invariant))
        swap = choice.choose(problem, num_splits, problem.num_sms, one_per_sm=False, one_wave=False).swap
        batch, seqlen_q, num_heads, head_dim = q.shape
        out_partial = torch.empty((num_splits, batch, seqlen_q, num_heads, head_dim), dtype=torch.float32,
                                  device=q.device)
        lse_partial = torch.empty((num_splits, batch, num_heads, seqlen_q), dtype=torch.float32, device=q.device)
        launch = self.launcher.split_launch(q, k_cache, v_cache, cache_seqlens, block_table, num_splits,
                                            softmax_scale, causal, out_partial, lse_partial, True, k_descale,
                                            v_descale, swap=swap, variant=variant)
        launch.launch(q, k_cache, v_cache, out_partial.data_ptr(), lse_partial.data_ptr(), cache_seqlens,
                      block_table, k_descale, v_descale, None, raw_stream(q))
        return out_partial, lse_partial

    def combine(self, out_partial, lse_partial, out, lse, sinks=None) -> None:
        """Merge the partials into ``out``/``lse``; ``sinks`` ``[H_q]`` join each row's softmax."""
        batch, seqlen_q, num_heads, _ = out.shape
        lse_buf = lse if lse is not None else torch.empty((batch, num_heads, seqlen_q), dtype=torch.float32,
                                                          device=out.device)
        if lse_buf.stride() != compact_strides(lse_buf.shape):
            raise ValueError(f"lse: expected a contiguous [B, H, L_q] tensor, got strides {lse_buf.stride()}")
        self.launcher.combine_launch(out_partial, lse_partial, out, sinks).launch(
            out_partial.data_ptr(), lse_partial.data_ptr(), out.data_ptr(), lse_buf.data_ptr(), raw_stream(out), sinks)


def compile_cache_size() -> int:
    """Number of compiled CuTe kernels in this process (0 before any cute launch)."""
    import sys

    mod = sys.modules.get("flashsplit.cute.compile")
    return 0 if mod is None else mod.cache_size()
