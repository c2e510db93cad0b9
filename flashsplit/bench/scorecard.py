"""The bench's scorecard: per cell, flashsplit ``auto`` against the faster flashsplit backend, the
peers and the read floor, all from the same run.

For each cell where ``auto`` was timed: its time over the faster of ``triton`` and ``cute`` where
both ran (``auto`` should be within :data:`AUTO_SLACK` of it), over cuDNN SDPA's and
FlashAttention-3's (``sdpa-cudnn``, ``flash-attn3``; under 1 is faster), and over the floor: the
measured read of the cell's bytes where the run timed it (``--read-floor``), else the cell's bytes
read at the run's measured ceiling. Nothing here measures anything; it reads
:class:`~.rows.BenchRow` s, so it summarizes saved runs too (``--from-json``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .rows import OK, BenchRow, CellVariantFields

#: ``auto`` within 2% of the faster flashsplit backend of its cell.
AUTO_SLACK = 1.02
#: Against cuDNN a slower ``auto`` still ties within 0.5% where both read at >= 97% of the ceiling.
CUDNN_TIE = 1.005
TIE_PCT_CEILING = 97.0
#: The contenders the scorecard compares ``auto`` with.
BACKENDS = ("triton", "cute")
CUDNN, FA3, READ_FLOOR = "sdpa-cudnn", "flash-attn3", "read-floor"

_BACKEND_NOTE = re.compile(r"\bbackend (\w+)")


@dataclass
class ScoreRow(CellVariantFields):
    """One cell's scorecard (``contender`` is "auto"); ratios are auto's time over the other's."""

    auto_us: float = 0.0
    auto_backend: str = ""            # the backend auto ran, from its row's note
    best_backend: str = ""            # the faster of triton and cute ("" unless both ran)
    best_us: float | None = None
    vs_best: float | None = None
    cudnn_us: float | None = None
    vs_cudnn: float | None = None
    fa3_us: float | None = None
    vs_fa3: float | None = None
    floor_us: float | None = None     # the measured read of the cell's bytes, else its bytes at the ceiling
    vs_floor: float | None = None
    auto_ok: bool | None = None       # vs_best <= AUTO_SLACK (None: not both backends ran)
    cudnn_ok: bool | None = None      # auto at most cuDNN's time, or a tie at the read rate

    @property
    def kv(self) -> str:
        return self.kv_dtype or self.dtype


def _ratio(us: float, other: float | None) -> float | None:
    return None if other is None or other <= 0 else us / other


def score(rows: list[BenchRow]) -> list[ScoreRow]:
    """One :class:`ScoreRow` per cell with a timed ``auto`` row, in the rows' order."""
    timed: dict[tuple, dict[str, BenchRow]] = {}
    for row in rows:
        if row.status == OK and row.device_us:
            timed.setdefault(row.cell, {})[row.contender] = row
    card = []
    for by_name in timed.values():
        auto = by_name.get("auto")
        if auto is None:
            continue
        backends = [by_name[name] for name in BACKENDS if name in by_name]
        best = min(backends, key=lambda r: r.device_us) if len(backends) == len(BACKENDS) else None
        cudnn, fa3 = by_name.get(CUDNN), by_name.get(FA3)
        match = _BACKEND_NOTE.search(auto.note)
        s = ScoreRow("auto", auto.batch, auto.seqlen_k, auto.num_heads, auto.num_heads_kv, auto.head_dim, auto.dtype,
                     auto.page_size, auto.kv_dtype, auto.window, auto.softcap, auto.sinks, auto.batch_invariant,
                     auto.append, auto.rotary, seqlen_q=auto.seqlen_q, auto_us=auto.device_us,
                     auto_backend=match.group(1) if match else "")
        if best is not None:
            s.best_backend, s.best_us = best.contender, best.device_us
            s.vs_best = _ratio(auto.device_us, best.device_us)
            s.auto_ok = s.vs_best <= AUTO_SLACK
        if cudnn is not None:
            s.cudnn_us, s.vs_cudnn = cudnn.device_us, _ratio(auto.device_us, cudnn.device_us)
            at_read_rate = all(r.pct_ceiling is not None and r.pct_ceiling >= TIE_PCT_CEILING for r in (auto, cudnn))
            s.cudnn_ok = s.vs_cudnn <= 1.0 or (at_read_rate and s.vs_cudnn <= CUDNN_TIE)
        if fa3 is not None:
            s.fa3_us, s.vs_fa3 = fa3.device_us, _ratio(auto.device_us, fa3.device_us)
        floor = by_name.get(READ_FLOOR)
        if floor is not None:
            s.floor_us, s.vs_floor = floor.device_us, _ratio(auto.device_us, floor.device_us)
        elif auto.pct_ceiling:
            s.floor_us = auto.device_us * auto.pct_ceiling / 100.0
            s.vs_floor = 100.0 / auto.pct_ceiling
        card.append(s)
    return card
