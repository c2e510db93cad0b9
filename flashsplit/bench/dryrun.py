"""``--dry-run``: what a run would do, computed without a GPU (no inputs, no timing)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .cases import Case, SkippedCell, case_rotation, rotation_note
from .contenders import Contender, Unsupported
from .device import DeviceInfo


@dataclass(frozen=True)
class ContenderStatus:
    name: str
    family: str
    reason: str | None  # None: would run (static checks only; the GPU check is the header's)


@dataclass
class PlannedCell:
    """One cell: its rotation count (and ``rotation_note``, a warning when the memory cap left
    too few sets to keep the KV out of L2), per flashsplit contender the planned split count (an
    int) or why the backend cannot run it (a str), the keys its splits cover (``spans``: under a
    window, ``SplitPlan.span``), which backend each of them would run and the selection rule
    behind it (``"cute (swapped-operands)"``), and per other contender that cannot take the
    cell's cache format (paged, fp8), attention variant (window, softcap, sinks,
    batch-invariant, append, rotary) or queries per row (``L_q > 1``) why not."""

    case: Case
    sets: int
    plans: dict[str, int | str] = field(default_factory=dict)
    backends: dict[str, str] = field(default_factory=dict)
    spans: dict[str, int] = field(default_factory=dict)
    format_skips: dict[str, str] = field(default_factory=dict)
    variant_skips: dict[str, str] = field(default_factory=dict)
    query_skips: dict[str, str] = field(default_factory=dict)
    rotation_note: str = ""


@dataclass
class DryRun:
    device: DeviceInfo
    contenders: list[ContenderStatus]
    cells: list[PlannedCell]
    skipped: list[SkippedCell]


def build_dry_run(cases: list[Case], skipped: list[SkippedCell], contenders: list[Contender],
                  device: DeviceInfo, mem_cap_bytes: float) -> DryRun:
    statuses = [ContenderStatus(c.name, c.family, c.static_reason()) for c in contenders]
    runnable = {s.name for s in statuses if s.reason is None}
    planners = [c for c in contenders if c.family == "flashsplit" and c.name in runnable]
    cells = []
    for case in cases:
        sets = case_rotation(case, device.l2_bytes, mem_cap_bytes)
        cell = PlannedCell(case, sets, rotation_note=rotation_note(case, sets, device.l2_bytes))
        for c in planners:
            try:
                plan = c.plan(case, device.num_sms)
                cell.plans[c.name] = plan.num_splits
                cell.backends[c.name] = f"{plan.backend} ({plan.rule})"
                cell.spans[c.name] = plan.span
            except Unsupported as e:
                cell.plans[c.name] = str(e)
        for c in contenders:
            if c.name not in runnable:
                continue
            # in the runner's order (Contender.skip_reason): only the first reason counts
            for skips, reason in ((cell.format_skips, c.format_reason(case)),
                                  (cell.variant_skips, c.variant_reason(case)),
                                  (cell.query_skips, c.queries_reason(case))):
                if reason is not None:
                    skips[c.name] = reason
                    break
        cells.append(cell)
    return DryRun(device, statuses, cells, skipped)
