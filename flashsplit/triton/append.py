"""The append step of a Triton decode: one launch of the append kernel before the split kernel.

:class:`PreparedAppend` writes a call's new keys and values into its cache (rotated and quantized
as the problem says) and, with rotary tables, a rotated copy of q into per-stream scratch
memory, then hands the split kernel the q to read. Same stream as the split kernel, so the
split kernel reads the new keys; on Hopper the split kernel is launched as a programmatic
dependent of it (it waits for the append's writes before its first load), so its launch
overlaps the append.
"""

from __future__ import annotations

import torch
import triton

from ..call import DecodeTensors
from ..problem import DecodeProblem
from ..workspace import Workspace, stream_key
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

    ``self(tensors)`` launches the append kernel and returns the q the split kernel reads: the
    caller's, or its rotated copy in the stream's scratch (``workspace``: a fresh tensor while a
    CUDA graph is captured). ``pdl``: the kernel lets the split kernel launch early
    (``griddepcontrol.launch_dependents``); the split kernel must then wait for it.
    """

    def __init__(self, problem: DecodeProblem, workspace: Workspace, pdl: bool = False):
        self.problem = problem
        self.workspace = workspace
        self.pdl = pdl
        self.launch: Relaunch | None = None
        batch, seqlen_q, num_heads, head_dim = problem.batch, problem.seqlen_q, problem.num_heads, problem.head_dim
        self._q_shape = (batch, seqlen_q, num_heads, head_dim)
        itemsize = torch.empty((), dtype=problem.dtype).element_size()
        self._scratch_numel = -(-batch * seqlen_q * num_heads * head_dim * itemsize // 4)  # fp32 elements

    def rotated_q(self, q: torch.Tensor) -> torch.Tensor:
        """Scratch ``[B, L_q, H_q, D]`` in q's dtype, contiguous, for the rotated q."""
        if q.is_cuda:
            buffer = self.workspace.stream_buffer(stream_key(q.get_device()), self._scratch_numel)
        else:
            buffer = self.workspace.buffer(q.device, self._scratch_numel)
        numel = self._q_shape[0] * self._q_shape[1] * self._q_shape[2] * self._q_shape[3]
        return buffer[: self._scratch_numel].view(q.dtype)[:numel].view(self._q_shape)

    def __call__(self, tensors: DecodeTensors) -> torch.Tensor:
        q = tensors.q
        q_rot = self.rotated_q(q) if self.problem.has_rotary else None
        pointers = (tensors.k_new.data_ptr(), tensors.v_new.data_ptr(), tensors.k_cache.data_ptr(),
                    tensors.v_cache.data_ptr(), tensors.cache_seqlens.data_ptr(), _address(tensors.cache_leftpad),
                    _address(tensors.block_table), _address(tensors.cache_batch_idx), _address(tensors.rotary_cos),
                    _address(tensors.rotary_sin), q.data_ptr() if q_rot is not None else None, _address(q_rot),
                    _address(tensors.k_descale), _address(tensors.v_descale))
        if self.launch is not None:
            self.launch(pointers)
        else:
            self.launch = launch_append(tensors, q_rot, self.problem, self.pdl)
        return q if q_rot is None else q_rot


def launch_append(tensors: DecodeTensors, q_rot: torch.Tensor | None, problem: DecodeProblem,
                  pdl: bool = False) -> Relaunch | None:
    """Launch :func:`~flashsplit.triton.append_kernel.append_kv_kernel` for ``tensors`` (validated:
    ``k_new``, ``v_new`` and ``cache_seqlens`` given); ``q_rot``: where the rotated q goes (with
    rotary tables). Returns a :class:`Relaunch` of it where replays are possible."""
    q, k_cache, v_cache, k_new, v_new = tensors.q, tensors.k_cache, tensors.v_cache, tensors.k_new, tensors.v_new
    block_table, cos = tensors.block_table, tensors.rotary_cos
    batch, seqlen_new, num_heads_kv, head_dim = k_new.shape
    rotary = q_rot is not None
    block_d = max(16, triton.next_power_of_2(head_dim))
    heads = max(num_heads_kv, problem.num_heads if rotary else 1)
    block_h = max(1, min(triton.next_power_of_2(heads), TILE_ELEMENTS // block_d))
    fp8 = k_cache.dtype in FP8_FORMATS
    fp8_emin, fp8_mbits = FP8_FORMATS.get(k_cache.dtype, (0, 0))
    paged = block_table is not None
    grid = (max(seqlen_new, problem.seqlen_q if rotary else 0), batch, 3 if rotary else 2)  # keys, values, q
    pointers = (k_new, v_new, k_cache, v_cache, tensors.cache_seqlens, tensors.cache_leftpad, block_table,
                tensors.cache_batch_idx, cos, tensors.rotary_sin, q if rotary else None, q_rot,
                tensors.k_descale if fp8 else None, tensors.v_descale if fp8 else None)
    tail = (
        *k_new.stride()[:3], *v_new.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3],
        *(q.stride()[:3] if rotary else (0, 0, 0)), *_strides(q_rot, 3),
        *_strides(block_table, 1), *_strides(cos, 1),
        *_descale_strides(tensors.k_descale if fp8 else None), *_descale_strides(tensors.v_descale if fp8 else None),
        seqlen_new, problem.seqlen_q, num_heads_kv, problem.num_heads, head_dim, problem.seqlen_k, k_cache.shape[0],
        cos.shape[0] if rotary else 1, cos.shape[1] if rotary else 0,
        # constexprs, in the kernel's order
        block_h, block_d, k_cache.shape[1] if paged else 0, paged, problem.has_leftpad, problem.has_batch_idx,
        rotary, problem.rotary_interleaved, problem.rotary_q_per_token, fp8, fp8_emin, fp8_mbits,
        float(torch.finfo(k_cache.dtype).max) if fp8 else 0.0, pdl,
    )
    return launch(append_kv_kernel, grid, pointers, tail, dict(num_warps=4))
