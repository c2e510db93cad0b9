"""Reusable scratch memory for the split partials, one buffer per (device, stream).

A decode step's partials live only between the split kernel and the combine, both on the
caller's current stream, so the next step on that stream may reuse the same memory: no allocator
call per step. While a CUDA graph is being captured a fresh tensor is returned instead (it then
belongs to the graph's private memory pool, so graphs never share scratch with each other or
with eager calls).
"""

from __future__ import annotations

import torch


class Workspace:
    def __init__(self) -> None:
        self._buffers: dict[tuple[int, int], torch.Tensor] = {}

    def get(self, device: torch.device, numel: int) -> torch.Tensor:
        """A float32 tensor of ``numel`` elements on ``device`` (contents undefined)."""
        return self.buffer(device, numel)[:numel]

    def buffer(self, device: torch.device, numel: int) -> torch.Tensor:
        """The stream's float32 buffer, of at least ``numel`` elements (keep a reference to it
        until the kernels that use it are enqueued: during a capture it is a fresh tensor)."""
        if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
            return torch.empty(numel, dtype=torch.float32, device=device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (index, torch._C._cuda_getCurrentRawStream(index))
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            # Grow geometrically so alternating shapes do not reallocate every step.
            size = numel if buffer is None else max(numel, 2 * buffer.numel())
            buffer = torch.empty(size, dtype=torch.float32, device=device)
            self._buffers[key] = buffer
        return buffer

    def clear(self) -> None:
        """Drop every cached buffer (their memory returns to torch's caching allocator)."""
        self._buffers.clear()
