"""Bench results as plain dataclasses, and their JSON / CSV forms (renderer-independent).

A :class:`Report` is a :class:`RunHeader` (the machine and the ceilings), the
:class:`BenchRow` list, for ``--sweep-splits`` the :class:`SweepSummary` list, for
``--compare-formats`` the :class:`FormatComparison` list and for ``--compare-variants`` the
:class:`VariantComparison` list. Every row type names its cell by the :class:`CellFields`, its
cache format (``page_size``, ``kv_dtype``) and its attention variant (``window``, ``softcap``,
``sinks``, ``batch_invariant``, ``append``, ``rotary``; reports written before a field existed
read it back at its plain default, ``seqlen_q`` at 1).
``report_from_json(report_to_json(r)) == r`` and ``rows_from_csv(rows_to_csv(rows)) == rows``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import typing
from dataclasses import dataclass, field

from .cases import Variant, variant_label

#: Row statuses. "wrong": ran but failed the reference check (not timed).
OK, SKIPPED, WRONG, ERROR = "ok", "skipped", "wrong", "error"


@dataclass
class CellFields:
    """The fields that name one contender on one grid cell; every row type starts with them.
    ``seqlen_q`` (queries per row; > 1: causal, bottom-right aligned) is keyword-only, so rows are
    built positionally as before it existed, and defaults to 1 for reports written before then."""

    contender: str
    batch: int
    seqlen_k: int
    seqlen_q: int = field(default=1, kw_only=True)
    num_heads: int
    num_heads_kv: int
    head_dim: int
    dtype: str


class VariantFields:
    """What the row types with ``window``, ``softcap``, ``sinks``, ``batch_invariant``, ``append``
    and ``rotary`` fields share."""

    window: int
    softcap: float
    sinks: bool
    batch_invariant: bool
    append: int
    rotary: bool

    @property
    def variant(self) -> Variant:
        return Variant(self.window, self.softcap, self.sinks, self.batch_invariant, self.append, self.rotary)

    @property
    def variant_label(self) -> str:
        return variant_label(self.window, self.softcap, self.sinks, self.batch_invariant, self.append, self.rotary)


@dataclass
class CellVariantFields(CellFields, VariantFields):
    """:class:`CellFields`, then the cell's cache format and attention variant: the leading
    fields of every row type but :class:`FormatComparison` (whose ``kind`` comes first)."""

    page_size: int = 0                # keys per page of a paged cache; 0: dense
    kv_dtype: str = ""                # the cache's dtype ("bf16", "fp8e4m3", ...); "" means dtype
    window: int = -1                  # attention variant: keys left of the query (-1: none),
    softcap: float = 0.0              # softcap (0: off), sinks, batch-invariant decode
    sinks: bool = False
    batch_invariant: bool = False
    append: int = 0                   # new keys per row written by the call; rotary of them and q
    rotary: bool = False


@dataclass
class BenchRow(CellVariantFields):
    """One contender on one case. Times in microseconds per call; None where not measured."""

    status: str = OK
    num_splits: int | None = None     # flashsplit contenders: from flashsplit.plan
    device_us: float | None = None
    eager_us: float | None = None
    host_us: float | None = None      # the host's time per eager call (the launch loop alone)
    method: str = ""                  # "graph" or "events": how device_us was measured
    gbps: float | None = None         # (KV + q + out) bytes / device time, in GB/s
    pct_datasheet: float | None = None
    pct_ceiling: float | None = None
    rel_err: float | None = None      # vs the float64 reference
    sets: int | None = None           # input sets rotated through (L2 defeat)
    note: str = ""

    @property
    def heads(self) -> str:
        return f"{self.num_heads}/{self.num_heads_kv}"

    @property
    def kv(self) -> str:
        return self.kv_dtype or self.dtype

    @property
    def cell(self) -> tuple:
        """The grid cell the row times, contender aside: shape, queries, cache format and variant."""
        return (self.batch, self.seqlen_k, self.seqlen_q, self.num_heads, self.num_heads_kv, self.head_dim, self.dtype,
                self.page_size, self.kv, self.variant)


@dataclass
class SweepSummary(CellVariantFields):
    """``--sweep-splits`` for one flashsplit backend on one case: heuristic vs best measured."""

    heuristic_splits: int | None = None
    heuristic_us: float | None = None
    best_splits: int | None = None
    best_us: float | None = None
    gap_pct: float | None = None      # (heuristic - best) / best * 100; 0 when the heuristic is best
    note: str = ""


@dataclass
class FormatComparison(CellFields, VariantFields):
    """``--compare-formats``: one flashsplit contender on one cell, a cache format against its baseline.

    ``kind`` "paged": a paged cache against the dense one of the same dtype (``ratio`` = paged
    time / dense time; lower is better). ``kind`` "fp8": an fp8 cache against the 16-bit one of
    the same layout (``speedup`` = 16-bit time / fp8 time; higher is better). ``target`` and
    ``met``: the performance target for this comparison, where one is set (:mod:`.formats`).
    """

    kind: str                         # "paged" or "fp8"
    page_size: int = 0                # the format measured
    kv_dtype: str = ""
    window: int = -1                  # the variant both were run with
    softcap: float = 0.0
    sinks: bool = False
    batch_invariant: bool = False
    append: int = 0
    rotary: bool = False
    base_page_size: int = 0           # the format it is compared with
    base_kv_dtype: str = ""
    us: float | None = None           # device us of the format
    base_us: float | None = None      # device us of the baseline
    ratio: float | None = None        # us / base_us
    speedup: float | None = None      # base_us / us
    target: str = ""                  # e.g. "paged/dense <= 1.10"; "" where no target is set
    met: bool | None = None
    note: str = ""


@dataclass
class VariantComparison(CellVariantFields):
    """``--compare-variants``: one contender on one cell and cache format, an attention variant
    against the plain decode of the same cell (``ratio`` = variant time / plain time). For a
    window of ``w``, also against the plain decode of a ``w + 1``-key cache (the keys the
    window sees), where the grid has that cell: ``short_seqlen``, ``short_us``, ``short_ratio``.
    """

    us: float | None = None           # device us of the variant
    base_us: float | None = None      # device us of the plain decode, same cell
    ratio: float | None = None        # us / base_us
    short_seqlen: int = 0             # w + 1 for a window of w (0: no window)
    short_us: float | None = None     # device us of the plain decode of short_seqlen keys
    short_ratio: float | None = None  # us / short_us
    note: str = ""


@dataclass
class RunHeader:
    """The run's machine and reference bandwidths."""

    device: str = ""
    num_sms: int = 0
    l2_bytes: int = 0
    datasheet_bw: float = 0.0         # bytes/s
    datasheet_note: str = ""
    ceiling_bw: float | None = None   # bytes/s, measured (None: probe skipped or failed)
    ceiling_note: str = ""
    torch_version: str = ""
    triton_version: str = ""
    flashsplit_version: str = ""
    timing: str = ""                  # the timing settings, in words
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    header: RunHeader
    rows: list[BenchRow] = field(default_factory=list)
    sweep: list[SweepSummary] = field(default_factory=list)
    formats: list[FormatComparison] = field(default_factory=list)
    variants: list[VariantComparison] = field(default_factory=list)


