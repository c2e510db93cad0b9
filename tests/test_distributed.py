"""Context-parallel decode on the CPU: gloo process groups of 2 and 4 (torch.multiprocessing
spawn, one spawn per world size running many cases), every rank's output and LSE checked against
single-process decode over the whole cache and the float64 reference; argument errors in a group
of one."""


import pytest
import torch
import torch.distributed as dist

import flashsplit.distributed as fd
from cp_cases import build_case, check_case, spawn_cases, group_of_one as cp_group_of_one


def _default_cases(world: int) -> list:
    """Masks that see every key (any cover), causal L_q = 4 (bulk and tail, shards ending among
    the last queries), windows (per query), sinks, paged shards, a row of no keys at all; both
    merges, one per case beyond the first (the full matrix runs both everywhere)."""
    gather, reduce = ("gather",), ("reduce",)
    cases = [
        build_case("lq4-causal-tail", world, 3, seqlen_q=4, causal=True, tail_cuts=True),
        build_case("lq4-causal-permuted-sinks", world, 4, seqlen_q=4, causal=True, layout="permuted", sinks=True,
                   totals=(2, 190), merges=reduce),
        build_case("lq4-causal-window-paged", world, 6, seqlen_q=4, causal=True, window_size=(40, 0), page_size=16,
                   tail_cuts=True, merges=gather),
    ]
    if world == 2:  # covered at 4 ranks by the full matrix
        cases += [build_case("lq1", world, 1, seqlen_q=1, merges=gather),
                  build_case("lq1-interleaved-no-offset", world, 2, seqlen_q=1, layout="interleaved",
                             pass_offset=False, merges=gather),
                  build_case("lq1-empty-row-sinks", world, 5, seqlen_q=1, sinks=True, totals=(0, 150),
                             merges=reduce)]
    return cases


def _full_cases(world: int) -> list:
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
    return [
        build_case("lq1", world, 1, seqlen_q=1),
        build_case("lq1-empty-row-sinks", world, 5, seqlen_q=1, sinks=True, totals=(0, 150)),
        build_case("lq1-interleaved-no-offset", world, 2, seqlen_q=1, layout="interleaved", pass_offset=False),
        build_case("lq4-causal-paged-tail", world, 11, seqlen_q=4, causal=True, page_size=16, tail_cuts=True),
        build_case("lq4-causal-paged1", world, 12, seqlen_q=4, causal=True, page_size=1, totals=(40, 9)),
        build_case("lq4-causal-fp8", world, 13, seqlen_q=4, causal=True, fp8=e4m3, tail_cuts=True),
        build_case("lq1-fp8-paged-sinks", world, 14, seqlen_q=1, fp8=e5m2, page_size=8, sinks=True),
        build_case("lq4-causal-softcap-d64", world, 15, seqlen_q=4, causal=True, softcap=5.0, head_dim=64,
                   heads=(8, 2)),
        build_case("lq3-right-window", world, 16, seqlen_q=3, window_size=(-1, 1), tail_cuts=True),
        build_case("lq1-left-window", world, 17, seqlen_q=1, window_size=(7, -1), layout="permuted"),
        build_case("lq4-left-window-unbounded-right", world, 18, seqlen_q=4, window_size=(20, -1), page_size=16),
        build_case("lq4-causal-window-sinks", world, 19, seqlen_q=4, causal=True, window_size=(3, 0), sinks=True,
                   tail_cuts=True),
        build_case("lq2-noncausal", world, 20, seqlen_q=2, layout="permuted"),
        build_case("lq4-causal-short-rows", world, 21, seqlen_q=4, causal=True, totals=(3, 1), batch=2),
        build_case("lq4-causal-b3", world, 22, seqlen_q=4, causal=True, batch=3, totals=(129, 0, 260)),
    ]


def test_uninitialized_world_is_named():
    if dist.is_initialized():
        pytest.skip("a process group exists in this process")
    q, k, v, seqlens, _ = _shard()
    with pytest.raises(ValueError, match="group: torch.distributed is not initialized"):
        fd.cp_decode(q, k, v, cache_seqlens=seqlens)


@pytest.mark.cpu
@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.full)])
def test_cp_decode_gloo(world, tmp_path):
    spawn_cases(world, _default_cases(world), tmp_path)


@pytest.mark.full
@pytest.mark.cpu
@pytest.mark.parametrize("world", [2, 3, 4])
def test_cp_decode_gloo_full(world, tmp_path):
    spawn_cases(world, _full_cases(world), tmp_path)


@pytest.fixture(scope="module")
def group_of_one():
    """A gloo group of this process alone (the world, destroyed after the module's tests)."""
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    with cp_group_of_one("gloo") as group:
        yield group


@pytest.mark.cpu
def test_group_of_one_equals_decode(group_of_one):
    for case in (build_case("one-lq1", 1, 31, seqlen_q=1, sinks=True),
                 build_case("one-lq4-causal", 1, 32, seqlen_q=4, causal=True, totals=(200, 3))):
        check_case(case, 0, 1, group=group_of_one)


