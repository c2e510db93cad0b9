"""``flashsplit tune`` without a GPU: shapes parse, records become a table (the GPU's cells,
the latest of a cell recorded twice), --from-jsonl writes a table flashsplit loads, and unusable
input stops with exit code 2 and a message."""

import argparse
import json
import subprocess

import pytest

from flashsplit import measured_table
from flashsplit.__main__ import main
from flashsplit.bench import tune


def _record(batch=1, seqlen_k=4096, triton_us=10.0, cute_us=9.0, gpu="NVIDIA H200", **shape):
    fields = dict(num_heads=32, num_heads_kv=8, head_dim=128, seqlen_q=1, page_size=0, kv_dtype="same")
    fields.update(shape)
    return dict(gpu=gpu, num_sms=132, date="2026-12-03", versions={"torch": "2.11"}, command="flashsplit tune",
                batch=batch, seqlen_k=seqlen_k, triton_us=triton_us, cute_us=cute_us, **fields)


def test_parse_shape():
    assert tune.parse_shape("32/8:128:lq=4:page=16:kv=fp8e4m3") == dict(
        num_heads=32, num_heads_kv=8, head_dim=128, seqlen_q=4, page_size=16, kv_dtype="fp8e4m3")
    assert tune.shape_label(tune.parse_shape("16/2:256:lq=4")) == "16/2 d256 Lq4"
    for bad in ("32:128", "32/8", "32/7:128", "32/8:100", "32/8:128:lq=0", "32/8:128:lq=x", "32/8:128:kv=int8",
                "32/8:128:x=1"):
        with pytest.raises(Exception, match="expected Q/KV:D"):
            tune.parse_shape(bad)


def test_default_grid_spans_the_target():
    shapes = [tune.parse_shape(s) for s in tune.DEFAULT_SHAPES]
    assert {s["head_dim"] for s in shapes} == {64, 96, 128, 256} and {s["seqlen_q"] for s in shapes} == {1, 4}
    assert {s["page_size"] for s in shapes} == {0, 16, 128} and {s["kv_dtype"] for s in shapes} == {"same", "fp8e4m3"}
    assert len(shapes) == 4 * 6 * 2 + 3


def test_build_table_keeps_the_latest_cell_of_the_last_gpu():
    records = [_record(triton_us=10.0), _record(gpu="NVIDIA H100 80GB HBM3"), _record(triton_us=8.0),
               _record(batch=4, kv_dtype="fp8e4m3", cute_us=30.0), dict(_record(batch=16), cute_us=None)]
    table = tune.build_table(records)
    assert table.gpu == "NVIDIA H200" and table.command == "flashsplit tune"
    assert [(c.batch, c.triton_us, c.kv_dtype) for c in table.cells] == [(1, 8.0, "bfloat16"), (4, 10.0, "float8_e4m3fn")]
    with pytest.raises(ValueError, match="at least one"):
        tune.build_table([])


def test_from_jsonl_writes_a_table_flashsplit_loads(tmp_path, capsys):
    records = tmp_path / "part.jsonl"
    records.write_text("".join(json.dumps(_record(batch=b, cute_us=5.0 * b)) + "\n" for b in (1, 4, 16)))
    out = tmp_path / "h200.json"
    assert main(["tune", "--from-jsonl", str(records), "--out", str(out)]) == 0
    assert "3 cells measured on NVIDIA H200" in capsys.readouterr().out
    table = measured_table.load_table(out)
    assert [c.cute_us for c in table.cells] == [5.0, 20.0, 80.0] and table.versions == {"torch": "2.11"}
    assert sum(line.startswith('  {"num_heads"') for line in out.read_text().splitlines()) == 3, "a line per cell"


def test_unusable_input_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"gpu": "x"}\n')
    assert main(["tune", "--from-jsonl", str(bad), "--out", str(tmp_path / "t.json")]) == 2
    assert "lacks ['num_sms'" in capsys.readouterr().err
    bad.write_text("not json\n")
    assert main(["tune", "--from-jsonl", str(bad), "--out", str(tmp_path / "t.json")]) == 2
    assert "bad.jsonl:1: expected one JSON record per line" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["tune", "--from-jsonl", str(bad)])
    assert e.value.code == 2 and "--from-jsonl needs --out or --update" in capsys.readouterr().err


