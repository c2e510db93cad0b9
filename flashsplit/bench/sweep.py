"""``--sweep-splits``: time flashsplit at every num_splits of a list and judge the heuristic.

For each case and each flashsplit backend, every split count in the list (plus the
heuristic's own choice, if it is not in the list) runs as a normal checked, timed row; the
:class:`~.rows.SweepSummary` then compares the heuristic's choice with the fastest one.
"""

from __future__ import annotations

from .cases import Case
from .contenders import Contender, FlashsplitContender, Unsupported
from .device import DeviceInfo
from .inputs import InputSets
from .rows import OK, BenchRow, SweepSummary
from .runner import Progress, RunOptions, bench_one, run_case

#: The default sweep: 1..64 splits.
DEFAULT_SWEEP = tuple(range(1, 65))


def sweep_backends(contenders: list[Contender]) -> list[FlashsplitContender]:
    """The heuristic-driven flashsplit backends among ``contenders`` (not ``auto``, not a fixed count)."""
    return [c for c in contenders
            if isinstance(c, FlashsplitContender) and c.backend != "auto" and c.num_splits == 0]


def _summary(contender: str, case: Case, **kw) -> SweepSummary:
    return SweepSummary(contender, case.batch, case.seqlen_k, case.num_heads, case.num_heads_kv, case.head_dim,
                        case.dtype, case.page_size, case.kv, case.window, case.softcap, case.sinks,
                        case.batch_invariant, case.append, case.rotary, seqlen_q=case.seqlen_q, **kw)


def summarize(contender: str, case: Case, heuristic: int | None, rows: list[BenchRow]) -> SweepSummary:
    """Heuristic vs best measured split count among ``rows`` (one per num_splits)."""
    summary = _summary(contender, case, heuristic_splits=heuristic)
    timed = [r for r in rows if r.status == OK and r.device_us is not None]
    if not timed:
        summary.note = "no split count ran"
        return summary
    best = min(timed, key=lambda r: r.device_us)
    summary.best_splits, summary.best_us = best.num_splits, best.device_us
    heur = next((r for r in timed if r.num_splits == heuristic), None)
    if heur is None:
        summary.note = "the heuristic's split count did not run"
        return summary
    summary.heuristic_us = heur.device_us
    summary.gap_pct = 100.0 * (heur.device_us - best.device_us) / best.device_us
    failed = [r.num_splits for r in rows if r.status != OK]
    if failed:
        summary.note = f"not timed at num_splits {failed}"
    return summary


def sweep_case(case: Case, backends: list[FlashsplitContender], splits: list[int], device: DeviceInfo,
               ceiling_bw: float | None, options: RunOptions,
               progress: Progress | None = None) -> tuple[list[BenchRow], list[SweepSummary]]:
    """Sweep ``splits`` for every backend on one case; returns the per-count rows and summaries."""
    progress = progress or Progress()
    summaries: list[SweepSummary] = []

    def body(inputs: InputSets) -> list[BenchRow]:
        rows: list[BenchRow] = []
        for backend in backends:
            try:
                heuristic = backend.plan(case, device.num_sms).num_splits
            except Unsupported as e:
                summaries.append(_summary(backend.name, case, note=str(e)))
                continue
            backend_rows = []
            for s in sorted(set(splits) | {heuristic}):
                fixed = FlashsplitContender(backend.name, backend.backend, num_splits=s)
                progress.start(f"{backend.name} splits={s} {case.label()}")
                row = bench_one(fixed, case, inputs, device, ceiling_bw, options)
                row.note = "; ".join(p for p in ("heuristic" if s == heuristic else "", row.note) if p)
                backend_rows.append(row)
                progress.advance(row)
            rows.extend(backend_rows)
            summaries.append(summarize(backend.name, case, heuristic, backend_rows))
        return rows

    rows = run_case(case, backends, device, ceiling_bw, options, progress, body=body)
    return rows, summaries


def sweep_grid(cases: list[Case], backends: list[FlashsplitContender], splits: list[int], device: DeviceInfo,
               ceiling_bw: float | None, options: RunOptions,
               progress: Progress | None = None) -> tuple[list[BenchRow], list[SweepSummary]]:
    rows: list[BenchRow] = []
    summaries: list[SweepSummary] = []
    for case in cases:
        r, s = sweep_case(case, backends, splits, device, ceiling_bw, options, progress)
        rows.extend(r)
        summaries.extend(s)
    return rows, summaries

