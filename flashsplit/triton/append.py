"""The append step of a Triton decode: one launch of the append kernel before the split kernel.

:class:`PreparedAppend` writes a call's new keys and values into its cache (rotated and quantized
as the problem says). Same stream as the split kernel, in plain stream order, so the split
kernel reads the new keys; the split kernel rotates q itself (no copy of q is written). Launching
the split kernel as a programmatic dependent (PDL) of the append was slower on an H200 (32/8 heads,
d 128, bf16, one new token, graph replay; PDL vs stream order: B = 1 x 16k 25.9 vs 24.8 us,
B = 16 x 16k 263.0 vs 248.2, B = 16 x 128k 2096.9 vs 1913.9; without an append 22.5, 245.6, 1928.3).
"""

from __future__ import annotations

import torch
import triton

from ..call import DecodeTensors
from ..problem import DecodeProblem
from .append_kernel import append_kv_kernel
from .launch import Relaunch, launch

#: fp8 formats as the append kernel rounds to them: (smallest normal exponent, mantissa bits).
FP8_FORMATS = {torch.float8_e4m3fn: (-6, 3), torch.float8_e5m2: (-14, 2)}
#: Elements of one program's [heads, head dim] tile (a few fp32 registers a thread on 4 warps).
TILE_ELEMENTS = 4096


def _address(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _strides(t: torch.Tensor | None, dims: int) -> tuple[int, ...]:
    return tuple(t.stride()[:dims]) if t is not None else (0,) * dims


def _descale_strides(scale: torch.Tensor | None) -> tuple[int, int]:
    return (0, 0) if scale is None or scale.numel() == 1 else tuple(scale.stride())


class PreparedAppend:
    """The append of one prepared decode (one call signature).

    ``self(tensors)`` launches the append kernel.
    """

    def __init__(self, problem: DecodeProblem):
        self.problem = problem
        self.launch: Relaunch | None = None

    def __call__(self, tensors: DecodeTensors) -> None:
        pointers = (tensors.k_new.data_ptr(), tensors.v_new.data_ptr(), tensors.k_cache.data_ptr(),
                    tensors.v_cache.data_ptr(), tensors.cache_seqlens.data_ptr(), _address(tensors.cache_leftpad),
                    _address(tensors.block_table), _address(tensors.cache_batch_idx), _address(tensors.rotary_cos),
                    _address(tensors.rotary_sin), _address(tensors.k_descale), _address(tensors.v_descale))
        if self.launch is not None:
            self.launch(pointers)
        else:
            self.launch = launch_append(tensors, self.problem)


def launch_append(tensors: DecodeTensors, problem: DecodeProblem) -> Relaunch | None:
    """Launch :func:`~flashsplit.triton.append_kernel.append_kv_kernel` for ``tensors`` (validated:
    ``k_new``, ``v_new`` and ``cache_seqlens`` given). Returns a :class:`Relaunch` of it where
    replays are possible."""
    k_cache, v_cache, k_new, v_new = tensors.k_cache, tensors.v_cache, tensors.k_new, tensors.v_new
    block_table, cos = tensors.block_table, tensors.rotary_cos
    batch, seqlen_new, num_heads_kv, head_dim = k_new.shape
    rotary = problem.has_rotary
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_h = max(1, min(triton.next_power_of_2(num_heads_kv), TILE_ELEMENTS // block_d))
    fp8 = k_cache.dtype in FP8_FORMATS
    fp8_emin, fp8_mbits = FP8_FORMATS.get(k_cache.dtype, (0, 0))
    paged = block_table is not None
    grid = (seqlen_new, batch, 2)  # keys, values
    pointers = (k_new, v_new, k_cache, v_cache, tensors.cache_seqlens, tensors.cache_leftpad, block_table,
                tensors.cache_batch_idx, cos if rotary else None, tensors.rotary_sin if rotary else None,
                tensors.k_descale if fp8 else None, tensors.v_descale if fp8 else None)
    tail = (
        *k_new.stride()[:3], *v_new.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3],
        *_strides(block_table, 1), *_strides(cos, 1),
        *_descale_strides(tensors.k_descale if fp8 else None), *_descale_strides(tensors.v_descale if fp8 else None),
        seqlen_new, num_heads_kv, head_dim, problem.seqlen_k, k_cache.shape[0],
        cos.shape[0] if rotary else 1, cos.shape[1] if rotary else 0,
        # constexprs, in the kernel's order
        block_h, block_d, k_cache.shape[1] if paged else 0, paged, problem.has_leftpad, problem.has_batch_idx,
        rotary, problem.rotary_interleaved, fp8, fp8_emin, fp8_mbits,
        float(torch.finfo(k_cache.dtype).max) if fp8 else 0.0,
    )
    return launch(append_kv_kernel, grid, pointers, tail, dict(num_warps=4))
