"""Run contenders over the grid and return :class:`~.rows.BenchRow` s (no rendering here).

One failing contender never stops the run: its exception becomes the row's ``error`` status
and note. Inputs are made once per case and shared by every contender. A contender that cannot
take a case's cache format (paged, fp8), attention variant (window, softcap, sinks,
batch-invariant, append, rotary) or queries per row (``L_q > 1``) is skipped with its reason
before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .cases import Case, case_rotation, rotation_note
from .check import check_output
from .contenders import Contender, Unsupported
from .device import DeviceInfo, synchronize
from .inputs import InputSets, make_inputs
from .rows import ERROR, OK, SKIPPED, WRONG, BenchRow
from .timing import Timing, TimingConfig, measure


@dataclass(frozen=True)
class RunOptions:
    """How to run: timing settings, memory cap, input seed, and the timer itself
    (``timer(run, num_sets, timing) -> Timing``; tests substitute a fake one to run on CPU)."""

    timing: TimingConfig = field(default_factory=TimingConfig)
    mem_cap_bytes: float = 80e9
    seed: int = 0
    timer: Callable[[Callable[[int], object], int, TimingConfig], Timing] = measure


class Progress:
    """Callbacks the runner reports to (the CLI drives a rich progress bar with them)."""

    def start(self, description: str) -> None:
        pass

    def advance(self, row: BenchRow) -> None:
        pass


def _free() -> None:
    # Return freed cache blocks so the next case (maybe 34 GB of KV) finds the memory.
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _short(e: BaseException, limit: int = 160) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text[:limit]}"


def empty_row(contender: str, case: Case, **kw) -> BenchRow:
    return BenchRow(contender, case.batch, case.seqlen_k, case.num_heads, case.num_heads_kv, case.head_dim,
                    case.dtype, case.page_size, case.kv, case.window, case.softcap, case.sinks, case.batch_invariant,
                    case.append, case.rotary, seqlen_q=case.seqlen_q, **kw)


def fill_bandwidth(row: BenchRow, case: Case, device: DeviceInfo, ceiling_bw: float | None) -> None:
    """GB/s of (KV + q + out) bytes at ``row.device_us``, and its share of datasheet and ceiling."""
    if not row.device_us:
        return
    bw = case.moved_bytes / (row.device_us * 1e-6)
    row.gbps = bw / 1e9
    row.pct_datasheet = 100.0 * bw / device.datasheet_bw
    row.pct_ceiling = 100.0 * bw / ceiling_bw if ceiling_bw else None


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def bench_one(contender: Contender, case: Case, inputs: InputSets, device: DeviceInfo,
              ceiling_bw: float | None, options: RunOptions) -> BenchRow:
    """Prepare, check against the reference (set 0; not for the read floor, which computes no
    attention), then time one contender on one case."""
    row = empty_row(contender.name, case, sets=len(inputs))
    reason = contender.skip_reason(case)
    if reason is not None:  # never time it on another format, variant or query count instead
        row.status, row.note = SKIPPED, reason
        return row
    prepared = None
    try:
        prepared = contender.prepare(case, inputs)
        row.num_splits, row.note = prepared.num_splits, prepared.note
        out = prepared(0)
        synchronize()
        if contender.checks_output:
            result = check_output(prepared.to_bshd(out), inputs)
            row.rel_err = result.rel_err
            if not result.ok:
                row.status, row.note = WRONG, _join(f"wrong: {result.detail}", row.note)
                return row
        del out
        t = options.timer(prepared, len(inputs), options.timing)
        row.device_us, row.eager_us, row.host_us, row.method = t.device_us, t.eager_us, t.host_us, t.method
        row.note = _join(row.note, t.note)
        fill_bandwidth(row, case, device, ceiling_bw)
        row.status = OK
    except Unsupported as e:
        row.status, row.note = SKIPPED, str(e)
    except Exception as e:  # any failure is this contender's row, never the run's
        row.status, row.note = ERROR, _short(e)
    finally:
        if prepared is not None:
            try:
                prepared.close()
            except Exception as e:
                row.note = _join(row.note, f"close failed: {_short(e)}")
        del prepared
    return row


def run_case(case: Case, contenders: list[Contender], device: DeviceInfo, ceiling_bw: float | None,
             options: RunOptions, progress: Progress | None = None,
             body: Callable[[InputSets], list[BenchRow]] | None = None) -> list[BenchRow]:
    """Make the case's input sets, run ``body`` (default: every contender) on them, free them.
    Rows of a case with too few sets to keep its KV out of L2 say so (:func:`~.cases.rotation_note`)."""
    progress = progress or Progress()
    sets = case_rotation(case, device.l2_bytes, options.mem_cap_bytes)
    try:
        inputs = make_inputs(case, sets, device="cuda" if device.is_cuda else "cpu", seed=options.seed)
    except Exception as e:  # typically out of memory: every contender of this case fails alike
        _free()
        rows = [empty_row(c.name, case, status=ERROR, sets=sets, note=f"making inputs failed: {_short(e)}")
                for c in contenders]
        for r in rows:
            progress.advance(r)
        return rows
    try:
        if body is not None:
            rows = body(inputs)
        else:
            rows = []
            for contender in contenders:
                progress.start(f"{contender.name} {case.label()}")
                row = bench_one(contender, case, inputs, device, ceiling_bw, options)
                rows.append(row)
                progress.advance(row)
        note = rotation_note(case, sets, device.l2_bytes)
        for r in rows:
            if note and r.status == OK:
                r.note = _join(r.note, note)
        return rows
    finally:
        del inputs
        _free()


def run_grid(cases: list[Case], contenders: list[Contender], device: DeviceInfo, ceiling_bw: float | None,
             options: RunOptions, progress: Progress | None = None) -> list[BenchRow]:
    """Every contender on every case, case by case."""
    rows: list[BenchRow] = []
    for case in cases:
        rows.extend(run_case(case, contenders, device, ceiling_bw, options, progress))
    return rows
