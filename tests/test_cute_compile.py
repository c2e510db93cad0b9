"""CuTe kernels compile to sm_90a on a CPU-only machine (no launch), and supports() explains refusals.

``CUTE_DSL_ARCH=sm_90a`` must be set before cutlass is first imported; this module sets it when
it is unset (a GPU machine that already imported cutlass for its own arch skips the PTX checks).
Every configuration the dispatcher can select is compiled once, its PTX dumped and checked for
the two instructions the design rests on: ``wgmma.mma_async`` (warpgroup MMA) and
``cp.async.bulk.tensor`` (TMA loads). Compile times are printed (``pytest -s``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from flashsplit.cute import CuteBackend, all_combine_configs, all_split_configs
from flashsplit.problem import DecodeProblem

_HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
needs_cutlass = pytest.mark.skipif(not _HAS_CUTLASS, reason="nvidia-cutlass-dsl is not installed")


def _arch_ok() -> bool:
    if "cutlass" not in sys.modules:
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    return os.environ.get("CUTE_DSL_ARCH", "sm_90a") == "sm_90a"


def _ptx(dump_dir: Path) -> str:
    files = list(dump_dir.glob("*.ptx"))
    assert files, f"no PTX written under {dump_dir}"
    return "\n".join(f.read_text() for f in files)


@needs_cutlass
@pytest.mark.parametrize("config", all_split_configs(), ids=str)
def test_split_kernel_compiles_to_wgmma_and_tma(config, tmp_path):
    if not _arch_ok():
        pytest.skip("CUTE_DSL_ARCH is set to another arch")
    from flashsplit.cute.compile import compile_split

    t0 = time.perf_counter()
    compile_split(config, options=f"--keep-ptx --dump-dir={tmp_path}")
    print(f"\ncompile {config}: {time.perf_counter() - t0:.2f} s")
    ptx = _ptx(tmp_path)
    assert "wgmma.mma_async" in ptx
    assert "cp.async.bulk.tensor" in ptx
    assert ".minnctapersm" in ptx or config.units_per_sm == 1


@needs_cutlass
@pytest.mark.parametrize("config", all_combine_configs(), ids=str)
def test_combine_kernel_compiles(config, tmp_path):
    if not _arch_ok():
        pytest.skip("CUTE_DSL_ARCH is set to another arch")
    from flashsplit.cute.compile import compile_combine

    t0 = time.perf_counter()
    compile_combine(config, options=f"--keep-ptx --dump-dir={tmp_path}")
    print(f"\ncompile {config}: {time.perf_counter() - t0:.2f} s")
    assert ".entry" in _ptx(tmp_path)


def test_configs_fit_shared_memory():
    from flashsplit.cute.configs import check_smem

    for config in all_split_configs():
        check_smem(config)
        assert 128 % config.tile_n == 0


def test_import_does_not_import_cutlass():
    code = "import sys, flashsplit.cute; assert 'cutlass' not in sys.modules"
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


def _problem(**overrides) -> DecodeProblem:
    fields = dict(batch=1, seqlen_q=1, seqlen_k=4096, num_heads=32, num_heads_kv=8, head_dim=128,
                  dtype=torch.bfloat16, causal=False, has_cache_seqlens=True, device_type="cpu", aligned_16b=True)
    fields.update(overrides)
    return DecodeProblem(**fields)


@pytest.mark.parametrize("overrides,needle", [
    (dict(head_dim=96), "head_dim 96"),
    (dict(head_dim=32), "head_dim 32"),
    (dict(dtype=torch.float32), "float16 or bfloat16"),
    (dict(aligned_16b=False), "16-byte"),
    (dict(), "CUDA device"),
])
def test_supports_reasons_on_cpu_problems(overrides, needle):
    if not _HAS_CUTLASS and needle == "CUDA device":
        needle = "not installed"
    reason = CuteBackend().supports(_problem(**overrides))
    assert reason is not None and needle in reason, reason


def test_supports_reason_without_cutlass(monkeypatch):
    import flashsplit.cute.backend as backend

    monkeypatch.setattr(backend, "cutlass_available", lambda: False)
    assert CuteBackend().supports(_problem()) == "nvidia-cutlass-dsl is not installed"


def test_backend_static_facts():
    b = CuteBackend()
    assert b.name == "cute" and b.priority == 10
    assert b.block_m(_problem()) == 64
    assert b.units_per_sm(_problem(head_dim=128)) == 2
    assert b.units_per_sm(_problem(head_dim=256)) == 1
