"""The bench scorecard (flashsplit.bench.scorecard): auto against the faster backend, the peers and
the read floor, computed from rows alone (so saved runs render it too)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from flashsplit.bench import render, rows
from flashsplit.bench.scorecard import score


def _row(contender, us, batch=1, seqlen=16384, pct_ceiling=None, note="", status=rows.OK, **kw):
    return rows.BenchRow(contender, batch, seqlen, 32, 8, 128, "bf16", device_us=us, pct_ceiling=pct_ceiling,
                         note=note, status=status, **kw)


def test_auto_against_the_faster_backend_and_the_peers():
    card = score([_row("triton", 22.0), _row("cute", 21.0), _row("auto", 21.3, pct_ceiling=80.0, note="backend cute"),
                  _row("sdpa-cudnn", 23.1), _row("flash-attn3", 27.7)])
    (c,) = card
    assert (c.auto_backend, c.best_backend, c.best_us) == ("cute", "cute", 21.0)
    assert c.vs_best == pytest.approx(21.3 / 21.0) and c.auto_ok
    assert c.vs_cudnn == pytest.approx(21.3 / 23.1) and c.cudnn_ok
    assert c.vs_fa3 == pytest.approx(21.3 / 27.7)
    assert c.floor_us == pytest.approx(21.3 * 0.8) and c.vs_floor == pytest.approx(1.25)


def test_auto_past_the_slack_and_behind_cudnn_fail():
    (c,) = score([_row("triton", 113.5), _row("cute", 97.3), _row("auto", 113.5, note="backend triton"),
                  _row("sdpa-cudnn", 110.0)])
    assert c.best_backend == "cute" and c.auto_ok is False and c.cudnn_ok is False


@pytest.mark.parametrize("pct, ok", [(98.0, True), (96.0, False)])
def test_a_cudnn_tie_counts_only_at_the_read_rate(pct, ok):
    """0.3% slower than cuDNN: a tie where both read at >= 97% of the ceiling, a loss elsewhere."""
    (c,) = score([_row("auto", 100.3, pct_ceiling=pct), _row("sdpa-cudnn", 100.0, pct_ceiling=pct)])
    assert c.cudnn_ok is ok
    (c,) = score([_row("auto", 101.0, pct_ceiling=99.0), _row("sdpa-cudnn", 100.0, pct_ceiling=99.0)])
    assert c.cudnn_ok is False  # 1% is no tie


def test_cells_are_kept_apart_and_untimed_rows_ignored():
    card = score([_row("auto", 10.0), _row("triton", 9.0), _row("cute", 9.5, status=rows.WRONG),
                  _row("auto", 50.0, batch=4), _row("triton", 49.0, batch=4), _row("cute", 48.0, batch=4),
                  _row("auto", 30.0, page_size=16), _row("triton", 20.0, kv_dtype="fp8e4m3")])
    assert [(c.batch, c.page_size) for c in card] == [(1, 0), (4, 0), (1, 16)]
    assert card[0].auto_ok is None and card[0].best_backend == ""  # cute's row failed its check: no verdict
    assert card[1].best_backend == "cute" and card[1].auto_ok is False  # 50 / 48 = 1.042
    assert card[2].best_us is None and card[2].cudnn_us is None and card[2].floor_us is None
    assert score([_row("triton", 1.0), _row("cute", 1.0)]) == []  # no auto row: no scorecard


def test_the_report_renders_the_scorecard_from_rows():
    header = rows.RunHeader(device="NVIDIA H200", num_sms=132)
    report = rows.Report(header, [_row("triton", 22.0), _row("cute", 21.0), _row("auto", 21.3, note="backend cute"),
                                  _row("sdpa-cudnn", 20.0)])
    out = io.StringIO()
    render.render_report(Console(file=out, width=250), report)
    text = out.getvalue()
    assert "scorecard" in text and "1.014" in text and "1.065" in text and "NO" in text
    out = io.StringIO()
    render.render_report(Console(file=out, width=250), rows.Report(header, [_row("triton", 22.0)]))
    assert "scorecard" not in out.getvalue()


def test_cells_of_different_l_q_are_scored_apart():
    card = score([_row("triton", 9.0), _row("cute", 9.5), _row("auto", 9.0, note="backend triton"),
                  _row("triton", 12.0, seqlen_q=4), _row("cute", 10.0, seqlen_q=4),
                  _row("auto", 12.0, seqlen_q=4, note="backend triton")])
    assert [(c.seqlen_q, c.best_backend, c.auto_ok) for c in card] == [(1, "triton", True), (4, "cute", False)]
    assert card[1].vs_best == pytest.approx(1.2)
    out = io.StringIO()
    render.render_report(Console(file=out, width=250), rows.Report(rows.RunHeader(device="NVIDIA H200"), [
        _row("triton", 12.0, seqlen_q=4), _row("cute", 10.0, seqlen_q=4), _row("auto", 12.0, seqlen_q=4)]))
    scorecard_lines = out.getvalue().split("scorecard")[1]
    assert " L_q " in scorecard_lines and "1.200" in scorecard_lines
