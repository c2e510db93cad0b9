"""The ``flashsplit`` command line: help texts, sub-command wiring, and bad input that ends in an
argparse error (exit 2) instead of a traceback. ``bench``'s own options are in test_bench.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flashsplit
from flashsplit import __main__ as cli
from flashsplit import demo
from flashsplit.bench import cli as bench_cli

HAS_CUDA = torch.cuda.is_available()
REPO = Path(__file__).resolve().parents[1]


def _exit_code(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_top_level_help_names_each_command_with_an_example(capsys):
    code, out, _ = _exit_code(["--help"], capsys)
    assert code == 0
    assert "usage: flashsplit" in out and "Split-KV" in out
    for command in ("demo", "bench"):
        assert f"    {command}  " in out, f"{command} is listed with its help line"
        assert f"flashsplit {command} " in out.split("examples:")[1], f"an example runs {command}"


def test_version(capsys):
    code, out, _ = _exit_code(["--version"], capsys)
    assert code == 0 and out.strip() == f"flashsplit {flashsplit.__version__}"


def test_demo_help_describes_the_step_and_the_backends(capsys):
    code, out, _ = _exit_code(["demo", "--help"], capsys)
    assert code == 0
    assert "usage: flashsplit demo" in out and "float64 reference" in out and "Llama-3-8B" in out
    assert "{" + ",".join(["auto", *flashsplit.backends()]) + "}" in out
    assert "examples:" in out


@pytest.mark.parametrize("argv, needle", [
    ([], "required"),
    (["nope"], "invalid choice"),
    (["demo", "--backend", "nope"], "invalid choice: 'nope'"),
    (["demo", "--backend"], "expected one argument"),
    (["demo", "--unknown"], "unrecognized arguments"),
    (["bench", "--batch", "0"], "--batch"),
    (["bench", "--seqlen-q", "17"], "--seqlen-q"),
    (["bench", "--seqlen-q", "0", "--dry-run"], "queries per row in 1..16"),
])
def test_bad_input_is_an_argparse_error(argv, needle, capsys):
    code, _, err = _exit_code(argv, capsys)
    assert code == 2
    assert "error:" in err and needle in err
    assert "Traceback" not in err


def test_demo_backend_choices_come_from_the_registry():
    parser = cli.build_parser()
    for name in flashsplit.backends():
        assert parser.parse_args(["demo", "--backend", name]).backend == name
    assert parser.parse_args(["demo"]).backend == "auto"


@pytest.mark.skipif(HAS_CUDA, reason="on a CUDA machine the cute backend may be able to run the demo")
def test_demo_on_a_backend_this_machine_cannot_run_is_an_argparse_error(capsys):
    code, out, err = _exit_code(["demo", "--backend", "cute"], capsys)
    assert code == 2
    assert "--backend cute" in err and "CUDA" in err and "Traceback" not in err
    assert out == "", "nothing ran"


def test_demo_unavailable_backend_is_reported_from_plan(monkeypatch, capsys):
    """Whatever the machine: plan()'s refusal reaches the user as an argparse error."""
    def refuse(*args, **kwargs):
        raise ValueError("backend: 'triton' cannot run this problem: a stated reason")

    monkeypatch.setattr(demo, "plan", refuse)
    code, _, err = _exit_code(["demo", "--backend", "triton"], capsys)
    assert code == 2
    assert "--backend triton: 'triton' cannot run this problem: a stated reason" in err


@pytest.mark.skipif(HAS_CUDA, reason="the GPU demo is a 32k-key Llama-3-8B step, exercised by test_gpu.py's shapes")
def test_demo_runs_checks_and_exits_0_on_the_cpu(capsys):
    assert cli.main(["demo", "--backend", "triton"]) == 0
    out = capsys.readouterr().out
    assert "plan: on the CPU (Triton interpreter): backend triton" in out and "max |out - float64 reference|" in out
    assert "FAILED" not in out
    assert "SMs x" not in out and "CTA slots" not in out  # the CPU has none
    assert 'flashsplit.plan(2, 1024, 8, 2, 64, gpu="h200")' in out  # how to see a GPU's plan


@pytest.mark.skipif(HAS_CUDA, reason="runs the CPU demo shape")
def test_demo_exits_1_when_the_output_fails_the_reference_check(monkeypatch, capsys):
    real_decode = demo.decode

    def off_by_a_little(*args, **kwargs):
        out, lse = real_decode(*args, **kwargs)
        return out + 0.05, lse

    monkeypatch.setattr(demo, "decode", off_by_a_little)
    assert cli.main(["demo"]) == 1
    assert "FAILED the reference check" in capsys.readouterr().out


def test_bench_without_a_gpu_exits_2_and_points_to_dry_run(monkeypatch, capsys):
    monkeypatch.setattr(bench_cli, "_run_on_gpu", lambda args: pytest.fail("no GPU: nothing may run"))
    from flashsplit.bench import device

    monkeypatch.setattr(device, "cuda_available", lambda: False)
    assert cli.main(["bench", "--batch", "1"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert "error:" in out.err and "CUDA GPU" in out.err and "--dry-run" in out.err and "--from-json" in out.err


def test_module_entry_point_reports_bad_input_without_a_traceback():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "flashsplit", "demo", "--backend", "nope"], capture_output=True,
                          text=True, timeout=120, env=env, cwd=REPO)
    assert proc.returncode == 2
    assert "invalid choice: 'nope'" in proc.stderr and "Traceback" not in proc.stderr


def test_native_builds_the_host_step_and_says_so(capsys, monkeypatch):
    assert cli.main(["native"]) == 0
    assert capsys.readouterr().out.strip() == "native host step: ready"
    monkeypatch.setenv("FLASHSPLIT_NATIVE", "0")
    assert cli.main(["native"]) == 1
    assert capsys.readouterr().out.strip() == "native host step: off (FLASHSPLIT_NATIVE=0)"
