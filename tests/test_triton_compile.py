"""Triton kernel variants compile for sm_90 (no GPU needed: ptxas ships with triton); every one under --full.

The interpreter that runs the CPU tests never compiles, and it accepts code the compiler
rejects; this caught a single-split variant that only failed on the GPU.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest


#: The default run compiles one variant in this many (about 35 of 260, ~40 s on two cores);
#: ``pytest --full`` compiles every one (~200 s).
DEFAULT_EVERY = 8


@pytest.mark.skipif(sys.platform != "linux", reason="triton's sm_90 toolchain ships for Linux")
@pytest.mark.parametrize("every", [DEFAULT_EVERY, pytest.param(1, marks=pytest.mark.full)])
def test_triton_variants_compile_for_sm90(every):
    repo = Path(__file__).resolve().parents[1]  # this tree's flashsplit, whatever else is installed
    path = os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": path}
    script = Path(__file__).with_name("triton_sm90_compile.py")
    result = subprocess.run([sys.executable, str(script), "--every", str(every)], env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    last = result.stdout.splitlines()[-1]
    assert last.startswith("compiled ") and int(last.split()[1]) > 0, last