def _shard(seqlen_q=1, batch=2):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, seqlen_q, 4, 32, generator=g).half()
    k = torch.randn(batch, 64, 2, 32, generator=g).half()
    return q, k, k.clone(), torch.full((batch,), 64, dtype=torch.int32), torch.zeros(batch, dtype=torch.int32)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(group="world"), TypeError, "group: expected a torch.distributed ProcessGroup"),
    (dict(return_lse=1), TypeError, "return_lse: expected a bool"),
    (dict(merge="allreduce"), ValueError, "merge: expected one of"),
    (dict(kv_offset=[0, 0]), TypeError, "kv_offset: expected an int32 torch.Tensor"),
    (dict(kv_offset=torch.zeros(2, dtype=torch.int64)), TypeError, "kv_offset: expected dtype int32"),
    (dict(kv_offset=torch.zeros(3, dtype=torch.int32)), ValueError, r"kv_offset: expected shape \[2\]"),
    (dict(kv_offset=torch.zeros(2, dtype=torch.int32, device="meta")), ValueError, "kv_offset: expected q's device"),
    (dict(causal=True, kv_offset=None), ValueError, "kv_offset: required with causal=True"),
    (dict(window_size=(8, 0), seqlen_q=1, kv_offset=None), ValueError, "kv_offset: required"),
    (dict(k_new=True), ValueError, "k: not supported by cp_decode"),
    (dict(cache_leftpad=torch.zeros(2, dtype=torch.int32)), ValueError, "cache_leftpad: not supported"),
    (dict(rotary_cos=torch.zeros(1)), ValueError, "rotary_cos: not supported"),
    (dict(num_split=2), TypeError, "unexpected keyword argument 'num_split'"),
    (dict(block_table=torch.zeros(2, 1, dtype=torch.int32), page_table=torch.zeros(2, 1, dtype=torch.int32)),
     ValueError, "page_table: an alias of block_table"),
    # The shard's own arguments: decode's validation names them.
    (dict(q_heads=3), ValueError, "num_heads"),
    (dict(cache_seqlens=torch.zeros(3, dtype=torch.int32)), ValueError, r"cache_seqlens: expected shape \[2\]"),
    (dict(cache_seqlens=torch.zeros(2, dtype=torch.int64)), TypeError, "cache_seqlens: expected dtype int32"),
    (dict(v_len=63), ValueError, "k_cache and v_cache: expected the same shape"),
    (dict(q="q"), TypeError, "q"),
    (dict(window_size=(4, 2), causal=True), ValueError, "window_size"),
    (dict(sinks=torch.zeros(3)), ValueError, "sinks: expected shape"),
    (dict(out=torch.zeros(2, 1, 4, 16).half()), ValueError, "out: expected q's shape"),
])
def test_bad_arguments(group_of_one, kwargs, error, match):
    kwargs = dict(kwargs)
    q, k, v, seqlens, offset = _shard(kwargs.pop("seqlen_q", 4 if kwargs.get("causal") else 1))
    if kwargs.pop("k_new", False):
        kwargs["k"] = kwargs["v"] = k[:, :1]
    if "q_heads" in kwargs:
        q = q[:, :, :kwargs.pop("q_heads")]
    if "v_len" in kwargs:
        v = v[:, :kwargs.pop("v_len")]
    q = kwargs.pop("q", q)
    kwargs.setdefault("cache_seqlens", seqlens)
    kwargs.setdefault("kv_offset", offset)
    with pytest.raises(error, match=match):
        fd.cp_decode(q, k, v, **kwargs)


def test_choose_merge_by_bytes():
    # One partial per rank, 16-bit q: a gather moves (W - 1) * 2N bytes of outputs, a ring all-reduce
    # of fp32 2 (W - 1) / W * 4N: the gather is cheaper up to 4 ranks.
    picks = {w: fd.choose_merge(w, 8, 1, 32, 128, torch.bfloat16) for w in (1, 2, 4, 8)}
    assert picks == {1: "gather", 2: "gather", 4: "gather", 8: "reduce"}
    cost = fd.merge_bytes(8, 8, 1, 32, 128, torch.bfloat16)
    n, m = 8 * 32 * 128, 8 * 32
    assert cost == {"gather": 7 * (4 * m + 2 * n), "reduce": 7 * 4 * m + 2 * 7 * 4 * n // 8}
    assert fd.shard_layout(1, -1, 0) == fd.PLAIN and fd.shard_layout(4, -1, 0) == fd.BULK_AND_TAIL
    assert fd.shard_layout(4, -1, -1) == fd.PLAIN and fd.shard_layout(1, 8, 0) == fd.PER_QUERY


@pytest.mark.full
@pytest.mark.cpu
def test_bench_cp_smoke(tmp_path):
    """scripts/bench_cp.py's CPU smoke configuration under torchrun: both merges timed, sane rows."""
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "cp.json"
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""), TRITON_INTERPRET="1")
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    os.path.join(root, "scripts", "bench_cp.py"), "--smoke", "--seqlen-q", "4", "--causal",
                    "--json", str(out)], check=True, env=env, cwd=str(tmp_path), timeout=300)
    rows = json.loads(out.read_text())
    assert [row["merge"] for row in rows] == ["gather", "reduce"]
    for row in rows:
        assert row["world"] == 2 and row["keys_per_rank"] == 256 and row["timing"] == "eager"
        assert row["cp_us"] > 0 and 0 <= row["merge_share"] < 1 and row["speedup"] > 0
