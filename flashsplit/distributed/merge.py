"""Merging the ranks' partial results (O, LSE) into every rank's final output, with collectives.

Each rank brings ``P`` local partials (1, or 2 when its shard was attended in two pieces):
outputs ``[B, L_q, H_q, D]`` in q's dtype and LSEs fp32 ``[B, H_q, L_q]`` (natural log, ``-inf``
for a partial that saw no key). Two ways to merge them, both ending with the same output on
every rank:

- ``"gather"``: one all-gather of every rank's outputs and LSEs (packed into one byte buffer),
  then a local :func:`flashsplit.combine` of the ``W * P`` partials.
- ``"reduce"``: an all-gather of the LSEs, from which each rank computes the merged LSE and
  rescales its own outputs (fp32), then one all-reduce (sum) of the rescaled outputs.

Sinks join the merged softmax once (here, never in a rank's partials). Nothing reads tensor
values on the host: the merge can be captured in a CUDA graph with NCCL.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..api import combine

MERGES = ("gather", "reduce")


def merge_bytes(world_size: int, batch: int, seqlen_q: int, num_heads: int, head_dim: int,
                dtype: torch.dtype = torch.bfloat16, partials: int = 1) -> dict[str, int]:
    """Bytes each rank receives per merge, by a ring model of the collectives.

    ``gather``: ``(W - 1) * P * (4 M + e N)``, ``reduce``: ``(W - 1) * P * 4 M`` for the LSEs plus
    ``2 (W - 1) / W * 4 N`` for the fp32 all-reduce, with ``N = B * L_q * H_q * D`` output
    elements of ``e`` bytes (q's dtype) and ``M = B * H_q * L_q`` LSEs.
    """
    n_out = batch * seqlen_q * num_heads * head_dim
    n_lse = batch * num_heads * seqlen_q
    elem = torch.empty((), dtype=dtype).element_size()
    lse_bytes = (world_size - 1) * partials * 4 * n_lse
    return {"gather": lse_bytes + (world_size - 1) * partials * elem * n_out,
            "reduce": lse_bytes + (2 * (world_size - 1) * 4 * n_out) // max(world_size, 1)}


def choose_merge(world_size: int, batch: int, seqlen_q: int, num_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.bfloat16, partials: int = 1) -> str:
    """The merge that moves fewer bytes (:func:`merge_bytes`); ``"gather"`` on a tie (it is one
    collective, ``"reduce"`` two). With one partial per rank and 16-bit q: ``"gather"`` up to 4
    ranks, ``"reduce"`` beyond."""
    cost = merge_bytes(world_size, batch, seqlen_q, num_heads, head_dim, dtype, partials)
    return "gather" if cost["gather"] <= cost["reduce"] else "reduce"


def _gather_single(output: torch.Tensor, local: torch.Tensor, group) -> None:
    """All-gather ``local`` into ``output`` (``[W * n]``), by whichever name this torch has."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, local, group=group)


def merge_partials(outs: list[torch.Tensor], lses: list[torch.Tensor], *, group, world_size: int, merge: str,
                   sinks: torch.Tensor | None, out: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge every rank's ``outs``/``lses`` (as in the module docstring) into ``(out, lse)``:
    ``out`` ``[B, L_q, H_q, D]`` in the partials' dtype (written into ``out`` when given), ``lse``
    fp32 ``[B, H_q, L_q]``. A row no partial of any rank saw gets O = 0 and LSE = -inf (its sink
    with ``sinks``)."""
    o_local = torch.stack(outs)  # [P, B, L_q, H_q, D]
    lse_local = torch.stack(lses)  # [P, B, H_q, L_q]
    partials, batch, seqlen_q, num_heads, head_dim = o_local.shape
    if merge == "gather":
        if world_size > 1:
            packed = torch.cat([lse_local.reshape(-1).view(torch.uint8), o_local.reshape(-1).view(torch.uint8)])
            gathered = torch.empty(world_size * packed.numel(), dtype=torch.uint8, device=packed.device)
            _gather_single(gathered, packed, group)
            gathered = gathered.view(world_size, packed.numel())
            lse_bytes = lse_local.numel() * 4  # a multiple of 4: the outputs' bytes start aligned
            lse_all = gathered[:, :lse_bytes].contiguous().view(torch.float32)
            o_all = gathered[:, lse_bytes:].contiguous().view(o_local.dtype)
        else:
            lse_all, o_all = lse_local, o_local
        lse_all = lse_all.reshape(world_size * partials, batch, num_heads, seqlen_q)
        o_all = o_all.reshape(world_size * partials, batch, seqlen_q, num_heads, head_dim).float()
        return combine(o_all, lse_all, out=out, out_dtype=o_local.dtype, sinks=sinks)
    if world_size > 1:
        lse_all = torch.empty((world_size * partials, batch, num_heads, seqlen_q), dtype=torch.float32,
                              device=lse_local.device)
        _gather_single(lse_all, lse_local, group)
    else:
        lse_all = lse_local
    lse = torch.logsumexp(lse_all, dim=0)  # -inf where every partial is empty
    if sinks is not None:
        lse = torch.logaddexp(lse, sinks.float()[None, :, None])
    weights = torch.exp(lse_local - torch.where(torch.isneginf(lse), 0.0, lse))  # [P, B, H_q, L_q]
    weights = weights.permute(0, 1, 3, 2)[..., None]  # [P, B, L_q, H_q, 1]
    # An empty partial's output is never let in (selection, not multiplication by a zero weight).
    scaled = torch.where(weights > 0, weights * o_local.float(), 0.0).sum(0)
    if world_size > 1:
        dist.all_reduce(scaled, op=dist.ReduceOp.SUM, group=group)
    if out is None:
        return scaled.to(o_local.dtype), lse
    out.copy_(scaled)
    return out, lse
