"""Check ``backend="auto"`` over a grid of shapes: both backends timed side by side in each cell,
and the backend ``auto`` picks for it, against the faster one.

For each shape (q/KV heads, head dim, queries per row, cache format) and each cell (batch x keys,
KV capped by ``--max-kv-gb``), the Triton and cute launches that ``decode(backend=...)`` makes
are checked against the float64 reference (outputs poisoned with NaN first), captured as CUDA
graphs over input sets rotated so the KV never sits in L2, and replayed interleaved
(:func:`flashsplit.bench.timing.time_interleaved`). ``auto`` runs the launch of the backend it
picks (the rule in :func:`flashsplit.plan`), so its time is that backend's: the table gives
auto / best per cell and lists the cells over ``--tolerance``. One JSON object per cell goes to
``--jsonl`` as it finishes; cells not reached by ``--deadline-s`` are listed at the end.

    python scripts/selection_grid.py --shape 40/8:128 --shape 16/2:256 --shape 32/8:128:lq=4 \\
        --shape 32/8:128:page=16 --shape 32/8:128:kv=fp8e4m3 --batch 1 4 16 64 \\
        --seqlen 1k 4k 16k 128k 300k --jsonl grid.jsonl

Shape: ``Q/KV:D`` with optional ``:lq=N`` (queries per row, causal), ``:page=P`` (a paged cache
of P-key pages), ``:kv=fp8e4m3|fp8e5m2`` (an fp8 cache).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import flashsplit
from flashsplit.bench.cases import KV_DTYPES, Case, rotation_count
from flashsplit.bench.check import check_output
from flashsplit.bench.inputs import make_inputs
from flashsplit.bench.options import format_seqlen, parse_seqlen
from flashsplit.bench.timing import TimingConfig, calls_per_graph, capture_graph, time_interleaved

BACKENDS = ("triton", "cute")


def parse_shape(text: str) -> dict:
    """``"32/8:128:lq=4:page=16"`` -> ``{"num_heads": 32, "num_heads_kv": 8, "head_dim": 128,
    "seqlen_q": 4, "page_size": 16, "kv_dtype": "same"}``."""
    heads, _, rest = text.partition(":")
    parts = rest.split(":")
    try:
        q, kv = map(int, heads.split("/"))
        shape = dict(num_heads=q, num_heads_kv=kv, head_dim=int(parts[0]), seqlen_q=1, page_size=0, kv_dtype="same")
        for item in parts[1:]:
            key, _, value = item.partition("=")
            if key == "lq":
                shape["seqlen_q"] = int(value)
            elif key == "page":
                shape["page_size"] = int(value)
            elif key == "kv" and value in KV_DTYPES:
                shape["kv_dtype"] = value
            else:
                raise ValueError(item)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected Q/KV:D[:lq=N][:page=P][:kv=fp8e4m3|fp8e5m2], got {text!r}") from None
    return shape


def shape_label(shape: dict) -> str:
    label = f"{shape['num_heads']}/{shape['num_heads_kv']} d{shape['head_dim']}"
    if shape["seqlen_q"] > 1:
        label += f" Lq{shape['seqlen_q']}"
    if shape["page_size"]:
        label += f" p{shape['page_size']}"
    if shape["kv_dtype"] != "same":
        label += f" {shape['kv_dtype']}"
    return label


def plan_for(case: Case, backend: str):
    kv = KV_DTYPES[case.kv_dtype]
    return flashsplit.plan(case.batch, case.seqlen_k, case.num_heads, case.num_heads_kv, case.head_dim,
                           seqlen_q=case.seqlen_q, causal=case.causal, page_size=case.page_size, kv_dtype=kv,
                           backend=backend)


def run_cell(case: Case, rounds: int) -> dict:
    """Times and errors of both backends in one cell, and auto's pick."""
    auto = plan_for(case, "auto")
    record = dict(batch=case.batch, seqlen_k=case.seqlen_k, auto=auto.backend, rule=auto.rule)
    num_sets = rotation_count(case.kv_bytes, mem_cap_bytes=40e9)
    inputs = make_inputs(case, num_sets)
    outs = [torch.full_like(q, float("nan")) for q in inputs.q]
    runs = {}
    for name in BACKENDS:
        def run(i, name=name):
            flashsplit.api.decode_into(inputs.q[i], inputs.k[i], inputs.v[i], outs[i], None,
                                       cache_seqlens=inputs.cache_seqlens, backend=name,
                                       **inputs.cache_kwargs(i), **inputs.variant_kwargs())
        try:
            for out in outs:
                out.fill_(float("nan"))
            run(0)
            torch.cuda.synchronize()
        except Exception as e:  # a backend that cannot run the shape: recorded, not timed
            record[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
            continue
        checked = check_output(outs[0], inputs)
        record[f"{name}_err"] = checked.rel_err
        record[f"{name}_splits"] = plan_for(case, name).num_splits
        if checked.ok:
            runs[name] = run
        else:
            record[name] = f"wrong: {checked.detail}"
    calls = calls_per_graph(TimingConfig(), num_sets, per_call_us=max(1.0, case.kv_bytes / 4.0e6))
    graphs = {name: capture_graph(run, num_sets, calls) for name, run in runs.items()}
    for graph in graphs.values():
        for _ in range(3):
            graph.replay()
    torch.cuda.synchronize()
    for name, us in time_interleaved(graphs, calls, rounds).items():
        record[name] = round(us, 2)
    del graphs, inputs, outs
    torch.cuda.empty_cache()
    return record


def summarize(label: str, record: dict) -> tuple[str, float | None]:
    times = {n: record[n] for n in BACKENDS if isinstance(record.get(n), float)}
    if not times:
        return f"{label:24s} B={record['batch']:3d} L={format_seqlen(record['seqlen_k']):5s} no timing: " \
               f"{[record.get(n) for n in BACKENDS]}", None
    best = min(times.values())
    auto_us = times.get(record["auto"])
    ratio = auto_us / best if auto_us else None
    cells = "  ".join(f"{n} {record[n]:>9.2f} ({record.get(n + '_splits')})" if n in times else f"{n} {record.get(n)}"
                      for n in BACKENDS)
    return (f"{label:24s} B={record['batch']:3d} L={format_seqlen(record['seqlen_k']):5s} {cells}  auto {record['auto']}"
            f" ({record['rule']}) {ratio:.3f}" if ratio else f"{label} ... auto {record['auto']} not timed"), ratio


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", type=parse_shape, action="append", required=True)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--seqlen", type=parse_seqlen, nargs="+", default=[1024, 4096, 16384, 131072, 307200])
    ap.add_argument("--max-kv-gb", type=float, default=20.0, help="skip cells with more KV (default 20)")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--tolerance", type=float, default=1.02, help="auto / best above this is a miss")
    ap.add_argument("--deadline-s", type=float, default=0.0, help="stop starting cells after this (0: none)")
    ap.add_argument("--jsonl", help="append one JSON object per cell")
    args = ap.parse_args(argv)
    start = time.monotonic()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    misses, skipped = [], []
    for shape in args.shape:
        label = shape_label(shape)
        for batch in args.batch:
            for seqlen in args.seqlen:
                case = Case(batch, seqlen, **shape)
                if case.kv_bytes > args.max_kv_gb * 1e9:
                    continue
                if args.deadline_s and time.monotonic() - start > args.deadline_s:
                    skipped.append(f"{label} B={batch} L={format_seqlen(seqlen)}")
                    continue
                t0 = time.monotonic()
                record = dict(shape=label, **run_cell(case, args.rounds), seconds=round(time.monotonic() - t0, 1))
                line, ratio = summarize(label, record)
                print(line, f"[{record['seconds']} s]", flush=True)
                if ratio is None or ratio > args.tolerance:
                    misses.append(line)
                if args.jsonl:
                    with open(args.jsonl, "a") as f:
                        f.write(json.dumps(record) + "\n")
    print(f"\n{len(misses)} cells over {args.tolerance} or untimed:")
    print("\n".join(misses))
    if skipped:
        print(f"\nnot reached by the deadline ({len(skipped)}): " + ", ".join(skipped))


if __name__ == "__main__":
    main()
