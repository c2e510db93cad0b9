"""Bad input to decode: each a clear TypeError/ValueError naming the argument."""

import pytest
import torch

import flashsplit


def _good(batch=2, seqlen_q=1, num_heads=8, num_heads_kv=2, seqlen_k=64, head_dim=64, dtype=torch.float16):
    q = torch.randn(batch, seqlen_q, num_heads, head_dim).to(dtype)
    k = torch.randn(batch, seqlen_k, num_heads_kv, head_dim).to(dtype)
    v = torch.randn(batch, seqlen_k, num_heads_kv, head_dim).to(dtype)
    return q, k, v


def _call(q=None, k=None, v=None, **kwargs):
    gq, gk, gv = _good()
    return flashsplit.decode(gq if q is None else q, gk if k is None else k, gv if v is None else v, **kwargs)


Q, K, V = _good()
CASES = [
    # (description, kwargs for _call, exception, message fragment)
    ("q rank", dict(q=Q[0]), ValueError, "q: expected 4 dims"),
    ("k rank", dict(k=K[..., None]), ValueError, "k_cache: expected 4 dims"),
    ("q not a tensor", dict(q=[1, 2]), TypeError, "q: expected a torch.Tensor"),
    ("head dim mismatch", dict(k=torch.randn(2, 64, 2, 32).half(), v=torch.randn(2, 64, 2, 32).half()),
     ValueError, "expected head_dim 64"),
    ("k/v shape mismatch", dict(v=torch.randn(2, 64, 1, 64).half()), ValueError, "k_cache and v_cache"),
    ("heads not a multiple", dict(k=torch.randn(2, 64, 3, 64).half(), v=torch.randn(2, 64, 3, 64).half()),
     ValueError, "multiple of num_heads_kv"),
    ("batch mismatch", dict(k=torch.randn(3, 64, 2, 64).half(), v=torch.randn(3, 64, 2, 64).half()),
     ValueError, "k_cache: expected batch 2"),
    ("dtype mismatch", dict(k=K.bfloat16(), v=V.bfloat16()), TypeError, "k_cache/v_cache: expected q's dtype"),
    ("fp32 q", dict(q=Q.float(), k=K.float(), v=V.float()), TypeError, "q: expected dtype float16 or bfloat16"),
    ("head dim not /8", dict(q=torch.randn(2, 1, 8, 20).half(), k=torch.randn(2, 64, 2, 20).half(),
                             v=torch.randn(2, 64, 2, 20).half()), ValueError, "multiple of 8"),
    ("head dim > 256", dict(q=torch.randn(2, 1, 8, 264).half(), k=torch.randn(2, 8, 2, 264).half(),
                            v=torch.randn(2, 8, 2, 264).half()), ValueError, "multiple of 8 in"),
    ("last dim strided", dict(k=torch.randn(2, 64, 2, 128).half()[..., ::2]), ValueError,
     "k_cache: the last dim must be contiguous"),
    ("seqlens dtype", dict(cache_seqlens=torch.tensor([3, 4])), TypeError, "cache_seqlens: expected dtype int32"),
    ("seqlens shape", dict(cache_seqlens=torch.tensor([3, 4, 5], dtype=torch.int32)), ValueError,
     r"cache_seqlens: expected shape \[2\]"),
    ("seqlens not a tensor", dict(cache_seqlens=[3, 4]), TypeError, "cache_seqlens: expected a torch.Tensor"),
    ("num_splits < 0", dict(num_splits=-1), ValueError, "num_splits: expected 0"),
    ("num_splits > 256", dict(num_splits=257), ValueError, "num_splits: expected 0"),
    ("num_splits float", dict(num_splits=2.0), TypeError, "num_splits: expected an int"),
    ("out shape", dict(out=torch.empty(2, 1, 8, 32).half()), ValueError, "out: expected q's shape"),
    ("out dtype", dict(out=torch.empty(2, 1, 8, 64)), TypeError, "out: expected q's dtype"),
    ("unknown backend", dict(backend="cuda-magic"), ValueError, r"backend: expected 'auto' or one of \["),
    ("causal not bool", dict(causal=1), TypeError, "causal: expected a bool"),
    ("bad softmax_scale", dict(softmax_scale="x"), TypeError, "softmax_scale: expected a finite float"),
    ("unhashable softmax_scale", dict(softmax_scale=[0.1]), TypeError, "softmax_scale: expected a finite float"),
    ("return_lse not bool", dict(return_lse=None), TypeError, "return_lse: expected a bool"),
]


@pytest.mark.parametrize("what, kwargs, exc, match", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_clear_error(what, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        _call(**kwargs)


def test_zero_query_length_is_rejected():
    q = torch.randn(2, 0, 8, 64).half()
    with pytest.raises(ValueError, match="seqlen_q >= 1"):
        _call(q=q)


@pytest.mark.gpu
def test_tensors_on_different_devices():
    q, k, v = _good()
    with pytest.raises(ValueError, match="k_cache: expected q's device"):
        flashsplit.decode(q.cuda(), k, v.cuda())
    with pytest.raises(ValueError, match="cache_seqlens: expected q's device"):
        flashsplit.decode(q.cuda(), k.cuda(), v.cuda(), cache_seqlens=torch.tensor([1, 2], dtype=torch.int32))


def test_device_mismatch_on_meta():
    """The device check without a GPU: a 'meta' cache beside CPU tensors."""
    q, k, v = _good()
    with pytest.raises(ValueError, match="v_cache: expected q's device"):
        flashsplit.decode(q, k, v.to("meta"))


@pytest.mark.parametrize("q", [[1, 2], torch.randn(2, 8, 64)])
def test_bad_q_with_return_lse(q):
    """Outputs are allocated from q before validation; a bad q must still get the clear error."""
    _, k, v = _good()
    with pytest.raises((TypeError, ValueError), match="q: expected"):
        flashsplit.decode(q, k, v, return_lse=True)
