"""Context-parallel decode: one sequence's KV cache sharded along its keys over the ranks of a
``torch.distributed`` process group, merged by LSE.

    import flashsplit.distributed
    out = flashsplit.distributed.cp_decode(q, k_shard, v_shard, cache_seqlens=local_lengths,
                                           kv_offset=first_key, causal=True)

Every rank holds the same q and its own shard of each row's keys; each runs
:func:`flashsplit.decode` on its shard and the ranks merge the partial results with collectives
(:mod:`flashsplit.distributed.merge`), so every rank ends with the same output, equal to a
single-GPU decode over the whole cache. See docs/distributed.md.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import dispatch
from ..call import DecodeOptions, DecodeTensors
from ..validation import check_decode_inputs
from .merge import MERGES, choose_merge, merge_bytes, merge_partials
from .shards import BULK_AND_TAIL, PER_QUERY, PLAIN, shard_layout, shard_partials

__all__ = ["cp_decode", "choose_merge", "merge_bytes", "shard_layout", "MERGES", "PLAIN", "BULK_AND_TAIL",
           "PER_QUERY"]

#: decode arguments cp_decode does not take, and why.
_REFUSED = {
    "k": "append new keys on the rank whose shard holds them, with flashsplit.decode(k=, v=) or a cache write, "
         "then call cp_decode",
    "v": "append new values on the rank whose shard holds them, then call cp_decode",
    "rotary_cos": "rotary embedding goes with the append (k/v), which cp_decode does not do",
    "rotary_sin": "rotary embedding goes with the append (k/v), which cp_decode does not do",
    "rotary_interleaved": "rotary embedding goes with the append (k/v), which cp_decode does not do",
    "cache_leftpad": "a shard's keys start at local key 0; kv_offset places them in the row",
}
#: decode arguments passed through, with their defaults.
_PASSED = {"softmax_scale": None, "causal": False, "num_splits": 0, "out": None, "block_table": None,
           "page_table": None, "k_descale": None, "v_descale": None, "window_size": (-1, -1), "softcap": 0.0,
           "sinks": None, "batch_invariant": False, "backend": "auto", "cache_batch_idx": None}

_VALIDATED = dispatch.SignatureCache(max_size=1024)  # call signature -> DecodeProblem: validated once


def cp_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *, group=None,
              cache_seqlens: torch.Tensor | None = None, kv_offset: torch.Tensor | None = None,
              return_lse: bool = False, merge: str | None = None, **decode_kwargs):
    """Decode attention over a KV cache sharded along the keys across the ranks of ``group``.

    Args:
        q: ``[B, L_q, H_q, D]``, the same on every rank (not checked: that needs a collective).
        k_cache, v_cache: this rank's shard, in any layout :func:`flashsplit.decode` takes: dense
            ``[B, L_k, H_kv, D]`` or paged ``[num_pages, page_size, H_kv, D]`` with
            ``block_table``; fp8 with ``k_descale``/``v_descale``. Local key ``j`` of row b is the
            row's key ``kv_offset[b] + j``.
        group: a ``torch.distributed`` ``ProcessGroup`` (default: the world). Every rank of it
            calls ``cp_decode`` with the same shapes and options.
        cache_seqlens: int32 ``[B]``: the shard's keys per row (default ``L_k``); 0 for a rank that
            holds none of a row. Clamped into ``[0, L_k]`` as decode does.
        kv_offset: int32 ``[B]`` on q's device: each row's global position of the shard's first
            key. The shards of a row must be a disjoint cover of ``[0, S)``, ``S`` the row's total
            length (not checked: that needs a host sync). Required with ``causal`` and ``L_q > 1``
            or with a ``window_size`` bound that can matter; otherwise keys are a set and any
            disjoint cover works (then ``kv_offset`` is unused).
        return_lse: also return the merged LSE, fp32 ``[B, H_q, L_q]``.
        merge: ``"gather"`` (one all-gather of outputs and LSEs, then a local
            :func:`flashsplit.combine`) or ``"reduce"`` (an all-gather of LSEs, then an all-reduce
            of fp32 rescaled outputs); default (None): the one that moves fewer bytes,
            :func:`choose_merge` (``"gather"`` up to 4 ranks for 16-bit q).
        decode_kwargs: :func:`flashsplit.decode`'s ``softmax_scale``, ``causal``, ``window_size``,
            ``softcap``, ``sinks`` (counted once over all ranks: they join the merge, never a
            rank's partials), ``block_table``/``page_table``, ``k_descale``/``v_descale``,
            ``cache_batch_idx``, ``num_splits``, ``batch_invariant``, ``backend`` and ``out``.
            The cache updates (``k``/``v``, rotary) and ``cache_leftpad`` are refused.

    Returns:
        ``out`` ``[B, L_q, H_q, D]`` in q's dtype, the same on every rank, and with ``return_lse``
        ``lse`` fp32 ``[B, H_q, L_q]``. A row with no key on any rank gives O = 0 and LSE = -inf
        (the sink with ``sinks``), as :func:`flashsplit.decode`.

    Causal masks with ``L_q > 1`` and sliding windows need each query's global position ``S -
    L_q + i``: one all-reduce (max) of ``kv_offset + cache_seqlens`` gives ``S`` on the device, and each
    rank expresses its shard's mask through decode's per-row ``cache_seqlens``/``cache_leftpad``
    (:mod:`flashsplit.distributed.shards`). Nothing synchronizes with the host, so a step can be
    captured in a CUDA graph with NCCL.
    """
    opts = _decode_options(decode_kwargs)
    group = _check_group(group, q)
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: expected a bool, got {type(return_lse).__name__}")
    block_table = opts["block_table"] if opts["block_table"] is not None else opts["page_table"]
    tensors = DecodeTensors(q, k_cache, v_cache, opts["out"], None, cache_seqlens, block_table, opts["k_descale"],
                            opts["v_descale"], opts["sinks"], cache_batch_idx=opts["cache_batch_idx"])
    window = opts["window_size"]
    options = DecodeOptions(opts["softmax_scale"], opts["causal"], opts["num_splits"], opts["backend"],
                            tuple(window) if isinstance(window, list) else window, opts["softcap"],
                            opts["batch_invariant"])
    problem = _validated(tensors, options)
    world_size = dist.get_world_size(group)
    layout = shard_layout(problem.seqlen_q, problem.window_left, problem.window_right)
    if kv_offset is not None or layout != PLAIN:
        _check_kv_offset(kv_offset, problem.batch, q.device, layout)
    partials = 2 if layout == BULK_AND_TAIL else 1
    if merge is None:
        merge = choose_merge(world_size, problem.batch, problem.seqlen_q, problem.num_heads, problem.head_dim,
                             q.dtype, partials)
    elif merge not in MERGES:
        raise ValueError(f"merge: expected one of {MERGES} or None (the cheaper), got {merge!r}")

    capacity = problem.seqlen_k
    if cache_seqlens is None:
        n = torch.full((problem.batch,), capacity, dtype=torch.int32, device=q.device)
    else:
        n = cache_seqlens.clamp(0, capacity)
    total = None
    if layout != PLAIN:
        total = (kv_offset + n).to(torch.int32)
        if world_size > 1:
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=group)
    outs, lses = shard_partials(
        q, k_cache, v_cache, layout=layout, n=n, cache_seqlens=cache_seqlens, kv_offset=kv_offset, total=total,
        capacity=capacity, window_left=problem.window_left, window_right=problem.window_right,
        block_table=block_table, cache_batch_idx=opts["cache_batch_idx"], k_descale=opts["k_descale"],
        v_descale=opts["v_descale"], num_splits=opts["num_splits"], batch_invariant=opts["batch_invariant"],
        backend=opts["backend"], softmax_scale=opts["softmax_scale"], softcap=opts["softcap"])
    out, lse = merge_partials(outs, lses, group=group, world_size=world_size, merge=merge, sinks=opts["sinks"],
                              out=opts["out"])
    return (out, lse) if return_lse else out


def _decode_options(decode_kwargs: dict) -> dict:
    """decode's keyword arguments with their defaults; refused and unknown ones raise."""
    for name in decode_kwargs:
        if name in _REFUSED:
            raise ValueError(f"{name}: not supported by cp_decode ({_REFUSED[name]})")
        if name not in _PASSED:
            raise TypeError(f"cp_decode() got an unexpected keyword argument {name!r}")
    opts = {**_PASSED, **decode_kwargs}
    if opts["page_table"] is not None and opts["block_table"] is not None:
        raise ValueError("page_table: an alias of block_table; pass one of them, not both")
    return opts


def _check_group(group, q):
    """The process group to merge over (the world for None)."""
    if group is None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("group: torch.distributed is not initialized; call torch.distributed."
                             "init_process_group() first or pass a ProcessGroup")
        group = dist.group.WORLD
    elif not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group: expected a torch.distributed ProcessGroup or None (the world), got "
                        f"{type(group).__name__}")
    if isinstance(q, torch.Tensor) and q.device.type != "cuda" and dist.get_backend(group) == "nccl":
        raise ValueError(f"q: the group's backend is nccl, which needs CUDA tensors; got q on {q.device}")
    return group