def _write_records(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_a_table_becomes_the_records_it_was_built_from():
    records = [_record(batch=1), _record(batch=4, kv_dtype="fp8e4m3", cute_us=30.0),
               _record(batch=16, kv_dtype="fp8e5m2", page_size=16, seqlen_q=4, head_dim=64, triton_us=7.5)]
    table = tune.build_table(records)
    again = tune.table_records(table)
    assert again == records, "every field of a cell, its cache format's --shape name among them"
    assert tune.build_table(again) == table
    odd = measured_table.Table("NVIDIA H200", 132, "", {}, "", (measured_table.Cell(32, 8, 128, 1, 0, "float16", 1,
                                                                                    1024, 1.0, 2.0),))
    with pytest.raises(ValueError, match="bfloat16 or fp8 cache, got float16"):
        tune.table_records(odd)


def test_update_merges_new_records_into_a_table(tmp_path, capsys):
    table = tmp_path / "h200.json"
    base = [_record(batch=b, cute_us=9.0) for b in (1, 4, 16)]
    assert main(["tune", "--from-jsonl", _write_records(tmp_path / "a.jsonl", base), "--out", str(table)]) == 0
    newer = [dict(_record(batch=4, cute_us=11.0), date="2026-12-09", versions={"torch": "2.12"}, command="again"),
             dict(_record(batch=64, cute_us=3.0), date="2026-12-09", versions={"torch": "2.12"}, command="again")]
    capsys.readouterr()
    assert main(["tune", "--from-jsonl", _write_records(tmp_path / "b.jsonl", newer), "--update", str(table)]) == 0
    printed = capsys.readouterr().out
    assert "4 cells measured on NVIDIA H200" in printed and "timed with different versions" in printed
    merged = measured_table.load_table(table)
    assert [(c.batch, c.cute_us) for c in merged.cells] == [(1, 9.0), (4, 11.0), (16, 9.0), (64, 3.0)]
    assert merged.command == "flashsplit tune; again" and merged.date == "2026-12-09"
    assert merged.versions == {"torch": "2.12"}


def test_update_refuses_a_table_of_another_gpu(tmp_path, capsys):
    table = tmp_path / "h100.json"
    h100 = [_record(gpu="NVIDIA H100 80GB HBM3")]
    assert main(["tune", "--from-jsonl", _write_records(tmp_path / "a.jsonl", h100), "--out", str(table)]) == 0
    before = table.read_text()
    assert main(["tune", "--from-jsonl", _write_records(tmp_path / "b.jsonl", [_record()]), "--update",
                 str(table)]) == 2
    assert "expected a table measured on NVIDIA H200, got one of NVIDIA H100 80GB HBM3" in capsys.readouterr().err
    assert table.read_text() == before, "the table is left as it was"


def test_timing_without_a_gpu_exits_2(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: tune would time the grid")
    assert main(["tune", "--shape", "32/8:128", "--batch", "1", "--seqlen", "1k"]) == 2
    assert "timing needs a CUDA GPU" in capsys.readouterr().err


def test_shape_text_inverts_parse_shape():
    for text in tune.DEFAULT_SHAPES + ("16/2:256:lq=4:page=16:kv=fp8e5m2",):
        assert tune.parse_shape(tune.shape_text(tune.parse_shape(text))) == tune.parse_shape(text)
    assert tune.shape_text(tune.parse_shape("32/8:128:lq=4")) == "32/8:128:lq=4"


def test_retime_groups_take_each_head_dims_short_cells():
    records = [_record(batch=b, seqlen_k=n, **shape) for b in (1, 4, 16) for n in (1024, 16384, 131072)
               for shape in (dict(), dict(seqlen_q=4), dict(head_dim=64), dict(kv_dtype="fp8e4m3"))]
    assert tune.retime_groups(records) == [
        ["--shape", "32/8:64", "--batch", "1", "4", "--seqlen", "1024", "16384"],
        ["--shape", "32/8:128", "--shape", "32/8:128:lq=4", "--shape", "32/8:128:kv=fp8e4m3",
         "--batch", "1", "4", "--seqlen", "1024", "16384"]]
    assert tune.retime_groups([_record(batch=16), _record(seqlen_k=131072)]) == []


class _FakeDevice:
    name, num_sms = "NVIDIA H200", 132


def _args(*argv):
    return tune.configure_parser(argparse.ArgumentParser()).parse_args(argv)


def _fake_grid(monkeypatch, child_cute_us, child_returncode=0):
    """run_grid on the CPU: every grid cell times Triton 10 us and cute 12 us; a re-timing child
    process records cute at ``child_cute_us`` for each cell its arguments name. Returns the
    commands the children were started with."""
    from flashsplit.bench import device

    monkeypatch.setattr(device, "device_info", lambda: _FakeDevice())
    monkeypatch.setattr(tune, "versions", lambda: {"torch": "2.11"})
    cell = dict(auto="triton", rule="default", triton_us=10.0, cute_us=12.0, triton_splits=1, cute_splits=1)
    monkeypatch.setattr(tune, "time_cell", lambda case, rounds: dict(cell))
    monkeypatch.setattr(tune, "RETIME_AFTER_CELLS", 0)  # (these grids are a few cells)
    children = []

    def child(command, capture_output, text):
        children.append(command)
        args = _args(*command[4:])
        assert not args.retime, "a child must not re-time again"
        with open(args.jsonl, "a") as f:
            for shape in args.shape:
                for batch in args.batch:
                    for seqlen in args.seqlen:
                        record = _record(batch=batch, seqlen_k=seqlen, **tune.parse_shape(shape))
                        record.update(cell, cute_us=child_cute_us, command="child")
                        f.write(json.dumps(record) + "\n")
        return subprocess.CompletedProcess(command, child_returncode, "32/8 d128 B=  1 L=1k ... [0.1 s]\n9 cells\n",
                                           "boom")

    monkeypatch.setattr(tune.subprocess, "run", child)
    return children


def test_tune_retimes_short_cells_in_fresh_processes(tmp_path, monkeypatch, capsys):
    children = _fake_grid(monkeypatch, child_cute_us=9.0)
    jsonl, out = tmp_path / "grid.jsonl", tmp_path / "t.json"
    args = _args("--shape", "32/8:128", "--shape", "32/8:64", "--batch", "1", "16", "--seqlen", "1k", "128k",
                 "--jsonl", str(jsonl), "--out", str(out))
    assert tune.run_grid(args) == 0
    assert len(children) == 2 and children[0][1:4] == ["-m", "flashsplit", "tune"], "one process per head dim"
    assert all(c[c.index("--batch") + 1:c.index("--seqlen")] == ["1"] for c in children)
    records = tune.read_records([str(jsonl)])
    assert len(records) == 8 + 2, "the grid's 8 cells, then its 2 short cells again"
    assert {r["command"] for r in records} == {records[0]["command"]}, "the run's command, not the child's"
    table = measured_table.load_table(out)
    assert sorted((c.head_dim, c.batch, c.seqlen_k, c.cute_us) for c in table.cells) == [
        (64, 1, 1024, 9.0), (64, 1, 131072, 12.0), (64, 16, 1024, 12.0), (64, 16, 131072, 12.0),
        (128, 1, 1024, 9.0), (128, 1, 131072, 12.0), (128, 16, 1024, 12.0), (128, 16, 131072, 12.0)]
    printed = capsys.readouterr().out
    assert "again, a fresh process per head dim" in printed and "[0.1 s]" in printed
    assert "9 cells" not in printed, "only the children's cell lines are shown"


def test_a_failed_retime_keeps_the_grids_times(tmp_path, monkeypatch, capsys):
    _fake_grid(monkeypatch, child_cute_us=9.0, child_returncode=2)
    args = _args("--shape", "32/8:128", "--batch", "1", "--seqlen", "1k", "--out", str(tmp_path / "t.json"))
    assert tune.run_grid(args) == 0
    printed = capsys.readouterr().out
    assert "re-timing failed" in printed and "boom" in printed
    assert [c.cute_us for c in measured_table.load_table(tmp_path / "t.json").cells] == [12.0]


def test_no_retime_starts_no_process(tmp_path, monkeypatch):
    children = _fake_grid(monkeypatch, child_cute_us=9.0)
    out = tmp_path / "t.json"
    args = _args("--shape", "32/8:128", "--batch", "1", "--seqlen", "1k", "--no-retime", "--out", str(out))
    assert tune.run_grid(args) == 0 and children == []
    assert [c.cute_us for c in measured_table.load_table(out).cells] == [12.0]


def test_a_grid_run_updates_a_table_in_place(tmp_path, monkeypatch, capsys):
    _fake_grid(monkeypatch, child_cute_us=9.0)
    table = tmp_path / "h200.json"
    base = [_record(batch=1, seqlen_k=1024, cute_us=5.0), _record(batch=4, seqlen_k=1024, cute_us=5.0)]
    assert main(["tune", "--from-jsonl", _write_records(tmp_path / "a.jsonl", base), "--out", str(table)]) == 0
    args = _args("--shape", "32/8:128", "--batch", "4", "16", "--seqlen", "1k", "--no-retime", "--update", str(table))
    assert tune.run_grid(args) == 0
    merged = measured_table.load_table(table)
    assert [(c.batch, c.cute_us) for c in merged.cells] == [(1, 5.0), (4, 12.0), (16, 12.0)]
    other = _args("--shape", "32/8:128", "--batch", "1", "--seqlen", "1k", "--update", str(tmp_path / "none.json"))
    assert tune.run_grid(other) == 2 and "none.json" in capsys.readouterr().err


def test_a_short_check_starts_no_process(tmp_path, monkeypatch):
    children = _fake_grid(monkeypatch, child_cute_us=9.0)
    monkeypatch.setattr(tune, "RETIME_AFTER_CELLS", 2)
    assert tune.run_grid(_args("--shape", "32/8:128", "--batch", "1", "4", "--seqlen", "1k")) == 0 and children == []
    assert tune.run_grid(_args("--shape", "32/8:128", "--batch", "1", "4", "--seqlen", "1k", "4k")) == 0
    assert len(children) == 1, "four cells: more than two"