# -- conversions -----------------------------------------------------------------------------

def _coerce(value, annotation):
    """Turn a JSON/CSV value back into ``annotation``'s type (CSV gives strings; "" is None)."""
    args = typing.get_args(annotation)
    optional = type(None) in args
    if optional:
        annotation = next(a for a in args if a is not type(None))
        if value is None or value == "":
            return None
    if annotation is bool:
        return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "1")
    if annotation is int:
        return int(value)
    if annotation is float:
        return float(value)
    if annotation is str:
        return "" if value is None else str(value)
    return value


def from_dict(cls, data: dict):
    """Build dataclass ``cls`` from a dict, coercing each field to its annotated type."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _coerce(data[f.name], hints[f.name])
    return cls(**kwargs)


def _json_safe(value):
    # JSON has no inf/NaN: write them as strings, read back by float().
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    return value


def report_to_json(report: Report) -> str:
    payload = {
        "header": dataclasses.asdict(report.header),
        "rows": [{k: _json_safe(v) for k, v in dataclasses.asdict(r).items()} for r in report.rows],
        "sweep": [{k: _json_safe(v) for k, v in dataclasses.asdict(s).items()} for s in report.sweep],
        "formats": [{k: _json_safe(v) for k, v in dataclasses.asdict(c).items()} for c in report.formats],
        "variants": [{k: _json_safe(v) for k, v in dataclasses.asdict(c).items()} for c in report.variants],
    }
    return json.dumps(payload, indent=2)


def report_from_json(text: str) -> Report:
    payload = json.loads(text)
    header = from_dict(RunHeader, payload.get("header", {}))
    return Report(header, [from_dict(BenchRow, r) for r in payload.get("rows", [])],
                  [from_dict(SweepSummary, s) for s in payload.get("sweep", [])],
                  [from_dict(FormatComparison, c) for c in payload.get("formats", [])],
                  [from_dict(VariantComparison, c) for c in payload.get("variants", [])])


def to_csv(items: list, cls) -> str:
    """CSV with one column per field of dataclass ``cls``; None is written as an empty cell."""
    buf = io.StringIO()
    names = [f.name for f in dataclasses.fields(cls)]
    writer = csv.DictWriter(buf, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    for item in items:
        writer.writerow({k: ("" if v is None else repr(v) if isinstance(v, float) else v)
                         for k, v in dataclasses.asdict(item).items()})
    return buf.getvalue()


def from_csv(text: str, cls) -> list:
    return [from_dict(cls, row) for row in csv.DictReader(io.StringIO(text))]


def rows_to_csv(rows: list[BenchRow]) -> str:
    return to_csv(rows, BenchRow)


def rows_from_csv(text: str) -> list[BenchRow]:
    return from_csv(text, BenchRow)
