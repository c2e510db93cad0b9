"""flashsplit bench's --append / --rotary on CPU: parsing and grid, the inputs (rows hold
L_k - n keys, the call appends the rest), the reference check (a contender that drops the
append or the rotation is wrong), peers' skip reasons, FlashAttention's k/v/rotary arguments,
the JSON round trip, and appends with several queries per row (each query rotated at its own
position)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import flashsplit
from flashsplit.bench import cli, contenders, device, rows, runner
from flashsplit.bench.cases import PLAIN, Case, Variant
from flashsplit.bench.inputs import make_inputs
from flashsplit.bench.timing import Timing
from flashsplit.reference import attention_ref

HAS_CUDA = torch.cuda.is_available()


def parse(*argv):
    return cli.build_parser().parse_args(list(argv))


def _timer(run, num_sets, config):
    run(num_sets - 1)
    return Timing(device_us=10.0, eager_us=20.0, method="graph")


def _info():
    return device.DeviceInfo("test", 132, 1024, 0, 4.8e12, "datasheet", HAS_CUDA)


def _run(cases, roster):
    return runner.run_grid(cases, roster, _info(), None, runner.RunOptions(mem_cap_bytes=1e9, timer=_timer))


def test_append_options_multiply_the_grid():
    args = parse("--batch", "1", "--seqlen", "4k", "--append", "1,4", "--rotary", "off", "on", "--compare-variants")
    assert cli.resolve_variants(args) == [PLAIN, Variant(append=1), Variant(append=1, rotary=True), Variant(append=4),
                                          Variant(append=4, rotary=True)]
    assert [v.label for v in cli.resolve_variants(args)][1:3] == ["append 1", "append 1 + rotary"]
    assert cli.resolve_variants(parse("--append", "0", "1", "--rotary")) == [Variant(append=1, rotary=True)], \
        "rotary only with an append"


@pytest.mark.parametrize("argv, needle", [(["--append", "-1"], "new keys per row >= 0"),
                                          (["--append", "x"], "expected new keys per row")])
def test_bad_append_values_are_argparse_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        parse(*argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_rotary_without_an_append_exits_2(monkeypatch, capsys):
    monkeypatch.setattr(device, "cuda_available", lambda: False)
    assert cli.main(["--rotary", "--dry-run"]) == 2
    assert "--rotary rotates appended keys: it needs --append N" in capsys.readouterr().err


def test_append_inputs():
    plain = make_inputs(Case(2, 64, 4, 2, 16, "fp16"), 2, device="cpu", seed=5)
    case = Case(2, 64, 4, 2, 16, "fp16", append=3, rotary=True)
    appended = make_inputs(case, 2, device="cpu", seed=5)
    assert plain.append_kwargs(0) == {} and plain.k_new is None
    assert all(torch.equal(a, b) for a, b in zip(plain.q + plain.k + plain.v, appended.q + appended.k + appended.v))
    assert appended.cache_seqlens.tolist() == [61, 61], "rows hold L_k - n keys; the call appends n"
    kw = appended.append_kwargs(1)
    assert kw["k"].shape == (2, 3, 2, 16) and kw["k"] is appended.k_new[1] and kw["rotary_interleaved"] is False
    assert kw["rotary_cos"].shape == (64, 8) and kw["rotary_cos"].dtype == torch.float32
    assert case.moved_bytes == Case(2, 64, 4, 2, 16, "fp16").moved_bytes + 2 * 2 * 3 * 2 * 16 * 4 + 2 * 4 * 2 * 3 * 8


class _Fake(contenders.Contender):
    family = "torch"
    variants = frozenset(contenders.VARIANT_FEATURES)

    def __init__(self, name, make):
        self.name, self.make = name, make

    def prepare(self, case, inputs):
        return contenders.Prepared(self.make(case, inputs))


def _ignores_the_append(case, inputs):
    """Attends to the cache as it was: the new keys are never written."""
    return lambda i: attention_ref(inputs.q[i], inputs.k[i], inputs.v[i], inputs.cache_seqlens + case.append)[0].half()


def _no_rotary(case, inputs):
    """Appends the keys unrotated, attends with q unrotated."""
    def run(i):
        kw = {n: t for n, t in inputs.append_kwargs(i).items() if not n.startswith("rotary")}
        return flashsplit.decode(inputs.q[i], inputs.k[i], inputs.v[i], cache_seqlens=inputs.cache_seqlens,
                                 backend="triton", **kw)
    return run


@pytest.mark.parametrize("page_size, kv_dtype", [(0, "same"), (16, "same"), (0, "fp8e4m3")])
def test_check_passes_flashsplit(page_size, kv_dtype):
    cases = [Case(2, 256, 4, 2, 64, "fp16", page_size, kv_dtype, append=2),
             Case(2, 256, 4, 2, 64, "fp16", page_size, kv_dtype, append=1, rotary=True)]
    out = _run(cases, [contenders.FlashsplitContender("triton", "triton")])
    for row, case in zip(out, cases):
        assert row.status == rows.OK and row.rel_err < 1e-2, row.note
        assert (row.append, row.rotary) == (case.append, case.rotary)


def test_check_fails_what_drops_the_append():
    """The fakes run first (a faithful contender's append would leave the new keys in the cache)."""
    cases = [Case(2, 256, 4, 2, 64, "fp16", append=2), Case(2, 256, 4, 2, 64, "fp16", append=1, rotary=True)]
    roster = [_Fake("stale", _ignores_the_append), _Fake("unrotated", _no_rotary),
              contenders.FlashsplitContender("triton", "triton")]
    by = {(r.contender, r.variant_label): r for r in _run(cases, roster)}
    assert by[("stale", "append 2")].status == rows.WRONG
    assert by[("unrotated", "append 1 + rotary")].status == rows.WRONG
    assert by[("unrotated", "append 2")].status == rows.OK, "without rotary it is the faithful call"
    assert by[("triton", "append 1 + rotary")].status == rows.OK


def test_peers_without_an_append_input_are_skipped():
    by = {c.name: c for c in contenders.all_contenders()}
    case = Case(1, 4096, 32, 8, 128, append=1, rotary=True)
    for name in ("triton", "cute", "triton-nosplit", "auto"):
        assert by[name].variant_reason(case) is None
    assert by["sdpa-flash"].variant_reason(case) == "torch SDPA has no new-key append/rotary input in the bench's call"
    assert by["flashinfer"].variant_reason(Case(1, 4096, 32, 8, 128, append=1)).startswith(
        "flashinfer has no new-key append input")


def test_flash_attn_gets_k_v_and_the_rotary_tables(monkeypatch):
    """A FlashAttention build whose flash_attn_with_kvcache is flashsplit's (the bench's call
    is FA's): k, v and the rotary tables reach it, per input set, the tables in q's dtype (FA3
    refuses others)."""
    seen = []

    def fake(q, k_cache, v_cache, **kw):
        seen.append(kw)
        return flashsplit.flash_attn_with_kvcache(q, k_cache, v_cache, **kw)

    module = types.ModuleType("flash_attn_interface")
    module.flash_attn_with_kvcache = lambda q, k_cache, v_cache, *, k=None, v=None, rotary_cos=None, \
        rotary_sin=None, cache_seqlens=None, page_table=None, rotary_interleaved=True: fake(
            q, k_cache, v_cache, **{n: t for n, t in dict(k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
                                                           cache_seqlens=cache_seqlens, page_table=page_table,
                                                           rotary_interleaved=rotary_interleaved).items()
                                     if t is not None})
    monkeypatch.setitem(sys.modules, "flash_attn_interface", module)
    contenders._import_reason.cache_clear()
    try:
        fa3 = contenders.FlashAttnContender("flash-attn3", "flash_attn_interface")
        case = Case(2, 128, 4, 2, 64, "fp16", page_size=16, append=1, rotary=True)
        assert fa3.variant_reason(case) is None
        (row,) = _run([case], [fa3])
        assert row.status == rows.OK and row.rel_err < 1e-2, row.note
        assert {"k", "v", "rotary_cos", "rotary_sin", "page_table"} <= set(seen[0])
        assert seen[0]["rotary_interleaved"] is False
        assert seen[0]["rotary_cos"].dtype == seen[0]["rotary_sin"].dtype == torch.float16
    finally:
        contenders._import_reason.cache_clear()


def test_append_rows_round_trip():
    row = rows.BenchRow("triton", 1, 4096, 32, 8, 128, "bf16", append=1, rotary=True, device_us=10.0)
    report = rows.Report(rows.RunHeader("H200", 132, 60 * 2**20, 4.8e12), [row])
    back = rows.report_from_json(rows.report_to_json(report))
    assert back.rows[0].variant == Variant(append=1, rotary=True)
    assert back.rows[0].variant_label == "append 1 + rotary"
    assert rows.rows_from_csv(rows.rows_to_csv([row])) == [row]


# -- appends with several queries per row (speculative decoding: the drafts' keys appended) ---

def test_several_queries_rotate_each_at_its_own_position():
    """Query i is rotated at the row's length before the call + i (FlashAttention's causal
    convention), and the rotary tables reach the last of those positions."""
    from flashsplit.reference import rotary_ref

    case = Case(2, 64, 4, 2, 16, "fp16", append=1, rotary=True, seqlen_q=4)
    inputs = make_inputs(case, 1, device="cpu", seed=5)
    assert inputs.q[0].shape == (2, 4, 4, 16) and inputs.cache_seqlens.tolist() == [63, 63]
    assert inputs.rotary_cos.shape == (67, 8), "query 3 sits at position 63 + 3"
    positions = torch.tensor([[63, 64, 65, 66]])
    expected = rotary_ref(inputs.q[0][1:2], inputs.rotary_cos, inputs.rotary_sin, positions, False).half()
    assert torch.equal(inputs.reference_q(1), expected)
    assert not torch.equal(inputs.reference_q(1)[:, 1:], rotary_ref(
        inputs.q[0][1:2], inputs.rotary_cos, inputs.rotary_sin, torch.full((1, 4), 63), False).half()[:, 1:])
    assert inputs.variant_kwargs() == {"causal": True}


@pytest.mark.parametrize("append, rotary", [(4, False), (4, True), (1, True), (6, False)])
def test_flashsplit_appends_with_several_queries(append, rotary):
    """The check passes flashsplit's causal call with appended keys, whether the append covers
    the queries (4 drafts, 4 keys), fewer keys or more."""
    case = Case(2, 256, 4, 2, 64, "fp16", append=append, rotary=rotary, seqlen_q=4)
    (row,) = _run([case], [contenders.FlashsplitContender("triton", "triton")])
    assert row.status == rows.OK and row.rel_err < 1e-2, row.note
    assert (row.seqlen_q, row.append, row.rotary) == (4, append, rotary)


def test_an_append_ignored_with_several_queries_fails_the_check():
    class Stale(_Fake):
        multi_query = True

    def stale(case, inputs):
        return lambda i: attention_ref(inputs.q[i], inputs.k[i], inputs.v[i], inputs.cache_seqlens + case.append,
                                       causal=True)[0].half()

    (row,) = _run([Case(2, 256, 4, 2, 64, "fp16", append=4, seqlen_q=4)], [Stale("stale", stale)])
    assert row.status == rows.WRONG
