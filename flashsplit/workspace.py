"""Reusable scratch memory for the split partials, one buffer per (device, stream).

A decode step's partials live only between the split kernel and the combine, both on the
caller's current stream, so the next step on that stream may reuse the same memory: no allocator
call per step. While a CUDA graph is being captured a fresh tensor is returned instead (it then
belongs to the graph's private memory pool, so graphs never share scratch with each other or
with eager calls).

Inside :class:`transient_scratch` (what ``torch.ops.flashsplit.decode_into`` runs its launches
in) every request is a fresh tensor that the call drops, and nothing is cached: a compiled graph
may run with the allocator routed to a graph pool that no capture announces (torch.compile's
cudagraph trees warm a graph up eagerly in its pool), and a buffer kept past the call would be
memory of that pool that no graph output accounts for, which cudagraph trees refuse ("Detected
... tensor(s) in the cudagraph pool not tracked as outputs").
"""

from __future__ import annotations

import threading

import torch


#: The current raw stream of a CUDA device index (absent from CPU builds of torch): the one
#: probe that :func:`stream_key`, the eager hot paths and the native host programs read per call.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_key(index: int) -> tuple[int, int]:
    """(CUDA device index, raw handle of its current stream): what the per-stream caches key on,
    and the stream the backends' prepared launches of that call go to."""
    return index, _raw_stream(index)


def _stream_key(device: torch.device) -> tuple[int, int]:
    return stream_key(device.index if device.index is not None else torch.cuda.current_device())


#: ``torch.cuda.is_current_stream_capturing`` without its Python wrapper (0.34 us per call on the
#: H200's host: it runs on every eager decode step); the wrapper where torch lacks CUDA.
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or torch.cuda.is_current_stream_capturing


class _Scratch(threading.local):
    transient = False  # per thread: cudagraph trees warm up and record on the calling thread


_SCRATCH = _Scratch()


class transient_scratch:
    """Context manager: while active on this thread, :class:`Workspace` and :class:`ArrivalCounters`
    hand out fresh tensors and keep none, so no allocation outlives the call that made it."""

    __slots__ = ("_previous",)

    def __enter__(self) -> "transient_scratch":
        self._previous = _SCRATCH.transient
        _SCRATCH.transient = True
        return self

    def __exit__(self, *exc) -> None:
        _SCRATCH.transient = self._previous


def scratch_is_transient() -> bool:
    """Whether this thread is inside :class:`transient_scratch`."""
    return _SCRATCH.transient


class Workspace:
    def __init__(self) -> None:
        self._buffers: dict[tuple[int, int], torch.Tensor] = {}
        #: stream key -> (numel, address) of its cached buffer: what an eager hot path reads
        #: instead of calling :meth:`stream_buffer` (it declines while capturing or transient).
        self.addresses: dict[tuple[int, int], tuple[int, int]] = {}

    def get(self, device: torch.device, numel: int) -> torch.Tensor:
        """A float32 tensor of ``numel`` elements on ``device`` (contents undefined)."""
        return self.buffer(device, numel)[:numel]

    def buffer(self, device: torch.device, numel: int) -> torch.Tensor:
        """The stream's float32 buffer, of at least ``numel`` elements (keep a reference to it
        until the kernels that use it are enqueued: during a capture it is a fresh tensor)."""
        if device.type != "cuda":
            return torch.empty(numel, dtype=torch.float32, device=device)
        return self.stream_buffer(_stream_key(device), numel)

    def stream_buffer(self, key: tuple[int, int], numel: int) -> torch.Tensor:
        """:meth:`buffer` for a CUDA device whose (index, raw current stream) the caller already
        has (:func:`stream_key`): the eager hot path, which also launches on that stream."""
        if _SCRATCH.transient or _capturing():
            return torch.empty(numel, dtype=torch.float32, device=torch.device("cuda", key[0]))
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            # Grow geometrically so alternating shapes do not reallocate every step.
            size = numel if buffer is None else max(numel, 2 * buffer.numel())
            buffer = torch.empty(size, dtype=torch.float32, device=torch.device("cuda", key[0]))
            self._buffers[key] = buffer
            self.addresses[key] = size, buffer.data_ptr()
        return buffer

    def clear(self) -> None:
        """Drop every cached buffer (their memory returns to torch's caching allocator)."""
        self._buffers.clear()
        self.addresses.clear()


