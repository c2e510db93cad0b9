"""Measured selection tables: both backends timed over a grid of problems on one GPU model, and the
vote of the nearest measured cells that ``backend="auto"`` takes (:mod:`flashsplit.selection`'s
``measured`` rule).

A table is a JSON file (``flashsplit/tables/*.json``, or the file named by the environment
variable :data:`TABLE_ENV`) that ``flashsplit tune`` writes::

    {"gpu": "NVIDIA H200", "num_sms": 132, "date": "...", "versions": {...}, "command": "...",
     "cells": [{"num_heads": 32, "num_heads_kv": 8, "head_dim": 128, "seqlen_q": 1, "page_size": 0,
                "kv_dtype": "bfloat16", "batch": 4, "seqlen_k": 4096, "triton_us": 21.3, "cute_us": 22.2},
               ...]}

A problem is compared with the cells of the same head dim and cache format (16-bit or one fp8
dtype, dense or paged) by three coordinates, each in log2: packed q rows per KV head (the tile
height each backend pads to), work units (batch rows x KV heads: how the machine fills) and the
keys a row's splits cover. The :data:`NEIGHBOURS` nearest cells vote with the log of their time ratio,
weighted by inverse squared distance, so a problem between cells takes the side its neighbours
favour; a problem of a measured shape (same heads, queries, batch and keys) takes its cell's faster
backend, even where a cell of another head layout shares its coordinates. Leaving each cell of the
H200 table out in turn and voting from the rest, the pick was within 2% of the faster backend in
1064 of 1151 cells, the worst 1.39x (the misses at the grid's edges, where a left-out cell has no
neighbour beyond it, and at four causal queries, where the faster backend flips between neighbouring
cells: 32/8 heads at d = 96 run faster on Triton in 15 of 18 cells, 40/8 heads on cute in 14).
Before they joined the table, 155 cells measured off its grid (B 2, 8, 32 x 2k-64k keys, 48/8, 14/2,
32/4 and 8/1 heads among them) were within 2% in 146, the worst 1.115x; 376 cells of shapes it then
lacked (L_q = 4 for 21 head layouts and dims), in 315, the worst 1.77x (16/2 heads, d = 256, B = 1 x
1k). A fourth coordinate, packed rows rounded up to Triton's power-of-two tile, lifted the
leave-one-out count (1061 of the first 1116 cells, against 1043) but lowered the second count to
308: not taken.

The H100 (SXM, 80 GB) table, made the same way, holds 1261 cells: left out in turn, the vote
is within 2% in 1201, the worst 1.30x (28/4 heads, d = 256, L_q 4, B = 1 x 16k); the vote of its
default grid's 907 cells is within 2% on 141 of 155 cells measured off that grid, the worst
1.07x.
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .problem import DecodeProblem

#: Tables shipped with flashsplit, one per GPU model.
TABLE_DIR = Path(__file__).with_name("tables")
#: A table file to use before the shipped ones (a table ``flashsplit tune`` wrote for this GPU).
TABLE_ENV = "FLASHSPLIT_SELECTION_TABLE"
#: Cells that vote on a problem.
NEIGHBOURS = 4
#: Weights of the coordinates (packed rows, work units, span) in the distance; the span weighs
#: half (the leave-one-out error above was lowest so).
WEIGHTS = (1.0, 1.0, 0.5)
#: Backends a table times.
BACKENDS = ("triton", "cute")


@dataclass(frozen=True)
class Cell:
    """One measured problem (a plain decode: no window, softcap, sinks or appended keys; causal
    when ``seqlen_q`` > 1) and both backends' device times in microseconds."""

    num_heads: int
    num_heads_kv: int
    head_dim: int
    seqlen_q: int
    page_size: int
    kv_dtype: str  #: torch dtype name of the cache ("bfloat16", "float8_e4m3fn", ...)
    batch: int
    seqlen_k: int
    triton_us: float
    cute_us: float

    def problem(self) -> DecodeProblem:
        """The cell as a :class:`DecodeProblem` (bf16 queries)."""
        kv = getattr(torch, self.kv_dtype)
        return DecodeProblem(batch=self.batch, seqlen_q=self.seqlen_q, seqlen_k=self.seqlen_k,
                             num_heads=self.num_heads, num_heads_kv=self.num_heads_kv, head_dim=self.head_dim,
                             dtype=torch.bfloat16, causal=self.seqlen_q > 1, has_cache_seqlens=True,
                             device_type="cuda", kv_dtype=None if kv == torch.bfloat16 else kv,
                             page_size=self.page_size)

    @property
    def log_ratio(self) -> float:
        """``log(cute / triton)``: positive where Triton is faster."""
        return math.log(self.cute_us / self.triton_us)

    def describe(self) -> str:
        rows = f" L_q {self.seqlen_q}" if self.seqlen_q > 1 else ""
        page = f" pages of {self.page_size}" if self.page_size else ""
        cache = f" {self.kv_dtype} cache" if getattr(torch, self.kv_dtype).itemsize == 1 else ""
        return (f"{self.num_heads}/{self.num_heads_kv} heads d {self.head_dim}{rows}{page}{cache} B = {self.batch} x "
                f"{self.seqlen_k}: triton {self.triton_us:g}, cute {self.cute_us:g} us")


def problem_class(problem: DecodeProblem) -> tuple[int, str, bool]:
    """Cells compare only within a class: (head dim, cache format, paged); the format is "16-bit"
    or the fp8 dtype's name. The fp8 formats convert differently (e5m2 is the top byte of an
    fp16, e4m3 takes a ``cvt``), so each votes from its own cells; timed in one run on an H100,
    23 cells of each ran within 2% of each other on either backend (32/8 heads B = 4 x 128k:
    Triton 365.7 us on both, cute 375.0 on both)."""
    fmt = str(problem.cache_dtype).removeprefix("torch.") if problem.cache_dtype.itemsize == 1 else "16-bit"
    return problem.head_dim, fmt, problem.paged


