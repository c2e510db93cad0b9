"""The ``tune`` sub-command: time both backends over a grid and write the GPU's selection table.

For each shape (q/KV heads, head dim, queries per row, cache format) and each cell (batch x keys,
KV capped by ``--max-kv-gb``), the Triton and cute launches of ``decode_into(backend=...)`` are
checked against the float64 reference (outputs poisoned with NaN first), captured as CUDA graphs
over input sets rotated so the KV never sits in L2, and replayed interleaved
(:func:`flashsplit.bench.timing.time_side_by_side`). Each cell prints both times and the backend
``auto`` picks (its rule, :func:`flashsplit.plan`) with auto / best; a long grid's short cells
are then timed again in fresh processes (:func:`retime_short_cells`), and cells over
``--tolerance`` are listed at the end. ``--jsonl`` appends one record per cell and skips cells
already recorded there for this GPU (a long grid can run in pieces); ``--out`` writes the table
(:mod:`flashsplit.measured_table`) from every record of this GPU; ``--from-jsonl`` builds one
from saved records without a GPU; ``--update`` starts from an existing table, whose cells the ones
timed now (or read) replace, and writes the merged table back. Point ``FLASHSPLIT_SELECTION_TABLE``
at the file, or place it in ``flashsplit/tables/``, and ``auto`` takes its vote on that GPU model.

Exit codes: 0 on success; 1 when a backend was wrong in a cell; 2 when nothing could run (no CUDA
GPU without ``--from-jsonl``, a record file that is not one).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from ..measured_table import Cell, Table, load_table
from .cases import KV_DTYPES, Case, rotation_count
from .options import SAME_KV, format_seqlen, parse_head_dim, parse_heads, parse_seqlen

BACKENDS = ("triton", "cute")

#: The default grid: head dims x head counts x queries per row, dense bf16, plus pages and fp8.
DEFAULT_HEADS = ("32/8", "32/32", "40/8", "64/8", "28/4", "16/2")
DEFAULT_SHAPES = tuple(f"{heads}:{d}{':lq=4' if lq > 1 else ''}" for d in (64, 96, 128, 256)
                       for heads in DEFAULT_HEADS for lq in (1, 4)) + (
    "32/8:128:page=16", "32/8:128:page=128", "32/8:128:kv=fp8e4m3")
DEFAULT_BATCHES = (1, 4, 16, 64)
DEFAULT_SEQLENS = (1024, 4096, 16384, 131072, 307200)
#: After a grid, its cells of at most this many batch rows and keys are timed again, one fresh
#: process per head dim (:func:`retime_short_cells`): late in a run of hundreds of cells cute's
#: short calls time slower than in a fresh process (H200: 3.6% at B <= 4 x <= 4k; H100: 6% at 1k
#: keys, 29 of 306 verdicts flipped; the cause is not known), Triton's do not.
RETIME_MAX_BATCH = 4
RETIME_MAX_SEQLEN = 16384
#: ... when the run timed more cells than this: the fresh processes whose times matched a bench
#: run ran 72-90 cells each (H100), and a check of a few cells needs no second pass.
RETIME_AFTER_CELLS = 100

_EPILOG = """\
examples:
  flashsplit tune --out h200.json                    # the default grid (907 cells, ~12 min on an H200
                                                     # or an H100, then ~5 to re-time its short cells)
  flashsplit tune --shape 32/8:128 --shape 32/8:128:lq=4 --batch 1 16 --seqlen 4k 128k
                                                     # check auto on a few cells
  flashsplit tune --shape 40/8:128 --jsonl part.jsonl   # a grid in pieces: recorded cells are skipped
  flashsplit tune --from-jsonl part1.jsonl part2.jsonl --out h200.json   # no GPU needed
  flashsplit tune --update flashsplit/tables/h200.json --shape 32/8:128:kv=fp8e4m3 --batch 1 64
                                                     # time some cells again, merged into a table
  FLASHSPLIT_SELECTION_TABLE=h200.json python serve.py   # auto votes from that table

