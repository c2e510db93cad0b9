"""flashsplit bench on CPU: options, grid, rotation count, rows I/O, dry run, no-GPU exit code,
contender availability, the runner's check / error handling with a fake timer, the cache
formats (paged / fp8 inputs, skip reasons, --compare-formats ratios) and several queries per row
(--seqlen-q: grid, bytes, labels, rows I/O, tables, dry run, the causal check)."""

from __future__ import annotations

import argparse
import io
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

from conftest import NEEDS_CUTLASS

import flashsplit
from flashsplit.bench import cases, cli, contenders, device, formats, options, render, rows, runner, sweep
from flashsplit.bench.cases import Case, Shape, build_grid, rotation_count
from flashsplit.bench.options import parse_heads, parse_seqlen
from flashsplit.bench.check import check_output, relative_error
from flashsplit.bench.inputs import make_inputs
from flashsplit.bench.timing import Timing, TimingConfig, calls_per_graph

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"
H200_L2 = 60 * 2**20


def parse(*argv):
    return cli.build_parser().parse_args(list(argv))


# -- options ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("4096", 4096), ("1k", 1024), ("16K", 16384), ("128k", 131072), ("1m", 1 << 20), ("1.5k", 1536), (" 64k ", 65536),
])
def test_parse_seqlen_suffixes(text, expected):
    assert parse_seqlen(text) == expected


@pytest.mark.parametrize("text", ["", "k", "abc", "0", "-4", "1.3k", "16kb", "4g"])
def test_parse_seqlen_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_seqlen(text)


def test_format_seqlen_inverts_parse():
    for n in (1000, 1024, 16384, 131072, 1 << 20):
        assert parse_seqlen(options.format_seqlen(n)) == n


