"""The README's Python examples run as written: the CPU one here (fp16, through the Triton
interpreter), every GPU one on a CUDA machine; each defines every name it uses."""

from __future__ import annotations

import ast
import builtins
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashsplit.testing import check_against_reference

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, re.S | re.M)
CPU_BLOCKS = [b for b in BLOCKS if "cuda" not in b]
GPU_BLOCKS = [b for b in BLOCKS if "cuda" in b]


def _where(block: str) -> str:
    """The README line the block starts on, as a test id."""
    return f"README.md:{README[:README.index(block)].count(chr(10)) + 1}"


def _undefined_names(block: str) -> set[str]:
    """Names ``block`` reads but neither assigns, imports nor gets from builtins."""
    tree = ast.parse(block)
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read - bound


def _run(block: str, name: str) -> dict:
    namespace: dict = {"__name__": "__readme__"}
    exec(compile(block, f"README.md ({name})", "exec"), namespace)
    return namespace


def test_the_readme_has_one_cpu_example_and_several_gpu_ones():
    assert len(CPU_BLOCKS) == 1 and len(GPU_BLOCKS) >= 3, [_where(b) for b in BLOCKS]
    intro = README[:README.index(CPU_BLOCKS[0])].rsplit("\n\n", 2)[-2]
    assert "fp16" in intro and "bf16 needs a CUDA GPU" in intro, intro


@pytest.mark.parametrize("block", BLOCKS, ids=[_where(b) for b in BLOCKS])
def test_every_example_defines_what_it_uses(block):
    assert _undefined_names(block) == set()


def test_the_undefined_name_check_finds_one():
    assert _undefined_names("import torch\nq = torch.randn(2)\nout = f(q, sinks=sinks)\n") == {"f", "sinks"}


@pytest.mark.cpu
def test_the_cpu_example_runs_on_the_cpu(capsys):
    ns = _run(CPU_BLOCKS[0], "CPU example")
    printed = capsys.readouterr().out
    q, k, v, seqlens = ns["q"], ns["k_cache"], ns["v_cache"], ns["cache_seqlens"]
    assert q.device.type == "cpu" and q.dtype == torch.float16
    check_against_reference(ns["out"], ns["lse"], q, k, v, seqlens)
    assert "on the CPU (Triton interpreter): backend triton" in printed, printed
    assert "on NVIDIA H200: backend" in printed, printed


@pytest.mark.gpu
@pytest.mark.parametrize("block", GPU_BLOCKS, ids=[_where(b) for b in GPU_BLOCKS])
def test_every_gpu_example_runs_on_a_gpu(block):
    if "transformers" in block:
        pytest.importorskip("transformers")
    ns = _run(block, _where(block))
    torch.cuda.synchronize()
    out = ns["out"]
    assert out.is_cuda and torch.isfinite(out.float()).all()


def test_the_example_without_transformers_names_the_extra():
    """``python examples/generate.py`` without transformers: the extra to install, no traceback."""
    hide = ("import runpy, sys; sys.modules['transformers'] = None; sys.argv = ['examples/generate.py']; "
            "runpy.run_path('examples/generate.py', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", hide], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    assert 'pip install "flashsplit[transformers]"' in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""
