"""What GPU the bench runs on: name, SMs, L2 size and datasheet HBM bandwidth."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..plan import DEFAULT_NUM_SMS
from .cases import DEFAULT_L2_BYTES

#: Datasheet HBM bandwidth in bytes/s, matched by substring of the device name, first match
#: wins (so "GH200" is listed before "H200" and the H100 variants before plain "H100").
DATASHEET_BANDWIDTH: tuple[tuple[str, float], ...] = (
    ("GH200", 4.9e12),          # 144 GB HBM3e variant (the 96 GB HBM3 one has 4.0 TB/s)
    ("H200", 4.8e12),
    ("H100 NVL", 3.9e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),          # SXM5 80 GB HBM3
    ("H20", 4.0e12),
    ("B200", 8.0e12),
    ("A100-SXM4-40GB", 1.555e12),
    ("A100-PCIE-40GB", 1.555e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100", 2.039e12),         # SXM4 80 GB
    ("L40S", 0.864e12),
)
#: Used (with a note) for a device the table does not know: an H200's figure.
DEFAULT_DATASHEET_BANDWIDTH = 4.8e12


def cuda_available() -> bool:
    """Whether a CUDA GPU is usable (one place, so tests can monkeypatch it)."""
    return torch.cuda.is_available()


def synchronize() -> None:
    """Wait for the GPU (no-op without one, so the runner's logic also runs on CPU tensors in tests)."""
    if cuda_available():
        torch.cuda.synchronize()


def datasheet_bandwidth(device_name: str) -> tuple[float, str]:
    """``(bytes/s, note)`` for ``device_name``; unknown devices get 4.8e12 and a note saying so."""
    for key, bandwidth in DATASHEET_BANDWIDTH:
        if key.lower() in device_name.lower():
            return bandwidth, f"datasheet {bandwidth / 1e12:.2f} TB/s ({key})"
    return DEFAULT_DATASHEET_BANDWIDTH, (f"datasheet bandwidth unknown for {device_name!r}: "
                                         f"assumed {DEFAULT_DATASHEET_BANDWIDTH / 1e12:.1f} TB/s (an H200's)")


@dataclass(frozen=True)
class DeviceInfo:
    """The facts of the timing device that shape the bench (or an H200's, without a GPU)."""

    name: str
    num_sms: int
    l2_bytes: int
    total_memory: int
    datasheet_bw: float
    datasheet_note: str
    is_cuda: bool


def device_info() -> DeviceInfo:
    """The current CUDA device, or an H200 stand-in (``is_cuda=False``) for dry runs."""
    if not cuda_available():
        bw, note = datasheet_bandwidth("H200")
        return DeviceInfo("no CUDA GPU (planning for an H200)", DEFAULT_NUM_SMS, DEFAULT_L2_BYTES,
                          141 * 10**9, bw, note, False)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    bw, note = datasheet_bandwidth(props.name)
    l2 = int(getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES)
    return DeviceInfo(props.name, props.multi_processor_count, l2, int(props.total_memory), bw, note, True)
