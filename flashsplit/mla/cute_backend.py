"""The cute MLA backend: the Hopper CuteDSL split kernel (``flashsplit.cute``'s MLA module:
TMA loads of the latent tiles, warpgroup MMA, warp specialization) and the Triton combine.

Imported lazily: ``supports`` names what is missing (no sm_90 GPU, no nvidia-cutlass-dsl, no MLA
kernel in this build) instead of failing an import.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util

from .problem import MlaProblem
from .registry import MlaBackend
from .triton_backend import alloc_partials, combine

#: Modules of ``flashsplit.cute`` that may hold ``mla_split_forward`` and ``mla_supports``.
KERNEL_MODULES = ("flashsplit.cute.mla_launcher", "flashsplit.cute.mla")
#: Rows per CTA tile of the cute kernel: 64 packed rows, one CTA per SM.
CUTE_BLOCK_M = 64


@functools.lru_cache(maxsize=None)
def kernel_module():
    """The module exposing ``mla_split_forward``/``mla_supports``, or a string saying why none."""
    if importlib.util.find_spec("cutlass") is None:
        return "nvidia-cutlass-dsl is not installed"
    for name in KERNEL_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                continue
        except ModuleNotFoundError:
            continue
        module = importlib.import_module(name)
        if hasattr(module, "mla_split_forward") and hasattr(module, "mla_supports"):
            return module
    return "not available: this build of flashsplit has no CuteDSL MLA kernel"


class CuteMlaBackend(MlaBackend):
    name = "cute"
    priority = 10

    def supports(self, problem: MlaProblem) -> str | None:
        if problem.device_type != "cuda":
            return f"needs a CUDA device, got tensors on {problem.device_type!r}"
        target = problem.target
        if target is None or target.capability != (9, 0):
            return f"needs an sm_90 (Hopper) GPU, got {target.arch if target else 'none'}"
        if problem.fp8_tokens:
            return "FlashMLA's 656-byte fp8 tokens run on the Triton backend"
        module = kernel_module()
        if isinstance(module, str):
            return module
        return module.mla_supports(**problem.cute_facts())

    def block_m(self, problem: MlaProblem) -> int:
        return CUTE_BLOCK_M

    def run(self, q, kv_cache, cache_seqlens, block_table, out, lse, *, num_splits, softmax_scale, causal,
            kv_descale) -> None:
        out_partial, lse_partial = self.forward_partials(q, kv_cache, cache_seqlens, block_table,
                                                         num_splits=num_splits, softmax_scale=softmax_scale,
                                                         causal=causal, kv_descale=kv_descale)
        combine(out_partial, lse_partial, out, lse)  # the Triton combine kernel

    def forward_partials(self, q, kv_cache, cache_seqlens, block_table, *, num_splits, softmax_scale, causal,
                         kv_descale=None):
        out_partial, lse_partial = alloc_partials(q, num_splits)
        kernel_module().mla_split_forward(q, kv_cache, cache_seqlens, block_table, out_partial, lse_partial,
                                          softmax_scale=softmax_scale, causal=causal, num_splits=num_splits,
                                          kv_descale=kv_descale)
        return out_partial, lse_partial
