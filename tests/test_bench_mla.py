"""``flashsplit bench --mla``: the cells, their floors and the dry run (no GPU needed)."""

import argparse
import subprocess
import sys

import pytest

from flashsplit.bench.mla import MlaCell, build_cells, datasheet_tflops, floors_us


def test_floors_count_the_cache_and_the_flops():
    cell = MlaCell(heads=128, batch=32, seqlen=4096)
    kv = 32 * 4096 * 576 * 2
    assert cell.bytes_moved() == kv + 32 * 128 * (576 + 512) * 2 + 4 * 32 * 64  # cache, q and out, page table
    assert cell.flops() == 2 * 32 * 128 * 4096 * (576 + 512)
    read, tc = floors_us(cell, 3.35e12, datasheet_tflops("NVIDIA H100 80GB HBM3"))
    assert read == pytest.approx(cell.bytes_moved() / 3.35e6) and tc == pytest.approx(cell.flops() / 989e6)
    assert datasheet_tflops("NVIDIA H200") == 989e12 and datasheet_tflops("NVIDIA H20") == 148e12
    assert MlaCell(16, 1, 1024, fp8=True).bytes_moved() < MlaCell(16, 1, 1024).bytes_moved()


def test_default_grid_is_the_deepseek_cells():
    args = argparse.Namespace(heads=None, batch=None, seqlen=None, page_size=None, seqlen_q=None, kv_dtype=None)
    cells = build_cells(args)
    assert len(cells) == 2 * 4 * 4 and {c.page_size for c in cells} == {64}
    assert {c.heads for c in cells} == {16, 128} and {c.seqlen for c in cells} == {1024, 4096, 16384, 65536}


def test_dry_run_lists_cells_and_plans():
    result = subprocess.run([sys.executable, "-m", "flashsplit", "bench", "--mla", "--dry-run", "--batch", "1", "32",
                             "--seqlen", "4k"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("  H")]
    assert len(lines) == 4
    assert any("compute-bound" in line for line in lines) and any("memory-bound" in line for line in lines)
    assert "989 TFLOPS" in result.stdout


@pytest.mark.cpu  # the cells are planned for CPU tensors, which run only where the interpreter is
def test_tile_variants_and_split_sweep_are_contenders():
    from flashsplit.bench.mla import contender_status, parse_variant

    assert parse_variant("m64-n64-s3") == {"max_block_m": 64, "block_n": 64, "num_stages": 3}
    with pytest.raises(ValueError, match="--mla"):
        parse_variant("m48")
    wide, narrow = MlaCell(128, 1, 4096), MlaCell(16, 1, 4096)
    status = contender_status(wide, "cpu", ["m64", "n64"], [1, 8])
    assert all(status[n] is None for n in ("triton", "triton-m64", "triton-n64", "triton/1", "triton/8"))
    assert "64 packed rows" in contender_status(narrow, "cpu", ["m64"])["triton-m64"]
    assert status["cute"] is not None
