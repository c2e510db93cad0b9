"""Without a CUDA device, ``import flashsplit`` chooses the Triton interpreter for the process
and says so once, when it first runs a kernel on CPU tensors; a choice the user made
(``TRITON_INTERPRET`` set, or triton imported first) stands.

Each case runs in a fresh process with CUDA hidden, since the choice is made once per process.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Run in the child: import (optionally triton first), report the state, define a user kernel,
# and run one decode (ragged lengths, several splits) against the float64 reference.
CHILD = r"""
import json, os, sys, warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    if sys.argv[1] == "triton-first":
        import triton
    import torch
    import flashsplit
from flashsplit.testing import POISON, check_against_reference
from flashsplit.triton import interpreter_active
import triton
import triton.language as tl


@triton.jit
def user_kernel(X):
    tl.store(X, tl.load(X) + 1)


def interpreter_warnings(caught):
    return [str(w.message) for w in caught if "TRITON_INTERPRET" in str(w.message)]


report = {
    "env": os.environ.get("TRITON_INTERPRET"),
    "import_warnings": interpreter_warnings(caught),
    "plan": str(flashsplit.plan(2, 300, 8, 2, 64, dtype=torch.float16)) if interpreter_active() else None,
    "interpreter_active": interpreter_active(),
    "user_kernel": type(user_kernel).__name__,
}
g = torch.Generator().manual_seed(7)
q = torch.randn(2, 1, 8, 64, dtype=torch.float16, generator=g)
k = torch.randn(2, 300, 2, 64, dtype=torch.float16, generator=g)
v = torch.randn(2, 300, 2, 64, dtype=torch.float16, generator=g)
seqlens = torch.tensor([300, 129], dtype=torch.int32)
out = torch.full_like(q, POISON)
with warnings.catch_warnings(record=True) as caught:
    try:
        flashsplit.decode(q, k, v, cache_seqlens=seqlens, num_splits=3, out=out)
        report["decode_err"] = check_against_reference(out, None, q, k, v, seqlens)
        flashsplit.decode(q, k, v, cache_seqlens=seqlens, num_splits=2)
    except ValueError as e:
        report["decode_error"] = str(e)
report["warnings"] = interpreter_warnings(caught)
report["warned_at"] = [os.path.basename(w.filename) for w in caught if "TRITON_INTERPRET" in str(w.message)]
print(json.dumps(report))
"""


def _child_env(interpret: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # no CUDA device, also on a GPU machine
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    if interpret is not None:
        env["TRITON_INTERPRET"] = interpret
    return env


def _run_child(tmp_path, interpret: str | None, triton_first: bool = False) -> dict:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    result = subprocess.run([sys.executable, str(script), "triton-first" if triton_first else "plain"],
                            env=_child_env(interpret), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_import_without_cuda_chooses_the_interpreter_and_warns_at_the_first_cpu_decode(tmp_path):
    report = _run_child(tmp_path, interpret=None)
    assert report["env"] == "1"
    assert report["import_warnings"] == []  # importing (and planning) decodes nothing: nothing to say yet
    assert report["plan"].startswith("on the CPU (Triton interpreter)")
    assert len(report["warnings"]) == 1, report["warnings"]  # two decodes, one warning
    assert report["warned_at"] == ["child.py"]  # the user's decode call, not flashsplit's insides
    assert "process-wide" in report["warnings"][0]
    assert report["interpreter_active"] is True
    # The interpreter is a process-wide mode: the warning says the user's kernels use it too.
    assert report["user_kernel"] == "InterpretedFunction"
    assert report["decode_err"] < 1e-2, report


def test_user_set_interpreter_is_kept_without_a_warning(tmp_path):
    report = _run_child(tmp_path, interpret="1")
    assert report["env"] == "1"
    assert report["import_warnings"] == report["warnings"] == []
    assert report["interpreter_active"] is True
    assert report["user_kernel"] == "InterpretedFunction"
    assert report["decode_err"] < 1e-2, report


@pytest.mark.parametrize("interpret,triton_first", [("0", False), (None, True)], ids=["interpret-0", "triton-first"])
def test_interpreter_left_off_refuses_cpu_tensors_clearly(tmp_path, interpret, triton_first):
    """TRITON_INTERPRET=0, or triton imported before flashsplit (its library already compiled):
    the user's kernels compile as usual and decode on CPU tensors says how to get the interpreter."""
    report = _run_child(tmp_path, interpret=interpret, triton_first=triton_first)
    assert report["env"] == interpret
    assert report["import_warnings"] == report["warnings"] == []
    assert report["interpreter_active"] is False
    assert report["user_kernel"] == "JITFunction"
    error = report["decode_error"]
    assert "TRITON_INTERPRET=1" in error and "before triton is first imported" in error


@pytest.mark.parametrize("command", [["bench", "--dry-run", "--batch", "1", "--seqlen", "1k"], ["demo"]],
                         ids=["bench-dry-run", "demo"])
def test_the_command_line_does_not_warn(command):
    """``python -m flashsplit`` runs no Triton code but flashsplit's: the interpreter is chosen
    without a warning, also when the demo decodes on the CPU."""
    result = subprocess.run([sys.executable, "-m", "flashsplit", *command], env=_child_env(None), capture_output=True,
                            text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TRITON_INTERPRET" not in result.stderr and "Warning" not in result.stderr, result.stderr[-3000:]
    assert ("cells" if command[0] == "bench" else "max |out - float64 reference|") in result.stdout
