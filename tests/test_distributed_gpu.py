"""Context-parallel decode on GPUs: a group of one on one GPU equals decode (eager and in a CUDA
graph), argument errors, and NCCL groups of 2, 4 and 8 ranks where the machine has the GPUs."""


import pytest
import torch
import torch.distributed as dist

import flashsplit.distributed as fd
from cp_cases import build_case, check_case, check_graph_replay, group_of_one, spawn_cases

pytestmark = pytest.mark.gpu

E4M3 = torch.float8_e4m3fn


def _gpu_cases(world: int, device: str = "cuda") -> list:
    """d = 128, 32/8 heads (and the CPU suite's small shapes), every decomposition and cache format."""
    big = dict(heads=(32, 8), head_dim=128, totals=(4100, 777))
    return [
        build_case("lq1-llama3", world, 41, seqlen_q=1, device=device, **big),
        build_case("lq4-causal-tail-llama3", world, 42, seqlen_q=4, causal=True, tail_cuts=True, device=device, **big),
        build_case("lq4-causal-sinks-permuted", world, 43, seqlen_q=4, causal=True, sinks=True, layout="permuted",
                   device=device),
        build_case("lq1-empty-row-sinks", world, 44, seqlen_q=1, sinks=True, totals=(0, 300), device=device),
        build_case("lq4-causal-paged16", world, 45, seqlen_q=4, causal=True, page_size=16, tail_cuts=True,
                   device=device, **big),
        build_case("lq4-causal-fp8", world, 46, seqlen_q=4, causal=True, fp8=E4M3, tail_cuts=True, device=device,
                   **big),
        build_case("lq4-window-softcap", world, 47, seqlen_q=4, causal=True, window_size=(100, 0), softcap=20.0,
                   device=device, **big),
    ]


@pytest.fixture(scope="module")
def nccl_group_of_one():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    torch.cuda.set_device(0)
    with group_of_one("nccl") as group:
        yield group


def test_group_of_one_equals_decode(nccl_group_of_one):
    for case in _gpu_cases(1):
        check_case(case, 0, 1, group=nccl_group_of_one)


def test_group_of_one_graph_replay(nccl_group_of_one):
    for case in _gpu_cases(1)[1:4]:
        for merge in fd.MERGES:
            check_graph_replay(case, 0, 1, group=nccl_group_of_one, merge=merge)


def test_bad_arguments_on_gpu(nccl_group_of_one):
    q = torch.randn(2, 4, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 256, 8, 128, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.full((2,), 256, dtype=torch.int32, device="cuda")
    offset = torch.zeros(2, dtype=torch.int32, device="cuda")
    with pytest.raises(TypeError, match="group: expected a torch.distributed ProcessGroup"):
        fd.cp_decode(q, k, k, group=0, cache_seqlens=seqlens, kv_offset=offset, causal=True)
    with pytest.raises(ValueError, match="kv_offset: expected q's device"):
        fd.cp_decode(q, k, k, cache_seqlens=seqlens, kv_offset=offset.cpu(), causal=True)
    with pytest.raises(ValueError, match="kv_offset: required"):
        fd.cp_decode(q, k, k, cache_seqlens=seqlens, causal=True)
    with pytest.raises(ValueError, match="cache_seqlens: expected q's device"):
        fd.cp_decode(q, k, k, cache_seqlens=seqlens.cpu(), kv_offset=offset, causal=True)
    with pytest.raises(ValueError, match="nccl, which needs CUDA tensors"):
        fd.cp_decode(q.cpu(), k.cpu(), k.cpu(), cache_seqlens=seqlens.cpu(), kv_offset=offset.cpu(), causal=True)
    with pytest.raises(ValueError, match="num_heads"):
        fd.cp_decode(q[:, :, :30], k, k, cache_seqlens=seqlens, kv_offset=offset, causal=True)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_cp_decode_nccl(world, tmp_path):
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < world:
        pytest.skip(f"NCCL context parallelism over {world} ranks needs {world} GPUs; this machine has {count}")
    spawn_cases(world, _gpu_cases(world), tmp_path, backend="nccl", graphs=True)
