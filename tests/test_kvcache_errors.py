"""Bad cache-update arguments: each a TypeError/ValueError naming the argument, what was
expected and what was given; check_inputs catches what needs the values (a host sync)."""

import pytest
import torch
from conftest import DEVICE

import flashsplit
from flashsplit.testing_kvcache import KVCacheCase, make_kvcache_inputs


def _args(generator, **case):
    spec = KVCacheCase(**{"seqlen_new": 1, "lengths": (10, 20, 30), **case})
    return spec, make_kvcache_inputs(spec, DEVICE, generator)


def _raises(error, match, args, **options):
    with pytest.raises(error, match=match):
        flashsplit.decode(**args, **options)


def test_k_without_v(generator):
    _, args = _args(generator)
    del args["v"]
    _raises(ValueError, r"^k: given without v", args)
    _, args = _args(generator)
    del args["k"]
    _raises(ValueError, r"^v: given without k", args)


@pytest.mark.parametrize("change, error, match", [
    (lambda a: a.update(k=a["k"].float()), TypeError, r"^k: expected q's dtype torch.float16.*got torch.float32"),
    (lambda a: a.update(v=a["v"].to(torch.bfloat16)), TypeError, r"^v: expected q's dtype"),
    (lambda a: a.update(k=a["k"][:, :, :1]), ValueError,
     r"^k: expected shape \[3, seqlen_new, 2, 64\], got \[3, 1, 1, 64\]"),
    (lambda a: a.update(k=a["k"][:2]), ValueError, r"^k: expected shape \[3, seqlen_new, 2, 64\]"),
    (lambda a: a.update(v=torch.cat([a["v"], a["v"]], 1)), ValueError, r"^k and v: expected the same shape"),
    (lambda a: a.update(k=a["k"][0]), ValueError, r"^k: expected 4 dims"),
    (lambda a: a.update(k=a["k"][:, :0], v=a["v"][:, :0]), ValueError, r"^k: expected seqlen_new \(dim 1\) >= 1"),
    (lambda a: a.update(k=a["k"].transpose(2, 3).contiguous().transpose(2, 3)), ValueError,
     r"^k: the last dim must be contiguous"),
    (lambda a: a.update(k=a["k"].to("meta")), ValueError, r"^k: expected q's device"),
    (lambda a: a.update(k=[1.0]), TypeError, r"^k: expected a torch.Tensor, got list"),
    (lambda a: a.pop("cache_seqlens"), ValueError, r"^cache_seqlens: required with k and v"),
])
def test_bad_new_keys(change, error, match, generator):
    _, args = _args(generator)
    change(args)
    _raises(error, match, args)


def test_new_keys_past_the_capacity(generator):
    _, args = _args(generator, seqlen_k=8, lengths=(0, 0, 0), seqlen_new=8)
    flashsplit.decode(**args)  # exactly the capacity: fine
    _, args = _args(generator, seqlen_k=8, lengths=(0, 0, 0), seqlen_new=8)
    args["k"], args["v"] = torch.cat([args["k"], args["k"][:, :1]], 1), torch.cat([args["v"], args["v"][:, :1]], 1)
    _raises(ValueError, r"^k: 9 new keys per row cannot fit a cache of capacity 8", args)


def test_append_into_a_cache_whose_elements_share_memory(generator):
    _, args = _args(generator)
    args["k_cache"] = args["k_cache"][:, :1].expand(args["k_cache"].shape)
    _raises(ValueError, r"^k_cache: elements may share memory", args)


def test_cache_batch_idx_with_a_paged_cache(generator):
    _, args = _args(generator, page_size=16)
    args["cache_batch_idx"] = torch.arange(3, dtype=torch.int32, device=DEVICE)
    _raises(ValueError, r"^cache_batch_idx: only for a dense cache", args)


@pytest.mark.parametrize("name", ["cache_batch_idx", "cache_leftpad"])
@pytest.mark.parametrize("value, error, match", [
    (lambda: torch.zeros(3, dtype=torch.int64), TypeError, r"expected dtype int32, got torch.int64"),
    (lambda: torch.zeros(4, dtype=torch.int32), ValueError, r"expected shape \[3\], got \[4\]"),
    (lambda: torch.zeros(3, 2, dtype=torch.int32, device=DEVICE)[:, 0], ValueError, r"expected a contiguous \[3\] tensor"),
    (lambda: torch.zeros(3, dtype=torch.int32, device="meta"), ValueError, r"expected q's device"),
    (lambda: [0, 1, 2], TypeError, r"expected a torch.Tensor, got list"),
])
def test_bad_row_indices(name, value, error, match, generator):
    _, args = _args(generator)
    tensor = value()
    # (a strided view is made on the test device: .to() would make it contiguous)
    args[name] = tensor.to(DEVICE) if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta" else tensor
    _raises(error, f"^{name}: {match}", args)


