"""The eager hot path of a prepared CuTe decode: a call's addresses in, its launches out.

Once a :class:`~flashsplit.cute.launcher.PreparedCuteDecode` has made its first launch, every
later call with the same call signature differs only in addresses and the stream: the shapes,
which optional tensors are given, the device and every address's residue mod 16 are part of
the signature. :func:`eager_path` builds, for one prepared decode, a function that reads just
those (the stream handle, the stream's workspace and arrival-counter addresses, one
``data_ptr()`` per tensor) and hands them to fixed launches whose sizes and strides were packed
once (:func:`~flashsplit.cute.fixed_launch.fixed_launch`).

It launches exactly what the general path (``PreparedCuteDecode.__call__``) launches, with the
same placeholders for arguments a configuration never reads, and declines (returns False, so
the general path runs) while a CUDA graph is being captured, inside
:class:`~flashsplit.workspace.transient_scratch`, or where the stream's workspace or counters
are not yet large enough.
"""

from __future__ import annotations

from collections.abc import Callable

from ..call import DecodeTensors
from ..workspace import _SCRATCH, _capturing, _raw_stream


def _launches_and_layout(prepared, tensors: DecodeTensors):
    """``(split, combine, rows, workspace numel, lp offset, lse offset)`` of ``prepared``'s eager
    launches for calls like ``tensors``: new fixed launches (combine None where the split kernel
    merges or writes the outputs), the output rows, the fp32 elements the launches take from the
    stream's workspace, and the byte offsets there of the partial LSEs (after the partial outputs)
    and of the lse scratch (after them); None where this configuration has no eager path (new
    keys appended in the call, no fast launcher)."""
    if prepared.variant.seqlen_new or _raw_stream is None:
        return None
    split = prepared.split.fixed()
    combine = prepared.combine.fixed() if prepared.combine is not None else None
    if split is None or (prepared.combine is not None and combine is None):
        return None
    batch, seqlen_q, num_heads, head_dim = tensors.q.shape
    rows = batch * seqlen_q * num_heads
    partial_rows = 0 if prepared.direct else prepared.num_splits * rows
    numel = partial_rows * (head_dim + 1) + rows * (tensors.lse is None) or 1
    lp_offset = partial_rows * head_dim * 4
    return split, combine, rows, numel, lp_offset, lp_offset + partial_rows * 4


def eager_path(prepared, tensors: DecodeTensors, device_index: int) -> Callable[[DecodeTensors], bool] | None:
    """``run(tensors) -> bool`` for calls of ``prepared``'s signature on CUDA device
    ``device_index`` (``tensors``: one such call, after its first launch), or None where this
    configuration has no eager path (new keys appended in the call, no fast launcher)."""
    layout = _launches_and_layout(prepared, tensors)
    if layout is None:
        return None
    split, combine, rows, numel, lp_offset, lse_offset = layout
    variant = prepared.variant
    full = prepared.split.full_seqlens
    full_ptr = full.data_ptr() if full is not None else 0
    workspaces = prepared.launcher.workspace.addresses
    counters = prepared.launcher.arrivals.addresses
    has_leftpad, has_batch_idx = variant.has_leftpad, variant.has_batch_idx
    merge = prepared.tile.merge and not prepared.direct
    direct = prepared.direct
    scratch, capturing, raw_stream, index = _SCRATCH, _capturing, _raw_stream, device_index

    def run(tensors: DecodeTensors) -> bool:
        if scratch.transient or capturing():
            return False
        stream = raw_stream(index)
        key = index, stream
        workspace = workspaces.get(key)
        if workspace is None or workspace[0] < numel:
            return False
        if merge:
            arrivals = counters.get(key)
            if arrivals is None or arrivals[0] < rows:
                return False
        q, k, v, out, lse, seqlens, table, k_descale, v_descale, sinks = tensors[:10]
        op = workspace[1]
        lse_ptr = op + lse_offset if lse is None else lse.data_ptr()
        seqlens_ptr = full_ptr if seqlens is None else seqlens.data_ptr()
        if has_batch_idx:  # the dense cache read as one page per row: page cache_batch_idx[b]
            table_ptr = tensors[14].data_ptr()
        else:
            table_ptr = seqlens_ptr if table is None else table.data_ptr()
        leftpad_ptr = tensors[15].data_ptr() if has_leftpad else seqlens_ptr
        if direct:  # one split writes the final outputs
            o, lp = out.data_ptr(), lse_ptr
            merge_out, merge_lse, arrivals_ptr = o, lp, lp
        else:
            o, lp = op, op + lp_offset
            if merge:
                merge_out, merge_lse, arrivals_ptr = out.data_ptr(), lse_ptr, arrivals[1]
            else:
                merge_out, merge_lse, arrivals_ptr = o, lp, lp
        split_sinks = lp if sinks is None or combine is not None else sinks.data_ptr()
        split(q.data_ptr(), k.data_ptr(), v.data_ptr(), o, lp, seqlens_ptr, table_ptr,
              lp if k_descale is None else k_descale.data_ptr(), lp if v_descale is None else v_descale.data_ptr(),
              merge_out, merge_lse, arrivals_ptr, split_sinks, leftpad_ptr, stream)
        if combine is not None:
            combine(o, lp, out.data_ptr(), lse_ptr, lse_ptr if sinks is None else sinks.data_ptr(), stream)
        return True

    return run


