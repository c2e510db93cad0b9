"""``torch.ops.flashsplit.decode_into``: decode as a PyTorch custom operator, for torch.compile.

Dynamo cannot trace through Triton's or CuteDSL's launchers, so under ``torch.compile``
:func:`flashsplit.decode` allocates its outputs in the graph and calls this operator, which
the compiler treats as one opaque node (no graph break). Its arguments are the fields of
:class:`~flashsplit.call.DecodeTensors` then :class:`~flashsplit.call.DecodeOptions`, in that
order (the schema is generated from them). ``torch.ops.flashsplit.decode_append_into`` is the same
operator for calls that write new keys into the cache (``k_new``/``v_new``): its schema also marks
``k_cache`` and ``v_cache`` mutated, which ``decode_into``'s does not, so a plain decode never makes
the compiler treat a cache as written. Eager calls do not go through the dispatcher at all: its
per-call cost would count against the decode step's host time.

The operator launches inside :class:`~flashsplit.workspace.transient_scratch`: its partials
and counters are fresh tensors dropped when it returns, never the per-stream
buffers eager calls reuse. A compiled graph may run its operators with the allocator routed to a
CUDA-graph pool without a capture in progress (the eager warm-up of torch.compile's cudagraph
trees, ``mode="reduce-overhead"`` and transformers' static-cache generation); a buffer kept
from such a call would be pool memory no graph output owns, which cudagraph trees refuse. For the same reason a call without ``cache_seqlens`` gets its
full lengths as a tensor of the call, not one a backend keeps.
"""

from __future__ import annotations

import torch

from . import dispatch
from .call import DecodeOptions, DecodeTensors, cache_capacity, operator_schema
from .workspace import transient_scratch

_LIBRARY = torch.library.Library("flashsplit", "DEF")
_LIBRARY.define("decode_into" + operator_schema())
_LIBRARY.define("decode_append_into" + operator_schema(appends=True))
_TENSORS = len(DecodeTensors._fields)


def _decode_into(*args) -> None:
    """Write ``decode(...)`` into ``out`` (and ``lse`` when given); validates like ``decode``."""
    options = DecodeOptions(*args[_TENSORS:])
    # The dispatcher hands lists over as int[] arguments: the options keep tuples (hashable).
    options = options._replace(window_size=tuple(options.window_size))
    tensors = DecodeTensors(*args[:_TENSORS])
    if tensors.cache_seqlens is None and _full_length_applies(tensors):
        # Every slot live: the lengths as a tensor of this call (a backend would otherwise keep one).
        capacity = cache_capacity(tensors.k_cache, tensors.block_table)
        tensors = tensors._replace(cache_seqlens=torch.full((tensors.q.shape[0],), capacity, dtype=torch.int32,
                                                            device=tensors.q.device))
    with transient_scratch():  # no buffer outlives the call (it may run in a graph pool)
        dispatch.decode_into(tensors, options)


def _full_length_applies(tensors: DecodeTensors) -> bool:
    """Whether the call is a decode without an append whose shapes can be read (else validation
    explains what is wrong: an append needs its lengths)."""
    q, k, table = tensors.q, tensors.k_cache, tensors.block_table
    return (tensors.k_new is None and isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.dim() == 4
            and k.dim() == 4 and (table is None or (isinstance(table, torch.Tensor) and table.dim() == 2)))


def _decode_into_fake(*args) -> None:
    return None


for _name in ("decode_into", "decode_append_into"):
    _LIBRARY.impl(_name, _decode_into, "CompositeExplicitAutograd")
    torch.library.register_fake(f"flashsplit::{_name}", _decode_into_fake, lib=_LIBRARY)
decode_into = torch.ops.flashsplit.decode_into
decode_append_into = torch.ops.flashsplit.decode_append_into