def _check_kv_offset(kv_offset, batch: int, device, layout: str) -> None:
    """``kv_offset``: int32 ``[B]`` on q's device; required unless every query sees every key."""
    if kv_offset is None:
        raise ValueError("kv_offset: required with causal=True and seqlen_q > 1, or with a window_size bound "
                         "(each query's global position depends on where the shard sits in the row); expected "
                         f"an int32 [{batch}] tensor of each row's first global key on this rank")
    if not isinstance(kv_offset, torch.Tensor):
        raise TypeError(f"kv_offset: expected an int32 torch.Tensor of shape [{batch}], got "
                        f"{type(kv_offset).__name__}")
    if kv_offset.dtype != torch.int32:
        raise TypeError(f"kv_offset: expected dtype int32, got {kv_offset.dtype}")
    if tuple(kv_offset.shape) != (batch,):
        raise ValueError(f"kv_offset: expected shape [{batch}], got {list(kv_offset.shape)}")
    if kv_offset.device != device:
        raise ValueError(f"kv_offset: expected q's device {device}, got {kv_offset.device}")


def _validated(tensors: DecodeTensors, options: DecodeOptions):
    """decode's validation of the shard's arguments (its errors name them), once per call signature."""
    return _VALIDATED.get_or_make(dispatch.signature(tensors, options), check_decode_inputs, tensors, options)
