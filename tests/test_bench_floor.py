"""The bench's measurement options on the CPU: the read floor (``--read-floor``: its kernel through
the Triton interpreter, its row, the scorecard's floor) and the host time of an eager call."""

from __future__ import annotations

import io

import pytest
import torch

from flashsplit.bench import cli, contenders, device, floor, rows, runner
from flashsplit.bench.cases import Case
from flashsplit.bench.scorecard import score
from flashsplit.bench.timing import Timing, TimingConfig

H200_L2 = 60 * 1024 * 1024
HAS_CUDA = torch.cuda.is_available()
#: Where the kernel runs: the GPU where there is one, else the Triton interpreter (conftest).
DEVICE = "cuda" if HAS_CUDA else "cpu"


@pytest.mark.parametrize("dtype, shape", [(torch.float16, (2, 96, 2, 64)), (torch.float8_e4m3fn, (1, 40, 1, 32))])
def test_the_read_kernel_reads_every_word_of_k_and_v(dtype, shape):
    """Each program sums its chunk of K (first half of the grid) or V; a cache whose word count is
    not a whole number of chunks gets a masked last chunk, nothing read twice or left out."""
    k = torch.randn(shape, device=DEVICE).to(dtype)
    v = torch.randn(shape, device=DEVICE).to(dtype)
    kw, vw = floor.as_words(k), floor.as_words(v)
    assert kw.numel() * 4 == k.numel() * k.element_size()
    words = 1024
    programs = -(-kw.numel() // words)
    out = torch.full((2 * programs,), float("nan"), device=DEVICE)
    floor.launch_read(kw, vw, out, words, 4)
    expected = [c.double().sum() for t in (kw, vw) for c in t.split(words)]
    assert torch.allclose(out.double().cpu(), torch.stack(expected).cpu(), rtol=1e-5, atol=0)


def test_a_strided_cache_is_refused():
    with pytest.raises(contenders.Unsupported, match="contiguous"):
        floor.as_words(torch.randn(4, 8, 2, 16).transpose(1, 2))


def _info():
    return device.DeviceInfo("test", 132, H200_L2, 0, 4.8e12, "datasheet", HAS_CUDA)


def _timer(run, num_sets, config):
    run(num_sets - 1)
    return Timing(device_us=8.0, eager_us=30.0, method="graph", host_us=6.5)


@pytest.mark.parametrize("page_size, kv_dtype", [(0, "same"), (16, "fp8e4m3")])
def test_the_read_floor_row_is_timed_without_a_reference_check(page_size, kv_dtype):
    case = Case(2, 256, 4, 2, 64, "fp16", page_size=page_size, kv_dtype=kv_dtype)
    options = runner.RunOptions(mem_cap_bytes=1e9, timer=_timer)
    (row,) = runner.run_grid([case], [floor.ReadFloorContender()], _info(), ceiling_bw=4.0e12, options=options)
    assert row.status == rows.OK, row.note
    assert row.contender == "read-floor" and row.rel_err is None
    assert (row.device_us, row.eager_us, row.host_us) == (8.0, 30.0, 6.5)
    assert "MB" in row.note and "per program" in row.note


def test_windowed_cells_skip_the_read_floor():
    reader = floor.ReadFloorContender()
    assert "window" in reader.skip_reason(Case(1, 4096, 32, 8, 128, "bf16", window=128))
    assert reader.skip_reason(Case(1, 4096, 32, 8, 128, "bf16", softcap=30.0, sinks=True)) is None
    assert reader.skip_reason(Case(1, 4096, 32, 8, 128, "bf16", seqlen_q=4)) is None


def test_the_scorecard_prefers_the_measured_read_to_the_ceiling():
    def row(name, us, pct=None):
        return rows.BenchRow(name, 1, 4096, 32, 8, 128, "bf16", device_us=us, pct_ceiling=pct)

    (with_read,) = score([row("auto", 9.6, pct=40.0), row("read-floor", 5.5)])
    assert with_read.floor_us == 5.5 and with_read.vs_floor == pytest.approx(9.6 / 5.5)
    (without,) = score([row("auto", 9.6, pct=40.0)])
    assert without.floor_us == pytest.approx(9.6 * 0.4) and without.vs_floor == pytest.approx(2.5)


def test_read_floor_option_adds_the_contender(capsys):
    args = cli.build_parser().parse_args(["--read-floor", "--contenders", "auto,triton"])
    assert [c.name for c in cli.resolve_contenders(args)] == ["triton", "auto", "read-floor"]
    assert "read-floor" not in [c.name for c in cli.resolve_contenders(cli.build_parser().parse_args([]))]
    assert cli.main(["--dry-run", "--read-floor", "--batch", "1", "--seqlen", "4k", "--contenders", "auto"]) == 0
    assert "read-floor" in capsys.readouterr().out


def test_help_names_the_measurement_options():
    text = cli.build_parser().format_help()
    assert "--read-floor" in text and "host us" not in text  # host time is a column, always measured
    assert "--read-floor" in cli._EPILOG


@pytest.mark.gpu
def test_the_read_floor_and_host_time_on_a_gpu():
    """The real timer on a small cell: the read floor picks a config, captures and replays; every
    row carries a host time; the scorecard measures auto against the read."""
    from flashsplit.bench.device import device_info

    case = Case(1, 16384, 32, 8, 128, "bf16")
    roster = [contenders.FlashsplitContender("auto", "auto"), floor.ReadFloorContender()]
    options = runner.RunOptions(mem_cap_bytes=8e9, timing=TimingConfig(replays=10, eager_repeats=3))
    out = runner.run_grid([case], roster, device_info(), ceiling_bw=None, options=options)
    assert [r.status for r in out] == [rows.OK, rows.OK], [r.note for r in out]
    auto, read = out
    assert read.method == "graph" and read.device_us > 0 and read.rel_err is None
    assert auto.host_us is not None and auto.host_us > 0 and read.host_us is not None
    (card,) = score(out)
    assert card.floor_us == read.device_us


def test_host_time_is_the_launch_loop_alone(monkeypatch):
    """host us times the loop of calls without the synchronize after it: with a fake clock that
    advances 2 us per call and 100 us per synchronize, eager is 2 + 100 / calls, host is 2."""
    from flashsplit.bench import timing

    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])

    def sync():
        now[0] += 100e-6

    def call(i):
        now[0] += 2e-6

    monkeypatch.setattr(timing.torch.cuda, "synchronize", sync)
    eager, host = timing.time_eager_and_host(call, 3, TimingConfig(eager_repeats=3), calls=10)
    assert host == pytest.approx(2.0) and eager == pytest.approx(12.0)
    assert timing.time_eager(call, 3, TimingConfig(eager_repeats=3), calls=10) == pytest.approx(12.0)


def test_host_time_shows_in_the_table_and_survives_json():
    row = rows.BenchRow("auto", 1, 4096, 32, 8, 128, "bf16", device_us=9.6, eager_us=14.0, host_us=6.3)
    report = rows.Report(rows.RunHeader(device="NVIDIA H100", num_sms=132), [row])
    assert rows.report_from_json(rows.report_to_json(report)).rows[0].host_us == 6.3
    from rich.console import Console

    from flashsplit.bench import render

    buf = io.StringIO()
    Console(file=buf, width=250).print(render.rows_table([row]))
    assert "host us" in buf.getvalue() and " 6.3 " in buf.getvalue()