def test_dense_cache_rows(generator):
    _, args = _args(generator, batch_idx="subset")
    del args["cache_batch_idx"]
    _raises(ValueError, r"^k_cache: expected batch 3 \(q's dim 0\).*or cache_batch_idx", args)
    _, args = _args(generator, batch_idx="subset")
    args["k_cache"], args["v_cache"] = args["k_cache"][:0], args["v_cache"][:0]
    _raises(ValueError, r"^k_cache: expected at least one cache row", args)


@pytest.mark.parametrize("change, error, match", [
    (lambda a: a.pop("rotary_sin"), ValueError, r"^rotary_cos: given without rotary_sin"),
    (lambda a: a.pop("rotary_cos"), ValueError, r"^rotary_sin: given without rotary_cos"),
    (lambda a: [a.pop("k"), a.pop("v")], ValueError, r"^rotary_cos: only with k and v"),
    (lambda a: a.update(rotary_cos=a["rotary_cos"][:299], rotary_sin=a["rotary_sin"][:299]), ValueError,
     r"^rotary_cos: expected at least 300 positions \(the cache's capacity\), got 299"),
    (lambda a: a.update(rotary_cos=a["rotary_cos"].double()), TypeError,
     r"^rotary_cos: expected q's dtype torch.float16 or float32, got torch.float64"),
    (lambda a: a.update(rotary_sin=a["rotary_sin"].half()), ValueError,
     r"^rotary_cos and rotary_sin: expected one shape and dtype"),
    (lambda a: a.update(rotary_cos=torch.ones(300, 40, device=DEVICE), rotary_sin=torch.ones(300, 40, device=DEVICE)),
     ValueError, r"^rotary_cos: expected rotary_dim = 2 \* dim 1 in \[2, head_dim = 64\], got 80"),
    (lambda a: a.update(rotary_cos=a["rotary_cos"][:, :0], rotary_sin=a["rotary_sin"][:, :0]), ValueError,
     r"^rotary_cos: expected rotary_dim"),
    (lambda a: a.update(rotary_cos=a["rotary_cos"][None]), ValueError, r"^rotary_cos: expected 2 dims"),
    (lambda a: a.update(rotary_cos=a["rotary_cos"].t().contiguous().t()), ValueError,
     r"^rotary_cos: expected a contiguous tensor"),
])
def test_bad_rotary_tables(change, error, match, generator):
    _, args = _args(generator, rotary_dim=32)
    change(args)
    _raises(error, match, args)


def test_rotary_interleaved_must_be_a_bool(generator):
    _, args = _args(generator, rotary_dim=32)
    _raises(TypeError, r"^rotary_interleaved: expected a bool, got int", args, rotary_interleaved=1)


def test_check_inputs_catches_what_needs_the_values(generator):
    """The value checks decode cannot make without a host sync."""
    spec, args = _args(generator, seqlen_k=64, lengths=(10, 63, 30), seqlen_new=2)
    with pytest.raises(ValueError, match=r"^cache_seqlens: row 1 has 63 keys and 2 new ones from k, past the cache's "
                                         r"capacity 64"):
        flashsplit.check_inputs(**args)
    spec, args = _args(generator, lengths=(10, 20, 30), leftpad=(0, 0, 0))
    args["cache_leftpad"][2] = 31
    with pytest.raises(ValueError, match=r"^cache_leftpad: row 2 starts at key 31, outside \[0, 30\]"):
        flashsplit.check_inputs(**args)
    spec, args = _args(generator, batch_idx="subset")
    args["cache_batch_idx"][1] = 5
    with pytest.raises(ValueError, match=r"^cache_batch_idx: row 1 uses cache row 5, outside \[0, 5\)"):
        flashsplit.check_inputs(**args)
    args["cache_batch_idx"][1] = args["cache_batch_idx"][0]
    with pytest.raises(ValueError, match=r"^cache_batch_idx: rows share a cache row"):
        flashsplit.check_inputs(**args)
    spec, args = _args(generator, page_size=16, lengths=(10, 16, 30))
    args["block_table"][1, 1] = 10 ** 6  # the page the append opens
    with pytest.raises(ValueError, match=r"^block_table: row 1 entry 1 is page 1000000"):
        flashsplit.check_inputs(**args)
    # Queries past the new keys: a table as long as the cache is refused from the shapes, before
    # any length is read (row 1's query 3 would sit at position 65).
    spec, args = _args(generator, rotary_dim=32, seqlen_k=64, lengths=(10, 62, 30), causal=True, seqlen_q=4)
    flashsplit.check_inputs(**args, causal=True)  # tables of 67 positions: valid
    short = {name: args[name][:64] for name in ("rotary_cos", "rotary_sin")}
    with pytest.raises(ValueError, match=r"^rotary_cos: expected at least 67 positions.*got 64"):
        flashsplit.check_inputs(**(args | short), causal=True)
    spec, args = _args(generator, rotary_dim=32, leftpad=(1, 2, 3), batch_idx="permutation")
    flashsplit.check_inputs(**args)  # all valid
