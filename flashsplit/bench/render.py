"""Rendering of bench data: rich tables for the terminal, and the optional matplotlib plot.

Nothing here measures anything; every function takes the dataclasses of :mod:`.rows` or
:mod:`.dryrun`. A table has an ``L_q`` column (queries per row) where some of its rows have
several queries; with one query per row everywhere it is left out.
"""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table

from .cases import SkippedCell, format_label
from .dryrun import DryRun
from .options import format_seqlen
from .rows import (ERROR, OK, SKIPPED, WRONG, BenchRow, FormatComparison, Report, RunHeader, SweepSummary,
                   VariantComparison)
from .scorecard import AUTO_SLACK, ScoreRow, score

_STATUS_STYLE = {OK: "", SKIPPED: "dim", WRONG: "bold red", ERROR: "red"}


def _f(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _several_queries(items) -> bool:
    """Whether a table of ``items`` (rows or cases) shows an ``L_q`` column."""
    return any(item.seqlen_q != 1 for item in items)


def _lq(names: tuple, show: bool, after: str = "L_k") -> tuple:
    """Column ``names`` with ``"L_q"`` after ``after`` when ``show``."""
    if not show:
        return names
    at = names.index(after) + 1
    return (*names[:at], "L_q", *names[at:])


def _lq_cell(item, show: bool) -> list[str]:
    """The ``L_q`` cell of a table row: ``[str(seqlen_q)]``, or nothing without the column."""
    return [str(item.seqlen_q)] if show else []


def render_header(console: Console, header: RunHeader) -> None:
    console.print(f"[bold]flashsplit bench[/bold] on {header.device} ({header.num_sms} SMs, "
                  f"L2 {header.l2_bytes / 2**20:.0f} MiB); torch {header.torch_version}, "
                  f"triton {header.triton_version}, flashsplit {header.flashsplit_version}")
    console.print(f"  bandwidth: {header.datasheet_note}; "
                  + (header.ceiling_note or "no measured ceiling"))
    if header.timing:
        console.print(f"  timing: {header.timing}")
    for note in header.notes:
        console.print(f"  note: {note}")


def rows_table(rows: list[BenchRow], title: str = "decode attention, per call") -> Table:
    table = Table(title=title, header_style="bold")
    show = _several_queries(rows)
    for name in _lq(("contender", "B", "L_k", "heads", "d", "dtype", "cache", "variant", "splits", "device us",
                     "eager us", "host us", "method", "GB/s", "% sheet", "% ceil", "rel err", "note"), show):
        left = name in ("contender", "dtype", "cache", "variant", "method", "note")
        table.add_column(name, justify="left" if left else "right", overflow="fold")
    previous = None
    for r in rows:
        cell = r.cell
        if previous is not None and cell != previous:
            table.add_section()
        previous = cell
        table.add_row(r.contender, str(r.batch), format_seqlen(r.seqlen_k), *_lq_cell(r, show), r.heads,
                      str(r.head_dim), r.dtype, format_label(r.page_size, r.kv), r.variant_label,
                      _f(r.num_splits, "{}"), _f(r.device_us), _f(r.eager_us), _f(r.host_us), r.method,
                      _f(r.gbps, "{:.0f}"), _f(r.pct_datasheet, "{:.0f}%"), _f(r.pct_ceiling, "{:.0f}%"), _f(r.rel_err, "{:.1e}"),
                      r.note if r.status == OK else f"{r.status}: {r.note}", style=_STATUS_STYLE.get(r.status, ""))
    return table


def sweep_table(summaries: list[SweepSummary]) -> Table:
    table = Table(title="num_splits heuristic vs best measured", header_style="bold")
    show = _several_queries(summaries)
    for name in _lq(("contender", "B", "L_k", "heads", "d", "cache", "variant", "heuristic", "heuristic us", "best",
                     "best us", "gap", "note"), show):
        table.add_column(name, justify="left" if name in ("contender", "cache", "variant", "note") else "right")
    for s in summaries:
        gap_style = "" if s.gap_pct is None or s.gap_pct < 5 else "yellow" if s.gap_pct < 15 else "red"
        table.add_row(s.contender, str(s.batch), format_seqlen(s.seqlen_k), *_lq_cell(s, show),
                      f"{s.num_heads}/{s.num_heads_kv}", str(s.head_dim),
                      format_label(s.page_size, s.kv_dtype or s.dtype), s.variant_label, _f(s.heuristic_splits, "{}"),
                      _f(s.heuristic_us), _f(s.best_splits, "{}"), _f(s.best_us), _f(s.gap_pct, "{:.1f}%"), s.note,
                      style=gap_style)
    return table


def formats_table(comparisons: list[FormatComparison]) -> Table:
    """``--compare-formats``: paged / dense time and 16-bit / fp8 speedup, against the targets of :mod:`.formats`."""
    table = Table(title="cache formats: paged vs dense time, fp8 vs 16-bit speedup", header_style="bold")
    show = _several_queries(comparisons)
    for name in _lq(("contender", "B", "L_k", "heads", "d", "cache", "vs", "variant", "us", "vs us", "paged/dense",
                     "speedup", "target", "met", "note"), show):
        table.add_column(name, justify="left" if name in ("contender", "cache", "vs", "variant", "target", "note")
                         else "right", overflow="fold")
    for c in comparisons:
        met = "-" if c.met is None else "yes" if c.met else "NO"
        style = "" if c.met is None else "green" if c.met else "red"
        table.add_row(c.contender, str(c.batch), format_seqlen(c.seqlen_k), *_lq_cell(c, show),
                      f"{c.num_heads}/{c.num_heads_kv}", str(c.head_dim),
                      format_label(c.page_size, c.kv_dtype or c.dtype),
                      format_label(c.base_page_size, c.base_kv_dtype or c.dtype), c.variant_label, _f(c.us),
                      _f(c.base_us), _f(c.ratio, "{:.3f}") if c.kind == "paged" else "",
                      _f(c.speedup, "{:.2f}x") if c.kind == "fp8" else "", c.target or "-", met, c.note, style=style)
    return table


def variants_table(comparisons: list[VariantComparison]) -> Table:
    """``--compare-variants``: variant time / plain time of the same cell (and for a window of w,
    / the plain time of a (w + L_q)-key cache where the grid has one), per contender."""
    table = Table(title="attention variants: time against plain decode", header_style="bold")
    show = _several_queries(comparisons)
    seen = "w+L_q" if show else "w+1"  # the keys a window of w shows the L_q queries
    for name in _lq(("contender", "B", "L_k", "heads", "d", "cache", "variant", "us", "plain us", "variant/plain",
                     f"{seen} keys", f"{seen} us", f"variant/({seen})", "note"), show):
        table.add_column(name, justify="left" if name in ("contender", "cache", "variant", "note") else "right",
                         overflow="fold")
    for c in comparisons:
        table.add_row(c.contender, str(c.batch), format_seqlen(c.seqlen_k), *_lq_cell(c, show),
                      f"{c.num_heads}/{c.num_heads_kv}", str(c.head_dim),
                      format_label(c.page_size, c.kv_dtype or c.dtype), c.variant_label, _f(c.us), _f(c.base_us),
                      _f(c.ratio, "{:.3f}"), format_seqlen(c.short_seqlen) if c.short_seqlen else "-",
                      _f(c.short_us), _f(c.short_ratio, "{:.3f}"), c.note)
    return table


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else "yes" if ok else "NO"


def scorecard_table(card: list[ScoreRow]) -> Table:
    """:mod:`.scorecard`: per cell, ``auto`` over the faster flashsplit backend, cuDNN, FlashAttention-3
    and the read floor of the same run."""
    table = Table(title=f"scorecard: auto against the faster backend (target <= {AUTO_SLACK:.2f}x), the peers "
                        "and the read floor", header_style="bold")
    show = _several_queries(card)
    for name in _lq(("B", "L_k", "heads", "d", "cache", "variant", "auto us", "ran", "best", "best us", "auto/best",
                     "ok", "cuDNN us", "auto/cuDNN", "ok", "FA3 us", "auto/FA3", "floor us", "auto/floor"), show):
        table.add_column(name, justify="left" if name in ("cache", "variant", "ran", "best") else "right",
                         overflow="fold")
    for c in card:
        style = "red" if c.auto_ok is False or c.cudnn_ok is False else ""
        table.add_row(str(c.batch), format_seqlen(c.seqlen_k), *_lq_cell(c, show), f"{c.num_heads}/{c.num_heads_kv}",
                      str(c.head_dim), format_label(c.page_size, c.kv), c.variant_label, _f(c.auto_us),
                      c.auto_backend or "-",
                      c.best_backend or "-", _f(c.best_us), _f(c.vs_best, "{:.3f}"), _verdict(c.auto_ok),
                      _f(c.cudnn_us), _f(c.vs_cudnn, "{:.3f}"), _verdict(c.cudnn_ok), _f(c.fa3_us),
                      _f(c.vs_fa3, "{:.3f}"), _f(c.floor_us), _f(c.vs_floor, "{:.3f}"), style=style)
    return table


def render_skipped_cells(console: Console, skipped: list[SkippedCell]) -> None:
    for cell in skipped:
        console.print(f"  skipped cell {cell.case.label()}: {cell.reason}", style="dim")


def render_report(console: Console, report: Report, skipped: list[SkippedCell] = ()) -> None:
    render_header(console, report.header)
    if report.rows:
        console.print(rows_table(report.rows))
    if report.sweep:
        console.print(sweep_table(report.sweep))
    if report.formats:
        console.print(formats_table(report.formats))
    if report.variants:
        console.print(variants_table(report.variants))
    card = score(report.rows)
    if card:
        console.print(scorecard_table(card))
    render_skipped_cells(console, list(skipped))
    counts = Counter(r.status for r in report.rows)
    console.print("  rows: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) if counts else "  no rows")


def _planned(cell, name: str) -> str:
    """A dry-run cell of contender ``name``: its split count (under a window, with the keys the
    splits cover; for auto, with its backend and rule), or why not."""
    plan = cell.plans[name]
    if not isinstance(plan, int):
        return f"no: {plan}"
    text = f"{plan} over {cell.spans[name]}" if cell.case.window >= 0 else str(plan)
    return f"{text} {cell.backends[name]}" if name == "auto" else text


def render_dry_run(console: Console, dry: DryRun) -> None:
    dev = dry.device
    where = dev.name if dev.is_cuda else f"{dev.name}: plans use {dev.num_sms} SMs, L2 {dev.l2_bytes / 2**20:.0f} MiB"
    console.print(f"[bold]flashsplit bench --dry-run[/bold] ({where})")
    contenders = Table(title="contenders", header_style="bold")
    contenders.add_column("contender")
    contenders.add_column("family")
    contenders.add_column("status", overflow="fold")
    for c in dry.contenders:
        contenders.add_row(c.name, c.family, "would run" if c.reason is None else f"skipped: {c.reason}",
                           style="" if c.reason is None else "dim")
    console.print(contenders)
    planners = [c.name for c in dry.contenders if c.family == "flashsplit" and c.reason is None]
    show = _several_queries([cell.case for cell in dry.cells])
    cells = Table(title="cells (flashsplit columns: planned num_splits, under a window 'N over S': N splits "
                        "covering S keys; auto: and the backend, by its rule)", header_style="bold")
    for name in _lq(("B", "L_k", "heads", "d", "dtype", "cache", "variant", "KV MB", "sets", *planners), show):
        cells.add_column(name, justify="left" if name in ("cache", "variant") else "right", overflow="fold")
    for cell in dry.cells:
        case = cell.case
        plans = [_planned(cell, p) for p in planners]
        cells.add_row(str(case.batch), format_seqlen(case.seqlen_k), *_lq_cell(case, show), case.heads,
                      str(case.head_dim), case.dtype, case.format_label, case.variant.label,
                      f"{case.kv_bytes / 1e6:.1f}", str(cell.sets), *plans)
    console.print(cells)
    skips: dict[tuple[str, str], list[str]] = {}
    for cell in dry.cells:
        for name, reason in cell.format_skips.items():
            skips.setdefault((name, reason), []).append(cell.case.format_label)
        for name, reason in cell.variant_skips.items():
            skips.setdefault((name, reason), []).append(cell.case.variant.label)
        for name, reason in cell.query_skips.items():
            skips.setdefault((name, reason), []).append(f"L_q={cell.case.seqlen_q}")
    for (name, reason), labels in skips.items():
        console.print(f"  {name} skipped on {len(labels)} {', '.join(dict.fromkeys(labels))} cell(s): {reason}",
                      style="dim")
    for cell in dry.cells:
        if cell.rotation_note:
            console.print(f"  cell {cell.case.label()}: {cell.rotation_note}", style="yellow")
    render_skipped_cells(console, dry.skipped)
    console.print(f"  {len(dry.cells)} cell(s) x {sum(c.reason is None for c in dry.contenders)} contender(s) "
                  f"would run; {len(dry.skipped)} cell(s) skipped")


# -- plot ------------------------------------------------------------------------------------

MATPLOTLIB_MISSING = ("--plot needs matplotlib, which is not installed: "
                      "pip install 'flashsplit[plot]' (or pip install matplotlib)")


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_choices(rows: list[BenchRow], fixed_seqlen: int | None = None) -> tuple[int | None, int | None]:
    """The batch of panel 1 (the smallest measured) and the L_k of panel 2 (``fixed_seqlen``, else
    the L_k measured at the most batch sizes, the larger on ties)."""
    ok = [r for r in rows if r.status == OK and r.device_us is not None]
    if not ok:
        return None, None
    batch = min(r.batch for r in ok)
    if fixed_seqlen is None:
        batches_per_len = Counter((r.seqlen_k, r.batch) for r in ok)
        per_len = Counter(length for length, _ in batches_per_len)
        fixed_seqlen = max(per_len, key=lambda length: (per_len[length], length))
    return batch, fixed_seqlen


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never needs a display
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(MATPLOTLIB_MISSING) from None
    return plt


def line_label(row: BenchRow, rows: list[BenchRow]) -> str:
    """A plot line's name: the contender, tagged with the row's cache format, attention variant and
    queries per row where ``rows`` hold several of them (so lines of different cells never merge)."""
    tags = [format_label(row.page_size, row.kv)] if len({(r.page_size, r.kv) for r in rows}) > 1 else []
    tags += [row.variant_label] if len({r.variant for r in rows}) > 1 else []
    tags += [f"L_q={row.seqlen_q}"] if len({r.seqlen_q for r in rows}) > 1 else []
    return f"{row.contender} [{', '.join(tags)}]" if tags else row.contender


def write_plot(report: Report, path: str, fixed_seqlen: int | None = None) -> None:
    """Two panels: latency vs L_k at the smallest batch, latency vs batch at a fixed L_k, one
    line per contender (for a ``--sweep-splits`` report: latency vs num_splits, see
    :func:`write_sweep_plot`).

    Raises ``ImportError`` with :data:`MATPLOTLIB_MISSING` when matplotlib is absent.
    """
    if report.sweep:
        write_sweep_plot(report, path)
        return
    plt = _pyplot()
    rows = [r for r in report.rows if r.status == OK and r.device_us is not None]
    batch, seqlen = plot_choices(rows, fixed_seqlen)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    def line_name(r: BenchRow) -> str:
        return line_label(r, rows)

    contenders = list(dict.fromkeys(line_name(r) for r in rows))
    for name in contenders:
        mine = [r for r in rows if line_name(r) == name]
        by_len = sorted((r.seqlen_k, r.device_us) for r in mine if r.batch == batch)
        if by_len:
            ax1.plot(*zip(*by_len), marker="o", label=name)
        by_batch = sorted((r.batch, r.device_us) for r in mine if r.seqlen_k == seqlen)
        if by_batch:
            ax2.plot(*zip(*by_batch), marker="o", label=name)
    for ax, xlabel, title in ((ax1, "L_k (keys)", f"batch {batch}"), (ax2, "batch", f"L_k {format_seqlen(seqlen or 0)}")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("device time per call (us)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(f"decode attention on {report.header.device}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_sweep_plot(report: Report, path: str) -> None:
    """Latency vs num_splits, one line per (contender, cell), the heuristic's choice circled."""
    plt = _pyplot()
    rows = [r for r in report.rows if r.status == OK and r.device_us is not None and r.num_splits]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    heuristics = {(s.contender, s.batch, s.seqlen_k, s.page_size, s.kv_dtype or s.dtype, s.variant, s.seqlen_q):
                  s.heuristic_splits for s in report.sweep}
    several = len({(r.page_size, r.kv) for r in rows}) > 1
    variants = len({r.variant for r in rows}) > 1
    queries = len({r.seqlen_q for r in rows}) > 1

    def key_of(r: BenchRow) -> tuple:
        return (r.contender, r.batch, r.seqlen_k, r.page_size, r.kv, r.variant, r.seqlen_q)

    keys = list(dict.fromkeys(key_of(r) for r in rows))
    for key in keys:
        points = sorted((r.num_splits, r.device_us) for r in rows if key_of(r) == key)
        tags = ([format_label(key[3], key[4])] if several else []) + ([key[5].label] if variants else [])
        tags += [f"L_q={key[6]}"] if queries else []
        fmt = f" [{', '.join(tags)}]" if tags else ""
        (line,) = ax.plot(*zip(*points), marker=".", label=f"{key[0]} B={key[1]} L_k={format_seqlen(key[2])}{fmt}")
        chosen = [p for p in points if p[0] == heuristics.get(key)]
        if chosen:
            ax.plot(*chosen[0], marker="o", markersize=10, fillstyle="none", color=line.get_color())
    ax.set_xlabel("num_splits")
    ax.set_ylabel("device time per call (us)")
    ax.set_yscale("log")
    ax.set_title(f"num_splits sweep on {report.header.device} (circle: the heuristic's choice)")
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
