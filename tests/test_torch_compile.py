"""decode under torch.compile: one graph, no break, same result as eager."""

import pytest
import torch

import flashsplit
from flashsplit.call import DecodeOptions, DecodeTensors
from flashsplit.testing import DecodeCase, make_inputs

from conftest import DEVICE


def _step(q, k, v, seqlens):
    out, lse = flashsplit.decode(q, k, v, cache_seqlens=seqlens, num_splits=3, return_lse=True)
    return out * 2, lse


def test_decode_compiles_into_one_graph(generator):
    case = DecodeCase(batch=2, seqlen_q=1, seqlen_k=300, num_heads_kv=2, group=4, head_dim=64,
                      dtype=torch.float16, lengths=(300, 77))
    q, k, v, seqlens = make_inputs(case, DEVICE, generator)
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(_step)(q, k, v, seqlens)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons
    compiled = torch.compile(_step, fullgraph=True, backend="aot_eager")
    out, lse = compiled(q, k, v, seqlens)
    eager_out, eager_lse = _step(q, k, v, seqlens)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)


def test_custom_op_validates_at_run_time():
    q = torch.randn(2, 1, 8, 64, device=DEVICE).half()
    k = torch.randn(2, 64, 3, 64, device=DEVICE).half()  # 8 heads are not a multiple of 3
    out = torch.empty_like(q)
    with pytest.raises(ValueError, match="multiple of num_heads_kv"):
        torch.ops.flashsplit.decode_into(*DecodeTensors(q, k, k, out), *DecodeOptions())