def host_program(prepared, tensors: DecodeTensors):
    """What :func:`eager_path`'s ``run`` computes, as data for a native caller
    (:class:`flashsplit.native.HostStep`): a :class:`~flashsplit.native.steps.HostProgram` whose
    launches are ``[(fixed launch, sources)]``, one source ``(kind, field, offset)`` per per-call
    value (kinds of :mod:`flashsplit.native`; ``field`` indexes :class:`DecodeTensors`), or None
    where this configuration has no eager path. The fixed launches are new ones, for the caller
    alone. ``tensors``: one call of ``prepared``'s signature (which optional tensors it gives)."""
    from ..native import CONST, COUNTERS, STREAM, TENSOR, WORKSPACE
    from ..native.steps import HostProgram
    from .fastcall import _raise_cuda

    layout = _launches_and_layout(prepared, tensors)
    if layout is None:
        return None
    split, combine, rows, numel, lp_offset, lse_offset = layout
    variant = prepared.variant

    def field(name: str):
        return TENSOR, DecodeTensors._fields.index(name), 0

    full = prepared.split.full_seqlens
    lse = (WORKSPACE, 0, lse_offset) if tensors.lse is None else field("lse")
    seqlens = (CONST, 0, full.data_ptr() if full is not None else 0) if tensors.cache_seqlens is None \
        else field("cache_seqlens")
    if variant.has_batch_idx:
        table = field("cache_batch_idx")
    else:
        table = seqlens if tensors.block_table is None else field("block_table")
    leftpad = field("cache_leftpad") if variant.has_leftpad else seqlens
    merge = prepared.tile.merge and not prepared.direct
    if prepared.direct:
        o, lp = field("out"), lse
        merge_out, merge_lse, arrivals = o, lp, lp
    else:
        o, lp = (WORKSPACE, 0, 0), (WORKSPACE, 0, lp_offset)
        merge_out, merge_lse, arrivals = (field("out"), lse, (COUNTERS, 0, 0)) if merge else (o, lp, lp)
    no_sinks = tensors.sinks is None
    split_sinks = lp if no_sinks or combine is not None else field("sinks")
    stream = (STREAM, 0, 0)
    launches = [(split, (field("q"), field("k_cache"), field("v_cache"), o, lp, seqlens, table,
                         lp if tensors.k_descale is None else field("k_descale"),
                         lp if tensors.v_descale is None else field("v_descale"),
                         merge_out, merge_lse, arrivals, split_sinks, leftpad, stream))]
    if combine is not None:
        launches.append((combine, (o, lp, field("out"), lse, lse if no_sinks else field("sinks"), stream)))
    return HostProgram(tensors.q.get_device(), _raw_stream, _capturing, prepared.launcher.workspace.addresses,
                       prepared.launcher.arrivals.addresses, numel, rows if merge else 0, launches, _raise_cuda)
