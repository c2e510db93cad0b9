"""The GPU a decode runs on, or is planned for: its SM count and compute capability.

``decode`` reads these off the tensors' CUDA device; :func:`flashsplit.plan` can also plan for a
named GPU from a machine without one (``plan(..., gpu="h200")``), so a laptop shows what an H200
will run. Both the split heuristic (how many CTAs fill the machine) and backend selection (the
cute backend needs sm_90) read only this object, never the local device, once it is built.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuTarget:
    """A CUDA GPU as planning sees it."""

    name: str
    num_sms: int
    capability: tuple[int, int]

    @property
    def arch(self) -> str:
        """``"sm_90"`` style name of the compute capability."""
        return f"sm_{self.capability[0]}{self.capability[1]}"


#: GPUs :func:`gpu_target` knows by name (SM counts and capabilities from the vendors' datasheets).
KNOWN_GPUS: dict[str, GpuTarget] = {
    "h200": GpuTarget("NVIDIA H200", 132, (9, 0)),
    "h100": GpuTarget("NVIDIA H100 80GB HBM3", 132, (9, 0)),  # the SXM part, as CUDA names it
    "h100-pcie": GpuTarget("NVIDIA H100 PCIe", 114, (9, 0)),
    "h20": GpuTarget("NVIDIA H20", 78, (9, 0)),
    "a100": GpuTarget("NVIDIA A100", 108, (8, 0)),
    "l40s": GpuTarget("NVIDIA L40S", 142, (8, 9)),
}
#: What planning assumes for a CUDA problem when no GPU is present and none is named.
DEFAULT_GPU = "h200"


def gpu_target(gpu: str | GpuTarget) -> GpuTarget:
    """A :class:`GpuTarget` by name (one of :data:`KNOWN_GPUS`, case-insensitive), or ``gpu`` itself.

    >>> gpu_target("H200")
    GpuTarget(name='NVIDIA H200', num_sms=132, capability=(9, 0))
    """
    if isinstance(gpu, GpuTarget):
        return gpu
    if not isinstance(gpu, str):
        raise TypeError(f"gpu: expected a GPU name or a GpuTarget, got {type(gpu).__name__}")
    target = KNOWN_GPUS.get(gpu.lower())
    if target is None:
        raise ValueError(f"gpu: expected one of {sorted(KNOWN_GPUS)} (or a GpuTarget), got {gpu!r}")
    return target


@functools.lru_cache(maxsize=None)
def device_target(index: int | None = None) -> GpuTarget:
    """The CUDA device ``index`` (the current one when None) as a :class:`GpuTarget`; the
    :data:`DEFAULT_GPU` when CUDA is not available (planning from a machine without a GPU)."""
    import torch

    if not torch.cuda.is_available():
        return KNOWN_GPUS[DEFAULT_GPU]
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    return GpuTarget(props.name, props.multi_processor_count, (props.major, props.minor))
