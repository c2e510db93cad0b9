"""MLA decode on a CUDA GPU: both backends (cute where it runs), bf16 and e4m3 caches against
the float64 reference, CUDA-graph replay with new lengths, and cute/Triton parity."""

import pytest
import torch

import flashsplit
from flashsplit.mla import registry
from flashsplit.mla.problem import MlaProblem
from flashsplit.mla.testing import check_mla, make_mla_inputs

pytestmark = pytest.mark.gpu

# (H_q, s_q, causal, page size (0: dense), num_splits (0: the plan's), lengths)
CASES = [
    (16, 1, False, 64, 0, [0, 1, 3000, 4096]),
    (16, 2, True, 64, 5, [1, 700, 2049]),
    (128, 1, False, 64, 0, [4096, 0, 130]),
    (128, 2, True, 64, 0, [1, 3000]),
    (32, 4, True, 1, 3, [5, 600]),
    (16, 1, False, 16, 17, [2500, 1]),
    (128, 1, False, 0, 0, [2000, 0]),
]


def _cute_reason(case, fp8=False) -> str | None:
    heads, seqlen_q, causal, page, splits, lengths = case
    problem = MlaProblem(batch=len(lengths), seqlen_q=seqlen_q, num_heads_q=heads, dtype=torch.bfloat16,
                         kv_dtype=torch.float8_e4m3fn if fp8 else torch.bfloat16, page_size=page,
                         capacity=max(lengths), causal=causal, num_splits=splits, device_type="cuda")
    return registry.get("cute").supports(problem)


def _decode(case, inputs, backend, **kw):
    heads, seqlen_q, causal, page, splits, lengths = case
    out = torch.full((len(lengths), seqlen_q, heads, 512), float("nan"), dtype=inputs.q.dtype, device="cuda")
    _, lse = flashsplit.mla_decode(inputs.q, inputs.kv_cache, inputs.cache_seqlens, causal=causal, num_splits=splits,
                                   return_lse=True, out=out, backend=backend, **inputs.kwargs(), **kw)
    return out, lse


@pytest.mark.parametrize("backend", ["triton", "cute"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "e4m3"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_reference(case, fp8, backend, generator):
    if backend == "cute" and (reason := _cute_reason(case, fp8)):
        pytest.skip(f"cute: {reason}")
    inputs = make_mla_inputs(len(case[5]), case[1], case[0], case[5], page_size=case[3], dtype=torch.bfloat16,
                             fp8=fp8, device="cuda", generator=generator)
    out, lse = _decode(case, inputs, backend)
    torch.cuda.synchronize()
    check_mla(out, lse, inputs, causal=case[2])


@pytest.mark.parametrize("backend", ["triton", "cute"])
@pytest.mark.parametrize("case", [CASES[0], CASES[3]], ids=str)
def test_graph_replay_with_new_lengths_equals_eager(case, backend, generator):
    if backend == "cute" and (reason := _cute_reason(case)):
        pytest.skip(f"cute: {reason}")
    heads, seqlen_q, causal, page, splits, lengths = case
    inputs = make_mla_inputs(len(lengths), seqlen_q, heads, [max(lengths)] * len(lengths), page_size=page,
                             dtype=torch.bfloat16, device="cuda", generator=generator)
    seqlens = inputs.cache_seqlens.clone()
    out = torch.empty((len(lengths), seqlen_q, heads, 512), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((len(lengths), heads, seqlen_q), dtype=torch.float32, device="cuda")

    def call():
        o, l = flashsplit.mla_decode(inputs.q, inputs.kv_cache, seqlens, block_table=inputs.block_table, causal=causal,
                                     return_lse=True, backend=backend)
        out.copy_(o)
        lse.copy_(l)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # compile and plan outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for new in ([1, 0, 77, 4000][: len(lengths)], lengths):
        seqlens.copy_(torch.tensor(new, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        eager_out, eager_lse = flashsplit.mla_decode(inputs.q, inputs.kv_cache, seqlens,
                                                     block_table=inputs.block_table, causal=causal, return_lse=True,
                                                     backend=backend)
        torch.cuda.synchronize()
        assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "e4m3"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_cute_triton_parity(case, fp8, generator):
    if reason := _cute_reason(case, fp8):
        pytest.skip(f"cute: {reason}")
    inputs = make_mla_inputs(len(case[5]), case[1], case[0], case[5], page_size=case[3], dtype=torch.bfloat16,
                             fp8=fp8, device="cuda", generator=generator)
    triton_out, triton_lse = _decode(case, inputs, "triton")
    cute_out, cute_lse = _decode(case, inputs, "cute")
    torch.testing.assert_close(cute_out.float(), triton_out.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(cute_lse, triton_lse, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "e4m3"])
@pytest.mark.parametrize("case", [c for c in CASES if c[0] * c[1] >= 64], ids=str)
def test_triton_64_row_tiles(case, fp8, generator):
    """The tiles the bench times as triton-m64 (Hopper's warpgroup MMA shape)."""
    from flashsplit.mla.triton_backend import choose_tiles

    heads, seqlen_q, causal, page, splits, lengths = case
    inputs = make_mla_inputs(len(lengths), seqlen_q, heads, lengths, page_size=page, dtype=torch.bfloat16, fp8=fp8,
                             device="cuda", generator=generator)
    out = torch.full((len(lengths), seqlen_q, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.empty((len(lengths), heads, seqlen_q), device="cuda")
    registry.get("triton").run(inputs.q, inputs.kv_cache, inputs.cache_seqlens, inputs.block_table, out, lse,
                               num_splits=splits or 3, softmax_scale=576 ** -0.5, causal=causal,
                               kv_descale=inputs.kv_descale, tiles=choose_tiles(heads * seqlen_q, 64))
    torch.cuda.synchronize()
    check_mla(out, lse, inputs, causal=causal)


@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[6]], ids=str)
def test_fp8_tokens_of_flashmla(case, generator):
    """FlashMLA's 656-byte fp8 tokens (bf16 rotary part) through its drop-in call."""
    heads, seqlen_q, causal, page, splits, lengths = case
    inputs = make_mla_inputs(len(lengths), seqlen_q, heads, lengths, page_size=page, dtype=torch.bfloat16,
                             fp8_tokens=True, device="cuda", generator=generator)
    metadata, _ = flashsplit.get_mla_metadata()
    out, lse = flashsplit.flash_mla_with_kvcache(inputs.q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens,
                                                 512, metadata, causal=causal, is_fp8_kvcache=True)
    torch.cuda.synchronize()
    check_mla(out, torch.where(torch.isposinf(lse), float("-inf"), lse), inputs, causal=causal)


def test_flash_mla_with_kvcache_on_gpu(generator):
    inputs = make_mla_inputs(3, 2, 128, [0, 64, 3000], page_size=64, dtype=torch.bfloat16, device="cuda",
                             generator=generator)
    metadata, _ = flashsplit.get_mla_metadata()
    out, lse = flashsplit.flash_mla_with_kvcache(inputs.q, inputs.kv_cache, inputs.block_table, inputs.cache_seqlens,
                                                 512, metadata, causal=True)
    torch.cuda.synchronize()
    assert torch.isposinf(lse[0]).all()
    check_mla(out, torch.where(torch.isposinf(lse), float("-inf"), lse), inputs, causal=True)
