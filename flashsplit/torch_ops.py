"""``torch.ops.flashsplit.decode_into``: decode as a PyTorch custom operator, for torch.compile.

Dynamo cannot trace through Triton's or CuteDSL's launchers, so under ``torch.compile``
:func:`flashsplit.decode` allocates its outputs in the graph and calls this operator, which
the compiler treats as one opaque node (no graph break). Its arguments are the fields of
:class:`~flashsplit.call.DecodeTensors` then :class:`~flashsplit.call.DecodeOptions`, in that
order (the schema is generated from them). Eager calls do not go through the dispatcher at all:
its per-call cost would count against the decode step's host time.
"""

from __future__ import annotations

import torch

from . import dispatch
from .call import DecodeOptions, DecodeTensors, operator_schema

_LIBRARY = torch.library.Library("flashsplit", "DEF")
_LIBRARY.define("decode_into" + operator_schema())
_TENSORS = len(DecodeTensors._fields)


def _decode_into(*args) -> None:
    """Write ``decode(...)`` into ``out`` (and ``lse`` when given); validates like ``decode``."""
    options = DecodeOptions(*args[_TENSORS:])
    # The dispatcher hands lists over as int[] arguments: the options keep tuples (hashable).
    options = options._replace(window_size=tuple(options.window_size))
    dispatch.decode_into(DecodeTensors(*args[:_TENSORS]), options)


def _decode_into_fake(*args) -> None:
    return None


_LIBRARY.impl("decode_into", _decode_into, "CompositeExplicitAutograd")
torch.library.register_fake("flashsplit::decode_into", _decode_into_fake, lib=_LIBRARY)
decode_into = torch.ops.flashsplit.decode_into