def test_parse_heads():
    assert parse_heads("32/8") == (32, 8)
    assert parse_heads(" 40 / 8 ") == (40, 8)
    for bad in ("32", "32/7", "0/8", "32:8", "a/b"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_heads(bad)


def test_lists_accept_spaces_and_commas():
    args = parse("--batch", "1,4", "16", "4", "--seqlen", "1k,16k", "128k")
    grid, skipped = cli.resolve_grid(args, H200_L2)
    assert skipped == []
    assert sorted({c.batch for c in grid}) == [1, 4, 16]
    assert sorted({c.seqlen_k for c in grid}) == [1024, 16384, 131072]
    assert len(grid) == 9, "repeated values are dropped"
    assert options.parse_splits("1-4,8,3") == [1, 2, 3, 4, 8]
    assert options.parse_splits("2..5") == [2, 3, 4, 5]


def test_default_grid_and_preset():
    args = parse()
    grid, skipped = cli.resolve_grid(args, H200_L2)
    assert [(c.batch, c.seqlen_k) for c in grid[:2]] == [(1, 1024), (1, 4096)]
    assert len(grid) + len(skipped) == 20
    assert all((c.num_heads, c.num_heads_kv, c.head_dim, c.dtype) == (32, 8, 128, "bf16") for c in grid)
    assert skipped == [], "llama-3-8b's largest cell (B=64, 128k: 34 GB) fits the default cap"


@pytest.mark.parametrize("preset, expected", [
    ("llama-3-8b", (32, 8, 128)), ("llama-2-7b", (32, 32, 128)), ("group5", (40, 8, 128)),
    ("d64", (32, 8, 64)), ("d256", (16, 8, 256)),
])
def test_presets(preset, expected):
    shape = cli.resolve_shape(parse("--preset", preset))
    assert (shape.num_heads, shape.num_heads_kv, shape.head_dim) == expected
    assert shape.num_heads % shape.num_heads_kv == 0


def test_heads_and_head_dim_override_the_preset():
    shape = cli.resolve_shape(parse("--preset", "d256", "--heads", "8/1"))
    assert (shape.num_heads, shape.num_heads_kv, shape.head_dim) == (8, 1, 256)
    shape = cli.resolve_shape(parse("--head-dim", "64", "--dtype", "fp16"))
    assert (shape.num_heads, shape.num_heads_kv, shape.head_dim) == (32, 8, 64)


@pytest.mark.parametrize("argv", [
    ["--seqlen", "12q"], ["--batch", "0"], ["--batch", "x"], ["--heads", "32/7"], ["--preset", "gpt-5"],
    ["--dtype", "fp32"], ["--head-dim", "100"], ["--head-dim", "512"], ["--mem-cap-gb", "-1"],
    ["--contenders", "triton,nope"], ["--sweep-splits", "0-4"], ["--sweep-splits", "1-999"], ["--replays", "0"],
])
def test_bad_options_are_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_add_bench_parser_sets_func():
    top = argparse.ArgumentParser(prog="flashsplit")
    sub = top.add_subparsers(dest="command")
    cli.add_bench_parser(sub)
    args = top.parse_args(["bench", "--dry-run", "--preset", "group5", "--sweep-splits"])
    assert args.func is cli.run_bench_command
    assert args.sweep_splits == list(range(1, 65)), "a bare --sweep-splits sweeps 1..64"
    assert args.preset == "group5" and args.dry_run


# -- grid, memory cap, rotation --------------------------------------------------------------

def test_rotation_count_worked_examples():
    def case(L):
        return Case(1, L, 32, 8, 128)
    assert rotation_count(cases.set_bytes(case(1024)), H200_L2) == 45
    assert rotation_count(cases.set_bytes(case(16384)), H200_L2) == 3
    assert rotation_count(cases.set_bytes(case(131072)), H200_L2) == 1


@pytest.mark.parametrize("set_bytes", [1, 4096, 4_202_496, 10**7, 62_914_560, 188_743_680, 188_743_681, 10**9])
def test_rotation_count_is_the_smallest_that_defeats_l2(set_bytes):
    r = rotation_count(set_bytes, H200_L2)
    assert r * set_bytes > 3 * H200_L2 or (r == 1 and set_bytes > 3 * H200_L2)
    assert r == 1 or (r - 1) * set_bytes <= 3 * H200_L2, "one set fewer must not be enough"


def test_rotation_count_is_capped_by_memory():
    assert rotation_count(10**8, l2_bytes=10**9, mem_cap_bytes=2.5e8) == 2
    assert rotation_count(10**9, l2_bytes=10**9, mem_cap_bytes=1e8) == 1, "never below one set"
    with pytest.raises(ValueError):
        rotation_count(0)


def test_memory_cap_skips_cells():
    llama2 = cases.PRESETS["llama-2-7b"]
    grid, skipped = build_grid([1, 64], [1024, 131072], llama2, mem_cap_bytes=80e9)
    assert [(c.batch, c.seqlen_k) for c in grid] == [(1, 1024), (1, 131072), (64, 1024)]
    assert [(s.case.batch, s.case.seqlen_k) for s in skipped] == [(64, 131072)]
    assert skipped[0].case.kv_bytes == 2 * 64 * 131072 * 32 * 128 * 2  # 137 GB
    assert "memory cap" in skipped[0].reason
    grid, skipped = build_grid([1], [1024, 16384], Shape(32, 8, 128), mem_cap_bytes=0.05e9)
    assert [c.seqlen_k for c in grid] == [1024] and [s.case.seqlen_k for s in skipped] == [16384]
    # The cap covers every rotation set: 45 sets of the 4.2 MB 1k cell would be 189 MB.
    assert rotation_count(cases.set_bytes(grid[0]), H200_L2, 0.05e9) * cases.set_bytes(grid[0]) <= 0.05e9


def test_case_bytes():
    c = Case(4, 4096, 32, 8, 128, "fp16")
    assert c.kv_bytes == 2 * 4 * 4096 * 8 * 128 * 2
    assert c.moved_bytes == c.kv_bytes + 2 * 4 * 32 * 128 * 2
    assert c.torch_dtype == torch.float16
    assert calls_per_graph(TimingConfig(calls_per_graph=20), 45) == 45
    assert calls_per_graph(TimingConfig(calls_per_graph=20), 3) == 20


# -- rows: json / csv ------------------------------------------------------------------------

def _sample_report() -> rows.Report:
    header = rows.RunHeader(device="NVIDIA H200", num_sms=132, l2_bytes=H200_L2, datasheet_bw=4.8e12,
                            datasheet_note="datasheet 4.80 TB/s (H200)", ceiling_bw=4.27e12, ceiling_note="probe",
                            notes=["flashinfer skipped: not importable"])
    r1 = rows.BenchRow("triton", 1, 131072, 32, 8, 128, "bf16", num_splits=29, device_us=118.25, eager_us=131.0,
                       method="graph", gbps=4540.1, pct_datasheet=94.6, pct_ceiling=106.3, rel_err=3.1e-3, sets=1,
                       note="backend triton, a note with, commas")
    r2 = rows.BenchRow("sdpa-flash", 1, 131072, 32, 8, 128, "bf16", status=rows.WRONG, rel_err=float("inf"),
                       note='wrong: "quoted"')
    r3 = rows.BenchRow("flex", 64, 1024, 40, 8, 128, "fp16", status=rows.ERROR, note="RuntimeError: boom\nline2")
    r4 = rows.BenchRow("triton", 1, 131072, 32, 8, 128, "bf16", page_size=16, kv_dtype="fp8e4m3", num_splits=29,
                       device_us=65.5, method="graph", rel_err=4e-3, sets=1)
    summary = rows.SweepSummary("triton", 1, 131072, 32, 8, 128, "bf16", heuristic_splits=29, heuristic_us=118.25,
                                best_splits=30, best_us=110.0, gap_pct=7.5)
    comparison = rows.FormatComparison("triton", 1, 131072, 32, 8, 128, "bf16", "fp8", page_size=0,
                                       kv_dtype="fp8e4m3", base_page_size=0, base_kv_dtype="bf16", us=65.5,
                                       base_us=118.25, ratio=65.5 / 118.25, speedup=118.25 / 65.5,
                                       target="speedup >= 1.70", met=True)
    return rows.Report(header, [r1, r2, r3, r4], [summary], [comparison])


def test_report_json_round_trip():
    report = _sample_report()
    back = rows.report_from_json(rows.report_to_json(report))
    assert back == report
    assert math.isinf(back.rows[1].rel_err) and back.rows[1].device_us is None


def test_rows_csv_round_trip():
    report = _sample_report()
    text = rows.rows_to_csv(report.rows)
    assert text.splitlines()[0].startswith("contender,batch,seqlen_k,")
    assert rows.rows_from_csv(text) == report.rows
    assert rows.from_csv(rows.to_csv(report.sweep, rows.SweepSummary), rows.SweepSummary) == report.sweep
    back = rows.from_csv(rows.to_csv(report.formats, rows.FormatComparison), rows.FormatComparison)
    assert back == report.formats and back[0].met is True


# -- no GPU, dry run, help -------------------------------------------------------------------

def test_no_gpu_exits_2_and_points_to_dry_run_and_from_json(monkeypatch, capsys):
    """Nothing runs and nothing is written (the --json path would fail if it were)."""
    monkeypatch.setattr(device, "cuda_available", lambda: False)
    assert cli.main(["--batch", "1", "--json", "/nonexistent/dir/x.json"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.strip() == cli.NO_GPU_MESSAGE
    assert "CUDA GPU" in out.err and "--dry-run" in out.err and "--from-json" in out.err


def test_dry_run_lists_cells_contenders_and_plans(monkeypatch, capsys):
    monkeypatch.setattr(device, "cuda_available", lambda: False)
    assert cli.main(["--dry-run", "--batch", "1", "16", "--seqlen", "4k", "128k", "--no-flex"]) == 0
    out = capsys.readouterr().out
    assert "--dry-run" in out and "132 SMs" in out
    for name in ("triton", "triton-nosplit", "auto", "sdpa-flash", "sdpa-cudnn"):
        assert name in out
    assert "skipped: disabled (--no-flex)" in out
    assert "4 cell(s)" in out
    # The planned split counts are flashsplit.plan's, for an H200 stand-in.
    dry = _dry_run(["--batch", "1", "16", "--seqlen", "4k", "128k", "--no-flex"])
    assert [(c.case.batch, c.case.seqlen_k) for c in dry.cells] == [(1, 4096), (1, 131072), (16, 4096), (16, 131072)]
    for cell in dry.cells:
        expected = flashsplit.plan(cell.case.batch, cell.case.seqlen_k, 32, 8, 128, num_sms=132, device="cuda",
                                   backend="triton").num_splits
        assert cell.plans["triton"] == expected
        assert cell.plans["triton-nosplit"] == 1
        assert f" {expected} " in out
    assert dry.cells[1].plans["triton"] == 32, "B=1, 32/8 heads, 128k keys -> 32 splits on 132 SMs (0.97 of a wave)"


def _dry_run(argv):
    from flashsplit.bench.dryrun import build_dry_run

    args = parse(*argv)
    info = device.device_info()
    grid, skipped = cli.resolve_grid(args, info.l2_bytes)
    return build_dry_run(grid, skipped, contenders.select_contenders(args.contenders, flex=not args.no_flex), info,
                         args.mem_cap_gb * 1e9)


def test_dry_run_reports_capped_cells_and_unsupported_backends(monkeypatch, capsys):
    monkeypatch.setattr(device, "cuda_available", lambda: False)
    assert cli.main(["--dry-run", "--preset", "llama-2-7b", "--batch", "64", "--seqlen", "1k", "128k"]) == 0
    out = capsys.readouterr().out
    assert "skipped cell B=64 L_k=128k" in out and "memory cap" in out
    assert "1 cell(s)" in out


def test_dry_run_sweep_line(monkeypatch, capsys):
    monkeypatch.setattr(device, "cuda_available", lambda: False)
    assert cli.main(["--dry-run", "--batch", "1", "--seqlen", "16k", "--sweep-splits", "1-8,30"]) == 0
    assert "num_splits 1..30 (9 counts)" in capsys.readouterr().out


def test_help_runs_standalone():
    repo = Path(__file__).resolve().parents[1]  # this tree's flashsplit, whatever else is installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "flashsplit.bench.cli", "--help"], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "usage: flashsplit bench" in proc.stdout and "--sweep-splits" in proc.stdout


# -- contenders ------------------------------------------------------------------------------

def test_contenders_give_reasons_without_a_gpu(monkeypatch):
    monkeypatch.setattr(device, "cuda_available", lambda: False)
    monkeypatch.setattr(contenders, "cuda_available", lambda: False)
    roster = contenders.all_contenders(flex=False)
    assert [c.name for c in roster][:4] == ["triton", "cute", "triton-nosplit", "auto"]
    for c in roster:
        reason = c.available()
        assert isinstance(reason, str) and reason, c.name
    by_name = {c.name: c for c in roster}
    assert by_name["triton"].available() == contenders.NO_GPU_REASON
    assert by_name["sdpa-cudnn"].available() in (contenders.NO_GPU_REASON, "cuDNN is not available in this torch build")
    assert by_name["flex"].available() == "disabled (--no-flex)"
    if "cute" not in flashsplit.backends():
        assert "not registered" in by_name["cute"].available()
    for name, module in (("flashinfer", "flashinfer"), ("flash-attn", "flash_attn")):
        reason = by_name[name].available()
        assert reason == contenders.NO_GPU_REASON or f"{module} is not importable" in reason


def test_select_contenders():
    assert [c.name for c in contenders.select_contenders(["sdpa-cudnn", "triton"])] == ["triton", "sdpa-cudnn"]
    with pytest.raises(ValueError, match="unknown contender"):
        contenders.select_contenders(["nope"])


def test_datasheet_table():
    assert device.datasheet_bandwidth("NVIDIA H200")[0] == 4.8e12
    assert device.datasheet_bandwidth("NVIDIA GH200 480GB")[0] == 4.9e12
    assert device.datasheet_bandwidth("NVIDIA H100 80GB HBM3")[0] == 3.35e12
    assert device.datasheet_bandwidth("NVIDIA H100 PCIe")[0] == 2.0e12
    bw, note = device.datasheet_bandwidth("Mystery GPU 9000")
    assert bw == 4.8e12 and "unknown" in note


# -- runner: check, errors, bandwidth (fake timer, runs on CPU through the Triton interpreter) --

def _fake_timer(calls):
    def timer(run, num_sets, config):
        calls.append(num_sets)
        run(num_sets - 1)  # the prepared callable takes any set index
        return Timing(device_us=10.0, eager_us=25.0, method="graph")
    return timer


class _Fake(contenders.Contender):
    family = "torch"

    def __init__(self, name, make):
        self.name, self.make = name, make

    def prepare(self, case, inputs):
        return self.make(case, inputs)


def _info():
    return device.DeviceInfo("test", 132, H200_L2, 0, 4.8e12, "datasheet", HAS_CUDA)


def test_runner_checks_times_and_survives_failures():
    from flashsplit.reference import attention_ref

    # fp16: the interpreter's bf16 dot is wrong (triton-lang/triton#11584). 512 keys: 4 granules, so it splits.
    case = Case(2, 512, 4, 2, 64, "fp16")

    def good(case, inputs):
        return contenders.Prepared(lambda i: attention_ref(inputs.q[i], inputs.k[i], inputs.v[i])[0].half())

    def zeros(case, inputs):
        return contenders.Prepared(lambda i: torch.zeros_like(inputs.q[i]))

    def boom(case, inputs):
        raise RuntimeError("kernel exploded\nsecond line")

    def unsupported(case, inputs):
        raise contenders.Unsupported("head_dim 64 is not supported")

    roster = [contenders.FlashsplitContender("triton", "triton"), _Fake("ref", good), _Fake("zeros", zeros),
              _Fake("boom", boom), _Fake("nope", unsupported), contenders.FlashsplitContender("cute", "cute")]
    calls = []
    options = runner.RunOptions(mem_cap_bytes=1e9, timer=_fake_timer(calls))
    out = runner.run_grid([case], roster, _info(), ceiling_bw=4.0e12, options=options)
    by = {r.contender: r for r in out}
    assert [r.contender for r in out] == ["triton", "ref", "zeros", "boom", "nope", "cute"]

    tri = by["triton"]
    assert tri.status == rows.OK, tri.note
    assert tri.num_splits == flashsplit.plan(2, 512, 4, 2, 64, dtype=torch.float16, num_sms=132 if not HAS_CUDA else
                                             torch.cuda.get_device_properties(0).multi_processor_count,
                                             device="cuda", backend="triton").num_splits
    assert tri.rel_err < 1e-2
    assert tri.sets == rotation_count(cases.set_bytes(case), H200_L2, 1e9)
    assert tri.device_us == 10.0 and tri.eager_us == 25.0 and tri.method == "graph"
    assert tri.gbps == pytest.approx(case.moved_bytes / 10e-6 / 1e9)
    assert tri.pct_datasheet == pytest.approx(100 * case.moved_bytes / 10e-6 / 4.8e12)
    assert tri.pct_ceiling == pytest.approx(100 * case.moved_bytes / 10e-6 / 4.0e12)

    assert by["ref"].status == rows.OK and by["ref"].num_splits is None
    assert by["zeros"].status == rows.WRONG and by["zeros"].rel_err == pytest.approx(1.0)
    assert by["zeros"].device_us is None, "a wrong contender is not timed"
    assert by["boom"].status == rows.ERROR and by["boom"].note == "RuntimeError: kernel exploded"
    assert by["nope"].status == rows.SKIPPED and "head_dim 64" in by["nope"].note
    if "cute" not in flashsplit.backends():
        assert by["cute"].status == rows.SKIPPED
    assert len(calls) == sum(r.status == rows.OK for r in out), "only passing contenders are timed"


def test_check_output_and_relative_error():
    inputs = make_inputs(Case(3, 256, 4, 1, 32, "fp16"), 1, device=DEV)
    from flashsplit.reference import attention_ref

    ref = attention_ref(inputs.q[0], inputs.k[0], inputs.v[0])[0]
    assert check_output(ref.half(), inputs).ok
    assert set(inputs.ref_cache) == {0, 2}, "first and last batch rows are checked"
    bad = ref.half().clone()
    bad[2] *= 1.5  # wrong only in the last row
    result = check_output(bad, inputs)
    assert not result.ok and "batch row 2" in result.detail
    assert not check_output(ref.half()[:, :, :2], inputs).ok
    nan = ref.clone()
    nan[0, 0, 0, 0] = float("nan")
    assert relative_error(nan, ref) == float("inf")


def test_sweep_summary_gap():
    case = Case(1, 16384, 32, 8, 128)

    def row(s, us, status=rows.OK):
        return runner.empty_row("triton", case, num_splits=s, device_us=us, status=status)

    summary = sweep.summarize("triton", case, 8, [row(4, 15.0), row(8, 12.0), row(16, 10.0), row(32, None, rows.ERROR)])
    assert (summary.heuristic_splits, summary.heuristic_us, summary.best_splits, summary.best_us) == (8, 12.0, 16, 10.0)
    assert summary.gap_pct == pytest.approx(20.0)
    assert "32" in summary.note
    assert sweep.summarize("triton", case, 16, [row(8, 12.0), row(16, 10.0)]).gap_pct == 0.0
    assert sweep.summarize("triton", case, 8, []).best_splits is None
    roster = contenders.all_contenders()
    assert [c.name for c in sweep.sweep_backends(roster)] == ["triton", "cute"]


def test_ceiling_probe_kernel_reads_every_element():
    from flashsplit.bench.ceiling import _read_sum_kernel

    block, tiles, programs = 16, 4, 3
    x = torch.arange(block * tiles * programs, dtype=torch.float32, device=DEV)
    partial = torch.empty(programs, dtype=torch.float32, device=DEV)
    _read_sum_kernel[(programs,)](x, partial, BLOCK=block, TILES=tiles)
    assert partial.cpu().tolist() == x.view(programs, -1).sum(1).cpu().tolist()


# -- rendering -------------------------------------------------------------------------------

def test_render_report_table():
    buf = io.StringIO()
    render.render_report(Console(file=buf, width=250), _sample_report())
    text = buf.getvalue()
    assert "NVIDIA H200" in text and "118.2" in text and "wrong:" in text and "error: RuntimeError" in text
    assert "heuristic vs best" in text and "7.5%" in text
    assert "paged/16 fp8e4m3" in text and "dense bf16" in text, "rows name their cache format"
    assert "cache formats" in text and "1.81x" in text and "speedup >= 1.70" in text and "yes" in text


def test_plot_choices():
    case_rows = [rows.BenchRow("t", b, n, 32, 8, 128, "bf16", device_us=1.0) for b in (4, 16) for n in (1024, 16384)]
    case_rows.append(rows.BenchRow("t", 64, 16384, 32, 8, 128, "bf16", device_us=1.0))
    assert render.plot_choices(case_rows) == (4, 16384)
    assert render.plot_choices(case_rows, fixed_seqlen=1024) == (4, 1024)
    assert render.plot_choices([]) == (None, None)


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    report = _sample_report()
    report.sweep = []
    report.rows = [rows.BenchRow(c, b, n, 32, 8, 128, "bf16", device_us=float(b * n) / 1e3)
                   for c in ("triton", "sdpa-cudnn") for b in (1, 4) for n in (1024, 4096, 16384)]
    path = tmp_path / "bench.png"
    render.write_plot(report, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sweep_report = _sample_report()
    sweep_report.rows = [rows.BenchRow("triton", 1, 131072, 32, 8, 128, "bf16", num_splits=s, device_us=100.0 + s)
                         for s in (1, 2, 29, 30)]
    render.write_plot(sweep_report, str(tmp_path / "sweep.png"))
    assert (tmp_path / "sweep.png").stat().st_size > 0


def test_plot_without_matplotlib_says_so(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    assert not render.matplotlib_available()
    with pytest.raises(ImportError, match="pip install"):
        render.write_plot(_sample_report(), str(tmp_path / "x.png"))



def test_from_json_renders_and_merges_saved_reports(tmp_path, capsys):
    """--from-json re-renders saved reports without a GPU: two files merge (rows, sweeps and
    format comparisons in order, the first header, a note naming the files) into --json/--csv."""
    first, second = _sample_report(), _sample_report()
    second.header.device = "another GPU"
    second.rows = [rows.BenchRow("cute", 16, 4096, 32, 8, 128, "bf16", num_splits=1, device_us=64.0, method="graph")]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(rows.report_to_json(first))
    b.write_text(rows.report_to_json(second))
    out_json, out_csv = tmp_path / "ab.json", tmp_path / "ab.csv"
    assert cli.main(["--from-json", str(a), str(b), "--json", str(out_json), "--csv", str(out_csv)]) == 0
    merged = rows.report_from_json(out_json.read_text())
    assert merged.rows == first.rows + second.rows
    assert merged.sweep == first.sweep + second.sweep and merged.formats == first.formats + second.formats
    assert merged.header.device == "NVIDIA H200" and merged.header.notes[-1].startswith("merged from 2 reports")
    assert rows.rows_from_csv(out_csv.read_text()) == merged.rows
    assert "64.0" in capsys.readouterr().out  # the merged table was rendered


@pytest.mark.parametrize("content,needle", [(None, "cannot read"), ("{}", "'header' and 'rows'"),
                                            ("[1, 2]", "'header' and 'rows'"), ("not json", "JSONDecodeError")])
def test_from_json_rejects_what_is_not_a_report(tmp_path, capsys, content, needle):
    path = tmp_path / "x.json"
    if content is not None:
        path.write_text(content)
    assert cli.main(["--from-json", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--from-json" in err and str(path) in err and needle in err

# -- cache formats: --page-size, --kv-dtype, --compare-formats -------------------------------

def test_format_options():
    args = parse("--page-size", "0,1", "16", "1", "--kv-dtype", "same", "FP8E4M3", "--batch", "1", "--seqlen", "1k")
    assert cli.resolve_formats(args) == [(0, "same"), (0, "fp8e4m3"), (1, "same"), (1, "fp8e4m3"), (16, "same"),
                                         (16, "fp8e4m3")]
    grid, _ = cli.resolve_grid(args, H200_L2)
    assert [(c.page_size, c.kv_dtype) for c in grid] == cli.resolve_formats(args), "formats are the innermost loop"
    assert cli.resolve_formats(parse()) == [(0, "same")], "dense q-dtype cache by default"
    # --compare-formats adds the baselines: dense 16-bit, and each fp8 format's 16-bit twin.
    args = parse("--compare-formats", "--page-size", "1", "16")
    assert cli.resolve_formats(args) == [(0, "same"), (1, "same"), (16, "same")]
    args = parse("--compare-formats", "--page-size", "16", "--kv-dtype", "fp8e5m2")
    assert cli.resolve_formats(args) == [(0, "same"), (16, "same"), (16, "fp8e5m2")]
    assert [c.name for c in cli.resolve_contenders(args)] == ["triton", "cute", "triton-nosplit", "auto"]
    args = parse("--compare-formats", "--kv-dtype", "fp8e4m3", "--contenders", "triton,sdpa-flash")
    assert [c.name for c in cli.resolve_contenders(args)] == ["triton", "sdpa-flash"], "--contenders wins"


@pytest.mark.parametrize("argv", [
    ["--page-size", "-1"], ["--page-size", "x"], ["--page-size", "1.5"], ["--kv-dtype", "fp8"],
    ["--kv-dtype", "int8"], ["--kv-dtype", "same,e4m3"],
])
def test_bad_format_options_are_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--compare-formats", "--page-size", "16", "--sweep-splits", "1-4"], "do not combine"),
    (["--compare-formats"], "needs a format to compare"),
])
def test_compare_formats_option_errors(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(device, "cuda_available", lambda: False)
    assert cli.main(["--dry-run", *argv]) == 2
    assert message in capsys.readouterr().err


def test_case_bytes_for_cache_formats():
    dense = Case(16, 131072, 32, 8, 128, "bf16")
    fp8 = Case(16, 131072, 32, 8, 128, "bf16", kv_dtype="fp8e4m3")
    assert fp8.kv_itemsize == 1 and fp8.itemsize == 2 and fp8.cache_torch_dtype == torch.float8_e4m3fn
    assert fp8.kv_bytes * 2 == dense.kv_bytes == 2 * 16 * 131072 * 8 * 128 * 2
    assert fp8.meta_bytes == 2 * 4 * 16 * 8, "two fp32 descales per (row, KV head)"
    assert fp8.moved_bytes == fp8.kv_bytes + fp8.meta_bytes + 2 * fp8.q_bytes
    assert Case(1, 1024, 32, 8, 128, kv_dtype="fp8e5m2").kv_bytes == 2 * 1024 * 8 * 128
    paged = Case(2, 1000, 32, 8, 128, "fp16", page_size=16)
    assert (paged.pages_per_row, paged.capacity) == (63, 1008)
    assert paged.kv_bytes == 2 * 2 * 1000 * 8 * 128 * 2, "GB/s counts the keys read, not the padded page"
    assert paged.meta_bytes == 4 * 2 * 63, "the int32 block table"
    assert cases.set_bytes(paged) == 2 * 2 * 1008 * 8 * 128 * 2 + paged.meta_bytes + paged.q_bytes
    assert dense.meta_bytes == 0 and cases.set_bytes(dense) == dense.kv_bytes + dense.q_bytes
    # Half the bytes: twice the rotation sets to defeat the L2.
    small = Case(1, 1024, 32, 8, 128)
    assert rotation_count(cases.set_bytes(Case(1, 1024, 32, 8, 128, kv_dtype="fp8e4m3")), H200_L2) > \
        rotation_count(cases.set_bytes(small), H200_L2)
    assert fp8.label() == "B=16 L_k=128k H=32/8 d=128 bf16 kv=fp8e4m3"
    assert Case(1, 4096, 32, 8, 128, page_size=1, kv_dtype="fp8e5m2").label().endswith("bf16 paged/1 kv=fp8e5m2")
    assert (dense.format_label, fp8.format_label, paged.format_label) == ("dense bf16", "dense fp8e4m3",
                                                                          "paged/16 fp16")


@pytest.mark.parametrize("seqlen, page_size", [(64, 16), (37, 16), (5, 1), (40, 64)])
def test_vectorised_paged_builder_round_trips_through_gather_paged(seqlen, page_size):
    from flashsplit.bench.inputs import to_paged
    from flashsplit.reference import gather_paged

    gen = torch.Generator().manual_seed(seqlen * 131 + page_size)
    dense = torch.randn(3, seqlen, 2, 8, generator=gen).half()
    pages, table = to_paged(dense, page_size, gen)
    num = -(-seqlen // page_size)
    assert pages.shape == (3 * num, page_size, 2, 8) and table.dtype == torch.int32 and table.shape == (3, num)
    assert sorted(table.flatten().tolist()) == list(range(3 * num)), "every page used once"
    if num > 1:
        assert table.flatten().tolist() != list(range(3 * num)), "physical order shuffled"
    gathered = gather_paged(pages, table)
    assert gathered.shape == (3, num * page_size, 2, 8)
    assert torch.equal(gathered[:, :seqlen], dense)
    assert torch.isnan(gathered[:, seqlen:]).all(), "slots past the last key are NaN"


def test_paged_fp8_inputs_and_their_reference_view():
    from flashsplit.bench.inputs import make_inputs as bench_inputs
    from flashsplit.reference import dequantize, gather_paged

    case = Case(3, 100, 4, 2, 16, "fp16", page_size=16, kv_dtype="fp8e4m3")
    inputs = bench_inputs(case, 2, device="cpu", seed=3)
    assert len(inputs) == 2 and inputs.block_table.shape == (3, 7) and inputs.block_table.dtype == torch.int32
    for i in range(2):
        assert inputs.k[i].shape == (21, 16, 2, 16) and inputs.k[i].dtype == torch.float8_e4m3fn
        assert inputs.k_descale[i].shape == (3, 2) and inputs.k_descale[i].dtype == torch.float32
        assert set(inputs.cache_kwargs(i)) == {"block_table", "k_descale", "v_descale"}
    assert not torch.equal(inputs.k_descale[0], inputs.k_descale[1]), "each set quantized on its own"
    k, v = inputs.reference_kv(2)
    expected = dequantize(gather_paged(inputs.k[0], inputs.block_table[2:3])[:, :100], inputs.k_descale[0][2:3])
    assert k.shape == (1, 100, 2, 16) and torch.equal(k, expected) and torch.isfinite(v).all()
    # The dequantized cache is close to normal values (the quantization is per (row, KV head)).
    assert 0.5 < float(k.float().std()) < 2.0
    dense = bench_inputs(Case(2, 64, 4, 2, 16, "fp16"), 1, device="cpu")
    assert dense.block_table is None and dense.k_descale is None and dense.cache_kwargs(0) == {}


def test_dense_inputs_are_unchanged_by_the_format_code():
    from flashsplit.bench.inputs import make_inputs as bench_inputs

    case = Case(2, 64, 4, 2, 16, "fp16")
    inputs = bench_inputs(case, 2, device="cpu", seed=7)
    gen = torch.Generator().manual_seed(7)
    expected = [torch.randn(shape, generator=gen, dtype=torch.float16)
                for _ in range(2) for shape in ((2, 1, 4, 16), (2, 64, 2, 16), (2, 64, 2, 16))]
    got = [t for i in range(2) for t in (inputs.q[i], inputs.k[i], inputs.v[i])]
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


@NEEDS_CUTLASS
def test_peers_skip_paged_and_fp8_with_reasons():
    paged, fp8 = Case(1, 4096, 32, 8, 128, page_size=16), Case(1, 4096, 32, 8, 128, kv_dtype="fp8e4m3")
    both, dense = Case(1, 4096, 32, 8, 128, page_size=1, kv_dtype="fp8e5m2"), Case(1, 4096, 32, 8, 128)
    by = {c.name: c for c in contenders.all_contenders()}
    sdpa = by["sdpa-flash"]
    assert sdpa.format_reason(dense) is None
    assert sdpa.format_reason(paged) == "torch SDPA has no paged KV input"
    assert sdpa.format_reason(fp8) == "torch SDPA has no fp8 KV input"
    assert sdpa.format_reason(both) == "torch SDPA has no paged/fp8 KV input"
    assert by["sdpa-cudnn"].format_reason(both) == "torch SDPA has no paged/fp8 KV input"
    assert by["flex"].format_reason(paged) == "torch FlexAttention has no paged KV input"
    assert "fp8" in by["flashinfer"].format_reason(fp8) and by["flashinfer"].format_reason(paged) is None
    assert "multiple of 256" in by["flash-attn"].format_reason(paged)
    assert by["flash-attn"].format_reason(Case(1, 4096, 32, 8, 128, page_size=256)) is None
    assert by["flash-attn3"].format_reason(paged) is None and "fp8" in by["flash-attn3"].format_reason(fp8)
    for name in ("triton", "cute", "triton-nosplit", "auto"):
        assert by[name].format_reason(both) is None, "flashsplit takes every format (a backend may refuse in plan)"
    # cute refuses through the registry, with its reason; auto plans the Triton backend.
    if "cute" in flashsplit.backends():
        with pytest.raises(contenders.Unsupported, match="head_dim 80"):
            by["cute"].plan(Case(1, 4096, 32, 8, 80, page_size=1, kv_dtype="fp8e5m2"), 132)
        # paged and fp8 are supported: cute plans them (for an H200 when there is no GPU here).
        for case in (fp8, both):
            assert by["cute"].plan(case, 132).backend == "cute"
    assert by["triton"].plan(paged, 132).num_splits == flashsplit.plan(1, 4096, 32, 8, 128, page_size=16,
                                                                       num_sms=132, backend="triton").num_splits


def test_runner_skips_a_format_before_preparing_and_runs_flashsplit_on_it():
    case = Case(2, 200, 4, 2, 64, "fp16", page_size=16, kv_dtype="fp8e5m2")
    prepared = []

    class Dense(_Fake):
        library = "a dense-only library"

    def make(case, inputs):
        prepared.append(case)
        return contenders.Prepared(lambda i: inputs.q[i])

    def ignores_pages(case, inputs):  # reads the pages as if they were a dense cache in row order
        from flashsplit.reference import attention_ref, dequantize

        def run(i):
            k = dequantize(inputs.k[i], inputs.k_descale[i][:1]).reshape(2, -1, 2, 64)[:, :200]
            v = dequantize(inputs.v[i], inputs.v_descale[i][:1]).reshape(2, -1, 2, 64)[:, :200]
            return attention_ref(inputs.q[i], k, v)[0].half()
        return contenders.Prepared(run)

    class Paged(_Fake):
        formats = frozenset({"paged", "fp8"})

    calls = []
    info = device.DeviceInfo("test", 132, 1024, 0, 4.8e12, "datasheet", HAS_CUDA)  # tiny L2: one input set
    out = runner.run_grid([case], [contenders.FlashsplitContender("triton", "triton"), Dense("dense", make),
                                   Paged("ignores-pages", ignores_pages)],
                          info, None, runner.RunOptions(mem_cap_bytes=1e9, timer=_fake_timer(calls)))
    by = {r.contender: r for r in out}
    assert all((r.page_size, r.kv_dtype) == (16, "fp8e5m2") for r in out), "rows carry the format"
    assert by["dense"].status == rows.SKIPPED and by["dense"].note == "a dense-only library has no paged/fp8 KV input"
    assert prepared == [], "a contender is never run on another format"
    tri = by["triton"]
    assert tri.status == rows.OK and tri.rel_err < 1e-2, tri.note
    assert tri.gbps == pytest.approx(case.moved_bytes / 10e-6 / 1e9)
    assert case.moved_bytes == 2 * 2 * 200 * 2 * 64 * 1 + 4 * 2 * 13 + 2 * 4 * 2 * 2 + 2 * 2 * 4 * 64 * 2
    assert by["ignores-pages"].status == rows.WRONG, "the check attends to the gathered pages"
    assert len(calls) == 1


def _frow(contender, page_size, kv, us, status=rows.OK, seqlen=131072, note=""):
    return rows.BenchRow(contender, 1, seqlen, 32, 8, 128, "bf16", page_size=page_size, kv_dtype=kv,
                         device_us=us if status == rows.OK else None, status=status, note=note)


def test_compare_formats_ratios_and_targets():
    data = [
        _frow("triton", 0, "bf16", 100.0, note="backend triton"),
        _frow("triton", 16, "bf16", 108.0, note="backend triton"),
        _frow("triton", 1, "bf16", 130.0, note="backend triton"),
        _frow("triton", 0, "fp8e4m3", 50.0, note="backend triton"),
        _frow("triton", 16, "fp8e4m3", 80.0, note="backend triton"),
        _frow("auto", 0, "bf16", 90.0, note="backend cute"),
        _frow("auto", 16, "bf16", 108.0, note="backend triton"),
        _frow("cute", 0, "bf16", 90.0),
        _frow("cute", 16, "bf16", None, rows.SKIPPED, note="paged KV caches ... not implemented"),
        _frow("triton", 0, "bf16", 20.0, seqlen=16384),
        _frow("triton", 0, "fp8e4m3", None, rows.ERROR, seqlen=16384, note="RuntimeError: x"),
        _frow("triton", 64, "bf16", 21.0, seqlen=16384),
    ]
    got = {(c.contender, c.seqlen_k, c.kind, c.page_size, c.kv_dtype): c for c in formats.compare_formats(data)}
    assert set(got) == {
        ("triton", 131072, "paged", 16, "bf16"), ("triton", 131072, "paged", 1, "bf16"),
        ("triton", 131072, "fp8", 0, "fp8e4m3"), ("triton", 131072, "paged", 16, "fp8e4m3"),
        ("triton", 131072, "fp8", 16, "fp8e4m3"), ("auto", 131072, "paged", 16, "bf16"),
        ("triton", 16384, "fp8", 0, "fp8e4m3"), ("triton", 16384, "paged", 64, "bf16"),
    }, "cute's skipped paged row is not compared"
    p16 = got[("triton", 131072, "paged", 16, "bf16")]
    assert (p16.base_page_size, p16.base_kv_dtype, p16.us, p16.base_us) == (0, "bf16", 108.0, 100.0)
    assert p16.ratio == pytest.approx(1.08) and p16.target == "paged/dense <= 1.10" and p16.met is True
    p1 = got[("triton", 131072, "paged", 1, "bf16")]
    assert p1.ratio == pytest.approx(1.30) and p1.target == "paged/dense <= 1.25" and p1.met is False
    f8 = got[("triton", 131072, "fp8", 0, "fp8e4m3")]
    assert f8.speedup == pytest.approx(2.0) and f8.target == "speedup >= 1.70" and f8.met is True
    pf8 = got[("triton", 131072, "fp8", 16, "fp8e4m3")]
    assert (pf8.base_page_size, pf8.base_kv_dtype) == (16, "bf16") and pf8.speedup == pytest.approx(108 / 80)
    assert pf8.met is False
    assert got[("triton", 131072, "paged", 16, "fp8e4m3")].ratio == pytest.approx(1.6)
    assert "backends differ: triton vs cute" in got[("auto", 131072, "paged", 16, "bf16")].note
    short = got[("triton", 16384, "fp8", 0, "fp8e4m3")]
    assert short.speedup is None and short.met is None and short.target == "", "fp8's target is set at 128k"
    assert "format not timed (error: RuntimeError: x)" in short.note
    p64 = got[("triton", 16384, "paged", 64, "bf16")]
    assert p64.ratio == pytest.approx(1.05) and p64.target == "" and p64.met is None
    assert formats.compare_formats([_frow("triton", 16, "bf16", 1.0)]) == [], "no baseline, no comparison"


def test_dry_run_lists_cache_formats(monkeypatch, capsys):
    monkeypatch.setattr(device, "cuda_available", lambda: False)
    assert cli.main(["--dry-run", "--batch", "1", "--seqlen", "128k", "--page-size", "16", "--kv-dtype", "fp8e4m3",
                     "--no-flex"]) == 0
    out = capsys.readouterr().out
    assert "paged/16 fp8e4m3" in out and " 268.4 " in out, "fp8 KV MB counts 1 byte per element"
    assert "sdpa-flash skipped on 1 paged/16 fp8e4m3 cell(s): torch SDPA has no paged/fp8 KV input" in out
    dry = _dry_run(["--batch", "1", "--seqlen", "128k", "--page-size", "16", "--kv-dtype", "fp8e4m3", "--no-flex"])
    (cell,) = dry.cells
    assert cell.plans["triton"] == flashsplit.plan(1, 131072, 32, 8, 128, page_size=16, kv_dtype=torch.float8_e4m3fn,
                                                   num_sms=132, backend="triton").num_splits
    assert cell.format_skips["sdpa-cudnn"] == "torch SDPA has no paged/fp8 KV input"
    assert "triton" not in cell.format_skips

    assert cli.main(["--dry-run", "--compare-formats", "--batch", "1", "16", "--seqlen", "16k", "128k",
                     "--page-size", "1", "16"]) == 0
    out = capsys.readouterr().out
    assert "16 cell(s)" not in out and "12 cell(s) x 4 contender(s)" in out
    assert "dense bf16" in out and "paged/1 bf16" in out and "paged/16 bf16" in out
    assert "--compare-formats would compare ['triton', 'cute', 'triton-nosplit', 'auto'] across dense bf16, " \
           "paged/1 bf16, paged/16 bf16" in out


def _fake_gpu(monkeypatch, timer):
    """The bench's CLI on CPU tensors as if on a GPU: a fake H200, no synchronize, ``timer`` for
    every timing (the Triton interpreter computes the outputs that are checked)."""
    import functools

    info = device.DeviceInfo("Fake H200", 132, 1024, 0, 4.8e12, "datasheet", False)
    monkeypatch.setattr(device, "cuda_available", lambda: True)
    monkeypatch.setattr(contenders, "cuda_available", lambda: True)
    monkeypatch.setattr(device, "device_info", lambda: info)
    monkeypatch.setattr(runner, "synchronize", lambda: None)
    monkeypatch.setattr(runner, "RunOptions", functools.partial(runner.RunOptions, timer=timer))


@pytest.mark.cpu
def test_compare_formats_end_to_end_with_a_fake_gpu(monkeypatch, tmp_path, capsys):
    """The whole --compare-formats run (rows, comparison table, JSON, CSV) on CPU tensors: the
    Triton interpreter computes, a fake timer makes paged 5% and fp8 2x."""
    fake_us = {(0, "fp16"): 100.0, (16, "fp16"): 105.0, (16, "fp8e4m3"): 52.5}

    def timer(run, num_sets, config):
        run(0)
        case = current[0]
        return Timing(device_us=fake_us[(case.page_size, case.kv)], eager_us=1.0, method="graph")

    current = []
    real_bench_one = runner.bench_one

    def bench_one(contender, case, *a, **kw):
        current[:] = [case]
        return real_bench_one(contender, case, *a, **kw)

    _fake_gpu(monkeypatch, timer)
    monkeypatch.setattr(runner, "bench_one", bench_one)
    json_path, csv_path = tmp_path / "r.json", tmp_path / "r.csv"
    code = cli.main(["--compare-formats", "--page-size", "16", "--kv-dtype", "fp8e4m3", "--contenders", "triton",
                     "--heads", "4/2", "--head-dim", "64", "--dtype", "fp16", "--batch", "2", "--seqlen", "256",
                     "--no-ceiling", "--json", str(json_path), "--csv", str(csv_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    report = rows.report_from_json(json_path.read_text())
    assert [(r.page_size, r.kv, r.status) for r in report.rows] == [(0, "fp16", "ok"), (16, "fp16", "ok"),
                                                                   (16, "fp8e4m3", "ok")]
    assert all(r.rel_err < 1e-2 for r in report.rows)
    # paged/16 fp8 has no dense fp8 run to compare with (not asked for): only its 16-bit twin.
    assert [(c.kind, c.page_size, c.kv_dtype, c.base_page_size, c.base_kv_dtype) for c in report.formats] == [
        ("paged", 16, "fp16", 0, "fp16"), ("fp8", 16, "fp8e4m3", 16, "fp16")]
    assert report.formats[0].ratio == pytest.approx(1.05) and report.formats[0].met is True
    assert report.formats[1].speedup == pytest.approx(2.0) and report.formats[1].met is None, "L_k < 128k"
    assert any("cache formats" in n for n in report.header.notes)
    assert (tmp_path / "r.formats.csv").exists() and "paged/16 fp8e4m3" in out and "1.050" in out
    assert rows.rows_from_csv(csv_path.read_text()) == report.rows


@pytest.mark.cpu
def test_json_holds_the_finished_rows_while_the_run_goes_on(monkeypatch, tmp_path, capsys):
    """With --json, each finished row is saved with those before it (a whole report, replaced by a
    rename), so a run stopped midway leaves what it measured; the end writes the full report."""
    json_path = tmp_path / "r.json"
    saved = []  # rows in the file when each timing starts

    def timer(run, num_sets, config):
        run(0)
        saved.append(len(rows.report_from_json(json_path.read_text()).rows) if json_path.exists() else None)
        return Timing(device_us=10.0, eager_us=1.0, method="graph")

    _fake_gpu(monkeypatch, timer)
    code = cli.main(["--contenders", "triton", "--heads", "4/2", "--head-dim", "64", "--dtype", "fp16",
                     "--batch", "1", "2", "--seqlen", "256", "512", "--no-ceiling", "--json", str(json_path)])
    assert code == 0, capsys.readouterr().out
    assert saved == [None, 1, 2, 3], "each timing starts with the rows before it saved"
    final = rows.report_from_json(json_path.read_text())
    assert [(r.batch, r.seqlen_k, r.status) for r in final.rows] == [(1, 256, "ok"), (1, 512, "ok"), (2, 256, "ok"),
                                                                    (2, 512, "ok")]
    assert final.header.device == "Fake H200" and not (tmp_path / "r.json.part").exists()


# -- several queries per row: --seqlen-q (speculative decoding, causal, bottom-right) --------

def test_seqlen_q_crosses_the_grid():
    args = parse("--batch", "1", "16", "--seqlen", "4k", "16k", "--seqlen-q", "1,4", "4")
    grid, skipped = cli.resolve_grid(args, H200_L2)
    assert skipped == []
    assert [(c.batch, c.seqlen_k, c.seqlen_q) for c in grid] == [
        (1, 4096, 1), (1, 4096, 4), (1, 16384, 1), (1, 16384, 4),
        (16, 4096, 1), (16, 4096, 4), (16, 16384, 1), (16, 16384, 4)], "L_q inside L_k, repeats dropped"
    assert [c.causal for c in grid[:2]] == [False, True]
    assert {c.seqlen_q for c in cli.resolve_grid(parse("--batch", "1"), H200_L2)[0]} == {1}, "one query by default"
    # Formats and variants cross it too, innermost.
    args = parse("--batch", "1", "--seqlen", "4k", "--seqlen-q", "2", "8", "--page-size", "0", "16")
    grid, _ = cli.resolve_grid(args, H200_L2)
    assert [(c.seqlen_q, c.page_size) for c in grid] == [(2, 0), (2, 16), (8, 0), (8, 16)]
    # A cache shorter than the queries is left out, with the reason.
    grid, skipped = build_grid([1], [2, 4096], Shape(32, 8, 128), seqlens_q=[4])
    assert [c.seqlen_k for c in grid] == [4096]
    assert [(s.case.seqlen_k, s.reason) for s in skipped] == [
        (2, "4 queries per row need a cache of at least as many keys")]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="seqlens_q"):
            build_grid([1], [1024], Shape(32, 8, 128), seqlens_q=[bad])


@pytest.mark.parametrize("value", ["0", "17", "-1", "x", "1.5", "4,0", ""])
def test_bad_seqlen_q_values_are_argparse_errors(value, capsys):
    with pytest.raises(SystemExit) as exc:
        parse("--seqlen-q", value)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --seqlen-q" in err and ("1..16" in err or "non-empty list" in err)


def test_seqlen_q_parser_takes_its_range():
    assert options.parse_seqlen_q_list("1, 16 4") == [1, 16, 4]
    assert parse("--seqlen-q", "16").seqlen_q == [[16]] and parse().seqlen_q is None


def test_case_bytes_and_labels_with_several_queries():
    one, four = Case(4, 4096, 32, 8, 128, "fp16"), Case(4, 4096, 32, 8, 128, "fp16", seqlen_q=4)
    assert four.q_bytes == 4 * one.q_bytes == 4 * 4 * 32 * 128 * 2
    assert four.kv_bytes == one.kv_bytes and four.read_kv_bytes == four.kv_bytes, "the last query sees every key"
    assert four.moved_bytes == four.kv_bytes + 2 * 4 * 4 * 32 * 128 * 2, "q read and out written L_q times"
    assert cases.set_bytes(four) == cases.set_bytes(one) + 3 * one.q_bytes
    windowed = Case(1, 131072, 32, 8, 128, window=128, seqlen_q=4)
    assert windowed.visible_keys == 132, "query i sees the 129 keys up to L_k - 4 + i: 132 together"
    assert windowed.read_kv_bytes == 2 * 132 * 8 * 128 * 2
    assert four.label() == "B=4 L_k=4k L_q=4 H=32/8 d=128 fp16" and one.label() == "B=4 L_k=4k H=32/8 d=128 fp16"
    assert Case(1, 1024, 32, 8, 128, page_size=16, window=64, seqlen_q=2).label() == \
        "B=1 L_k=1k L_q=2 H=32/8 d=128 bf16 paged/16 window 64"
    # The rotary tables reach the last query's position (FlashAttention rotates query i at the row's length + i).
    assert Case(2, 64, 4, 2, 16, append=1, rotary=True, seqlen_q=4).rotary_positions == 64 - 1 + 4
    assert Case(2, 64, 4, 2, 16, append=4, rotary=True, seqlen_q=4).rotary_positions == 64
    assert Case(2, 64, 4, 2, 16, append=1, rotary=True).rotary_positions == 64
    with pytest.raises(TypeError):
        Case(1, 4096, 32, 8, 128, "bf16", 0, "same", -1, 0.0, False, False, 0, False, 4)  # seqlen_q: keyword only


def test_rows_with_seqlen_q_round_trip_and_old_reports_read_as_one_query():
    import json

    report = _sample_report()
    report.rows.append(rows.BenchRow("triton", 1, 16384, 32, 8, 128, "bf16", seqlen_q=4, num_splits=32, device_us=30.0))
    report.sweep.append(rows.SweepSummary("triton", 1, 16384, 32, 8, 128, "bf16", seqlen_q=4, heuristic_splits=32))
    report.formats.append(rows.FormatComparison("triton", 1, 16384, 32, 8, 128, "bf16", "paged", seqlen_q=4,
                                                page_size=16))
    report.variants.append(rows.VariantComparison("triton", 1, 16384, 32, 8, 128, "bf16", seqlen_q=4, window=128,
                                                  short_seqlen=132))
    back = rows.report_from_json(rows.report_to_json(report))
    assert back == report and back.rows[-1].seqlen_q == 4 and back.formats[-1].kind == "paged"
    assert rows.rows_from_csv(rows.rows_to_csv(report.rows)) == report.rows
    for items, cls in ((report.sweep, rows.SweepSummary), (report.formats, rows.FormatComparison),
                       (report.variants, rows.VariantComparison)):
        assert rows.from_csv(rows.to_csv(items, cls), cls) == items
    assert rows.rows_to_csv(report.rows).splitlines()[0].startswith("contender,batch,seqlen_k,seqlen_q,")
    # Reports and CSVs written before the field existed read back with one query per row.
    old = json.loads(rows.report_to_json(_sample_report()))
    for section in ("rows", "sweep", "formats"):
        for item in old[section]:
            del item["seqlen_q"]
    back = rows.report_from_json(json.dumps(old))
    assert back == _sample_report() and {r.seqlen_q for r in back.rows + back.sweep + back.formats} == {1}
    old_csv = _without_column(rows.rows_to_csv(_sample_report().rows), "seqlen_q")
    assert "seqlen_q" not in old_csv
    assert rows.rows_from_csv(old_csv) == _sample_report().rows


def _without_column(text: str, name: str) -> str:
    """CSV ``text`` as written before column ``name`` existed."""
    import csv

    reader = csv.DictReader(io.StringIO(text))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, [f for f in reader.fieldnames if f != name], lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: v for k, v in row.items() if k != name} for row in reader)
    return buf.getvalue()


def test_tables_show_l_q_only_where_a_row_has_several_queries():
    plain = [rows.BenchRow("triton", 1, 16384, 32, 8, 128, "bf16", device_us=20.0)]
    several = plain + [rows.BenchRow("triton", 1, 16384, 32, 8, 128, "bf16", seqlen_q=4, device_us=23.0)]
    headers = [c.header for c in render.rows_table(plain).columns]
    assert "L_q" not in headers
    table = render.rows_table(several)
    headers = [c.header for c in table.columns]
    assert headers[:4] == ["contender", "B", "L_k", "L_q"]
    assert list(table.columns[3].cells) == ["1", "4"]
    assert table.rows[0].end_section, "L_q 1 and 4 are different cells: a section break between them"
    buf = io.StringIO()
    render.render_report(Console(file=buf, width=250), rows.Report(_sample_report().header, several))
    assert "23.0" in buf.getvalue() and " L_q " in buf.getvalue()


def test_plot_lines_keep_query_counts_apart():
    data = [rows.BenchRow("triton", 1, 16384, 32, 8, 128, "bf16", seqlen_q=q, device_us=1.0) for q in (1, 4)]
    assert [render.line_label(r, data) for r in data] == ["triton [L_q=1]", "triton [L_q=4]"]
    assert render.line_label(data[0], data[:1]) == "triton"


@NEEDS_CUTLASS
def test_dry_run_lists_l_q_and_plans_for_it(monkeypatch, capsys):
    monkeypatch.setattr(device, "cuda_available", lambda: False)
    argv = ["--seqlen-q", "1", "4", "--batch", "1", "16", "--seqlen", "4k", "16k", "--no-flex"]
    assert cli.main(["--dry-run", *argv]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "L_k" in line)
    assert [h.strip() for h in header.strip("┃").split("┃")][:3] == ["B", "L_k", "L_q"] and "8 cell(s)" in out
    dry = _dry_run(argv)
    assert [(c.case.batch, c.case.seqlen_k, c.case.seqlen_q) for c in dry.cells][:2] == [(1, 4096, 1), (1, 4096, 4)]
    for cell in dry.cells:
        case = cell.case
        expected = flashsplit.plan(case.batch, case.seqlen_k, 32, 8, 128, seqlen_q=case.seqlen_q,
                                   causal=case.seqlen_q > 1, num_sms=132, device="cuda", backend="triton")
        assert cell.plans["triton"] == expected.num_splits
        auto = flashsplit.plan(case.batch, case.seqlen_k, 32, 8, 128, seqlen_q=case.seqlen_q,
                               causal=case.seqlen_q > 1, num_sms=132, device="cuda")
        assert cell.backends["auto"] == f"{auto.backend} ({auto.rule})"
    planned = contenders.FlashsplitContender("triton", "triton").plan(dry.cells[1].case, 132)
    assert planned.seqlen_q == 4 and planned.window_left == -1
    if "cute" in flashsplit.backends():
        assert any(c.backends["auto"] != d.backends["auto"] for c, d in zip(dry.cells[::2], dry.cells[1::2])), \
            "auto picks another backend or rule for some L_q = 4 cell"


def test_dry_run_says_which_contenders_skip_several_queries(monkeypatch, capsys):
    """FlashInfer's decode wrapper takes one query per row: its L_q = 4 cells are skipped, and said so."""
    monkeypatch.setattr(device, "cuda_available", lambda: False)
    monkeypatch.setattr(contenders.FlashInferContender, "static_reason", lambda self: None)
    assert cli.main(["--dry-run", "--seqlen-q", "1", "4", "--batch", "1", "--seqlen", "4k", "16k",
                     "--contenders", "triton,flashinfer"]) == 0
    out = capsys.readouterr().out
    assert "flashinfer skipped on 2 L_q=4 cell(s): flashinfer's BatchDecodeWithPagedKVCacheWrapper is decode-only" \
        in out
    dry = _dry_run(["--seqlen-q", "1", "4", "--batch", "1", "--seqlen", "4k", "--contenders", "triton,flashinfer"])
    assert [sorted(c.query_skips) for c in dry.cells] == [[], ["flashinfer"]]
    assert "triton" not in dry.cells[1].query_skips


def test_help_describes_seqlen_q():
    text = cli.build_parser().format_help()
    assert "--seqlen-q N [N ...]" in text and "1..16" in text and "bottom-right aligned" in text
    assert "--seqlen-q 1 4" in text, "an example uses it"


@pytest.mark.full
def test_runner_checks_several_queries_causally():
    """L_q = 4 through the Triton interpreter (fp16): flashsplit passes; attention without the causal
    mask fails, at 512 keys by the tolerance, at 64k keys and L_q = 2 (where the mask hides too few keys to
    pass it) by being closer to the unmasked reference."""
    from flashsplit.reference import attention_ref

    class Ref(_Fake):
        multi_query = True

    def causal(case, inputs):
        def run(i):
            return attention_ref(inputs.q[i], inputs.k[i], inputs.v[i], causal=True)[0].half()
        return contenders.Prepared(run)

    def unmasked(case, inputs):
        return contenders.Prepared(lambda i: attention_ref(inputs.q[i], inputs.k[i], inputs.v[i])[0].half())

    short, long = Case(2, 512, 4, 2, 64, "fp16", seqlen_q=4), Case(2, 65536, 4, 2, 64, "fp16", seqlen_q=2)
    calls = []
    options = runner.RunOptions(mem_cap_bytes=1e9, timer=_fake_timer(calls))
    out = runner.run_grid([short], [contenders.FlashsplitContender("triton", "triton"), Ref("causal", causal),
                                    Ref("unmasked", unmasked), _Fake("one-query", causal)], _info(), 4.0e12, options)
    by = {r.contender: r for r in out}
    tri = by["triton"]
    assert tri.status == rows.OK and tri.rel_err < 1e-2 and tri.seqlen_q == 4, tri.note
    assert tri.num_splits == flashsplit.plan(2, 512, 4, 2, 64, seqlen_q=4, causal=True, dtype=torch.float16,
                                             num_sms=132, device="cuda", backend="triton").num_splits
    assert tri.gbps == pytest.approx(short.moved_bytes / 10e-6 / 1e9)
    assert by["causal"].status == rows.OK
    assert by["unmasked"].status == rows.WRONG and "tolerance" in by["unmasked"].note
    assert by["one-query"].status == rows.SKIPPED
    assert by["one-query"].note == "one-query has no causal multi-query (L_q > 1) input in the bench's call"
    (ok, wrong) = runner.run_grid([long], [Ref("causal", causal), Ref("unmasked", unmasked)], _info(), None, options)
    assert ok.status == rows.OK
    assert wrong.status == rows.WRONG and wrong.rel_err < 1e-2, "within the tolerance, yet wrong"
    assert "closer to attention without the causal mask" in wrong.note
    assert len(calls) == 3, "only the passing rows are timed"


def test_formats_and_sweeps_keep_l_q_apart():
    data = [_frow("triton", 0, "bf16", 100.0), _frow("triton", 16, "bf16", 105.0),
            _frow("triton", 0, "bf16", 120.0), _frow("triton", 16, "bf16", 150.0)]
    for r in data[2:]:
        r.seqlen_q = 4
    got = formats.compare_formats(data)
    assert [(c.seqlen_q, c.base_us, c.ratio) for c in got] == [(1, 100.0, pytest.approx(1.05)),
                                                               (4, 120.0, pytest.approx(1.25))]
    case = Case(1, 16384, 32, 8, 128, seqlen_q=4)
    summary = sweep.summarize("triton", case, 8, [runner.empty_row("triton", case, num_splits=8, device_us=9.0)])
    assert summary.seqlen_q == 4 and summary.gap_pct == 0.0
    assert runner.empty_row("triton", case).seqlen_q == 4


def test_check_output_wants_l_q_rows():
    inputs = make_inputs(Case(2, 64, 4, 2, 32, "fp16", seqlen_q=3), 1, device=DEV)
    from flashsplit.reference import attention_ref

    assert inputs.q[0].shape == (2, 3, 4, 32) and inputs.variant_kwargs() == {"causal": True}
    ref = attention_ref(inputs.q[0], inputs.k[0], inputs.v[0], causal=True)[0]
    assert check_output(ref.half(), inputs).ok
    result = check_output(ref.half()[:, :1], inputs)
    assert not result.ok and "expected [2, 3, 4, 32]" in result.detail
    assert make_inputs(Case(2, 64, 4, 2, 32, "fp16"), 1, device=DEV).variant_kwargs() == {}, \
        "one query per row: the plain call, no causal flag"


@pytest.mark.cpu
def test_seqlen_q_end_to_end_with_a_fake_gpu(monkeypatch, tmp_path, capsys):
    """A whole --seqlen-q 1 4 run (rows, tables, JSON, CSV) on CPU tensors: the Triton interpreter
    computes, a fake timer times."""

    def timer(run, num_sets, config):
        run(0)
        return Timing(device_us=10.0, eager_us=1.0, method="graph")

    _fake_gpu(monkeypatch, timer)
    json_path, csv_path = tmp_path / "r.json", tmp_path / "r.csv"
    code = cli.main(["--seqlen-q", "1", "4", "--contenders", "triton", "--heads", "4/2", "--head-dim", "64",
                     "--dtype", "fp16", "--batch", "2", "--seqlen", "256", "--no-ceiling", "--json", str(json_path),
                     "--csv", str(csv_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    report = rows.report_from_json(json_path.read_text())
    assert [(r.seqlen_q, r.status) for r in report.rows] == [(1, "ok"), (4, "ok")]
    assert all(r.rel_err < 1e-2 for r in report.rows)
    assert report.rows[1].gbps == pytest.approx(Case(2, 256, 4, 2, 64, "fp16", seqlen_q=4).moved_bytes / 10e-6 / 1e9)
    assert any(n.startswith("several queries per row (--seqlen-q N > 1): causal, bottom-right") for n in
               report.header.notes)
    assert rows.rows_from_csv(csv_path.read_text()) == report.rows
    assert " L_q " in out