Late in a long run cute's short calls time slower than in a fresh process (H200: 3.6% at
B <= 4 x <= 4k; H100: 6% at 1k keys; the cause is not known). After a grid of more than 100
cells, tune times its cells of B <= 4 x <= 16k keys again, one fresh process per head dim, and
keeps those times (--no-retime skips this).
"""


def parse_shape(text: str) -> dict:
    """``"32/8:128:lq=4:page=16"`` -> ``{"num_heads": 32, "num_heads_kv": 8, "head_dim": 128,
    "seqlen_q": 4, "page_size": 16, "kv_dtype": "same"}``."""
    heads, _, rest = text.partition(":")
    head_dim, *items = rest.split(":")
    try:
        q, kv = parse_heads(heads)
        shape = dict(num_heads=q, num_heads_kv=kv, head_dim=parse_head_dim(head_dim), seqlen_q=1, page_size=0,
                     kv_dtype="same")
        for item in items:
            key, _, value = item.partition("=")
            if key == "lq" and value.isdigit() and int(value) >= 1:
                shape["seqlen_q"] = int(value)
            elif key == "page" and value.isdigit() and int(value) >= 1:
                shape["page_size"] = int(value)
            elif key == "kv" and value in KV_DTYPES:
                shape["kv_dtype"] = value
            else:
                raise argparse.ArgumentTypeError(item)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"expected Q/KV:D[:lq=N][:page=P][:kv=fp8e4m3|fp8e5m2] ({e}), "
                                         f"got {text!r}") from None
    return shape


def _shape_words(shape: dict, sep: str, head_dim: str, seqlen_q: str, page: str, kv: str) -> str:
    """A shape's heads, then its head dim and, where they are not the default, its queries per
    row, page size and cache dtype, each through its format, joined by ``sep``."""
    words = [f"{shape['num_heads']}/{shape['num_heads_kv']}", head_dim.format(shape["head_dim"])]
    if shape["seqlen_q"] > 1:
        words.append(seqlen_q.format(shape["seqlen_q"]))
    if shape["page_size"]:
        words.append(page.format(shape["page_size"]))
    if shape["kv_dtype"] != "same":
        words.append(kv.format(shape["kv_dtype"]))
    return sep.join(words)


def shape_text(shape: dict) -> str:
    """The ``--shape`` text of a shape (:func:`parse_shape`'s inverse): ``32/8:128:lq=4``."""
    return _shape_words(shape, ":", "{}", "lq={}", "page={}", "kv={}")


def shape_label(shape: dict) -> str:
    """A shape as the printed lines name it: ``32/8 d128 Lq4``."""
    return _shape_words(shape, " ", "d{}", "Lq{}", "p{}", "{}")


#: A record's shape fields (:func:`parse_shape`'s keys).
SHAPE_KEYS = ("num_heads", "num_heads_kv", "head_dim", "seqlen_q", "page_size", "kv_dtype")


def cell_key(record: dict) -> tuple:
    """What identifies a cell of one GPU's grid in a record."""
    return tuple(record[k] for k in ("gpu", *SHAPE_KEYS, "batch", "seqlen_k"))


def record_cell(record: dict) -> Cell | None:
    """The table cell of a record; None if a backend has no time in it."""
    times = [record.get(f"{name}_us") for name in BACKENDS]
    if not all(isinstance(t, (int, float)) for t in times):
        return None
    cache_dtype = KV_DTYPES[record["kv_dtype"]] or torch.bfloat16  # the grid's queries are bf16
    return Cell(record["num_heads"], record["num_heads_kv"], record["head_dim"], record["seqlen_q"],
                record["page_size"], str(cache_dtype).removeprefix("torch."), record["batch"], record["seqlen_k"],
                *times)


def build_table(records: list[dict]) -> Table:
    """The table of the GPU of the last record, from every record of that GPU (the latest time
    of a cell recorded twice); its ``command``: each distinct command that measured them."""
    if not records:
        raise ValueError("records: expected at least one tune record, got none")
    last = records[-1]
    cells, commands = {}, {}
    for record in records:
        if record["gpu"] == last["gpu"]:
            cell = record_cell(record)
            if cell is not None:
                cells[cell_key(record)] = cell
                commands[record.get("command", "")] = None
    return Table(last["gpu"], last["num_sms"], last["date"], last["versions"], "; ".join(c for c in commands if c),
                 tuple(cells.values()))


def read_records(paths: list[str]) -> list[dict]:
    records = []
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{n}: expected one JSON record per line, got {e}") from None
    for record in records:
        missing = [k for k in ("gpu", "num_sms", "date", "versions", "batch", "seqlen_k") if k not in record]
        if missing:
            raise ValueError(f"records: expected tune records, one lacks {missing}: {str(record)[:120]}")
    return records


def table_records(table: Table) -> list[dict]:
    """A table's cells as tune records, each with the table's GPU, date, versions and command: the
    base that newer records update (:func:`build_table` keeps a cell's latest record)."""
    kv_names = {str(dtype).removeprefix("torch."): name for name, dtype in KV_DTYPES.items() if dtype is not None}
    kv_names["bfloat16"] = SAME_KV  # the grid's queries are bf16
    base = dict(gpu=table.gpu, num_sms=table.num_sms, date=table.date, versions=table.versions,
                command=table.command)
    records = []
    for cell in table.cells:
        if cell.kv_dtype not in kv_names:
            raise ValueError(f"table: expected cells of a bfloat16 or fp8 cache, got {cell.kv_dtype} in "
                             f"{cell.describe()}")
        fields = {k: getattr(cell, k) for k in SHAPE_KEYS + ("batch", "seqlen_k", "triton_us", "cute_us")}
        fields["kv_dtype"] = kv_names[cell.kv_dtype]
        records.append(dict(base, **fields))
    return records


def update_records(path: str, gpu: str) -> list[dict]:
    """The records of the table in ``path`` (``--update``); ``ValueError`` unless it was measured
    on ``gpu``: a table holds one GPU model's times."""
    table = load_table(path)
    if table.gpu != gpu:
        raise ValueError(f"--update: expected a table measured on {gpu}, got one of {table.gpu} ({path})")
    return table_records(table)


def versions() -> dict:
    import triton

    found = {"torch": torch.__version__, "triton": triton.__version__}
    try:
        from importlib.metadata import version

        found["nvidia-cutlass-dsl"] = version("nvidia-cutlass-dsl")
    except Exception:  # not installed: cute cannot run, the grid stops at its first cell
        pass
    return found


def time_cell(case: Case, rounds: int) -> dict:
    """Both backends' errors, splits and device times (us) in one cell, and auto's pick."""
    import flashsplit

    from .check import check_output
    from .inputs import make_inputs
    from .timing import time_side_by_side

    def plan(backend: str):
        return flashsplit.plan(case.batch, case.seqlen_k, case.num_heads, case.num_heads_kv, case.head_dim,
                               seqlen_q=case.seqlen_q, causal=case.causal, page_size=case.page_size,
                               kv_dtype=KV_DTYPES[case.kv_dtype], backend=backend)

    auto = plan("auto")
    record = dict(auto=auto.backend, rule=auto.rule)
    num_sets = rotation_count(case.kv_bytes, mem_cap_bytes=40e9)
    inputs = make_inputs(case, num_sets)
    outs = [torch.full_like(q, float("nan")) for q in inputs.q]
    runs = {}
    for name in BACKENDS:
        def run(i, name=name):
            flashsplit.api.decode_into(inputs.q[i], inputs.k[i], inputs.v[i], outs[i], None,
                                       cache_seqlens=inputs.cache_seqlens, backend=name,
                                       **inputs.cache_kwargs(i), **inputs.variant_kwargs())
        for out in outs:
            out.fill_(float("nan"))
        try:
            run(0)
        except ValueError as e:  # the backend cannot run this shape (its supports() refused it)
            record[f"{name}_refused"] = str(e)
            continue
        torch.cuda.synchronize()
        checked = check_output(outs[0], inputs)
        record[f"{name}_err"] = checked.rel_err
        record[f"{name}_splits"] = plan(name).num_splits
        if checked.ok:
            runs[name] = run
        else:
            record[f"{name}_wrong"] = checked.detail
    for name, us in time_side_by_side(runs, num_sets, case.kv_bytes, rounds).items():
        record[f"{name}_us"] = round(us, 2)
    del inputs, outs
    torch.cuda.empty_cache()
    return record


def summary_line(label: str, record: dict) -> tuple[str, float | None]:
    """The printed line of a cell and auto / best (None when a backend has no time)."""
    head = f"{label:24s} B={record['batch']:3d} L={format_seqlen(record['seqlen_k']):5s}"
    times = {n: record.get(f"{n}_us") for n in BACKENDS}
    if None in times.values():
        why = [f"{n}: {record.get(n + '_wrong') or record.get(n + '_refused')}" for n in BACKENDS if times[n] is None]
        return f"{head} not timed: " + "; ".join(why), None
    ratio = times[record["auto"]] / min(times.values())
    cells = "  ".join(f"{n} {times[n]:>9.2f} ({record[n + '_splits']})" for n in BACKENDS)
    return f"{head} {cells}  auto {record['auto']} ({record['rule']}) {ratio:.3f}", ratio


def run_grid(args: argparse.Namespace) -> int:
    from .device import device_info

    info = device_info()
    start = time.monotonic()
    base = dict(gpu=info.name, num_sms=info.num_sms, date=datetime.date.today().isoformat(), versions=versions(),
                command="flashsplit tune " + " ".join(sys.argv[2:]))
    print(f"{info.name}, {base['versions']}", flush=True)
    try:
        base_records = update_records(args.update, info.name) if args.update else []
    except (OSError, ValueError) as e:
        print(f"flashsplit tune: error: {e}", file=sys.stderr)
        return 2
    records = read_records([args.jsonl]) if args.jsonl and os.path.exists(args.jsonl) else []
    done = {cell_key(r) for r in records}
    timed, skipped = [], []
    for text in args.shape:
        shape = parse_shape(text)
        label = shape_label(shape)
        for batch in args.batch:
            for seqlen in args.seqlen:
                case = Case(batch, seqlen, **shape)
                record = dict(base, **shape, batch=batch, seqlen_k=seqlen)
                if case.kv_bytes > args.max_kv_gb * 1e9 or cell_key(record) in done:
                    continue
                if args.deadline_s and time.monotonic() - start > args.deadline_s:
                    skipped.append(f"{label} B={batch} L={format_seqlen(seqlen)}")
                    continue
                t0 = time.monotonic()
                record.update(time_cell(case, args.rounds), seconds=round(time.monotonic() - t0, 1))
                print(summary_line(label, record)[0], f"[{record['seconds']} s]", flush=True)
                timed.append(record)
                _append(args.jsonl, [record])
    if args.retime and len(timed) > RETIME_AFTER_CELLS:
        deadline = args.deadline_s - (time.monotonic() - start) if args.deadline_s else 0.0
        fresh = [dict(r, command=base["command"]) for r in
                 retime_short_cells(timed, args.rounds, args.max_kv_gb, deadline)]
        _append(args.jsonl, fresh)
        latest = {cell_key(r): r for r in timed + fresh}
        timed = list(latest.values())
    records += timed
    misses = []
    for record in timed:
        line, ratio = summary_line(shape_label(record), record)
        if ratio is None or ratio > args.tolerance:
            misses.append(line)
    print(f"\n{len(misses)} cells over {args.tolerance} or not timed:")
    print("\n".join(misses))
    if skipped:
        print(f"\nnot reached by the deadline ({len(skipped)}): " + ", ".join(skipped))
    if args.out or args.update:
        _write_table(base_records + [r for r in records if r["gpu"] == info.name], args.out or args.update)
    return 1 if any(f"{n}_wrong" in r for r in timed for n in BACKENDS) else 0


def _append(path: str | None, records: list[dict]) -> None:
    if path and records:
        with open(path, "a") as f:
            f.writelines(json.dumps(record) + "\n" for record in records)


def retime_groups(records: list[dict]) -> list[list[str]]:
    """``flashsplit tune`` arguments that time the short cells among ``records`` again
    (:data:`RETIME_MAX_BATCH`, :data:`RETIME_MAX_SEQLEN`), one list per head dim: its shapes, and
    the batches and key counts its short cells were timed at (a shape's short cells, as the grid
    crosses them)."""
    groups: dict[int, tuple[dict, set, set]] = {}
    for r in records:
        if r["batch"] <= RETIME_MAX_BATCH and r["seqlen_k"] <= RETIME_MAX_SEQLEN:
            shapes, batches, seqlens = groups.setdefault(r["head_dim"], ({}, set(), set()))
            shapes[shape_text({k: r[k] for k in SHAPE_KEYS})] = None
            batches.add(r["batch"])
            seqlens.add(r["seqlen_k"])
    return [[arg for shape in shapes for arg in ("--shape", shape)]
            + ["--batch", *map(str, sorted(batches)), "--seqlen", *map(str, sorted(seqlens))]
            for _, (shapes, batches, seqlens) in sorted(groups.items())]


def retime_short_cells(records: list[dict], rounds: int, max_kv_gb: float, deadline_s: float = 0.0) -> list[dict]:
    """Time the short cells among ``records`` again, each head dim's in a fresh ``flashsplit tune``
    process (:func:`retime_groups`), and return their records (a cell's later record replaces its
    earlier one in a table). ``deadline_s`` (0: none) is the time left: no process starts after it.
    A process that fails prints why and adds nothing."""
    groups = retime_groups(records)
    if not groups:
        return []
    print(f"\ntiming the cells of B <= {RETIME_MAX_BATCH} x <= {format_seqlen(RETIME_MAX_SEQLEN)} keys again, a "
          "fresh process per head dim:", flush=True)
    torch.cuda.empty_cache()  # (this process keeps its context; its cached blocks go back)
    start = time.monotonic()
    fresh = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, group in enumerate(groups):
            left = deadline_s - (time.monotonic() - start) if deadline_s else 0.0
            if deadline_s and left <= 0:
                print(f"not re-timed by the deadline: {len(groups) - n} head dim(s)")
                break
            path = os.path.join(tmp, f"{n}.jsonl")
            command = [sys.executable, "-m", "flashsplit", "tune", "--no-retime", *group, "--rounds", str(rounds),
                       "--max-kv-gb", str(max_kv_gb), "--jsonl", path]
            if deadline_s:
                command += ["--deadline-s", str(left)]
            done = subprocess.run(command, capture_output=True, text=True)
            cell_lines = [line for line in done.stdout.splitlines(keepends=True) if line.rstrip().endswith(" s]")]
            print("".join(cell_lines), end="", flush=True)
            if done.returncode not in (0, 1):
                print(f"re-timing failed ({' '.join(command[2:])}): {done.stderr.strip()[-400:]}", flush=True)
                continue
            if os.path.exists(path):
                fresh += read_records([path])
    return fresh


def _write_table(records: list[dict], path: str) -> None:
    table = build_table(records)
    kept = [r for r in records if r["gpu"] == table.gpu]
    timed_with = {json.dumps(r["versions"], sort_keys=True) for r in kept}
    if len(timed_with) > 1:
        print(f"note: {path}'s cells were timed with different versions: {', '.join(sorted(timed_with))}")
    data = table.to_json()
    cells = data.pop("cells")
    with open(path, "w") as f:  # one cell per line: a table reads (and diffs) as rows
        f.write(json.dumps(data, indent=1)[:-2] + ',\n "cells": [\n')
        f.write(",\n".join("  " + json.dumps(cell) for cell in cells) + "\n ]\n}\n")
    print(f"wrote {path}: {len(table.cells)} cells measured on {table.gpu}")


def run_tune_command(args: argparse.Namespace) -> int:
    if args.from_jsonl:
        try:
            records = read_records(args.from_jsonl)
            if args.update and records:  # (no records: build_table says so)
                records = update_records(args.update, records[-1]["gpu"]) + records
            _write_table(records, args.out or args.update)
        except (OSError, ValueError) as e:
            print(f"flashsplit tune: error: {e}", file=sys.stderr)
            return 2
        return 0
    if not torch.cuda.is_available():
        print("flashsplit tune: error: timing needs a CUDA GPU and none was found; --from-jsonl builds a table "
              "from saved records without one", file=sys.stderr)
        return 2
    return run_grid(args)


def configure_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--shape", action="append", type=lambda t: parse_shape(t) and t, metavar="Q/KV:D[:...]",
                        help="q/KV heads and head dim, with :lq=N (causal queries per row), :page=P (paged), "
                             ":kv=fp8e4m3|fp8e5m2; repeatable (default: head dims 64, 96, 128, 256 x heads "
                             f"{', '.join(DEFAULT_HEADS)} x L_q 1, 4, and 32/8:128 in pages of 16, 128 and fp8)")
    parser.add_argument("--batch", type=int, nargs="+", default=list(DEFAULT_BATCHES), metavar="B")
    parser.add_argument("--seqlen", type=parse_seqlen, nargs="+", default=list(DEFAULT_SEQLENS), metavar="L",
                        help="keys per row (1k = 1024; default 1k 4k 16k 128k 300k)")
    parser.add_argument("--max-kv-gb", type=float, default=20.0, help="skip cells with more KV (default 20)")
    parser.add_argument("--rounds", type=int, default=12, help="interleaved timing rounds per cell (default 12)")
    parser.add_argument("--tolerance", type=float, default=1.02, help="auto / best above this is listed (default 1.02)")
    parser.add_argument("--deadline-s", type=float, default=0.0, help="start no cell after this many seconds")
    parser.add_argument("--jsonl", metavar="FILE", help="append a record per cell; skip cells recorded there")
    parser.add_argument("--no-retime", dest="retime", action="store_false",
                        help=f"do not time the cells of B <= {RETIME_MAX_BATCH} x <= "
                             f"{format_seqlen(RETIME_MAX_SEQLEN)} keys again in a fresh process per head dim "
                             f"after a grid of more than {RETIME_AFTER_CELLS} cells")
    parser.add_argument("--out", metavar="FILE", help="write the selection table (JSON)")
    parser.add_argument("--from-jsonl", nargs="+", metavar="FILE", help="build --out from saved records (no GPU)")
    parser.add_argument("--update", metavar="TABLE",
                        help="start from this table (of this GPU): the cells timed now, or read by --from-jsonl, "
                             "replace its cells of the same shape; the merged table goes to --out, else back to TABLE")
    return parser


def add_tune_parser(subparsers) -> argparse.ArgumentParser:
    """Add the ``tune`` sub-command to an argparse ``subparsers`` object; sets ``func``."""
    parser = subparsers.add_parser(
        "tune", help="time both backends over a grid on this GPU and write its selection table",
        description=__doc__.split("\n\n")[0] + ". Timing needs a CUDA GPU with both backends; --from-jsonl "
                    "does not.", epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    configure_parser(parser)
    parser.set_defaults(func=_checked_run, parser=parser)
    return parser


def _checked_run(args: argparse.Namespace) -> int:
    if args.from_jsonl and not (args.out or args.update):
        args.parser.error("--from-jsonl needs --out or --update")
    args.shape = args.shape or list(DEFAULT_SHAPES)
    return run_tune_command(args)
