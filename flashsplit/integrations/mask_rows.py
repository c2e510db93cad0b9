"""Each batch row's live keys, read from a boolean attention mask on the device (no host sync).

A decode step in transformers hands its attention a mask ``[B, 1, L_q, L_k]`` (True: the query
may attend to the key) over the cache it returns: a DynamicCache's live tensor, or a
StaticCache's whole buffer, where only the mask says which slots hold tokens and left padding
leaves pads at the front of every row. When generating, a row's visible keys are one run
``[first, last]`` per query (causal, maybe windowed), so the union over the queries of a row is
``[leftpad, seqlen)``: the ``cache_leftpad`` and ``cache_seqlens`` :func:`flashsplit.decode`
takes, with the queries at the row's last ``L_q`` positions (bottom-right causal alignment).
"""

from __future__ import annotations

import torch


def rows_from_mask(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cache_seqlens, cache_leftpad)``, int32 ``[B]`` each, of a boolean ``mask`` ``[B, 1, L_q, L_k]``
    (or ``[B, L_q, L_k]``; any strides, a broadcast batch or query dim included).

    ``cache_seqlens[b]`` is one past the last key any query of row b sees, ``cache_leftpad[b]``
    the first such key; a row that sees no key gets ``(0, 0)``. Tensor ops only: capturable
    in a CUDA graph, traceable by torch.compile.
    """
    ends, starts = _run_of(_seen_keys(mask))
    return ends.to(torch.int32), starts.to(torch.int32)


def rows_and_holes(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`rows_from_mask`'s ``(cache_seqlens, cache_leftpad)`` and a bool ``[B]``: the rows whose
    visible keys are not that one run (a right-padded prompt, a custom mask with holes), where
    flashsplit would attend keys the mask hides. Tensor ops only."""
    seen = _seen_keys(mask)
    ends, starts = _run_of(seen)
    holes = seen.sum(dim=-1, dtype=torch.int64) != ends - starts
    return ends.to(torch.int32), starts.to(torch.int32), holes


def _seen_keys(mask: torch.Tensor) -> torch.Tensor:
    """bool ``[B, L_k]``: the keys some query of the row sees."""
    if mask.dtype != torch.bool:
        raise TypeError(f"mask: expected a bool tensor, got {mask.dtype}")
    if mask.dim() == 4:
        if mask.shape[1] != 1:
            raise ValueError(f"mask: expected one head ([B, 1, L_q, L_k]), got shape {tuple(mask.shape)}")
        mask = mask[:, 0]
    if mask.dim() != 3:
        raise ValueError(f"mask: expected [B, 1, L_q, L_k] or [B, L_q, L_k], got shape {tuple(mask.shape)}")
    return mask.any(dim=1)


def _run_of(seen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ``(ends, starts)`` ``[B]`` of the run that covers each row's ``seen`` keys."""
    # int64 throughout (the dtype of sizes), cast once at the end: recompiled with symbolic sizes,
    # an int32 select against the key count became, in Inductor's looped reduction (torch 2.11),
    # an int64 update of an int32 accumulator, which Triton refuses to compile.
    slots = torch.arange(1, seen.shape[-1] + 1, dtype=torch.int64, device=seen.device)
    none = torch.zeros((), dtype=torch.int64, device=seen.device)
    ends = torch.where(seen, slots, none).amax(dim=-1)  # one past the last seen key; 0 for none
    starts = torch.where(seen, slots - 1, none + seen.shape[-1]).amin(dim=-1)
    return ends, torch.minimum(starts, ends)  # a row with no key: (0, 0)


class MaskHoleError(ValueError):
    """A decode step's attention mask hides keys inside a row's run of live keys."""


class RowsCache:
    """:func:`rows_from_mask` once per mask: transformers hands every layer of a type the same mask
    tensor in a forward, so an eager decode step reads it once per layer type, not once per layer
    (its reductions are several small kernels, whose launches would add to every layer's host time).

    An entry is keyed by the mask's identity and version counter (an in-place change is a miss) and
    holds a reference to the mask, so an id is never reused while its entry lives; a few entries
    are kept. Under torch.compile or a CUDA graph capture it computes every time: the compiler
    merges the repeats, and a capture must record the reductions it replays.

    Eager calls also check each new mask for rows with holes (:func:`rows_and_holes`), without a
    host sync: the flag is copied to pinned memory behind an event, and a later call whose event
    has completed raises :class:`MaskHoleError` (on a CPU mask, the call itself raises).
    """

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._entries: dict[tuple[int, int], tuple] = {}
        self._pending: list[tuple] = []  #: (event, pinned flag [B] bool) of masks not yet read

    def __call__(self, mask: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cache_seqlens, cache_leftpad)`` of ``mask`` for a batch of ``batch`` rows (a mask
        broadcast over the batch gives each row its values)."""
        if torch.compiler.is_compiling() or (mask.is_cuda and torch.cuda.is_current_stream_capturing()):
            return _for_batch(*rows_from_mask(mask), batch)
        self._raise_for_holes_seen()
        key = (id(mask), mask._version)
        entry = self._entries.get(key)
        if entry is not None and entry[0] is mask and entry[1] == batch:
            return entry[2], entry[3]
        if len(self._entries) >= self.size:
            self._entries.clear()
        seqlens, leftpad, holes = rows_and_holes(mask)
        self._check_holes(holes)
        seqlens, leftpad = _for_batch(seqlens, leftpad, batch)
        self._entries[key] = (mask, batch, seqlens, leftpad)
        return seqlens, leftpad

    def _check_holes(self, holes: torch.Tensor) -> None:
        if not holes.is_cuda:
            _raise_if_holes(holes)
            return
        flag = torch.empty(holes.shape, dtype=torch.bool, pin_memory=True)
        flag.copy_(holes, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._pending.append((event, flag))

    def _raise_for_holes_seen(self) -> None:
        while self._pending and self._pending[0][0].query():
            _, flag = self._pending.pop(0)
            _raise_if_holes(flag)

    def clear(self) -> None:
        self._entries.clear()
        self._pending.clear()


def _raise_if_holes(holes: torch.Tensor) -> None:
    if holes.any():
        rows = holes.nonzero().flatten().tolist()
        raise MaskHoleError(
            f"attention_mask: in row(s) {rows[:8]} a decode step's visible keys are not one run of live keys "
            "[leftpad, seqlen): the mask hides keys inside it (a right-padded prompt? pad on the left: "
            "tokenizer.padding_side = 'left'). flashsplit would attend the hidden keys; pass such a mask as an "
            "additive float mask (it goes to SDPA) or use another attention implementation")


def _for_batch(seqlens: torch.Tensor, leftpad: torch.Tensor, batch: int):
    if seqlens.shape[0] != batch:  # a mask broadcast over the batch
        seqlens, leftpad = seqlens.expand(batch).contiguous(), leftpad.expand(batch).contiguous()
    return seqlens, leftpad
