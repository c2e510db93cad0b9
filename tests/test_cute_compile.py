"""CuTe kernels compile to sm_90a on a CPU-only machine (no launch), and supports() explains refusals.

``CUTE_DSL_ARCH=sm_90a`` must be set before cutlass is first imported; this module sets it when
it is unset (a GPU machine that already imported cutlass for its own arch skips the PTX checks).
Every configuration the dispatcher can select is compiled once, its PTX dumped and checked for
the two instructions the design rests on: ``wgmma.mma_async`` (warpgroup MMA) and
``cp.async.bulk.tensor`` (TMA loads); a paged kernel must also feed a page id it loaded from
global memory (the block table) into its TMA coordinates, and a dense one must not. An fp8-cache
kernel must still run 16-bit wgmma (q's dtype) and convert fp8 pairs in registers
(``cvt.rn.f16x2.e4m3x2`` / ``e5m2x2``). Where ``cuobjdump`` is at hand (triton's wheel ships
one), each kernel's cubin must hold no stack frame or local memory: ptxas spilled nothing under
the register cap of its CTAs per SM. Compile times are printed (``pytest -s -n 0``). The default
run builds a subset that covers every load mode, head dim, cache type, output kind and tile
(:func:`default_compile_configs`, 16 configurations); ``pytest --full`` builds all of them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from flashsplit.cute import CuteBackend, all_combine_configs, all_split_configs
from flashsplit.cute.config_lists import compile_check_configs
from flashsplit import selection
from flashsplit.plan import SPLIT_GRANULE
from flashsplit.problem import DecodeProblem
from flashsplit.cute.backend import CUTLASS_MISSING
from flashsplit.target import KNOWN_GPUS

_HAS_CUTLASS = importlib.util.find_spec("cutlass") is not None
needs_cutlass = pytest.mark.skipif(not _HAS_CUTLASS, reason=CUTLASS_MISSING)


def _arch_ok() -> bool:
    if "cutlass" not in sys.modules:
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    return os.environ.get("CUTE_DSL_ARCH", "sm_90a") == "sm_90a"


def _ptx(dump_dir: Path) -> str:
    files = list(dump_dir.glob("*.ptx"))
    assert files, f"no PTX written under {dump_dir}"
    return "\n".join(f.read_text() for f in files)


def _globally_loaded(ptx: str) -> set[str]:
    """Registers holding a 32-bit value loaded from global memory, directly or through ``mov``."""
    loaded = set(re.findall(r"ld\.global\.b32\s+(%r\d+),", ptx))
    moves = re.findall(r"mov\.b32\s+(%r\d+),\s*(%r\d+);", ptx)
    while True:
        more = {dst for dst, src in moves if src in loaded} - loaded
        if not more:
            break
        loaded |= more
    return loaded


def _tma_coords(ptx: str) -> list[list[str]]:
    """The coordinate registers of every ``cp.async.bulk.tensor`` load, in PTX order."""
    return [[c.strip() for c in group.split(",")]
            for group in re.findall(r"cp\.async\.bulk\.tensor[^\n]*?\{([^}]*)\}", ptx)]


def _tma_coords_from_global_loads(ptx: str) -> set[str]:
    """Registers that hold a 32-bit value loaded from global memory (directly or through
    ``mov``) and serve as a coordinate of a TMA load: the page ids of a paged kernel."""
    coords = {c for group in _tma_coords(ptx) for c in group}
    return coords & _globally_loaded(ptx)


def _check_subtile_copies(config, ptx: str) -> None:
    """Sub-tile paging: per stage, each of K and V is tile_n / P boxes (pages), and a box is
    ``D / 64`` TMA copies in the 128-byte-swizzled 16-bit stage (64 elements of d each; d = 96:
    three of 32 in its 64-byte-swizzled stage) or one in an fp8 staging slot; the producer loop
    is not unrolled, so the PTX holds each once. The page coordinate (the last) of every copy
    comes from a block-table load, one per box."""
    boxes = config.tile_n // config.subtile_page
    swizzle_columns = 64 if config.head_dim % 64 == 0 else 32
    per_box = 1 if config.fp8 else config.head_dim // swizzle_columns
    coords = _tma_coords(ptx)
    assert len(coords) == 2 * boxes * per_box, (len(coords), boxes, per_box)
    loaded = _globally_loaded(ptx)
    pages = [group[-1] for group in coords]
    assert set(pages) <= loaded, f"page coordinates {set(pages) - loaded} do not come from block_table loads"
    assert len(set(pages)) == boxes, pages
    # Every copy starts at slot 0 of its page (the slot coordinate, second, is a constant 0).
    slot_regs = {group[1] for group in coords}
    for reg in slot_regs:
        assert re.search(rf"mov\.b32\s+{re.escape(reg)},\s*0;", ptx), f"slot coordinate {reg} is not 0"


def _cuobjdump() -> str | None:
    """A ``cuobjdump``: the CUDA toolkit's on the PATH, else the one triton's wheel ships."""
    found = shutil.which("cuobjdump")
    if found or importlib.util.find_spec("triton") is None:
        return found
    bundled = Path(importlib.util.find_spec("triton").origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.is_file() else None


def _check_no_spills(dump_dir: Path) -> None:
    """The kernel's cubin has no stack frame and no local memory (``cuobjdump
    --dump-resource-usage``): ptxas kept every value in registers."""
    tool = _cuobjdump()
    if tool is None:
        return
    cubins = [str(f) for f in dump_dir.glob("*.cubin")]
    assert cubins, f"no cubin written under {dump_dir}"
    usage = subprocess.run([tool, "--dump-resource-usage", *cubins], capture_output=True, text=True, check=True).stdout
    found = re.findall(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
    assert found, usage
    for regs, stack, local in found:
        assert stack == "0" and local == "0", f"{regs} registers, stack {stack} bytes, local {local} bytes"


def _compiled_ptx(compile_fn, config, dump_dir) -> str:
    """Compile ``config`` for sm_90a (no launch), print the compile time, check that it spills
    nothing (:func:`_check_no_spills`), return the PTX."""
    if not _arch_ok():
        pytest.skip("CUTE_DSL_ARCH is set to another arch")
    t0 = time.perf_counter()
    compile_fn(config, options=f"--keep-ptx --keep-cubin --dump-dir={dump_dir}")
    print(f"\ncompile {config}: {time.perf_counter() - t0:.2f} s")
    _check_no_spills(dump_dir)
    return _ptx(dump_dir)


def _features(config) -> set[tuple]:
    """What a compile-check configuration exercises: its load mode, cache type, output kind,
    tile (two CTAs, one per SM, one-wave stages, swapped operands), dtype and mask, in the
    combinations the default run must cover."""
    mode = ("gathered" if config.gather_pages else "sub-tile" if config.subtile_page else
            "pages" if config.paged else "dense")
    output = "merge" if config.merge else "partials" if config.write_partials else "final"
    if config.swap_rows:
        tile = "swap"
    elif config.head_dim == 128 and config.units_per_sm == 1:
        tile = "one per SM"
    elif config.merge and config.head_dim == 128 and not config.staged and config.stages == 3:
        tile = "one wave"
    else:
        tile = "two CTAs"
    features = {("mode", mode, config.head_dim), ("cache", config.kv_dtype, config.head_dim),
                ("cache", config.kv_dtype, mode), ("output", output, tile), ("output", output, mode),
                ("tile", tile, mode), ("tile", tile, config.head_dim), ("tile", tile, config.causal),
                ("dtype", config.dtype, config.causal), ("fp16 operands", config.fp16_operands, mode),
                # d = 96's own paths: the merge's strided columns, the q rows' padded lane runs
                ("output", output, config.head_dim), ("fp16 operands", config.fp16_operands, config.head_dim),
                ("order", config.heads_first, output), ("cluster", config.cluster > 0, mode)}
    for variant in _variants(config):  # each variant on each consumer (--full: in every mode)
        features.add(("variant", variant, "swap" if config.swap_rows else "64 rows"))
    return features


def _variants(config) -> list[str]:
    """The attention variants a configuration turns on."""
    names = ("left_bound", "right_bound", "softcap", "invariant", "leftpad")
    return [n for n in names if getattr(config, n)] + (["sinks"] if config.sinks else [])


def _default_features(config) -> set[tuple]:
    """What the default run covers of a configuration's :func:`_features`: each feature on its
    own (a load mode, cache type, output, tile, dtype, mask, variant), and every load mode at
    every head dim; ``pytest --full`` builds their pairs (every configuration)."""
    features = _features(config)
    return {f[:2] for f in features} | {f for f in features if f[0] == "mode"}


def default_compile_configs() -> list:
    """The compile check's default run: a greedy cover (deterministic) of every feature
    :func:`_default_features` names over :func:`compile_check_configs`; ``pytest --full`` builds all."""
    configs = compile_check_configs()
    wanted = set().union(*(_default_features(c) for c in configs))
    chosen, covered = [], set()
    while covered != wanted:
        best = max(configs, key=lambda c: len(_default_features(c) - covered))
        chosen.append(best)
        covered |= _default_features(best)
    return chosen


_DEFAULT_COMPILES = set(default_compile_configs())


def test_default_compile_check_covers_every_mode():
    """The default run's ~16 configurations build every load mode at every head dim, every cache
    type, output kind and tile, fp16 operands, and every attention variant; ``--full`` builds
    each in every combination the configurations take."""
    chosen = default_compile_configs()
    assert len(chosen) <= 20 and len(set(chosen)) == len(chosen)
    features = set().union(*(_default_features(c) for c in chosen))
    assert features == set().union(*(_default_features(c) for c in compile_check_configs()))
    assert {f[1] for f in features if f[0] == "mode"} == {"dense", "pages", "sub-tile", "gathered"}
    assert {f[1] for f in features if f[0] == "tile"} == {"two CTAs", "one per SM", "one wave", "swap"}
    assert {f[1] for f in features if f[0] == "output"} == {"final", "partials", "merge"}
    assert {f[1] for f in features if f[0] == "cache"} == {"same", "float8_e4m3fn", "float8_e5m2"}
    assert any(c.fp16_operands for c in chosen) and {c.head_dim for c in chosen} == {64, 96, 128, 256}
    assert {f[1] for f in features if f[0] == "variant"} == {"left_bound", "right_bound", "softcap", "sinks",
                                                              "invariant", "leftpad"}


@needs_cutlass
@pytest.mark.parametrize("config", [c if c in _DEFAULT_COMPILES else pytest.param(c, marks=pytest.mark.full)
                                    for c in compile_check_configs()], ids=str)
def test_split_kernel_compiles_to_wgmma_and_tma(config, tmp_path):
    from flashsplit.cute.compile import compile_split

    ptx = _compiled_ptx(compile_split, config, tmp_path)
    assert "wgmma.mma_async" in ptx
    assert ".minnctapersm" in ptx or config.units_per_sm == 1
    # A partials launch that a combine follows signals it (PDL) after its last tile, nothing else does.
    assert ("griddepcontrol.launch_dependents" in ptx) == config.signals_combine
    if config.gather_pages:
        # One bulk copy of a key row for K and one for V in the producer loop, completing on the
        # stage's mbarrier (no TMA tensor copies), from addresses built on block-table loads.
        assert "cp.async.bulk.tensor" not in ptx
        rows = re.findall(r"cp\.async\.bulk\.shared::cluster\.global\.mbarrier::complete_tx::bytes", ptx)
        assert len(rows) == 2, rows
        assert _globally_loaded(ptx), "no block-table load"
    else:
        assert "cp.async.bulk.tensor" in ptx
        # Both descriptors are being fetched before the kernel waits on memory (its first global
        # load, the row's length): the first tile's load then finds them cached.
        assert ptx.count("prefetch.tensormap") == 2
        assert ptx.rindex("prefetch.tensormap") < ptx.index("ld.global")
        page_ids = _tma_coords_from_global_loads(ptx)
        if config.paged:
            assert page_ids, "paged kernel: no TMA coordinate comes from a block_table load"
            if config.subtile_page:
                _check_subtile_copies(config, ptx)
        else:
            assert not page_ids, f"dense kernel: TMA coordinates {page_ids} come from global loads"
    # wgmma multiplies q's 16-bit type, or fp16 for fp8 caches with fp16 operands (never fp8
    # wgmma); fp8 caches convert in registers.
    short = "f16" if config.fp16_operands else {"float16": "f16", "bfloat16": "bf16"}[config.dtype]
    kinds = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k(\d+)\.f32\.(\w+)\.(\w+)", ptx))
    assert kinds == {("16", short, short)}, kinds
    _check_swap_wgmmas(ptx, config)
    if config.fp16_operands:
        # fp8 -> fp16 is one cvt per pair: no detour through fp32 and bf16 (cvt.f32.f16 and
        # cvt.rn.bf16x2.f32 per pair in the bf16-operand kernel), and the q rows' scale is a
        # butterfly max over each row's lanes.
        # (A merging kernel's tail converts its fp32 sums to q's bf16: only the code before it,
        # which ends at the arrival count, or at a cluster merge's arrival on the cluster barrier.)
        tail_start = "barrier.cluster.arrive;" if config.cluster else "atom."
        main = ptx[:ptx.index(tail_start)] if config.merge else ptx
        assert "cvt.f32.f16" not in main and "cvt.rn.bf16x2.f32" not in main
        assert "shfl.sync.bfly" in ptx
    fp8_cvts = set(re.findall(r"cvt\.rn\.f16x2\.(e4m3x2|e5m2x2)", ptx))
    if config.fp8:
        assert fp8_cvts == {config.kv_dtype.split("_")[1][:4] + "x2"}, fp8_cvts
    else:
        assert not fp8_cvts
    _check_merge(ptx, config)
    _check_variants(ptx, config)
    _check_grid_extents(ptx, config)
    if config.staged:
        # The converted (fp8) or copied (gathered) K and V tiles reach their operand buffers in
        # 16-byte stores; 2-byte stores are left only in q's one-time load (8 per 8-element chunk
        # a thread takes: rows x d / 8 chunks over 128 threads) and the swapped consumer's P^T
        # (its share of the keys x rows scores).
        assert "st.shared.v4.b32" in ptx
        from flashsplit.cute.q_tile import QTile

        chunks = config.rows * QTile(config).lanes_per_row  # (d = 96, fp16 operands: 16 lanes a row)
        b16_stores = -(-chunks // 128) * 8 + (config.tile_n * config.rows // 128 if config.swap_rows else 0)
        assert ptx.count("st.shared.b16") <= b16_stores, "staged tiles stored 2 bytes at a time"


def _entry_params(ptx: str) -> str:
    """The parameter list of the PTX's kernel entry."""
    entry = ptx[ptx.index(".entry"):]
    return entry[:entry.index(")")]