def shape_key(problem: DecodeProblem) -> tuple:
    """What a problem shares with the cell measured for its very shape: class, heads, queries per
    row (and causality), batch and the keys its splits cover."""
    return (problem_class(problem), problem.num_heads, problem.num_heads_kv, problem.seqlen_q, problem.causal,
            problem.batch, problem.span)


def coordinates(problem: DecodeProblem) -> tuple[float, float, float]:
    """log2 of (packed q rows per KV head, batch x KV heads, keys a row's splits cover)."""
    return (math.log2(problem.packed_rows), math.log2(problem.batch * problem.num_heads_kv),
            math.log2(max(problem.span, 1)))


@dataclass(frozen=True)
class Table:
    """The cells measured on one GPU model (``gpu``: its CUDA device name)."""

    gpu: str
    num_sms: int
    date: str
    versions: dict
    command: str
    cells: tuple[Cell, ...]

    @functools.cached_property
    def by_class(self) -> dict[tuple, list[tuple[tuple[float, float, float], Cell]]]:
        classes: dict[tuple, list] = {}
        for cell in self.cells:
            problem = cell.problem()
            classes.setdefault(problem_class(problem), []).append((coordinates(problem), cell))
        return classes

    @functools.cached_property
    def by_shape(self) -> dict[tuple, Cell]:
        return {shape_key(cell.problem()): cell for cell in self.cells}

    def to_json(self) -> dict:
        return dict(gpu=self.gpu, num_sms=self.num_sms, date=self.date, versions=self.versions,
                    command=self.command, cells=[vars(cell) for cell in self.cells])


def parse_table(data: dict, source: str = "table") -> Table:
    """A :class:`Table` from its JSON object; ``ValueError`` naming ``source`` if a field is off."""
    try:
        cells = tuple(Cell(**cell) for cell in data["cells"])
        table = Table(str(data["gpu"]), int(data["num_sms"]), str(data.get("date", "")), dict(data.get("versions", {})),
                      str(data.get("command", "")), cells)
    except (KeyError, TypeError) as e:
        raise ValueError(f"{source}: expected a selection table (gpu, num_sms, cells of {list(Cell.__annotations__)}),"
                         f" got {type(e).__name__}: {e}") from None
    for cell in cells:
        if not (cell.triton_us > 0 and cell.cute_us > 0) or not hasattr(torch, cell.kv_dtype):
            raise ValueError(f"{source}: expected positive times and a torch dtype name per cell, got {cell}")
    return table


def load_table(path: str | os.PathLike) -> Table:
    """Read a table file (JSON, as ``flashsplit tune --out`` writes it)."""
    with open(path) as f:
        return parse_table(json.load(f), str(path))


@functools.lru_cache(maxsize=None)
def tables() -> dict[str, Table]:
    """Tables by GPU name: the shipped ones, then the file :data:`TABLE_ENV` names (which wins
    for its GPU). Read once per process."""
    found = {}
    for path in sorted(TABLE_DIR.glob("*.json")):
        table = load_table(path)
        found[table.gpu] = table
    extra = os.environ.get(TABLE_ENV)
    if extra:
        table = load_table(extra)
        found[table.gpu] = table
    return found


@dataclass(frozen=True)
class Vote:
    """What the nearest cells say about one problem."""

    backend: str
    #: Predicted ``cute / triton`` time ratio (above 1: Triton faster).
    ratio: float
    nearest: tuple[Cell, ...]
    #: The problem's own shape was measured: ``nearest`` is that one cell.
    exact: bool = False

    def describe(self) -> str:
        faster = "triton" if self.ratio > 1 else "cute"
        margin = max(self.ratio, 1 / self.ratio) - 1
        if self.exact:
            return (f"this shape measured on this GPU ran {100 * margin:.1f}% faster on {faster} "
                    f"({self.nearest[0].describe()})")
        return (f"the nearest cells measured on this GPU favour {faster} by {100 * margin:.1f}% "
                f"(nearest: {self.nearest[0].describe()})")


def table_for(problem: DecodeProblem) -> Table | None:
    """The table measured on ``problem``'s GPU model, if one exists."""
    target = problem.target
    if target is None:
        return None
    table = tables().get(target.name)
    return table if table is not None and table.num_sms == target.num_sms else None


def vote(problem: DecodeProblem, table: Table | None = None) -> Vote | None:
    """The backend the cell of the problem's shape, or else the nearest cells, of ``table``
    (default: :func:`table_for` the problem) favour; None without a table or without cells of
    the problem's class."""
    table = table if table is not None else table_for(problem)
    if table is None:
        return None
    cells = table.by_class.get(problem_class(problem))
    if not cells:
        return None
    measured = table.by_shape.get(shape_key(problem))
    if measured is not None:  # its own time outweighs any neighbour's (which may share its coordinates)
        return Vote("triton" if measured.log_ratio > 0 else "cute", math.exp(measured.log_ratio), (measured,), True)
    here = coordinates(problem)

    def distance2(point: tuple[float, float, float]) -> float:
        return sum((w * (a - b)) ** 2 for w, a, b in zip(WEIGHTS, point, here))

    nearest = sorted(cells, key=lambda item: distance2(item[0]))[:NEIGHBOURS]
    weights = [1.0 / (1e-3 + distance2(point)) for point, _ in nearest]
    log_ratio = sum(w * cell.log_ratio for w, (_, cell) in zip(weights, nearest)) / sum(weights)
    return Vote("triton" if log_ratio > 0 else "cute", math.exp(log_ratio), tuple(cell for _, cell in nearest))
