"""``flashsplit bench --mla``: MLA decode cells (DeepSeek-V3 shapes) with their floors.

Per cell (H_q, B, L_k, page 64, full rows): device us per call (CUDA-graph replay, contenders
side by side, caches rotated past the L2), TB/s of the bytes a call must move, TFLOPS, the read
floor (those bytes at the GPU's datasheet bandwidth) and the tensor-core floor (the call's
flops at the datasheet dense 16-bit peak). Contenders: flashsplit's MLA backends (``triton``,
``cute`` where it runs), Triton on other tiles (``--mla m64 n64 s3``: ``triton-m64``, ...; a
bare ``--mla`` times ``m64`` for cells of 64 packed rows or more) and at each split count of
``--sweep-splits`` (``triton/8``, ...), and FlashInfer's ``BatchMLAPagedAttentionWrapper`` when
importable.
Each contender is checked against a float32 reference of row 0 before it is timed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass

import torch

from ..mla.problem import MLA_HEAD_DIM, MLA_HEAD_DIM_V
from .device import device_info

#: Default grid: DeepSeek-V3 with 8-way tensor parallelism (16 q heads) and without (128).
DEFAULT_HEADS = (16, 128)
DEFAULT_BATCHES = (1, 8, 32, 128)
DEFAULT_SEQLENS = (1024, 4096, 16384, 65536)
DEFAULT_PAGE_SIZE = 64
#: Datasheet dense 16-bit tensor-core peak (FLOP/s) by device-name substring, first match wins.
DATASHEET_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989e12), ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H20", 148e12), ("H100", 989e12),
    ("H800", 989e12), ("A100", 312e12), ("L40S", 362e12),
)
DEFAULT_TFLOPS = 989e12
#: Relative error (to row 0's largest reference value) above which a contender is "wrong".
GATE_TOLERANCE = 2e-2
#: Triton tile variants timed beside the default tiles by a bare ``--mla``: 64-row tiles (where a
#: cell has 64 packed rows or more).
DEFAULT_VARIANTS = ("m64",)


@dataclass(frozen=True)
class MlaCell:
    heads: int
    batch: int
    seqlen: int
    page_size: int = DEFAULT_PAGE_SIZE
    seqlen_q: int = 1
    fp8: bool = False

    @property
    def name(self) -> str:
        fmt = "e4m3" if self.fp8 else "bf16"
        return f"H{self.heads} B{self.batch} L{self.seqlen // 1024}k p{self.page_size} q{self.seqlen_q} {fmt}"

    def bytes_moved(self) -> int:
        """Bytes a call must move: the cache's live keys (576 features each), q, the output, the page table."""
        kv = self.batch * self.seqlen * MLA_HEAD_DIM * (1 if self.fp8 else 2)
        rows = self.batch * self.seqlen_q * self.heads
        table = 4 * self.batch * -(-self.seqlen // self.page_size) if self.page_size else 0
        return kv + rows * (MLA_HEAD_DIM + MLA_HEAD_DIM_V) * 2 + table

    def flops(self) -> int:
        """2 x rows x keys x (576 for Q K^T + 512 for P V)."""
        return 2 * self.batch * self.seqlen_q * self.heads * self.seqlen * (MLA_HEAD_DIM + MLA_HEAD_DIM_V)


def datasheet_tflops(device_name: str) -> float:
    for key, flops in DATASHEET_TFLOPS:
        if key.lower() in device_name.lower():
            return flops
    return DEFAULT_TFLOPS


def floors_us(cell: MlaCell, bandwidth: float, peak_flops: float) -> tuple[float, float]:
    """(read floor, tensor-core floor) in microseconds."""
    return cell.bytes_moved() / bandwidth * 1e6, cell.flops() / peak_flops * 1e6


def build_cells(args: argparse.Namespace) -> list[MlaCell]:
    from .options import flatten

    heads = [args.heads[0]] if getattr(args, "heads", None) else list(DEFAULT_HEADS)
    batches = flatten(args.batch) if args.batch else list(DEFAULT_BATCHES)
    seqlens = flatten(args.seqlen) if args.seqlen else list(DEFAULT_SEQLENS)
    pages = flatten(args.page_size) if args.page_size else [DEFAULT_PAGE_SIZE]
    queries = flatten(args.seqlen_q) if args.seqlen_q else [1]
    kv = flatten(args.kv_dtype) if args.kv_dtype else ["same"]
    return [MlaCell(h, b, n, p, sq, k == "fp8e4m3") for k in kv for sq in queries for p in pages for h in heads
            for b in batches for n in seqlens]


def parse_variant(text: str) -> dict:
    """Tile overrides of a Triton variant name: ``m64`` rows, ``n64`` keys, ``s3`` stages,
    combined with dashes (``m64-s3``); arguments of :func:`~flashsplit.mla.triton_backend.choose_tiles`.

    >>> parse_variant("m64-n64-s3")
    {'max_block_m': 64, 'block_n': 64, 'num_stages': 3}
    """
    fields = {"m": ("max_block_m", (16, 32, 64)), "n": ("block_n", (16, 32, 64, 128)),
              "s": ("num_stages", (1, 2, 3, 4))}
    out = {}
    for part in text.split("-"):
        key, value = part[:1], part[1:]
        if key not in fields or not value.isdigit() or int(value) not in fields[key][1]:
            raise ValueError(f"--mla: expected tile variants like m64, n64, s3 or m64-s3 (m in 16/32/64, n in "
                             f"16-128, s in 1-4), got {text!r}")
        out[fields[key][0]] = int(value)
    return out


def contender_status(cell: MlaCell, device: str, variants=(), sweep=()) -> dict[str, str | None]:
    """Each contender's reason not to run ``cell`` (None: it runs): the backends, Triton's tile
    ``variants`` and split counts of ``sweep`` (``triton-m64``, ``triton/8``), FlashInfer."""
    import importlib.util

    from .. import mla_plan

    status = {}
    for backend in ("triton", "cute"):
        try:
            mla_plan(cell.batch, cell.seqlen, cell.heads, seqlen_q=cell.seqlen_q, page_size=cell.page_size,
                     kv_dtype=torch.float8_e4m3fn if cell.fp8 else None, causal=cell.seqlen_q > 1,
                     device=device, backend=backend)
            status[backend] = None
        except ValueError as error:
            status[backend] = str(error)
    for variant in variants:
        rows = parse_variant(variant).get("max_block_m", 16)
        status[f"triton-{variant}"] = status["triton"] or (
            None if cell.heads * cell.seqlen_q >= rows else f"{rows}-row tiles only for {rows} packed rows or more")
    for count in sweep:
        status[f"triton/{count}"] = status["triton"]
    if importlib.util.find_spec("flashinfer") is None:
        status["flashinfer"] = "flashinfer is not installed"
    elif cell.fp8 or cell.page_size == 0:
        status["flashinfer"] = "timed on 16-bit paged caches only"
    else:
        status["flashinfer"] = None
    return status


def _inputs(cell: MlaCell, num_sets: int, generator: torch.Generator):
    """``num_sets`` input sets of ``cell`` on the GPU: full rows, pages in one shuffled order
    (one page table, as FlashInfer's one plan needs)."""
    per_row = -(-cell.seqlen // cell.page_size)
    table = torch.randperm(cell.batch * per_row, generator=generator).view(cell.batch, per_row).int().cuda()
    seqlens = torch.full((cell.batch,), cell.seqlen, dtype=torch.int32, device="cuda")
    sets = []
    for _ in range(num_sets):
        q = torch.randn((cell.batch, cell.seqlen_q, cell.heads, MLA_HEAD_DIM), generator=generator) * 0.5
        cache = torch.randn((cell.batch * per_row, cell.page_size, 1, MLA_HEAD_DIM), device="cuda",
                            dtype=torch.bfloat16)
        descale = None
        if cell.fp8:  # values of N(0, 64^2) in e4m3, read back times 1/64
            cache, descale = (cache * 64).to(torch.float8_e4m3fn), torch.full((1,), 1 / 64, device="cuda")
        sets.append(dict(q=q.to("cuda", torch.bfloat16), kv=cache, table=table, seqlens=seqlens, descale=descale))
    return sets


def _reference_row0(s: dict, cell: MlaCell) -> torch.Tensor:
    """float32 output of row 0, ``[s_q, H, 512]``."""
    kv = s["kv"][s["table"][0].long()].reshape(-1, MLA_HEAD_DIM)[: cell.seqlen].float()
    if s["descale"] is not None:
        kv = kv * s["descale"]
    scores = torch.einsum("mhd,nd->mhn", s["q"][0].float(), kv) * MLA_HEAD_DIM ** -0.5
    if cell.seqlen_q > 1:
        n = torch.arange(cell.seqlen, device="cuda")
        last = cell.seqlen - cell.seqlen_q + torch.arange(cell.seqlen_q, device="cuda")
        scores = scores.masked_fill((n[None, :] > last[:, None])[:, None, :], -math.inf)
    return torch.einsum("mhn,nd->mhd", torch.softmax(scores, dim=-1), kv[:, :MLA_HEAD_DIM_V])


def _flashsplit_run(name: str, cell: MlaCell, sets: list[dict]):
    """``run(i)`` of contender ``name``: a backend through ``mla_decode``, or Triton on a tile
    variant (``triton-m64``) or at a split count (``triton/8``)."""
    from .. import mla_decode

    outs = [torch.empty((cell.batch, cell.seqlen_q, cell.heads, MLA_HEAD_DIM_V), device="cuda",
                        dtype=torch.bfloat16) for _ in sets]
    if name.startswith(("triton-", "triton/")):
        return _tiled_triton_run(name, cell, sets, outs)

    def run(i: int):
        s = sets[i]
        return mla_decode(s["q"], s["kv"], s["seqlens"], block_table=s["table"], causal=cell.seqlen_q > 1,
                          out=outs[i], backend=name, kv_descale=s["descale"])

    return run


def _tiled_triton_run(name: str, cell: MlaCell, sets: list[dict], outs: list[torch.Tensor]):
    """The Triton backend on the tiles of variant ``triton-<variant>`` split as the plan splits
    them (one CTA per SM from 32 rows), or on its default tiles at ``triton/<count>`` splits."""
    from ..mla import registry
    from ..mla.plan import mla_num_splits
    from ..mla.problem import MlaProblem
    from ..mla.triton_backend import choose_tiles

    variant, _, count = name.partition("/")
    overrides = parse_variant(variant[len("triton-"):]) if "-" in variant else {}
    tiles = choose_tiles(cell.heads * cell.seqlen_q, **overrides)
    problem = MlaProblem(batch=cell.batch, seqlen_q=cell.seqlen_q, num_heads_q=cell.heads, dtype=torch.bfloat16,
                         kv_dtype=torch.float8_e4m3fn if cell.fp8 else torch.bfloat16, page_size=cell.page_size,
                         capacity=-(-cell.seqlen // cell.page_size) * cell.page_size, causal=cell.seqlen_q > 1,
                         num_splits=0, device_type="cuda")
    splits = int(count) if count else mla_num_splits(problem, tiles.block_m, 2 if tiles.block_m <= 16 else 1)[0]
    backend = registry.get("triton")

    def run(i: int):
        s = sets[i]
        backend.run(s["q"], s["kv"], s["seqlens"], s["table"], outs[i], None, num_splits=splits,
                    softmax_scale=MLA_HEAD_DIM ** -0.5, causal=cell.seqlen_q > 1, kv_descale=s["descale"], tiles=tiles)
        return outs[i]

    return run


def _flashinfer_run(cell: MlaCell, sets: list[dict]):
    import flashinfer

    workspace = torch.empty(128 * 1024 * 1024, dtype=torch.int8, device="cuda")
    wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend="auto")
    per_row = -(-cell.seqlen // cell.page_size)
    qo_indptr = torch.arange(cell.batch + 1, dtype=torch.int32, device="cuda") * cell.seqlen_q
    kv_indptr = torch.arange(cell.batch + 1, dtype=torch.int32, device="cuda") * per_row
    # FlashInfer keeps the latent and rotary parts of q and of the cache apart: the same bytes, its layout.
    split = []
    for s in sets:
        q = s["q"].reshape(-1, cell.heads, MLA_HEAD_DIM)
        split.append((q[..., :MLA_HEAD_DIM_V].contiguous(), q[..., MLA_HEAD_DIM_V:].contiguous(),
                      s["kv"][:, :, 0, :MLA_HEAD_DIM_V].contiguous(), s["kv"][:, :, 0, MLA_HEAD_DIM_V:].contiguous()))
    wrapper.plan(qo_indptr, kv_indptr, sets[0]["table"].reshape(-1), sets[0]["seqlens"], cell.heads, MLA_HEAD_DIM_V,
                 MLA_HEAD_DIM - MLA_HEAD_DIM_V, cell.page_size, cell.seqlen_q > 1, MLA_HEAD_DIM ** -0.5,
                 torch.bfloat16, torch.bfloat16)

    def run(i: int):
        q_nope, q_pe, ckv, kpe = split[i]
        out = wrapper.run(q_nope, q_pe, ckv, kpe, return_lse=False)
        return out.view(cell.batch, cell.seqlen_q, cell.heads, MLA_HEAD_DIM_V)

    return run


def time_cell(cell: MlaCell, names: list[str], generator: torch.Generator, mem_cap: float) -> dict:
    from .timing import capture_graph, time_interleaved

    info = device_info()
    kv_bytes = cell.bytes_moved()
    num_sets = max(1, min(8, math.ceil(3 * info.l2_bytes / kv_bytes)))
    if kv_bytes * num_sets * (2 if "flashinfer" in names else 1) > mem_cap:  # FlashInfer's copy of the caches
        return {"skipped": f"needs {kv_bytes * num_sets / 1e9:.1f} GB > --mem-cap-gb"}
    sets = _inputs(cell, num_sets, generator)
    ref = _reference_row0(sets[0], cell)
    runs, results = {}, {}
    for name in names:
        try:
            run = _flashinfer_run(cell, sets) if name == "flashinfer" else _flashsplit_run(name, cell, sets)
            out = run(0)
            torch.cuda.synchronize()
            err = float((out[0].float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
            if not err <= GATE_TOLERANCE:
                results[name] = {"wrong": f"relative error {err:.3g} > {GATE_TOLERANCE}"}
                continue
            runs[name] = run
        except Exception as error:  # a contender that cannot run this cell: reported, not fatal
            first_line = str(error).splitlines()[0][:160] if str(error) else ""
            results[name] = {"failed": f"{type(error).__name__}: {first_line}"}
    read_floor, tc_floor = floors_us(cell, info.datasheet_bw, datasheet_tflops(info.name))
    estimate = 2 * max(read_floor, tc_floor, 5.0)
    calls = max(num_sets, min(20, math.ceil(2000 / estimate)))
    rounds = max(3, min(15, int(3e5 / (calls * estimate))))
    if runs:
        graphs = {name: capture_graph(run, num_sets, calls) for name, run in runs.items()}
        for graph in graphs.values():
            graph.replay()
        torch.cuda.synchronize()
        for name, us in time_interleaved(graphs, calls, rounds).items():
            results[name] = {"us": us, "TB/s": kv_bytes / us / 1e6, "TFLOPS": cell.flops() / us / 1e6,
                             "x_read_floor": us / read_floor, "x_tc_floor": us / tc_floor}
        del graphs
    del sets
    torch.cuda.empty_cache()
    return {"read_floor_us": read_floor, "tc_floor_us": tc_floor, "contenders": results}


def run_mla_command(args: argparse.Namespace) -> int:
    """``flashsplit bench --mla``: dry run (cells, plans, floors, contenders) or timing."""
    from .device import cuda_available

    cells = build_cells(args)
    variants = list(DEFAULT_VARIANTS) if not args.mla else args.mla
    try:
        for variant in variants:
            parse_variant(variant)
    except ValueError as error:
        print(f"flashsplit bench: error: {error}", file=sys.stderr)
        return 2
    sweep = list(args.sweep_splits or ())
    info = device_info()
    peak = datasheet_tflops(info.name)
    print(f"MLA decode cells on {info.name}: read floor at {info.datasheet_bw / 1e12:.2f} TB/s, tensor-core floor "
          f"at {peak / 1e12:.0f} TFLOPS (datasheet, dense 16-bit); q [B, s_q, H_q, 576], latent cache "
          f"[pages, page, 1, 576], V = its first 512 features")
    if args.dry_run or not cuda_available():
        from .. import mla_plan

        if not args.dry_run:
            print("flashsplit bench: error: timing needs a CUDA GPU; --dry-run lists the cells without one")
            return 2
        for cell in cells:
            read_floor, tc_floor = floors_us(cell, info.datasheet_bw, peak)
            plan = mla_plan(cell.batch, cell.seqlen, cell.heads, seqlen_q=cell.seqlen_q, page_size=cell.page_size,
                            kv_dtype=torch.float8_e4m3fn if cell.fp8 else None, causal=cell.seqlen_q > 1,
                            gpu="h200" if not info.is_cuda else None, backend="triton")
            status = contender_status(cell, "cuda", variants, sweep)
            able = [n for n, why in status.items() if why is None]
            print(f"  {cell.name:<28} read floor {read_floor:9.1f} us  tensor-core floor {tc_floor:9.1f} us  "
                  f"triton: {plan.num_splits} split(s) ({plan.split_reason.split(':')[0]})  contenders {able}")
        return 0
    generator = torch.Generator().manual_seed(args.seed)
    report, exit_code = [], 0
    for cell in cells:
        status = contender_status(cell, "cuda", variants, sweep)
        names = [n for n in status if status[n] is None]
        row = {"cell": asdict(cell), "name": cell.name, **time_cell(cell, names, generator, args.mem_cap_gb * 1e9),
               "not_run": {n: why for n, why in status.items() if why is not None}}
        report.append(row)
        parts = []
        for name, r in row.get("contenders", {}).items():
            if "us" in r:
                parts.append(f"{name} {r['us']:.1f} us {r['TB/s']:.2f} TB/s {r['TFLOPS']:.0f} TFLOPS "
                             f"({r['x_read_floor']:.2f}x read, {r['x_tc_floor']:.2f}x tc)")
            else:
                parts.append(f"{name} {next(iter(r))}: {next(iter(r.values()))}")
                exit_code = 1 if "wrong" in r else exit_code
        floors = (f"floors read {row['read_floor_us']:.1f} / tc {row['tc_floor_us']:.1f} us"
                  if "read_floor_us" in row else row.get("skipped", ""))
        print(f"  {cell.name:<28} {floors} | " + " | ".join(parts), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": info.name, "rows": report}, f, indent=1)
    return exit_code