def _check_variants(ptx: str, config) -> None:
    """A variant costs only the configurations that turn it on: its runtime values are kernel
    parameters there and nowhere else (a window bound one u32 each after the 6 sizes; the
    softcap one f32 after the softmax scale; sinks and left padding one tensor each after the 11
    plain ones, 2 fp8 descales and 3 merge outputs), the softcap's ``rcp.approx`` per score appears only with it,
    and only a batch-invariant split rule takes its 512-key minimum split."""
    from flashsplit.plan import BATCH_INVARIANT_MIN_SPLIT

    params = _entry_params(ptx)
    assert params.count(".param .u32") == 6 + config.left_bound + config.right_bound, params
    assert params.count(".param .f32") == 1 + config.softcap, params
    assert params.count(".param .align") == (11 + 2 * config.fp8 + 3 * config.merge + bool(config.sinks)
                                             + config.leftpad), params
    caps = len(re.findall(r"rcp\.approx\.ftz\.f32", ptx))
    scores = config.tile_n * config.rows // 128  # per consumer thread and tile
    assert caps == (scores if config.softcap else 0), (caps, scores)
    minimum = re.search(rf"max\.s32\s+%r\d+, %r\d+, {BATCH_INVARIANT_MIN_SPLIT};", ptx)
    assert bool(minimum) == config.invariant


def _check_grid_extents(ptx: str, config) -> None:
    """A CTA reads the grid's extents only where it counts with them, each on the axis its launch
    order (``heads_first``) puts it: the row tiles in a merging kernel's arrival counter (z, or x
    KV heads first), the split CTAs in a batch-invariant CTA's run of splits (x, or y)."""
    expected = set()
    if config.merge and not config.cluster:
        expected.add("x" if config.heads_first else "z")
    if config.invariant:
        expected.add("y" if config.heads_first else "x")
    assert set(re.findall(r"%nctaid\.([xyz])", ptx)) == expected


