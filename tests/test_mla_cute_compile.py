"""The MLA split kernel compiles to sm_90a on a CPU-only machine (no launch); what it supports.

Each configuration's PTX must hold the instructions the design rests on: 36 ``m64n32k16``
wgmmas of ``S = Q K^T`` (576 features, 16 per wgmma, a warpgroup's half of the keys) and 4
``m64n256k16`` of ``O += P V`` (a warpgroup's 256 columns, 64 keys) in q's dtype, the latter
reading P from shared memory and V MN-major (transposed B); an e4m3 cache's kernel
converts pairs of fp8 values (``cvt.rn.f16x2.e4m3x2``) and still runs 16-bit wgmma;
nine ``cp.async.bulk.tensor`` loads of a K tile (64-feature boxes), whose last (cache row)
coordinate comes from a block-table load in a paged kernel and from none in a dense one; and
``setmaxnreg`` (the producer warpgroup's registers go to the consumers). Where ``cuobjdump`` is
at hand, the cubin has no stack frame or local memory. ``seqlen_q``, the head count, the page
size and the split count are runtime values: one build serves every ``s_q`` (1 and 2 run on the
GPU tests). The default run builds two configurations; ``pytest --full`` all sixteen.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flashsplit.cute.mla_configs import MLAConfig, all_mla_configs, mla_supports

needs_cutlass = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None,
                                   reason="nvidia-cutlass-dsl is not installed")
DEFAULT = [MLAConfig("bfloat16", False, False), MLAConfig("float16", True, True, "float8_e4m3fn")]
PTX_TYPES = {"bfloat16": "bf16", "float16": "f16"}


def _arch_ok() -> bool:
    if "cutlass" not in sys.modules:
        os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    return os.environ.get("CUTE_DSL_ARCH", "sm_90a") == "sm_90a"


def _cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found or importlib.util.find_spec("triton") is None:
        return found
    bundled = Path(importlib.util.find_spec("triton").origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.is_file() else None


def _globally_loaded(ptx: str) -> set[str]:
    """Registers holding a 32-bit value loaded from global memory, directly or through ``mov``."""
    loaded = set(re.findall(r"ld\.global(?:\.nc)?\.b32\s+(%r\d+),", ptx))
    moves = re.findall(r"mov\.b32\s+(%r\d+),\s*(%r\d+);", ptx)
    while True:
        more = {dst for dst, src in moves if src in loaded} - loaded
        if not more:
            return loaded
        loaded |= more


def _check_ptx(config: MLAConfig, ptx: str) -> None:
    t = PTX_TYPES[config.dtype]
    assert len(re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n32k16\.f32\.{t}\.{t}", ptx)) == 36
    # P from shared memory (K-major A), V read MN-major (B transposed)
    pv = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.{t}\.{t} \{{[^}}]*\}}, "
                    r"%rd\d+, %rd\d+, p, 1,\s*1, (\d), (\d);", ptx)
    assert pv == [("0", "1")] * 4, pv
    assert len(re.findall(r"wgmma\.mma_async", ptx)) == 40
    assert not re.search(r"wgmma\.mma_async[^\n]*\.(?:e4m3|e5m2)", ptx)  # fp8 tiles are converted first
    assert ("cvt.rn.f16x2.e4m3x2" in ptx) == config.fp8
    coords = [[c.strip() for c in g.split(",")]
              for g in re.findall(r"cp\.async\.bulk\.tensor[^\n]*?\{([^}]*)\}", ptx)]
    assert len(coords) == 9, len(coords)  # 576 features = nine 64-column boxes per tile
    rows = {group[-1] for group in coords}
    from_table = rows & _globally_loaded(ptx)
    if config.paged:
        assert from_table == rows, f"cache-row coordinates {rows - from_table} do not come from block_table"
    else:
        assert not from_table, f"a dense kernel's TMA coordinates {from_table} come from global loads"
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+40;", ptx)
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+232;", ptx)


def _check_no_spills(dump_dir: Path) -> None:
    tool = _cuobjdump()
    if tool is None:
        return
    cubins = [str(f) for f in dump_dir.glob("*.cubin")]
    assert cubins, f"no cubin written under {dump_dir}"
    usage = subprocess.run([tool, "--dump-resource-usage", *cubins], capture_output=True, text=True,
                           check=True).stdout
    found = re.findall(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
    assert found, usage
    for regs, stack, local in found:
        assert stack == "0" and local == "0", f"{regs} registers, stack {stack} bytes, local {local} bytes"


@needs_cutlass
@pytest.mark.parametrize("config", [pytest.param(c, marks=[] if c in DEFAULT else [pytest.mark.full],
                                                 id=f"{c.dtype}-{'paged' if c.paged else 'dense'}"
                                                    f"{'-causal' if c.causal else ''}{'-e4m3' if c.fp8 else ''}")
                                    for c in all_mla_configs()])
def test_mla_kernel_compiles_with_wgmma_and_tma(config, tmp_path):
    if not _arch_ok():
        pytest.skip("CUTE_DSL_ARCH is set to another arch")
    from flashsplit.cute.mla_launcher import compile_mla

    compile_mla(config, options=f"--keep-ptx --keep-cubin --dump-dir={tmp_path}")
    ptx_files = list(tmp_path.glob("*.ptx"))
    assert ptx_files, f"no PTX written under {tmp_path}"
    _check_ptx(config, "\n".join(f.read_text() for f in ptx_files))
    _check_no_spills(tmp_path)


def test_mla_config_fits_shared_memory():
    """Q (72 KiB), two K stages (144 KiB) and the P tile fit one CTA's 227 KiB."""
    assert max(c.smem_bytes for c in all_mla_configs()) <= 227 * 1024
    with pytest.raises(ValueError, match="dtype"):
        MLAConfig("float32", False, False)


def _supports(**changes):
    problem = dict(dtype="bfloat16", kv_dtype="bfloat16", head_dim=576, head_dim_v=512, num_heads_q=128, seqlen_q=2,
                   paged=True, page_size=64)
    problem.update(changes)
    return mla_supports(**problem)


def test_mla_supports_names_each_refusal():
    assert _supports() is None
    assert _supports(dtype="float16", kv_dtype="float16", num_heads_q=16, seqlen_q=4, page_size=128) is None
    assert _supports(paged=False, page_size=0) is None
    assert _supports(kv_dtype="float8_e4m3fn") is None
    assert "float8_e5m2" in _supports(kv_dtype="float8_e5m2")
    assert "float32" in _supports(dtype="float32", kv_dtype="float32")
    assert "576" in _supports(head_dim=128)
    assert "129" in _supports(num_heads_q=129)
    assert "seqlen_q 5" in _supports(seqlen_q=5)
    assert "page size 16" in _supports(page_size=16)