class ArrivalCounters:
    """int32 counters that are zero between launches.

    A split kernel that merges in its last program counts each row's finished splits here and
    the last one sets the count back to zero, so counters zeroed once serve every later launch
    that cannot overlap with another user of them:

    - eager calls: one buffer per (device, stream) (launches on one stream never overlap);
    - calls captured into a CUDA graph: a slice of a per-device arena, zeroed when the first eager
      call made it, never handed out again (a graph may be replayed on any stream, beside eager
      calls and other graphs). Without an arena, or once it is used up, a fresh zeroed tensor
      (its memset is then a node of the graph);
    - inside :class:`transient_scratch` and not capturing: a fresh zeroed tensor, and no arena or
      buffer is made (it could be memory of a graph pool).
    """

    ARENA_COUNTERS = 1 << 20  # 4 MiB per device: ~500 captured calls of 64 rows x 32 q heads

    def __init__(self) -> None:
        self._buffers: dict[tuple[int, int], torch.Tensor] = {}
        #: stream key -> (numel, address) of its eager buffer (read by the eager hot paths).
        self.addresses: dict[tuple[int, int], tuple[int, int]] = {}
        self._arenas: dict[int, list] = {}  # device index -> [arena tensor, next free offset]

    def get(self, device: torch.device, numel: int) -> torch.Tensor:
        if device.type != "cuda":
            return torch.zeros(numel, dtype=torch.int32, device=device)
        key = _stream_key(device)
        index = key[0]
        if _capturing():
            arena = self._arenas.get(index)
            if arena is not None and arena[1] + numel <= arena[0].numel():
                arena[1] += numel
                return arena[0][arena[1] - numel: arena[1]]
            return torch.zeros(numel, dtype=torch.int32, device=device)
        if _SCRATCH.transient:
            return torch.zeros(numel, dtype=torch.int32, device=device)
        if index not in self._arenas:
            self._arenas[index] = [torch.zeros(self.ARENA_COUNTERS, dtype=torch.int32, device=device), 0]
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = torch.zeros(max(numel, 1024), dtype=torch.int32, device=device)
            self._buffers[key] = buffer
            self.addresses[key] = buffer.numel(), buffer.data_ptr()
        return buffer

    def for_queries(self, q: torch.Tensor) -> torch.Tensor:
        """Counters for one decode of ``q`` ``[B, L_q, H, D]``: one per split-kernel row tile
        ``[B, H_kv x row_blocks]``, bounded by one per (batch row, query position, q head)."""
        batch, seqlen_q, num_heads, _ = q.shape
        return self.get(q.device, batch * seqlen_q * num_heads)

    def address_for(self, key: tuple[int, int] | None, q: torch.Tensor) -> int:
        """``for_queries(q).data_ptr()``, where ``key`` is the :func:`stream_key` of a CUDA ``q``'s
        device and current stream (None for another device). The eager step's usual case (not
        capturing, not transient, the stream's buffer already large enough) skips the device
        object and the lookups of :meth:`get`: about 1 us of host time per merging launch on the
        H200's host."""
        batch, seqlen_q, num_heads, _ = q.shape
        known = None if key is None else self.addresses.get(key)
        if known is not None and known[0] >= batch * seqlen_q * num_heads and not _SCRATCH.transient \
                and not _capturing():
            return known[1]
        return self.for_queries(q).data_ptr()

    def clear(self) -> None:
        """Drop the eager buffers (the arena stays: captured graphs may still use its slices)."""
        self._buffers.clear()
        self.addresses.clear()


#: The counters both backends' in-kernel merges use (launches on one stream never overlap, so
#: they can share one buffer per stream and one arena per device).
ARRIVALS = ArrivalCounters()