def _check_swap_wgmmas(ptx: str, config) -> None:
    """Swapped operands: every wgmma is m64n8k16 (N = the 8 q rows), ``S^T = K Q^T`` (tile_n / 64
    x D / 16 of them) reads A untransposed and ``O^T = V^T P^T`` (D / 64 x tile_n / 16) reads the V
    stage as a transposed (MN-major) A; the 64-row kernel never issues N = 8."""
    shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k\d+)", ptx))
    if not config.swap_rows:
        assert "m64n8k16" not in shapes, shapes
        return
    assert shapes == {"m64n8k16"}, shapes
    transposed = re.findall(r"wgmma\.mma_async[^;]*p, 1,\s*1, (\d), (\d);", ptx)
    n, d = config.tile_n, config.head_dim
    assert sorted(transposed) == sorted([("0", "0")] * (n // 64 * d // 16) + [("1", "0")] * (d // 64 * n // 16)), transposed


def _check_merge(ptx: str, config) -> None:
    """Only a merging kernel counts arrivals: one acq_rel atomic add per CTA (gpu scope, PTX's
    default), after which the last CTA loads the partials as vectors (a lane's D / 32 columns),
    a whole chunk of splits before the first use: on the one-chunk path (a kernel of one CTA per
    SM), on the chunked path, and again in its loop over further chunks."""
    from flashsplit.cute.merge_tail import MergeTail

    atomics = re.findall(r"atom\.[\w.:]*", ptx)
    if not config.merge:
        assert not atomics, atomics
        return
    if config.cluster:
        _check_cluster_merge(ptx, config, atomics)
        return
    assert len(atomics) == 1 and ".acq_rel" in atomics[0] and ".add" in atomics[0], atomics
    assert ".cta" not in atomics[0] and ".sys" not in atomics[0], atomics
    merge = MergeTail(config).row_merge
    tail = ptx[ptx.index(atomics[0]):]
    paths = 3 if merge.one_chunk else 2
    if merge.strided:  # d = 96: a lane's 3 columns are 32 apart, scalar loads (and the LSEs')
        assert not re.findall(r"ld\.global\.v\d", tail)
        assert len(re.findall(r"ld\.global\.b32", tail)) >= paths * merge.chunk * merge.cols_per_lane
    else:
        vec = min(merge.cols_per_lane, 4)
        loads = len(re.findall(rf"ld\.global\.v{vec}\.b32", tail)) if vec > 1 else None
        assert loads == paths * merge.chunk * merge.cols_per_lane // vec, loads
    _check_row_offsets_hoisted(tail)
    if config.swap_rows:
        _check_swap_epilogue_hoisted(ptx, atomics[0])


def _check_swap_epilogue_hoisted(ptx: str, atomic: str) -> None:
    """The swapped consumer computes its output rows (the division by the GQA group) before
    its first tile: from its last pipeline wait to the arrival count no integer division runs
    (they cost ~0.6 us of a B = 1 call on the H200)."""
    last_wait = ptx.rindex("mbarrier.try_wait", 0, ptx.index(atomic))
    between = ptx[last_wait:ptx.index(atomic)]
    assert not re.findall(r"\b(?:div|rem)\.[su]32", between), re.findall(r"\b(?:div|rem)\.[su]32", between)


def _check_cluster_merge(ptx: str, config, atomics) -> None:
    """A cluster merge counts nothing in global memory: each CTA copies its slot to the leader
    with ``st.shared::cluster`` (rows x D / 128 stores per consumer thread, and one LSE), through
    two ``mapa`` addresses, between a relaxed arrive on entry, a wait before the copy (a consumer
    or the producer warp) and one arrive/wait pair after it."""
    assert not atomics, atomics
    assert len(re.findall(r"barrier\.cluster\.arrive\.relaxed", ptx)) == 1
    assert len(re.findall(r"barrier\.cluster\.arrive;", ptx)) == 1
    assert len(re.findall(r"barrier\.cluster\.wait", ptx)) == 3
    stores = len(re.findall(r"st\.shared::cluster\.f32", ptx))
    assert stores == config.rows * config.head_dim // 128 + 1, stores
    assert len(re.findall(r"mapa\.shared::cluster", ptx)) == 2
    assert ptx.index("barrier.cluster.arrive.relaxed") < ptx.index("cp.async.bulk.tensor")


def _check_row_offsets_hoisted(ptx: str) -> None:
    """The merge slices the row's views once, so each partial or LSE load adds one 64-bit
    multiply at most (its split's offset); indexing the 4-5 mode tensors per load cost about
    four, and 0.35 us of a bare combine on the H200 (2.37 -> 2.02 us)."""
    loads = len(re.findall(r"ld\.global", ptx))
    wide = len(re.findall(r"(?:mul|mad)\.lo\.s64", ptx))
    assert wide <= loads + 8, (wide, loads)


@needs_cutlass
@pytest.mark.parametrize("config", [c if not c.sinks or (c.head_dim, c.dtype) == (128, "bfloat16")
                                    else pytest.param(c, marks=pytest.mark.full)
                                    for c in all_combine_configs()], ids=str)
def test_combine_kernel_compiles(config, tmp_path):
    from flashsplit.cute.compile import compile_combine

    ptx = _compiled_ptx(compile_combine, config, tmp_path)
    assert ".entry" in ptx
    _check_combine_loads_first(ptx, config)
    # Sinks: one more tensor parameter (the logits) than the plain combine's three.
    assert _entry_params(ptx).count(".param .align") == 3 + bool(config.sinks)


def _check_combine_loads_first(ptx: str, config) -> None:
    """The combine's latency rests on one memory round trip: on its aligned path (first in the
    PTX) a warp's first chunk of partials loads as 8/16-byte vectors, all issued before the
    first shuffle of the LSE reduction, i.e. before anything waits on a load."""
    from flashsplit.cute.combine_kernel import CombineKernel

    kernel = CombineKernel(config)
    body = ptx[ptx.index(".entry"):]
    head = body[:body.index("shfl.sync.bfly")]
    if kernel.row_merge.strided:  # d = 96: scalar loads on the one path (with the LSEs')
        assert not re.findall(r"ld\.global\.v\d", ptx)
        scalars = len(re.findall(r"ld\.global\.b32", head))
        assert scalars >= kernel.chunk * kernel.cols_per_lane + kernel.row_merge.lse_regs + kernel.chunk, scalars
    else:
        vectors = len(re.findall(rf"ld\.global\.v{kernel.vec}\.b32", head))
        assert vectors == kernel.chunk * kernel.cols_per_lane // kernel.vec, vectors
    _check_row_offsets_hoisted(head)


def test_configs_fit_shared_memory():
    from flashsplit.cute.configs import check_smem

    for config in all_split_configs():
        check_smem(config)
        assert SPLIT_GRANULE % config.tile_n == 0


def _struct_bytes(config) -> int:
    """The size of ``config``'s shared-memory struct as CuTe lays it out (traced, not launched)."""
    import cutlass.cute as cute

    from flashsplit.cute.shared_storage import shared_storage
    from flashsplit.cute.split_kernel import SplitKVDecodeKernel

    kernel, size = SplitKVDecodeKernel(config), []

    @cute.jit
    def measure():
        _, _, q_layout, k_layout, v_layout, p_layout = kernel._operands()
        k_load, v_load = kernel._load_layouts(k_layout, v_layout)
        size.append(shared_storage(config, q_layout, k_layout, v_layout, p_layout, k_load, v_load).size_in_bytes())

    cute.compile(measure)
    return size[0]


@needs_cutlass
@pytest.mark.parametrize("full", [False, pytest.param(True, marks=pytest.mark.full)])
def test_smem_bytes_is_the_struct_size(full):
    """``SplitConfig.smem_bytes``, which decides CTAs per SM and the launch's fit, is the size of
    the struct the kernel allocates, to the byte (the default run: the default compile set)."""
    if not _arch_ok():
        pytest.skip("CUTE_DSL_ARCH is set to another arch")
    for config in compile_check_configs() if full else default_compile_configs():
        assert config.smem_bytes == _struct_bytes(config), config


def test_all_split_configs_include_paged():
    configs = [c for c in all_split_configs(subtile=False) if not c.fp8]
    assert len(configs) == len(set(configs)) == 64  # 4 head dims x dtype x causal x output x paged
    dense = {c for c in configs if not c.paged}
    assert {c.__class__(**{**c.__dict__, "paged": False}) for c in configs if c.paged} == dense


def test_all_split_configs_include_fp8():
    """Every 16-bit configuration also exists for both fp8 caches, with the same tile and CTAs
    per SM (more, half-size staging slots)."""
    configs = all_split_configs(subtile=False)
    assert len(configs) == len(set(configs)) == 192
    same = {c for c in configs if not c.fp8}
    for kv_dtype in ("float8_e4m3fn", "float8_e5m2"):
        fp8 = [c for c in configs if c.kv_dtype == kv_dtype]
        assert len(fp8) == 64
        for c in fp8:
            base = c.__class__(**{**c.__dict__, "kv_dtype": "same",
                                  "stages": {64: 3, 96: 3, 128: 2, 256: 3}[c.head_dim]})
            assert base in same
            assert c.stages >= base.stages


def test_subtile_configs():
    """Sub-tile paging adds one compile key per page size (multiples of 8 dividing the tile) to
    every paged configuration; dense and whole-tile paged keys keep subtile_page = 0 (their
    kernels compile exactly as before). The compile check builds every (cache type, head dim,
    page size) once, with each (dtype, causal, partials) combination among them."""
    from flashsplit.cute.configs import split_config, subtile_page_sizes

    assert subtile_page_sizes(64) == (8, 16, 32, 64)
    assert subtile_page_sizes(96) == subtile_page_sizes(128) == subtile_page_sizes(256) == (8, 16, 32)
    whole = all_split_configs(subtile=False)
    assert all(c.subtile_page == 0 for c in whole)
    sub = [c for c in all_split_configs() if c.subtile_page]
    assert len(sub) == len(set(sub)) == 3 * 8 * (4 + 3 + 3 + 3)
    for c in sub:
        assert c.paged and c.tile_n % c.subtile_page == 0 and c.subtile_page % 8 == 0
        assert c.__class__(**{**c.__dict__, "subtile_page": 0}) in whole
    dispatched = set(all_split_configs())  # the rest: test_merge_configs, test_one_per_sm_configs, ...
    checked = [c for c in compile_check_configs() if c.subtile_page and c in dispatched]
    assert {(c.kv_dtype, c.head_dim, c.subtile_page) for c in checked} == {
        (c.kv_dtype, c.head_dim, c.subtile_page) for c in sub}
    assert len({(c.dtype, c.causal, c.write_partials) for c in checked}) == 8
    gathered = {c for c in compile_check_configs() if c.gather_pages and c in dispatched}
    assert (set(compile_check_configs()) & dispatched) - set(checked) - gathered == set(whole)
    # The page size is a compile key only below the tile.
    assert split_config("bfloat16", 128, False, True, True, page_size=128).subtile_page == 0
    assert split_config("bfloat16", 128, False, True, True, page_size=16).subtile_page == 16
    assert split_config("bfloat16", 128, False, True, False, page_size=16).subtile_page == 0
    with pytest.raises(ValueError, match="page_size"):
        split_config("bfloat16", 128, False, True, True, page_size=0)


def test_gather_configs():
    """Page sizes that are neither multiples of the tile nor sub-tile sizes (1-7, 24, 48, 96, ...)
    share one gathered compile key per (dtype, head dim, causal, partials, cache type): the page
    size is a runtime value there. Staging fits two CTAs per SM up to d = 128."""
    from flashsplit.cute.configs import SMEM_PER_SM, SMEM_RESERVED_PER_CTA, split_config

    keys = {split_config("bfloat16", 128, False, True, True, page_size=p) for p in (1, 3, 7, 24, 48, 96, 200)}
    assert len(keys) == 1
    (key,) = keys
    assert key.gather_pages and key.staged and not key.fp8 and key.subtile_page == 0
    for page_size in (16, 64, 128, 256):  # sub-tile or whole-tile: TMA, not gathered
        assert not split_config("bfloat16", 128, False, True, True, page_size=page_size).gather_pages
    assert not split_config("bfloat16", 128, False, True, False, page_size=24).gather_pages  # dense
    gathered = [c for c in all_split_configs() if c.gather_pages]
    assert len(gathered) == len(set(gathered)) == 4 * 24
    for c in gathered:
        assert c.units_per_sm * (c.smem_bytes + SMEM_RESERVED_PER_CTA) <= SMEM_PER_SM
        assert c.units_per_sm == (1 if c.head_dim == 256 else 2)
    checked = [c for c in compile_check_configs() if c.gather_pages and not c.merge]
    assert {(c.kv_dtype, c.head_dim) for c in checked} == {(c.kv_dtype, c.head_dim) for c in gathered}


def test_merge_configs():
    """The last-CTA merge is a compile key of partials launches only; the compile check builds it
    for every (cache type, head dim) dense, with both dtypes and causal among them, and for
    whole-tile, sub-tile and gathered pages; its 16-byte ticket keeps the CTAs per SM."""
    from flashsplit.cute import configs

    with pytest.raises(ValueError, match="merge: only for a launch that writes partials"):
        configs.split_config("bfloat16", 128, False, False, merge=True)
    merged = [c for c in compile_check_configs() if c.merge and not _one_per_sm(c) and not _wave_or_swap(c)
              and not _variants(c) and not c.heads_first and not c.cluster]
    assert all(c.write_partials for c in merged)
    assert {(c.kv_dtype, c.head_dim) for c in merged if not c.paged} == {
        (kv, d) for kv in configs.KV_DTYPES for d in configs.HEAD_DIMS}
    assert {c.dtype for c in merged} == set(configs.DTYPES) and {c.causal for c in merged} == {False, True}
    assert {(c.subtile_page > 0, c.gather_pages) for c in merged if c.paged} == {
        (False, False), (True, False), (False, True)}
    for c in merged:
        plain = c.__class__(**{**c.__dict__, "merge": False})
        assert plain in set(all_split_configs()) and plain.smem_bytes <= c.smem_bytes <= plain.smem_bytes + 1024
        configs.check_smem(c)
    assert not any(c.merge for c in all_split_configs())  # the twins are listed here, not there


def test_heads_first_configs():
    """KV heads first is a launch order: each such configuration is its splits-first twin (one
    ``split_config`` builds) in every other field and in shared memory; the check builds it for
    one split, partials, the merge on each tile and batch-invariant runs. Launches take it by
    :func:`~flashsplit.cute.choice.launches_heads_first` (32 KV heads, 16 batch rows) or when
    asked, batch-invariant ones included."""
    from flashsplit.cute import choice
    from flashsplit.cute.config_lists import at_head_dim

    ordered = [c for c in compile_check_configs() if c.heads_first]
    for c in ordered:
        twin = dataclasses.replace(c, heads_first=False)
        assert at_head_dim(twin, twin.head_dim) == twin and at_head_dim(c, c.head_dim) == c
        assert c.smem_bytes == twin.smem_bytes
    assert {("merge" if c.merge else "partials" if c.write_partials else "final") for c in ordered} == {
        "final", "partials", "merge"}
    assert {"one per SM", "swap", "two CTAs"} <= {"one per SM" if _one_per_sm(c) else "swap" if c.swap_rows
                                                  else "two CTAs" for c in ordered if c.merge}
    assert any(c.invariant for c in ordered)
    assert choice.HEADS_FIRST is None
    problem = DecodeProblem(batch=4, seqlen_q=1, seqlen_k=4096, num_heads=32, num_heads_kv=8, head_dim=128,
                            dtype=torch.bfloat16, causal=False, has_cache_seqlens=True, device_type="cuda")
    assert not choice.choose(problem, 8, 132).heads_first
    assert choice.choose(problem, 8, 132, heads_first=True).heads_first
    mha = dataclasses.replace(problem, num_heads_kv=32)
    for batch, expected in ((4, False), (15, False), (16, True), (64, True)):
        assert choice.choose(dataclasses.replace(mha, batch=batch), 1, 132).heads_first is expected
    assert not choice.choose(dataclasses.replace(problem, batch=64), 1, 132).heads_first  # 8 KV heads
    assert not choice.choose(dataclasses.replace(mha, batch=64), 1, 132, heads_first=False).heads_first
    invariant = dataclasses.replace(problem, batch_invariant=True)
    assert choice.choose(invariant, 8, 132, heads_first=True).heads_first


@needs_cutlass
@pytest.mark.parametrize("gpu, shape, splits, cluster", [
    ("h200", dict(seqlen_k=4096), 8, True),  # 8 row tiles x 8 splits: one cluster each
    ("h200", dict(seqlen_k=2048, num_heads=64), 8, True),
    ("h200", dict(seqlen_k=4096, head_dim=64), 8, True),
    ("h200", dict(seqlen_k=4096, batch=4, num_heads=16, num_heads_kv=2), 8, True),
    ("h200", dict(seqlen_k=4096, page_size=16), 8, True),
    ("h200", dict(seqlen_k=16384), 16, False),  # past the H200's measured span: the counter
    ("h100", dict(seqlen_k=131072), 8, True),
    ("h100", dict(seqlen_k=307200), 16, False),
    ("h100", dict(seqlen_k=4096, num_heads=28, num_heads_kv=4), 32, False),  # 4 row tiles: no cap
    ("h100", dict(seqlen_k=4096, batch=2), 8, False),  # 16 row tiles: the plan's own 8, the counter
    ("h100", dict(seqlen_k=4096, softcap=30.0), 16, False),  # untested attention: no cap
    ("h100", dict(seqlen_k=131072, head_dim=64), 8, True),
    ("h100", dict(seqlen_k=4096, causal=True), 8, True),  # one causal query: no mask
    ("h100", dict(seqlen_k=4096, num_heads=40, head_dim=64), 32, False),  # d = 64, 5 packed rows
    ("h100", dict(seqlen_k=16384, page_size=16), 8, True),
    ("h100", dict(seqlen_k=131072, page_size=16), 32, False),  # pages over more than 16k keys
    ("h100", dict(seqlen_k=4096, head_dim=256), 16, False),  # no swapped operands at d = 256
])
def test_cluster_split_cap(gpu, shape, splits, cluster):
    """Where each of 8 row tiles' splits can merge through one cluster of 8 CTAs, the cute plan
    stops at 8 splits (not the 16-32 of one or two CTAs per SM) and says why."""
    import flashsplit
    from flashsplit.cute import choice

    args = dict(batch=1, seqlen_k=4096, num_heads=32, num_heads_kv=8, head_dim=128, page_size=0, softcap=0.0)
    args.update(shape)
    p = flashsplit.plan(args.pop("batch"), args.pop("seqlen_k"), args.pop("num_heads"), args.pop("num_heads_kv"),
                        args.pop("head_dim"), gpu=gpu, device="cuda", backend="cute", **args)
    assert p.num_splits == splits, p
    assert ("merge through one cluster" in p.split_reason) == cluster, p.split_reason
    assert p.num_splits * p.work_units <= choice.CLUSTER_MAX_CTAS or not cluster


def test_cluster_configs():
    """A cluster merge is a merging swapped-operand configuration at d = 64 or 128 of 2-16 splits
    per cluster, one CTA per SM, whose shared memory holds the leader's slots; launches take it
    up to ``choice.CLUSTER_MAX_CTAS`` CTAs or when asked, and only where every CTA fits one wave."""
    from flashsplit.cute import choice, configs

    clustered = [c for c in compile_check_configs() if c.cluster]
    assert {c.head_dim for c in clustered} == {64, 128} and {2, 16} <= {c.cluster for c in clustered}
    assert any(c.paged for c in clustered) and any(c.causal for c in clustered)
    for c in clustered:
        assert c.merge and c.swap_rows and c.units_per_sm == 1 and not c.heads_first
        twin = dataclasses.replace(c, cluster=0, units_per_sm=configs.split_tile(c.head_dim)[2])
        # the leader's slots on top of the twin's struct (both rounded to 1 KiB)
        assert c.smem_bytes > twin.smem_bytes - 1024 + c.cluster * c.rows * (c.head_dim + 1) * 4
        configs.check_smem(c)
    swap = configs.SWAP_AB_ROWS
    for bad in (dict(cluster=1), dict(cluster=17), dict(cluster=4, merge=False), dict(cluster=4, swap_rows=0),
                dict(cluster=4, heads_first=True)):
        kwargs = {"merge": True, "swap_rows": swap, **bad}
        with pytest.raises(ValueError, match="cluster"):
            configs.split_config("bfloat16", 128, False, True, **kwargs)
    with pytest.raises(ValueError, match="cluster"):
        configs.split_config("bfloat16", 256, False, True, merge=True, swap_rows=swap, cluster=4)
    assert choice.CLUSTER_MERGE is None
    h200, h100 = KNOWN_GPUS["h200"], KNOWN_GPUS["h100"]
    b1 = DecodeProblem(batch=1, seqlen_q=1, seqlen_k=4096, num_heads=32, num_heads_kv=8, head_dim=128,
                       dtype=torch.bfloat16, causal=False, has_cache_seqlens=True, device_type="cuda", gpu=h200)
    assert not choice.choose(b1, 16, 132).cluster  # 128 CTAs
    assert choice.choose(b1, 8, 132).cluster  # 64 CTAs
    short = dataclasses.replace(b1, seqlen_k=1024)
    assert choice.choose(short, 8, 132).cluster
    assert not choice.choose(dataclasses.replace(short, batch=2), 8, 132).cluster  # 128 CTAs
    # Spans: measured to 4k keys on the H200, to 128k on the H100.
    assert choice.cluster_max_span(b1) == choice.CLUSTER_MAX_SPAN == 4096
    assert not choice.choose(dataclasses.replace(b1, seqlen_k=4097), 8, 132).cluster
    assert choice.choose(dataclasses.replace(b1, seqlen_k=131072, gpu=h100), 8, 132).cluster
    assert not choice.choose(dataclasses.replace(b1, seqlen_k=131073, gpu=h100), 8, 132).cluster
    # Attention the cluster merge's GPU tests do not cover keeps the counter, and so does a
    # launch whose caller forces one-wave stages or the launch order.
    for untested in (dict(window_left=256), dict(softcap=30.0), dict(has_leftpad=True),
                     dict(kv_dtype=torch.float8_e4m3fn)):
        assert not choice.choose(dataclasses.replace(short, **untested), 8, 132).cluster, untested
    assert choice.choose(dataclasses.replace(short, has_sinks=True), 8, 132).cluster
    assert not choice.choose(short, 8, 132, one_wave=True).cluster
    assert not choice.choose(short, 8, 132, heads_first=True).cluster
    assert not choice.choose(short, 8, 132, cluster=False).cluster
    tile = choice.choose(b1, 16, 132, cluster=True)
    assert tile.cluster and tile.merge and tile.swap and not tile.heads_first and not tile.one_wave
    b4 = dataclasses.replace(b1, batch=4)  # 512 CTAs: more than one wave at one per SM
    assert not choice.choose(b4, 16, 132, cluster=True).cluster
    assert not choice.choose(b1, 1, 132, cluster=True).cluster  # one split: nothing to merge


def test_one_per_sm_configs():
    """The one-CTA-per-SM tile is a compile key of dense 16-bit d = 128 launches only (64-key
    tiles, 3 stages, one CTA per SM); the compile check builds all 8 of them and a merging one."""
    from flashsplit.cute import configs

    c = configs.split_config("bfloat16", 128, False, True, one_per_sm=True)
    assert (c.tile_n, c.stages, c.units_per_sm) == configs.ONE_PER_SM_TILE == (64, 3, 1)
    configs.check_smem(c)
    for kwargs in (dict(head_dim=64), dict(kv_dtype="float8_e4m3fn")):
        args = dict(dtype="bfloat16", head_dim=128, causal=False, write_partials=True) | kwargs
        with pytest.raises(ValueError, match="one_per_sm: only for 16-bit caches at head_dim 128"):
            configs.split_config(**args, one_per_sm=True)
    with pytest.raises(ValueError, match="one_per_sm: not for gathered pages"):
        configs.split_config("bfloat16", 128, False, True, True, page_size=48, one_per_sm=True)
    deep = [c for c in compile_check_configs() if _one_per_sm(c) and not c.paged and not _wave_or_swap(c)
            and not _variants(c)]
    assert len(deep) == 9 and {(c.dtype, c.causal, c.write_partials) for c in deep} == {
        (d, ca, wp) for d in configs.DTYPES for ca in (False, True) for wp in (False, True)}
    paged = [c for c in compile_check_configs() if _one_per_sm(c) and c.paged]
    assert {c.subtile_page for c in paged} == {0, 16}  # whole-tile and sub-tile TMA pages
    assert any(c.merge for c in deep) and not any(c in set(all_split_configs()) for c in deep)


def test_one_wave_configs():
    """Three stages for one-wave merging launches are a compile key of dense 16-bit d = 128
    merging launches on the two-CTA tile (still two CTAs per SM); the compile check builds them
    for every dtype x causal."""
    from flashsplit.cute import configs

    c = configs.split_config("bfloat16", 128, False, True, merge=True, one_wave=True)
    assert (c.tile_n, c.stages, c.units_per_sm) == (64, configs.ONE_WAVE_STAGES, 2) == (64, 3, 2)
    configs.check_smem(c)
    for kwargs in (dict(head_dim=64), dict(kv_dtype="float8_e4m3fn"), dict(paged=True, page_size=128),
                   dict(one_per_sm=True), dict(merge=False)):
        args = dict(dtype="bfloat16", head_dim=128, causal=False, write_partials=True, merge=True) | kwargs
        with pytest.raises(ValueError, match="one_wave: only for merging launches of dense 16-bit caches"):
            configs.split_config(**args, one_wave=True)
    deep = [c for c in compile_check_configs() if _one_wave(c)]
    assert all(c.merge and not c.paged and not c.fp8 for c in deep)
    assert {(c.dtype, c.causal) for c in deep} >= {(d, ca) for d in configs.DTYPES for ca in (False, True)}


def test_one_wave_merge_rule():
    """3 stages where a dense 16-bit d = 128 launch on the two-CTA tile merges 2-16 splits in
    one wave (Llama-3-8B heads, planned at one CTA per SM: B = 1 x 4k/128k, 16 splits; B = 4 x
    4k/16k, 4; B = 8 x 4k, 2), not for combined splits (16/2 heads at B = 1: 32 and 64), one split
    (B = 64), the one-CTA-per-SM tile (B = 16 x 4k/128k), d = 64, fp8 or paged caches."""
    from flashsplit.cute import choice

    def takes(batch, seqlen_k, head_dim=128, kv_dtype=None, page_size=0, heads=(32, 8)):
        p = DecodeProblem(batch, 1, seqlen_k, *heads, head_dim, torch.bfloat16, False, True, "cuda",
                          kv_dtype=kv_dtype, page_size=page_size)
        splits = choice.planned_split(p, p.work_units(64), choice.units_per_sm(p, 132), 132)[0]
        return choice.one_wave_merge(p, splits, 132), splits

    assert takes(1, 4096) == (True, 16) and takes(1, 131072) == (True, 16)
    assert takes(4, 4096) == (True, 4) and takes(4, 16384) == (True, 4) and takes(8, 4096) == (True, 2)
    assert takes(1, 4096, heads=(16, 2)) == (False, 32) and takes(1, 131072, heads=(16, 2)) == (False, 64)
    assert takes(64, 4096) == (False, 1)
    assert takes(16, 4096) == (False, 1) and takes(16, 131072) == (False, 1)  # one CTA per SM
    assert not takes(4, 4096, head_dim=64)[0] and not takes(4, 4096, kv_dtype=torch.float8_e4m3fn)[0]
    assert not takes(4, 4096, page_size=128)[0]


def test_swapped_kernel_plans_one_cta_per_sm():
    """The swapped-operand two-CTA tile (dense 16-bit d = 128, 1-8 packed rows) is planned at one
    CTA per SM where the plan's CTAs fit one CTA per SM there: B = 1 / 2 / 4 / 8 of 32/8 heads
    (16 / 8 / 4 / 2 splits), 32/32 heads at B = 1 (4), 28/4 at B = 1 (32 combined splits of 7
    rows); not where that plan fills two waves of one per SM (B = 3: 11 splits, 264 CTAs, one wave
    of two), where 5-8 packed rows would merge in the kernel (40/8, 64/8 heads at B = 1: 16
    splits), with 16 packed rows (L_q = 4), paged, fp8, batch-invariant, or d = 64."""
    from flashsplit.cute import choice

    def problem(batch, seqlen_k=4096, **kw):
        args = dict(batch=batch, seqlen_q=1, seqlen_k=seqlen_k, num_heads=32, num_heads_kv=8, head_dim=128,
                    dtype=torch.bfloat16, causal=False, has_cache_seqlens=True, device_type="cuda") | kw
        return DecodeProblem(**args)

    def planned(p):
        return choice.units_per_sm(p, 132), choice.planned_split(p, p.work_units(64), choice.units_per_sm(p, 132),
                                                                 132)[0]

    for batch, splits in ((1, 16), (2, 8), (4, 4), (8, 2)):
        assert choice.swaps_one_per_sm(problem(batch), 132) and planned(problem(batch)) == (1, splits)
    assert planned(problem(1, num_heads_kv=32)) == (1, 4)
    assert planned(problem(1, 16384, num_heads=28, num_heads_kv=4)) == (1, 32)
    for heads in (40, 64):
        assert not choice.swaps_one_per_sm(problem(1, num_heads=heads), 132)
        assert planned(problem(1, num_heads=heads)) == (2, 32)
    assert not choice.swaps_one_per_sm(problem(3), 132) and planned(problem(3)) == (2, 11)
    for p in (problem(1, seqlen_q=4, causal=True), problem(1, page_size=128), problem(1, kv_dtype=torch.float8_e4m3fn),
              problem(1, batch_invariant=True), problem(1, head_dim=64)):
        assert not choice.swaps_one_per_sm(p, 132), p
    tile = choice.choose(problem(1), 16, 132)
    assert (tile.one_per_sm, tile.one_wave, tile.merge, tile.swap) == (False, True, True, True)


def test_one_cta_per_sm_rule():
    """The cute backend plans one CTA per SM (and takes that tile) for 16-bit d = 128 problems,
    dense or in TMA pages, whose units fit one wave of 132 SMs in one split of >= 2k keys per CTA
    or several of >= 16k: B = 16 x 4k/16k/128k and B = 4 x 128k (4 splits) for Llama-3-8B heads,
    B = 4 x 4k for Llama-2-7B heads; not B = 1 x 16k/128k, B = 4 x 16k, B = 64, d = 64, fp8,
    gathered pages (the swapped-operand kernel of the first two plans one CTA per SM too)."""
    from flashsplit.cute import choice
    from flashsplit.dispatch import make_plan as _make_plan

    backend = CuteBackend()

    def problem(batch, seqlen_k, **kw):
        args = dict(batch=batch, seqlen_q=1, seqlen_k=seqlen_k, num_heads=32, num_heads_kv=8, head_dim=128,
                    dtype=torch.bfloat16, causal=False, has_cache_seqlens=True, device_type="cuda") | kw
        return DecodeProblem(**args)

    for p, deep in [(problem(16, 4096), True), (problem(16, 16384), True), (problem(1, 131072), False),
                    (problem(4, 16384), False), (problem(1, 16384), False), (problem(4, 4096), False),
                    (problem(64, 4096), False), (problem(16, 131072), True), (problem(4, 131072), True),
                    (problem(16, 4096, head_dim=64), False), (problem(16, 4096, kv_dtype=torch.float8_e4m3fn), False),
                    # TMA pages (whole-tile and sub-tile); gathered pages never
                    (problem(16, 4096, page_size=128), True), (problem(16, 4096, page_size=16), True),
                    (problem(16, 4096, page_size=48), False), (problem(4, 4096, num_heads_kv=32), True)]:
        assert choice.one_cta_per_sm(p, 132) == deep, p
        per_sm = 1 if deep or choice.swaps_one_per_sm(p, 132) else configs_tile(p.head_dim)[2]
        assert backend.units_per_sm(p) == choice.units_per_sm(p, 132) == per_sm, p
        if deep:  # the hand rules run cute there (paged: the paged-tma rule comes first)
            assert selection.rule_for(_without_table(p)).name == ("paged-tma" if p.paged else "one-cta-per-sm"), p
    plan = _make_plan(problem(4, 131072), backend, "", "", 0)
    assert (plan.units_per_sm, plan.num_splits) == (1, 4)
    assert _make_plan(problem(16, 4096), backend, "", "", 0).num_splits == 1



def test_batch_invariant_runs_of_splits():
    """A batch-invariant launch gives each CTA a run of consecutive fixed splits, as many CTAs per
    row tile as fit one wave (at least one): one split per CTA for a lone row, 2 CTAs of 16 splits
    each at B = 16 x 16k (32/8 heads), one CTA per row tile at B = 64; other launches one per split."""
    from flashsplit.cute import choice

    def problem(batch, seqlen_k, **kw):
        args = dict(batch=batch, seqlen_q=1, seqlen_k=seqlen_k, num_heads=32, num_heads_kv=8, head_dim=128,
                    dtype=torch.bfloat16, causal=False, has_cache_seqlens=True, device_type="cuda",
                    batch_invariant=True) | kw
        return DecodeProblem(**args)

    for batch, ctas in [(1, 32), (2, 16), (4, 8), (16, 2), (64, 1)]:
        tile = choice.choose(problem(batch, 16384), 32, 132)
        assert (tile.split_ctas, tile.merge, tile.one_per_sm, tile.swap) == (ctas, False, False, False), batch
        assert -(-32 // ctas) * (ctas - 1) < 32  # every CTA runs at least one split
    # 5 splits: 52 row tiles x 5 = 260 CTAs fit one wave of 264; 53 take runs of 2 (3 CTAs a tile)
    assert choice.invariant_split_ctas(52, 5, 2, 132) == 5 and choice.invariant_split_ctas(53, 5, 2, 132) == 3
    assert choice.invariant_split_ctas(300, 5, 2, 132) == 1
    assert choice.choose(problem(16, 16384, batch_invariant=False), 2, 132).split_ctas == 0


def test_swap_rule():
    """The swapped-operand kernel takes 1-8 packed rows of a 16-bit or fp8 cache (dense, whole-tile
    or sub-tile pages) in one wave of the tile's CTAs per SM; not 9+ rows, gathered pages or two
    waves; ``split_config`` refuses what it cannot build. fp8 runs its staging slots at the
    64-row kernel's CTAs per SM."""
    from flashsplit.cute import configs

    from flashsplit.cute import choice

    assert configs.swap_ab_applies(8, "same", None, 128) and configs.swap_ab_applies(1, "same", 16, 128)
    assert configs.swap_ab_applies(4, "same", 128, 128)
    assert not configs.swap_ab_applies(9, "same", None, 128)
    assert configs.swap_ab_applies(4, "float8_e4m3fn", None, 128) and configs.swap_ab_applies(8, "float8_e5m2", 16, 64)
    assert not configs.swap_ab_applies(4, "same", 48, 128)  # gathered pages
    assert not configs.swap_ab_applies(4, "float8_e4m3fn", 48, 128)
    assert choice.swaps(4, "same", None, 128, 264, 2, 132) and choice.swaps(4, "float8_e5m2", 16, 128, 264, 2, 132)
    assert not choice.swaps(4, "same", None, 128, 265, 2, 132)
    assert not choice.swaps(4, "same", None, 128, 133, 1, 132)
    for kw in (dict(swap_rows=16), dict(paged=True, page_size=48),
               dict(paged=True, page_size=48, kv_dtype="float8_e5m2")):
        with pytest.raises(ValueError, match="swap_rows"):
            configs.split_config("bfloat16", 128, False, True, swap_rows=kw.pop("swap_rows", 8), **kw)
    c = configs.split_config("bfloat16", 128, False, True, swap_rows=8)
    assert c.rows == 8 and c.stages == configs.SWAP_AB_STAGES and c.units_per_sm == 2
    configs.check_smem(c)
    for head_dim in (64, 128, 256):
        c = configs.split_config("bfloat16", head_dim, False, True, kv_dtype="float8_e4m3fn", swap_rows=8)
        assert c.fp16_operands and c.staged and c.stages == configs.fp8_stages(head_dim)
        assert c.units_per_sm == configs.split_tile(head_dim)[2]
        configs.check_smem(c)
    # d = 96: O^T's M (the head dim) is not whole 64-row wgmma blocks, so the 64-row consumer runs.
    assert not configs.swap_ab_applies(4, "same", None, 96) and not choice.swaps(4, "same", None, 96, 8, 2, 132)
    with pytest.raises(ValueError, match="swap_rows: .*head_dim 96"):
        configs.split_config("bfloat16", 96, False, True, swap_rows=8)
    assert not choice.choose(_problem(head_dim=96, device_type="cuda"), 3, 132).swap


def test_head_dim_96_configs():
    """d = 96 takes d = 128's 64-key tile with 3 stages at two CTAs per SM (16-bit, fp8 and
    gathered staging all fit), d = 128's sub-tile page sizes, and every configuration of the
    d = 128 compile-check list but the swapped consumer, one CTA per SM and one-wave stages."""
    from flashsplit.cute import config_lists, configs

    assert configs.split_tile(96) == (64, 3, 2) and configs.subtile_page_sizes(96) == (8, 16, 32)
    assert configs.fp8_stages(96) == 4
    for kw in (dict(), dict(kv_dtype="float8_e4m3fn"), dict(paged=True, page_size=24), dict(merge=True)):
        c = configs.split_config("bfloat16", 96, False, True, **kw)
        configs.check_smem(c)
        assert c.units_per_sm == 2 and 2 * (c.smem_bytes + configs.SMEM_RESERVED_PER_CTA) <= configs.SMEM_PER_SM
    for kw in (dict(one_per_sm=True), dict(merge=True, one_wave=True)):
        with pytest.raises(ValueError, match="head_dim 128"):
            configs.split_config("bfloat16", 96, False, True, **kw)
    checked = compile_check_configs()
    at_128 = [c for c in checked if c.head_dim == 128]
    at_96 = {c for c in checked if c.head_dim == 96}
    for c in at_128:
        twin = config_lists.at_head_dim(c, 96)
        refused = c.swap_rows > 0 or _one_per_sm(c) or _one_wave(c)
        assert (twin is None) == refused, c
        if twin is not None:
            assert twin in at_96 and (twin.subtile_page, twin.gather_pages, twin.merge) == (
                c.subtile_page, c.gather_pages, c.merge)
    assert at_96 == {config_lists.at_head_dim(c, 96) for c in at_128} - {None}


def test_choices_plan_for_the_named_machine():
    """The rules take the SM count they plan for: B = 16 x 4k (128 units) fits one wave of one CTA
    per SM on 132 SMs, not on 114; 4 splits of B = 8 x 4k (256 CTAs of 4 packed rows) swap
    operands and take the one-wave stages in one wave of 2 x 132, not in the two waves of 2 x
    100; and a launch's choice follows the rules unless a variant is named."""
    from flashsplit.cute import choice

    p = _problem(batch=16, device_type="cuda")
    assert choice.one_cta_per_sm(p, 132) and not choice.one_cta_per_sm(p, 114)
    assert choice.units_per_sm(p, 132) == 1 and choice.units_per_sm(p, 114) == 2
    assert choice.choose(p, 1, 132) == choice.LaunchChoice(one_per_sm=True, one_wave=False, merge=False, swap=True)
    small = _problem(batch=8, seqlen_k=4096, device_type="cuda")  # 4 packed rows, 64 CTAs per split
    assert choice.choose(small, 4, 132) == choice.LaunchChoice(False, True, True, True)
    assert choice.choose(small, 4, 100) == choice.LaunchChoice(False, False, True, False)  # two waves
    assert choice.choose(small, 4, 132, one_wave=False, swap=False) == choice.LaunchChoice(False, False, True, False)
    assert choice.choose(small, 4, 132, max_splits=1) == choice.LaunchChoice(False, False, False, True)
    assert choice.choose(small, 4, 132, one_per_sm=True).one_wave is False
    assert choice.kv_dtype_name(_problem(kv_dtype=torch.float8_e5m2)) == "float8_e5m2"
    assert choice.kv_dtype_name(_problem()) == "same"


def _one_per_sm(config) -> bool:
    """A configuration of the one-CTA-per-SM tile (test_one_per_sm_configs)."""
    return config.head_dim == 128 and config.units_per_sm == 1


def _one_wave(config) -> bool:
    """A configuration with ``ONE_WAVE_STAGES`` (test_one_wave_configs)."""
    from flashsplit.cute import configs

    return (config.head_dim == 128 and config.units_per_sm == 2 and config.stages == configs.ONE_WAVE_STAGES
            and not config.staged and not config.swap_rows)


def _wave_or_swap(config) -> bool:
    """A one-wave configuration (test_one_wave_configs) or a swapped-operand one (test_swap_rule)."""
    return _one_wave(config) or config.swap_rows > 0


def configs_tile(head_dim):
    from flashsplit.cute.configs import split_tile

    return split_tile(head_dim)


def test_fp8_configs_keep_two_ctas_per_sm_up_to_d128():
    from flashsplit.cute.configs import SMEM_PER_SM, SMEM_RESERVED_PER_CTA, split_config

    for d in (64, 128):
        c = split_config("bfloat16", d, False, True, kv_dtype="float8_e4m3fn")
        assert c.units_per_sm == 2 and 2 * (c.smem_bytes + SMEM_RESERVED_PER_CTA) <= SMEM_PER_SM
    with pytest.raises(ValueError, match="kv_dtype"):
        split_config("bfloat16", 128, False, True, kv_dtype="int8")


def test_import_does_not_import_cutlass():
    code = ("import sys, flashsplit.cute, flashsplit.cute.choice, flashsplit.cute.launcher, "
            "flashsplit.cute.launch_args; assert 'cutlass' not in sys.modules")
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


def _problem(**overrides) -> DecodeProblem:
    fields = dict(batch=1, seqlen_q=1, seqlen_k=4096, num_heads=32, num_heads_kv=8, head_dim=128,
                  dtype=torch.bfloat16, causal=False, has_cache_seqlens=True, device_type="cpu", aligned_16b=True)
    fields.update(overrides)
    return DecodeProblem(**fields)


def _without_table(problem: DecodeProblem) -> DecodeProblem:
    """``problem`` on a GPU of the H200's SM count without a measured table: the hand rules decide."""
    from flashsplit.target import GpuTarget

    return dataclasses.replace(problem, device_type="cuda", gpu=GpuTarget("NVIDIA H100 NVL", 132, (9, 0)))


@pytest.mark.parametrize("overrides,needle", [
    (dict(head_dim=32), "head_dim 32"),
    (dict(head_dim=80), "head_dim 80"),
    # d = 96 (Phi-3-mini): dense, whole-tile, sub-tile and gathered pages, fp8.
    (dict(head_dim=96, num_heads_kv=32), "CUDA device"),
    (dict(head_dim=96, page_size=64), "CUDA device"),
    (dict(head_dim=96, page_size=16), "CUDA device"),
    (dict(head_dim=96, page_size=24), "CUDA device"),
    (dict(dtype=torch.float32), "float16 or bfloat16"),
    (dict(aligned_16b=False), "16-byte"),
    (dict(), "CUDA device"),
    # Paged: a multiple of the KV tile passes the paged check (then fails on the CPU device).
    (dict(page_size=64), "CUDA device"),
    (dict(page_size=128), "CUDA device"),
    (dict(page_size=256, head_dim=64), "CUDA device"),
    (dict(page_size=64, head_dim=256), "CUDA device"),
    # Pages smaller than the tile (multiples of 8 dividing it): the sub-tile kernel.
    (dict(page_size=16), "CUDA device"),
    (dict(page_size=8), "CUDA device"),
    (dict(page_size=8, head_dim=256), "CUDA device"),
    (dict(page_size=32, head_dim=256), "CUDA device"),
    (dict(page_size=64, head_dim=64), "CUDA device"),
    # Any other page size: the gathered-row kernel.
    (dict(page_size=1), "CUDA device"),
    (dict(page_size=24), "CUDA device"),
    (dict(page_size=48, head_dim=64), "CUDA device"),
    # fp8 caches: dense, whole-tile, sub-tile and gathered pages.
    (dict(kv_dtype=torch.float8_e4m3fn), "CUDA device"),
    (dict(kv_dtype=torch.float8_e5m2, dtype=torch.float16, head_dim=256), "CUDA device"),
    (dict(page_size=128, kv_dtype=torch.float8_e4m3fn), "CUDA device"),
    (dict(page_size=16, kv_dtype=torch.float8_e4m3fn), "CUDA device"),
    (dict(page_size=8, kv_dtype=torch.float8_e5m2), "CUDA device"),
    (dict(kv_dtype=torch.float8_e5m2, page_size=96, head_dim=64), "CUDA device"),
    (dict(kv_dtype=torch.float8_e4m3fn, head_dim=96), "CUDA device"),
    (dict(kv_dtype=torch.float8_e5m2, dtype=torch.float16, head_dim=96, page_size=8), "CUDA device"),
])
def test_supports_reasons_on_cpu_problems(overrides, needle):
    reason = CuteBackend().supports(_problem(**overrides))
    assert reason is not None and needle in reason, reason


@pytest.mark.parametrize("overrides", [dict(page_size=1), dict(page_size=24), dict(page_size=48, head_dim=64),
                                       dict(page_size=96), dict(page_size=3, kv_dtype=torch.float8_e4m3fn)])
def test_gathered_pages_supported_but_ranked_below_triton(overrides):
    """Any page size passes the paged checks (then fails only on the CPU device); auto ranks
    gathered pages below Triton (measured slower)."""
    reason = CuteBackend().supports(_problem(**overrides))
    assert reason is not None and "CUDA device" in reason, reason
    assert selection.rule_for(_problem(**overrides)).name == "paged-gathered"


def test_supports_reason_without_cutlass(monkeypatch):
    import flashsplit.cute.backend as backend

    from flashsplit.target import KNOWN_GPUS

    monkeypatch.setattr(backend, "cutlass_available", lambda: False)
    on_h200 = _problem(device_type="cuda", gpu=KNOWN_GPUS["h200"])
    assert CuteBackend().supports(on_h200) == "nvidia-cutlass-dsl is not installed: pip install 'flashsplit[hopper]'"
    assert CuteBackend().supports(_problem()) == "needs a CUDA device, got cpu"  # the reason that comes first


@needs_cutlass
@pytest.mark.parametrize("paged,fp8,page_size", [(False, False, 0), (True, False, 128), (False, True, 0),
                                                (True, True, 128), (True, False, 16), (True, True, 8)])
def test_launch_arguments(paged, fp8, page_size, monkeypatch):
    """The launcher's positional arguments, named by the kernel's signature (placeholder
    compiles cannot catch two Int32 sizes swapped): a paged launch passes the page size, page
    count, table width and row stride, and the capacity max_pages * page_size."""
    _arch_ok()  # import cutlass for sm_90a, as the compile tests do
    import flashsplit.cute.compile as compile_mod
    from flashsplit.cute.split_kernel import SplitKVDecodeKernel

    calls = []
    monkeypatch.setattr(compile_mod, "compile_split", lambda config: lambda *args: calls.append((config, args)))
    batch, heads, heads_kv, d = 3, 8, 2, 128
    q = torch.zeros(batch, 1, heads, d, dtype=torch.float16)
    seqlens = torch.tensor([5, 300, 0], dtype=torch.int32)
    if paged:
        k = torch.zeros(11, page_size, heads_kv, d, dtype=torch.float16)  # 11 pages
        table = torch.zeros(batch, 6, dtype=torch.int32)[:, :4]  # row stride 6, 4 pages per row
    else:
        k, table = torch.zeros(batch, 700, heads_kv, d, dtype=torch.float16), None
    k_descale = v_descale = None
    if fp8:
        k = k.to(torch.float8_e5m2)
        k_descale = torch.ones(1, dtype=torch.float32)
        v_descale = torch.ones(6, 4, dtype=torch.float32)[:batch, :heads_kv]  # strides (4, 1)
    out_p, lse_p = CuteBackend().forward_partials(q, k, k, seqlens, 3, 0.1, False, block_table=table,
                                                  k_descale=k_descale, v_descale=v_descale)
    (config, args), = calls
    assert config.paged == paged and config.write_partials
    assert config.subtile_page == (page_size if page_size and page_size < 64 else 0)
    assert config.kv_dtype == ("float8_e5m2" if fp8 else "same")
    names = [n for n in inspect.signature(SplitKVDecodeKernel.__call__).parameters if n != "self"]
    assert len(names) == len(args)
    got = dict(zip(names, args))
    want = dict(batch=batch, num_heads=heads, num_heads_kv=heads_kv, num_splits=3, split_ctas=3, k_stride_b=k.stride(0),
                k_stride_l=k.stride(1))
    if paged:
        want.update(seqlen_k=4 * page_size, cache_rows=11, cache_len=page_size, max_pages=4, block_table_stride_b=6)
        assert f"{table.data_ptr():016x}" in str(got["block_table_ptr"])  # Ptr<0x...@gmem>
    else:
        want.update(seqlen_k=700, cache_rows=batch, cache_len=700, max_pages=1)
    want.update(k_descale_stride_b=0, k_descale_stride_h=0, v_descale_stride_b=4 if fp8 else 0,
                v_descale_stride_h=1 if fp8 else 0)
    assert {n: int(got[n]) for n in want} == want
    if fp8:
        assert f"{k_descale.data_ptr():016x}" in str(got["k_descale_ptr"])
        assert f"{v_descale.data_ptr():016x}" in str(got["v_descale_ptr"])


@needs_cutlass
@pytest.mark.parametrize("kernel, schema", [("split", "SPLIT_ARGS"), ("combine", "COMBINE_ARGS")])
def test_kernel_signatures_match_launch_schemas(kernel, schema):
    """Each kernel's ``__call__`` takes its schema's arguments (flashsplit.cute.launch_args), in
    order, with the annotation of each kind: what the compile placeholders, the raw tuple and
    the fallback are built from is what the kernel declares."""
    _arch_ok()
    from flashsplit.cute import launch_args
    from flashsplit.cute.combine_kernel import CombineKernel
    from flashsplit.cute.split_kernel import SplitKVDecodeKernel

    cls = {"split": SplitKVDecodeKernel, "combine": CombineKernel}[kernel]
    params = [p for p in inspect.signature(cls.__call__).parameters.values() if p.name != "self"]
    args = getattr(launch_args, schema)
    assert [p.name for p in params] == [a.name for a in args]
    annotation = {"ptr": "cute.Pointer", "i32": "Int32", "i64": "Int64", "f32": "Float32",
                  "stream": inspect.Parameter.empty}
    assert [p.annotation for p in params] == [annotation[a.kind] for a in args]
    assert len(launch_args.static_names(args)) + sum(a.per_call for a in args) == len(args)


@needs_cutlass
@pytest.mark.parametrize("seqlen_q, causal, window, softcap, sinks_dtype, splits, merge", [
    (1, False, (4096, -1), 0.0, None, 3, False),  # a left bound; L_q = 1 sees no right bound
    (4, False, (100, 1), 50.0, torch.bfloat16, 1, False),  # right bound 1 < L_q - 1; one split applies sinks
    (4, False, (-1, 0), 0.0, torch.float32, 5, True),  # right bound 0 is causal's mask; the merge applies sinks
    (4, True, (-1, -1), 0.0, torch.float16, 5, False),  # partials for a combine: sinks left to it
])
def test_variant_launch_arguments(seqlen_q, causal, window, softcap, sinks_dtype, splits, merge, monkeypatch):
    """A variant launch's compile key and raw arguments: the window bounds (-1 passed as 0, never
    read), softcap * log2(e), the sinks' address where the launch applies them (one split, the
    merge) and lse's where it does not."""
    _arch_ok()
    import math

    import flashsplit.cute.compile as compile_mod
    from flashsplit.cute import launch_args
    from flashsplit.cute.launcher import CuteLauncher
    from flashsplit.problem import Variant

    monkeypatch.setattr(compile_mod, "compile_split", lambda config: config)
    q = torch.zeros(2, seqlen_q, 8, 64, dtype=torch.float16)
    k = torch.zeros(2, 900, 2, 64, dtype=torch.float16)
    seqlens = torch.tensor([900, 5], dtype=torch.int32)
    sinks = None if sinks_dtype is None else torch.zeros(8, dtype=sinks_dtype)
    variant = Variant(window[0], 0 if causal else window[1], softcap, sinks is not None)
    partials = splits > 1
    o = torch.zeros(splits, 2, seqlen_q, 8, 64) if partials else torch.zeros_like(q)
    lse = torch.zeros(splits, 2, 8, seqlen_q) if partials else torch.zeros(2, 8, seqlen_q)
    out = torch.zeros_like(q) if merge else None
    launch = CuteLauncher().split_launch(q, k, k, seqlens, None, splits, 0.125, causal, o, lse, partials, out=out,
                                         variant=variant, sinks=sinks)
    config = launch.kernel
    applied = sinks is not None and (merge or not partials)
    assert (config.left_bound, config.softcap, config.sinks) == (window[0] >= 0, softcap > 0,
                                                                 str(sinks_dtype)[6:] if applied else "")
    assert config.causal == (causal or window[1] == 0)
    assert config.right_bound == (not config.causal and 0 <= window[1] < seqlen_q - 1)
    assert launch.elements["sinks"] == (config.sinks or "float32")
    merge_into = (out.data_ptr(), lse.data_ptr(), lse.data_ptr()) if merge else None
    raw = dict(zip([a.name for a in launch_args.SPLIT_ARGS],
                   launch.raw(q, k, k, o.data_ptr(), lse.data_ptr(), seqlens, None, None, None, merge_into, 0,
                              sinks if applied else None)))
    assert (raw["window_left"], raw["window_right"]) == (max(window[0], 0), max(variant.window_right, 0))
    assert raw["softcap_log2"] == pytest.approx(softcap * math.log2(math.e))
    assert raw["sinks_ptr"] == (sinks.data_ptr() if applied else lse.data_ptr())


def test_variant_configs_refuse_what_they_cannot_build():
    """A right bound beside causal, sinks in partials a combine merges, unknown sinks dtypes, and
    batch-invariant launches other than the two-CTA tile's partials raise ValueErrors naming the
    key; everything else combines."""
    from flashsplit.cute import configs

    c = configs.split_config
    for kwargs, needle in [(dict(causal=True, right_bound=True), "right_bound"),
                           (dict(sinks="float32"), "sinks: only where the kernel writes a final result"),
                           (dict(write_partials=False, sinks="int8"), "sinks: expected"),
                           (dict(write_partials=False, invariant=True), "invariant"),
                           (dict(merge=True, invariant=True), "invariant"),
                           (dict(swap_rows=8, invariant=True), "invariant"),
                           (dict(one_per_sm=True, invariant=True), "invariant")]:
        args = dict(dtype="bfloat16", head_dim=128, causal=False, write_partials=True) | kwargs
        with pytest.raises(ValueError, match=needle):
            c(**args)
    every = c("bfloat16", 128, False, True, True, page_size=16, left_bound=True, right_bound=True, softcap=True,
              invariant=True)
    assert every.variant and every.subtile_page == 16 and not c("bfloat16", 128, False, True).variant
    assert c("bfloat16", 128, True, True, merge=True, sinks="float16").sinks == "float16"
    from flashsplit.cute.variant_configs import variant_check_configs

    checked = variant_check_configs()
    assert len(set(checked)) == len(checked) and all(x.variant for x in checked)
    assert set(checked) <= set(compile_check_configs())
    for x in checked:
        configs.check_smem(x)
        # A variant adds no shared memory: the config without it takes as much.
        plain = x.__class__(**{**x.__dict__, "left_bound": False, "right_bound": False, "softcap": False,
                               "sinks": "", "invariant": False})
        assert x.smem_bytes == plain.smem_bytes


def test_batch_invariant_launches_take_the_two_cta_tile_and_the_combine():
    """A batch-invariant decode never takes a rule that follows the batch: not one CTA per SM
    (B = 16 x 4k would), not swapped operands or one-wave stages (B = 8 x 4k would), not the
    in-kernel merge (2-16 splits would): its tile and reduction order are the same in any batch."""
    from flashsplit.cute import choice

    plain = choice.LaunchChoice(one_per_sm=False, one_wave=False, merge=False, swap=False)
    for batch, splits in ((16, 1), (8, 4), (1, 32), (1, 2)):
        p = _problem(batch=batch, device_type="cuda", batch_invariant=True)
        tile = choice.choose(p, splits, 132)
        assert dataclasses.replace(tile, split_ctas=0) == plain and tile.split_ctas >= 1  # (runs: any result)
        assert not choice.one_cta_per_sm(p, 132) and choice.units_per_sm(p, 132) == 2
    assert choice.choose(_problem(batch=16, device_type="cuda"), 1, 132).one_per_sm  # (the plain rule)
    # auto's rules for those kernels do not fire either: B = 16 x 4k and B = 1 x 4k are plain
    # one-CTA-per-SM and swapped-operand problems.
    assert selection.rule_for(_without_table(_problem(batch=16, device_type="cuda"))).name == "one-cta-per-sm"
    assert selection.rule_for(_without_table(_problem(device_type="cuda"))).name == "swapped-operands"
    for batch in (16, 1):
        assert selection.rule_for(_problem(batch=batch, device_type="cuda", batch_invariant=True)).name not in (
            "one-cta-per-sm", "swapped-operands", "measured")


@pytest.mark.parametrize("overrides", [
    dict(window_left=300, window_right=0, causal=True), dict(window_left=0, window_right=-1),
    dict(window_left=-1, window_right=2, seqlen_q=4), dict(softcap=30.0), dict(has_sinks=True),
    dict(batch_invariant=True), dict(window_left=64, softcap=5.0, has_sinks=True, batch_invariant=True, page_size=16),
    dict(window_left=64, kv_dtype=torch.float8_e4m3fn, page_size=3, has_sinks=True),
])
def test_supports_every_variant(overrides):
    """Windows, softcap, sinks and batch-invariant decode (alone, together, on paged and fp8 caches)
    pass every check but the device's."""
    reason = CuteBackend().supports(_problem(**overrides))
    assert reason is not None and "CUDA device" in reason, reason


def test_launch_packers_follow_the_schemas():
    """The raw tuple a launch packs puts every per-call value and every static value at its
    schema position, whatever order they are given in."""
    from flashsplit.cute import launch_args

    for args in (launch_args.SPLIT_ARGS, launch_args.COMBINE_ARGS):
        static = launch_args.static_names(args)
        calls = {a.name: 10_000 + i for i, a in enumerate(args) if a.per_call}
        raw = launch_args.packer(args)(tuple(range(len(static))), **dict(reversed(calls.items())))
        want = [calls[a.name] if a.per_call else static.index(a.name) for a in args]
        assert list(raw) == want


def test_backend_static_facts():
    b = CuteBackend()
    assert b.name == "cute" and b.priority == 10
    assert b.block_m(_problem()) == 64
    assert b.units_per_sm(_problem(head_dim=128)) == 1  # the swapped-operand kernel at one CTA per SM
    assert b.units_per_sm(_problem(head_dim=128, seqlen_q=4, causal=True)) == 2
    assert b.units_per_sm(_problem(head_dim=96)) == 2
    assert b.units_per_sm(_problem(head_dim=256)) == 1


@pytest.mark.parametrize("overrides, winner", [
    (dict(), "cute"),  # dense 16-bit, B = 1 x 4k: the swapped-operand kernel (9.7 vs 10.3 us)
    (dict(num_heads_kv=32, batch=16, seqlen_k=16384), "triton"),  # one packed row, two waves
    (dict(kv_dtype=torch.float8_e4m3fn), "triton"),  # fp8: cute's in-smem conversion is slower
    (dict(page_size=128), "cute"),  # paged 16-bit: cute's TMA pages run at dense speed
    (dict(page_size=16), "cute"),  # sub-tile pages: also dense speed in cute (1.00-1.01x), 1.06-1.14x in Triton
    (dict(page_size=16, kv_dtype=torch.float8_e4m3fn), "triton"),  # fp8 pages: cute's conversion is slower
    (dict(page_size=24), "triton"),  # not a multiple of 8: only Triton can
])
def test_auto_takes_the_backend_measured_fastest(overrides, winner, monkeypatch):
    """auto ranks the backends that support a problem by their measured speed on the H200."""
    import flashsplit.cute.backend as cute_backend
    import flashsplit.triton.backend as triton_backend
    from flashsplit.registry import get, invalidate, select

    real = cute_backend.CuteBackend.supports
    # Pretend to be on an H200 with cutlass: keep every reason except the device ones.
    monkeypatch.setattr(cute_backend.CuteBackend, "supports", lambda self, p: _cute_reason_off_device(real, self, p))
    monkeypatch.setattr(triton_backend.TritonBackend, "supports", lambda self, p: None)
    invalidate()
    try:
        chosen, _, why = select(_problem(**overrides), "auto")
    finally:
        invalidate()
    assert chosen is get(winner), why
    assert why.startswith("auto: ")


def _cute_reason_off_device(real, backend, problem):
    """cute's supports() with the no-GPU/no-cutlass reasons dropped (they end the checks)."""
    reason = real(backend, problem)
    if reason is None or any(s in reason for s in ("CUDA", "not installed", "compute capability")):
        return None
    return reason


def test_fp16_operand_configs():
    """fp16 wgmma operands are what every fp8 cache with a bf16 q compiles to; the compile check
    builds them for every fp8 type and head dim, dense, and for whole-tile, sub-tile and gathered
    pages; their q row scales (fp32 per row) keep two CTAs per SM where the tile wants them."""
    from flashsplit.cute import configs

    assert all(c.fp16_operands == (c.fp8 and c.dtype == "bfloat16") for c in all_split_configs())
    checked = [c for c in compile_check_configs() if c.fp16_operands]
    assert {(c.kv_dtype, c.head_dim) for c in checked if not c.paged} == {
        (kv, d) for kv in configs.KV_DTYPES[1:] for d in configs.HEAD_DIMS}
    assert {(c.subtile_page > 0, c.gather_pages) for c in checked if c.paged} == {
        (False, False), (True, False), (False, True)}
    for c in checked:
        as_fp16_q = c.__class__(**{**c.__dict__, "dtype": "float16"})  # same tile, no row scales
        assert not as_fp16_q.fp16_operands and as_fp16_q.smem_bytes <= c.smem_bytes <= as_fp16_q.smem_bytes + 1024
        configs.check_smem(c)


@needs_cutlass
def test_timeline_probe_compiles_only_when_switched_on(tmp_path, monkeypatch):
    """The development probe (scripts/cute_timeline.py) adds nothing to a default build; switched
    on, a merging swapped-operand kernel reads both clocks once at each of its seven steps (no
    loop is unrolled, so each read appears once in the PTX)."""
    from flashsplit.cute import compile as cute_compile, timeline

    config = next(c for c in compile_check_configs() if c.merge and c.swap_rows and not c.paged and not _variants(c))
    (tmp_path / "default").mkdir()
    (tmp_path / "probe").mkdir()
    default_ptx = _compiled_ptx(cute_compile.compile_split, config, tmp_path / "default")
    assert "%globaltimer" not in default_ptx and "%clock64" not in default_ptx
    monkeypatch.setattr(timeline, "ADDRESS", 1 << 40)
    probe_ptx = _compiled_ptx(cute_compile.compile_split, config, tmp_path / "probe")
    assert len(re.findall(r"mov\.u64\s+%rd\d+,\s*%globaltimer;", probe_ptx)) == len(timeline.EVENTS)
    assert len(re.findall(r"mov\.u64\s+%rd\d+,\s*%clock64;", probe_ptx)) == len(timeline.EVENTS)
    assert len(re.findall(r"mov\.u32\s+%r\d+,\s*%smid;", probe_ptx)) == 1
    assert "%smid" not in default_ptx


@needs_cutlass
@pytest.mark.parametrize("cluster", [False, True])
def test_cluster_launch_asks_for_its_compile_key(cluster, monkeypatch):
    """``CuteBackend.prepare`` with the cluster merge on (``choice.CLUSTER_MERGE``) gives a B = 1
    launch of 16 merged splits on swapped operands the compile key of one 16-CTA cluster per row
    tile; off, the counter merge's (one-wave stages, two CTAs per SM)."""
    _arch_ok()
    import flashsplit.cute.compile as compile_mod
    from flashsplit.call import DecodeTensors
    from flashsplit.cute import choice, launcher as cute_launcher

    seen = []
    monkeypatch.setattr(compile_mod, "compile_split", lambda config: seen.append(config) or (lambda *args: None))
    monkeypatch.setattr(cute_launcher, "_run", lambda kernel, raw, library_args: None)
    monkeypatch.setattr(choice, "CLUSTER_MERGE", cluster)
    problem = DecodeProblem(batch=1, seqlen_q=1, seqlen_k=4096, num_heads=32, num_heads_kv=8, head_dim=128,
                            dtype=torch.bfloat16, causal=False, has_cache_seqlens=True, device_type="cuda")
    prepared = CuteBackend().prepare(problem, 16, 0.1)
    assert prepared.tile.cluster == cluster and prepared.tile.merge and prepared.tile.swap
    q = torch.zeros(1, 1, 32, 128, dtype=torch.bfloat16)
    k = torch.zeros(1, 4096, 8, 128, dtype=torch.bfloat16)
    prepared(DecodeTensors(q, k, k, torch.empty_like(q), None, torch.tensor([4096], dtype=torch.int32)))
    (config,) = seen
    assert config.merge and config.swap_rows == 8 and config.write_partials
    assert config.cluster == (16 if cluster else 0)
    assert config.units_per_sm == (1 if cluster else 2) and (config.stages == 3)


@needs_cutlass
def test_split_cap_follows_the_cluster_setting(monkeypatch):
    """The plan's cluster cap is part of the cute launch rules: forcing the counter
    (``choice.CLUSTER_MERGE = False``, then ``registry.invalidate()``) drops it from the next plan
    of the same problem, and restoring the rule brings it back."""
    import flashsplit
    from flashsplit.cute import choice
    from flashsplit.registry import invalidate

    def splits():
        return flashsplit.plan(1, 4096, 32, 8, 128, gpu="h200", device="cuda", backend="cute").num_splits

    assert splits() == 8
    monkeypatch.setattr(choice, "CLUSTER_MERGE", False)
    invalidate()
    assert splits() == 16
    monkeypatch.setattr(choice, "CLUSTER_MERGE", None)
    invalidate()
    assert splits() == 8
