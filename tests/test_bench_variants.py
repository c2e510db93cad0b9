"""flashsplit bench's attention variants on CPU: --window / --softcap / --sinks /
--batch-invariant parsing and grid, bytes and rotation of windowed cells, the reference check
with a variant (a contender that drops the window, softcap or sinks is wrong), peers' skip
reasons and FlashAttention's signature-driven arguments, --compare-variants, rendering and the
JSON / CSV round trip; and for several queries per row, each peer's bottom-right causal call
(SDPA's mask, FlexAttention's block mask, FlashAttention's causal=True) or skip reason."""

from __future__ import annotations

import io
import json
import sys
import types
import warnings

import pytest
import torch
from rich.console import Console

import flashsplit
from flashsplit.bench import cli, contenders, device, render, rows, runner, variants
from flashsplit.bench.cases import PLAIN, Case, Variant, case_rotation, rotation_note, set_bytes
from flashsplit.bench.timing import Timing
from flashsplit.reference import attention_ref, gather_paged

H200_L2 = 60 * 2**20
HAS_CUDA = torch.cuda.is_available()


def parse(*argv):
    return cli.build_parser().parse_args(list(argv))


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(device, "cuda_available", lambda: False)


# -- options and grid ------------------------------------------------------------------------

def test_variant_options_multiply_the_grid():
    args = parse("--batch", "1", "--seqlen", "4k", "--window", "none,128", "-1", "--sinks", "off", "on")
    assert cli.resolve_variants(args) == [Variant(-1), Variant(-1, sinks=True), Variant(128), Variant(128, sinks=True)]
    grid, skipped = cli.resolve_grid(args, H200_L2)
    assert skipped == [] and [c.variant for c in grid] == cli.resolve_variants(args)
    assert [(c.window, c.sinks, c.window_size) for c in grid] == [
        (-1, False, (-1, -1)), (-1, True, (-1, -1)), (128, False, (128, 0)), (128, True, (128, 0))]
    bare = parse("--sinks", "--batch-invariant", "--softcap", "0,30")
    assert cli.resolve_variants(bare) == [Variant(softcap=0.0, sinks=True, batch_invariant=True),
                                          Variant(softcap=30.0, sinks=True, batch_invariant=True)]
    assert cli.resolve_variants(parse()) == [PLAIN], "no variant option: plain decode only"
    compared = parse("--window", "128", "--compare-variants")
    assert cli.resolve_variants(compared) == [PLAIN, Variant(128)], "the baseline comes first"
    assert [c.name for c in cli.resolve_contenders(compared)] == ["triton", "cute", "triton-nosplit", "auto"]


def test_gpt_oss_preset():
    shape = cli.resolve_shape(parse("--preset", "gpt-oss-20b"))
    assert (shape.num_heads, shape.num_heads_kv, shape.head_dim) == (64, 8, 64)


@pytest.mark.parametrize("argv", [
    ["--window", "-2"], ["--window", "abc"], ["--window", "1.5"], ["--softcap", "-1"], ["--softcap", "inf"],
    ["--softcap", "x"], ["--sinks", "maybe"], ["--batch-invariant", "yes"],
])
def test_bad_variant_options_are_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


@pytest.mark.parametrize("argv, needle", [
    (["--compare-variants"], "--compare-variants needs a variant"),
    (["--compare-variants", "--window", "-1", "--softcap", "0"], "--compare-variants needs a variant"),
    (["--compare-variants", "--window", "128", "--sweep-splits", "1-4"], "do not combine"),
    (["--batch-invariant", "off", "on", "--sweep-splits", "1-4"], "batch-invariant decode fixes the split length"),
])
def test_option_combinations_that_cannot_run_exit_2(argv, needle, no_gpu, capsys):
    assert cli.main(["--dry-run", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flashsplit bench: error:") and needle in err


def test_help_describes_the_variant_options():
    text = cli.build_parser().format_help()
    for needle in ("--window LEFT", "window_size=(LEFT, 0)", "--softcap X", "--sinks", "--batch-invariant",
                   "--compare-variants", "gpt-oss-20b", "FILE.variants.csv"):
        assert needle in text, needle


# -- bytes and rotation ----------------------------------------------------------------------

def test_windowed_cells_count_the_keys_the_window_sees():
    full, windowed = Case(1, 131072, 32, 8, 128), Case(1, 131072, 32, 8, 128, window=128)
    assert windowed.kv_bytes == full.kv_bytes, "the cache is as large as ever"
    assert windowed.visible_keys == 129 and windowed.read_kv_bytes == 2 * 129 * 8 * 128 * 2
    assert windowed.moved_bytes == windowed.read_kv_bytes + 2 * 32 * 128 * 2
    assert Case(1, 100, 32, 8, 128, window=128).visible_keys == 100, "a window longer than the cache sees it all"
    sinks = Case(2, 4096, 32, 8, 128, sinks=True)
    assert sinks.moved_bytes == Case(2, 4096, 32, 8, 128).moved_bytes + 4 * 32, "fp32 sinks, one per q head"
    # Rotation sets are sized by the bytes a call reads: the docstring's worked example.
    assert case_rotation(full, H200_L2) == 1
    assert case_rotation(windowed, H200_L2) == 352
    assert case_rotation(windowed, H200_L2, 80e9) == 149 == int(80e9 // set_bytes(windowed))
    assert rotation_note(windowed, 352, H200_L2) == ""
    note = rotation_note(windowed, 149, H200_L2)
    assert note.startswith("149 set(s) read 80 MB per rotation") and "L2" in note
    assert case_rotation(Case(1, 1024, 32, 8, 128), H200_L2) == 45, "plain cells rotate as before"


def test_build_grid_rejects_what_is_not_a_variant():
    from flashsplit.bench.cases import Shape, build_grid

    with pytest.raises(TypeError, match="variants"):
        build_grid([1], [1024], Shape(32, 8, 128), variants=[(128, 0.0)])


# -- the reference check with a variant (fake timer; the Triton interpreter computes) --------

def _timer(calls):
    def timer(run, num_sets, config):
        calls.append(num_sets)
        run(num_sets - 1)
        return Timing(device_us=10.0, eager_us=20.0, method="graph")
    return timer


class _Fake(contenders.Contender):
    family = "torch"
    variants = frozenset(contenders.VARIANT_FEATURES)  # claims them all: the check must catch the liars

    def __init__(self, name, make):
        self.name, self.make = name, make

    def prepare(self, case, inputs):
        return contenders.Prepared(self.make(case, inputs))


def _info():
    return device.DeviceInfo("test", 132, 1024, 0, 4.8e12, "datasheet", HAS_CUDA)  # tiny L2: few sets


def _ref_run(inputs, **overrides):
    """A contender computing the reference, with some of the case's variant dropped."""
    case = inputs.case
    kw = {"window_size": case.window_size, "softcap": case.softcap, "sinks": inputs.sinks, **overrides}
    return lambda i: attention_ref(inputs.q[i], inputs.k[i], inputs.v[i], inputs.cache_seqlens, **kw)[0].half()


def test_check_fails_a_contender_that_drops_the_variant():
    # fp16: the interpreter's bf16 dot is wrong. 512 keys, a 31-key window; softcap 1 squeezes
    # every score into (-1, 1); sinks of ~N(3, 1) take ~15% of a 64-key softmax.
    cases = [Case(2, 512, 4, 2, 64, "fp16", window=31), Case(2, 64, 4, 2, 64, "fp16", softcap=1.0),
             Case(2, 64, 4, 2, 64, "fp16", sinks=True)]
    roster = [contenders.FlashsplitContender("triton", "triton"),
              _Fake("faithful", lambda case, inputs: _ref_run(inputs)),
              _Fake("no-window", lambda case, inputs: _ref_run(inputs, window_size=(-1, -1))),
              _Fake("no-softcap", lambda case, inputs: _ref_run(inputs, softcap=0.0)),
              _Fake("no-sinks", lambda case, inputs: _ref_run(inputs, sinks=None))]
    calls = []
    out = runner.run_grid(cases, roster, _info(), None, runner.RunOptions(mem_cap_bytes=1e9, timer=_timer(calls)))
    by = {(r.contender, r.variant_label): r for r in out}
    for label in ("window 31", "softcap 1", "sinks"):
        for name in ("triton", "faithful"):
            r = by[(name, label)]
            assert r.status == rows.OK and r.rel_err < 1e-2, (name, label, r.note)
    assert by[("no-window", "window 31")].status == rows.WRONG
    assert by[("no-softcap", "softcap 1")].status == rows.WRONG
    assert by[("no-sinks", "sinks")].status == rows.WRONG
    # Where a contender's omission changes nothing, it passes (it computes the same attention).
    assert by[("no-window", "sinks")].status == rows.OK and by[("no-sinks", "window 31")].status == rows.OK
    tri = by[("triton", "window 31")]
    span = flashsplit.plan(2, 512, 4, 2, 64, dtype=torch.float16, window_size=(31, 0), num_sms=132, device="cuda",
                           backend="triton").span
    assert tri.window == 31 and span < 512 and tri.note == f"backend triton; splits cover {span} keys"
    assert tri.gbps == pytest.approx(cases[0].moved_bytes / 10e-6 / 1e9)
    assert len(calls) == sum(r.status == rows.OK for r in out)


def test_flashsplit_rows_carry_the_variant_and_skip_what_a_backend_refuses():
    # (head dim 80: a variant case that cute refuses, for a reason of its own)
    case = Case(2, 256, 4, 2, 80, "fp16", window=64, sinks=True, batch_invariant=True)
    roster = [contenders.FlashsplitContender("triton", "triton"), contenders.FlashsplitContender("cute", "cute"),
              contenders.FlashsplitContender("triton-nosplit", "triton", num_splits=1),
              contenders.SdpaContender("sdpa-flash", "FLASH_ATTENTION")]
    out = runner.run_grid([case], roster, _info(), None, runner.RunOptions(mem_cap_bytes=1e9, timer=_timer([])))
    by = {r.contender: r for r in out}
    assert all((r.window, r.sinks, r.batch_invariant) == (64, True, True) for r in out)
    assert by["triton"].status == rows.OK, by["triton"].note
    assert by["triton"].num_splits == flashsplit.plan(2, 256, 4, 2, 80, dtype=torch.float16, window_size=(64, 0),
                                                      has_sinks=True, batch_invariant=True, num_sms=132,
                                                      device="cuda", backend="triton").num_splits
    assert by["cute"].status == rows.SKIPPED and "cute" in by["cute"].note and "head_dim 80" in by["cute"].note
    assert by["triton-nosplit"].status == rows.SKIPPED and "batch_invariant" in by["triton-nosplit"].note
    assert by["sdpa-flash"].status == rows.SKIPPED
    assert by["sdpa-flash"].note == "torch SDPA has no sliding-window/sinks/batch-invariant input in the bench's call"


def test_variant_inputs():
    from flashsplit.bench.inputs import make_inputs

    plain = make_inputs(Case(2, 64, 4, 2, 16, "fp16"), 2, device="cpu", seed=5)
    sinks = make_inputs(Case(2, 64, 4, 2, 16, "fp16", sinks=True, window=8, softcap=30.0), 2, device="cpu", seed=5)
    assert plain.sinks is None and plain.variant_kwargs() == {}, "a plain cell times the plain call"
    assert all(torch.equal(a, b) for a, b in zip(plain.q + plain.k + plain.v, sinks.q + sinks.k + sinks.v))
    assert sinks.sinks.shape == (4,) and sinks.sinks.dtype == torch.float32
    assert 0.5 < float(sinks.sinks.mean()) < 5.5
    kw = sinks.variant_kwargs()
    assert kw.keys() == {"window_size", "softcap", "sinks"} and kw["window_size"] == (8, 0) and kw["softcap"] == 30.0


# -- peers -----------------------------------------------------------------------------------

def test_peers_skip_variants_with_reasons():
    by = {c.name: c for c in contenders.all_contenders()}
    plain, window = Case(1, 4096, 32, 8, 128), Case(1, 4096, 32, 8, 128, window=128)
    both = Case(1, 4096, 32, 8, 128, softcap=30.0, sinks=True)
    for name in by:
        assert by[name].variant_reason(plain) is None, name
    for name in ("triton", "cute", "triton-nosplit", "auto"):
        assert by[name].variant_reason(both) is None, "flashsplit takes every variant (a backend may refuse in plan)"
    assert by["sdpa-cudnn"].variant_reason(window) == "torch SDPA has no sliding-window input in the bench's call"
    assert by["flex"].variant_reason(both) == "torch FlexAttention has no softcap/sinks input in the bench's call"
    reason = by["flashinfer"].variant_reason(both)
    assert reason.startswith("flashinfer has no sinks input") and "softcap" not in reason


def _fake_flash_attn(monkeypatch, params):
    """A fake ``flash_attn_interface`` whose flash_attn_with_kvcache has keyword ``params`` and
    computes the reference from what it is given (the calls are recorded)."""
    seen = []

    def impl(q, k_cache, v_cache, **kw):
        seen.append(kw)
        assert set(kw) <= set(params), kw
        table = kw.get("page_table", kw.get("block_table"))
        if table is not None:
            k_cache, v_cache = gather_paged(k_cache, table), gather_paged(v_cache, table)
        return attention_ref(q, k_cache, v_cache, kw["cache_seqlens"], causal=bool(kw.get("causal")),
                             window_size=kw.get("window_size", (-1, -1)), softcap=kw.get("softcap", 0.0),
                             sinks=kw.get("sinks"))[0].to(q.dtype)

    src = f"def flash_attn_with_kvcache(q, k_cache, v_cache, *, {', '.join(f'{p}=None' for p in params)}):\n" \
          f"    return impl(q, k_cache, v_cache, **{{k: v for k, v in locals().items() if k in {params!r} " \
          f"and v is not None}})\n"
    module = types.ModuleType("flash_attn_interface")
    exec(src, {"impl": impl}, module.__dict__)
    monkeypatch.setitem(sys.modules, "flash_attn_interface", module)
    contenders._import_reason.cache_clear()
    return seen


@pytest.fixture
def clear_import_cache():
    yield
    contenders._import_reason.cache_clear()


def test_flash_attn3_gets_the_variants_its_signature_has(monkeypatch, clear_import_cache):
    seen = _fake_flash_attn(monkeypatch, ["cache_seqlens", "page_table", "window_size", "softcap", "num_splits",
                                          "sinks"])
    fa3 = contenders.FlashAttnContender("flash-attn3", "flash_attn_interface")
    cases = [Case(2, 128, 4, 2, 32, "fp16", window=31, sinks=True), Case(2, 128, 4, 2, 32, "fp16", softcap=2.0),
             Case(2, 128, 4, 2, 32, "fp16", batch_invariant=True), Case(2, 128, 4, 2, 32, "fp16", page_size=16)]
    assert all(fa3.variant_reason(c) is None for c in cases)
    out = runner.run_grid(cases, [fa3], _info(), None, runner.RunOptions(mem_cap_bytes=1e9, timer=_timer([])))
    assert [r.status for r in out] == [rows.OK] * 4, [r.note for r in out]
    assert all(r.rel_err < 1e-2 for r in out)
    first = {tuple(sorted(kw)) for kw in seen}
    assert ("cache_seqlens", "sinks", "window_size") in first and ("cache_seqlens", "softcap") in first
    assert ("cache_seqlens", "num_splits") in first and ("cache_seqlens", "page_table") in first
    assert any(kw.get("window_size") == (31, 0) for kw in seen) and any(kw.get("num_splits") == 1 for kw in seen)
    assert "num_splits=1" in out[2].note
    assert all(kw["sinks"].dtype == torch.float16 for kw in seen if "sinks" in kw), "FA3 takes sinks in q's dtype"


def test_flash_attn_without_a_parameter_skips_that_variant(monkeypatch, clear_import_cache):
    _fake_flash_attn(monkeypatch, ["cache_seqlens", "block_table", "window_size"])
    fa3 = contenders.FlashAttnContender("flash-attn3", "flash_attn_interface")
    assert fa3.variant_reason(Case(1, 4096, 32, 8, 128, window=128)) is None
    reason = fa3.variant_reason(Case(1, 4096, 32, 8, 128, window=128, softcap=30.0, sinks=True))
    assert reason == "flash_attn_interface.flash_attn_with_kvcache has no softcap/sinks input in this build"
    case = Case(2, 128, 4, 2, 32, "fp16", sinks=True)
    (row,) = runner.run_grid([case], [fa3], _info(), None, runner.RunOptions(mem_cap_bytes=1e9, timer=_timer([])))
    assert row.status == rows.SKIPPED and row.note.endswith("has no sinks input in this build")


# -- several queries per row: each peer's causal, bottom-right call, or its skip reason -------

def test_bottom_right_masks():
    from flashsplit.bench.masks import bottom_right_visible, flex_block_mask, sdpa_causal_mask

    assert bottom_right_visible(3, 5).int().tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    one, three = Case(1, 5, 4, 2, 16, "fp16"), Case(1, 5, 4, 2, 16, "fp16", seqlen_q=3)
    assert sdpa_causal_mask("CUDNN_ATTENTION", one, "cpu") == (None, "") and flex_block_mask(one, "cpu") is None
    mask, note = sdpa_causal_mask("CUDNN_ATTENTION", three, "cpu")
    assert mask.dtype == torch.float16 and note == "bottom-right causal: additive [3, 5] mask"
    assert torch.equal(mask == 0, bottom_right_visible(3, 5)) and torch.isneginf(mask[0, 3:]).all()
    bias, note = sdpa_causal_mask("FLASH_ATTENTION", three, "cpu")
    assert type(bias).__name__ == "CausalBias" and "causal_lower_right" in note
    assert torch.equal(bias._materialize("cpu"), bottom_right_visible(3, 5)), "lower right, not SDPA's top left"
    block = flex_block_mask(three, "cpu")
    q_idx, kv_idx = torch.arange(3)[:, None], torch.arange(5)[None, :]
    assert torch.equal(block.mask_mod(0, 0, q_idx, kv_idx), bottom_right_visible(3, 5))


def _sdpa_top_left(case, inputs):
    """SDPA's own ``is_causal``: top-left aligned, so query i sees keys <= i only."""
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def run(i):
        q, k, v = (t.transpose(1, 2) for t in (inputs.q[i], inputs.k[i], inputs.v[i]))
        return sdpa(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)
    return run


@pytest.mark.skipif(HAS_CUDA, reason="runs torch SDPA and eager FlexAttention on CPU tensors (CPU machines only)")
def test_torch_peers_run_several_queries_bottom_right(monkeypatch):
    """On CPU tensors: SDPA's flash backend (CPU flash) takes the bottom-right mask and passes the
    check; its cuDNN backend has no kernel for it and is skipped, saying so; FlexAttention (eager
    here, compiled on a GPU) passes with its block mask; SDPA's top-left is_causal fails."""
    from torch.nn.attention.flex_attention import flex_attention

    flex = contenders.FlexContender()
    monkeypatch.setattr(flex, "_compile", lambda: flex_attention)
    monkeypatch.setattr(runner, "synchronize", lambda: None)

    class TopLeft(_Fake):
        multi_query = True

    case = Case(2, 256, 4, 2, 64, "fp16", seqlen_q=4)
    roster = [contenders.SdpaContender("sdpa-flash", "FLASH_ATTENTION"),
              contenders.SdpaContender("sdpa-cudnn", "CUDNN_ATTENTION"), flex, TopLeft("top-left", _sdpa_top_left)]
    with warnings.catch_warnings():  # eager flex on CPU warns that it is unfused
        warnings.simplefilter("ignore", UserWarning)
        out = runner.run_grid([case], roster, _info(), None, runner.RunOptions(mem_cap_bytes=1e9, timer=_timer([])))
    by = {r.contender: r for r in out}
    assert by["sdpa-flash"].status == rows.OK and by["sdpa-flash"].rel_err < 1e-2, by["sdpa-flash"].note
    assert "bottom-right causal: causal_lower_right" in by["sdpa-flash"].note
    assert by["sdpa-cudnn"].status == rows.SKIPPED
    assert by["sdpa-cudnn"].note.startswith("torch SDPA's CUDNN_ATTENTION backend has no kernel for a bottom-right "
                                            "causal mask of 4 queries")
    assert by["flex"].status == rows.OK and "bottom-right causal block mask" in by["flex"].note
    assert by["top-left"].status == rows.WRONG and by["top-left"].rel_err > 0.5


def test_peers_reasons_for_several_queries():
    by = {c.name: c for c in contenders.all_contenders()}
    one, four = Case(1, 4096, 32, 8, 128), Case(1, 4096, 32, 8, 128, seqlen_q=4)
    for name in by:
        assert by[name].queries_reason(one) is None, name
    for name in ("triton", "cute", "triton-nosplit", "auto", "sdpa-flash", "sdpa-cudnn", "flex", "flash-attn",
                 "flash-attn3"):
        assert by[name].queries_reason(four) is None, name
    assert by["flashinfer"].queries_reason(four) == (
        "flashinfer's BatchDecodeWithPagedKVCacheWrapper is decode-only: one query per row, not L_q = 4 (its "
        "prefill wrapper is not in the bench)")
    assert by["flashinfer"].skip_reason(four) == by["flashinfer"].queries_reason(four)
    assert by["flashinfer"].skip_reason(Case(1, 4096, 32, 8, 128, batch_invariant=True, seqlen_q=4)).startswith(
        "flashinfer has no batch-invariant input"), "the variant's reason comes first, as the runner asks"
    (row,) = runner.run_grid([Case(2, 128, 4, 2, 32, "fp16", seqlen_q=4)], [by["flashinfer"]], _info(), None,
                             runner.RunOptions(mem_cap_bytes=1e9, timer=_timer([])))
    assert row.status == rows.SKIPPED and "decode-only" in row.note and row.seqlen_q == 4


def test_flash_attn_gets_causal_for_several_queries(monkeypatch, clear_import_cache):
    seen = _fake_flash_attn(monkeypatch, ["cache_seqlens", "page_table", "window_size", "causal"])
    fa3 = contenders.FlashAttnContender("flash-attn3", "flash_attn_interface")
    cases = [Case(2, 128, 4, 2, 32, "fp16", seqlen_q=4), Case(2, 128, 4, 2, 32, "fp16", page_size=16, window=20,
                                                              seqlen_q=3), Case(2, 128, 4, 2, 32, "fp16")]
    assert all(fa3.skip_reason(c) is None for c in cases)
    out = runner.run_grid(cases, [fa3], _info(), None, runner.RunOptions(mem_cap_bytes=1e9, timer=_timer([])))
    assert [r.status for r in out] == [rows.OK] * 3 and all(r.rel_err < 1e-2 for r in out), [r.note for r in out]
    assert [kw.get("causal") for kw in (seen[0], seen[-1])] == [True, None], "one query per row: no causal flag"
    _fake_flash_attn(monkeypatch, ["cache_seqlens", "page_table"])
    assert fa3.queries_reason(cases[0]) == ("flash_attn_interface.flash_attn_with_kvcache has no causal input in "
                                            "this build (needed for L_q > 1)")


def test_compare_variants_pairs_cells_of_the_same_l_q():
    data = [_vrow(40.0), _vrow(50.0, seqlen_q=4), _vrow(8.0, window=128), _vrow(10.0, window=128, seqlen_q=4),
            _vrow(5.0, seqlen=129), _vrow(6.0, seqlen=132, seqlen_q=4), _vrow(7.0, seqlen=129, seqlen_q=4)]
    got = {(c.seqlen_k, c.seqlen_q): c for c in variants.compare_variants(data)}
    assert set(got) == {(131072, 1), (131072, 4)}
    one, four = got[(131072, 1)], got[(131072, 4)]
    assert (one.base_us, one.short_seqlen, one.short_us) == (40.0, 129, 5.0)
    assert (four.base_us, four.short_seqlen, four.short_us) == (50.0, 132, 6.0), "w + L_q keys, the same L_q"
    assert four.ratio == pytest.approx(0.2) and four.short_ratio == pytest.approx(10.0 / 6.0)
    buf = io.StringIO()
    render.render_report(Console(file=buf, width=300), rows.Report(rows.RunHeader(), data, [], [],
                                                                   variants.compare_variants(data)))
    assert "w+L_q keys" in buf.getvalue() and "132" in buf.getvalue()


# -- dry run ---------------------------------------------------------------------------------

def test_dry_run_lists_variant_cells_with_the_windowed_span(no_gpu, capsys):
    argv = ["--dry-run", "--preset", "gpt-oss-20b", "--batch", "1", "--seqlen", "129", "128k", "--window", "128",
            "--sinks", "--compare-variants", "--contenders", "triton,sdpa-flash"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    expected = flashsplit.plan(1, 131072, 64, 8, 64, window_size=(128, 0), has_sinks=True, num_sms=132,
                               backend="triton")
    assert f"{expected.num_splits} over {expected.span}" in out and expected.span == 256
    assert "window 128 + sinks" in out and "plain" in out and "4 cell(s) x 2 contender(s)" in out
    assert "sdpa-flash skipped on 2 window 128 + sinks cell(s): torch SDPA has no sliding-window/sinks input" in out
    assert "--compare-variants would compare ['triton', 'sdpa-flash'] on window 128 + sinks against plain" in out
    assert "298 set(s) read 81 MB" in out, "the memory cap leaves the 128k windowed cell too few sets"


# -- --compare-variants, rows I/O, rendering -------------------------------------------------

def _vrow(us, seqlen=131072, status=rows.OK, contender="triton", **variant):
    return rows.BenchRow(contender, 1, seqlen, 64, 8, 64, "bf16", status=status,
                         device_us=us if status == rows.OK else None, **variant)


def test_compare_variants_ratios():
    data = [
        _vrow(40.0), _vrow(8.0, window=128), _vrow(44.0, sinks=True), _vrow(10.0, window=128, sinks=True),
        _vrow(None, status=rows.SKIPPED, batch_invariant=True),
        _vrow(5.0, seqlen=129), _vrow(5.5, seqlen=129, window=128),
        _vrow(None, status=rows.ERROR, softcap=30.0),
        _vrow(9.0, contender="auto", window=128),  # auto has no plain row: nothing to compare with
    ]
    got = {(c.contender, c.seqlen_k, c.variant_label): c for c in variants.compare_variants(data)}
    assert set(got) == {("triton", 131072, "window 128"), ("triton", 131072, "sinks"),
                        ("triton", 131072, "window 128 + sinks"), ("triton", 129, "window 128"),
                        ("triton", 131072, "softcap 30")}
    w = got[("triton", 131072, "window 128")]
    assert (w.us, w.base_us, w.short_seqlen, w.short_us) == (8.0, 40.0, 129, 5.0)
    assert w.ratio == pytest.approx(0.2) and w.short_ratio == pytest.approx(1.6)
    assert got[("triton", 131072, "sinks")].ratio == pytest.approx(1.1)
    assert got[("triton", 131072, "sinks")].short_seqlen == 0 and got[("triton", 131072, "sinks")].short_us is None
    assert got[("triton", 131072, "window 128 + sinks")].short_ratio == pytest.approx(2.0)
    short = got[("triton", 129, "window 128")]
    assert short.ratio == pytest.approx(1.1) and short.short_us is None, "the window covers the whole cache"
    failed = got[("triton", 131072, "softcap 30")]
    assert failed.ratio is None and "variant not timed (error" in failed.note


def test_variant_report_round_trips_and_renders(tmp_path):
    header = rows.RunHeader(device="NVIDIA H200", num_sms=132)
    data = [_vrow(40.0), _vrow(8.0, window=128, softcap=30.0, sinks=True, batch_invariant=True)]
    sweep = [rows.SweepSummary("triton", 1, 131072, 64, 8, 64, "bf16", window=128, heuristic_splits=1)]
    fmt = [rows.FormatComparison("triton", 1, 131072, 64, 8, 64, "bf16", "paged", page_size=16, window=128)]
    report = rows.Report(header, data, sweep, fmt, variants.compare_variants(data))
    back = rows.report_from_json(rows.report_to_json(report))
    assert back == report and back.rows[1].variant == Variant(128, 30.0, True, True)
    assert rows.rows_from_csv(rows.rows_to_csv(data)) == data
    assert rows.from_csv(rows.to_csv(report.variants, rows.VariantComparison), rows.VariantComparison) == report.variants
    # A report written before variants existed reads back as plain decode.
    old = json.loads(rows.report_to_json(rows.Report(header, [_vrow(40.0)])))
    for r in old["rows"]:
        for key in ("window", "softcap", "sinks", "batch_invariant"):
            del r[key]
    del old["variants"]
    assert rows.report_from_json(json.dumps(old)).rows == [_vrow(40.0)]
    buf = io.StringIO()
    render.render_report(Console(file=buf, width=300), report)
    text = buf.getvalue()
    assert "window 128 + softcap 30 + sinks + batch-invariant" in text and "attention variants" in text
    assert "0.200" in text, "variant / plain time"
    # Plot lines keep variants (and formats) apart.
    assert [render.line_label(r, data) for r in data] == [
        "triton [plain]", "triton [window 128 + softcap 30 + sinks + batch-invariant]"]
    assert render.line_label(data[0], data[:1]) == "triton"


@pytest.mark.skipif(HAS_CUDA, reason="runs the Triton interpreter on CPU tensors (CPU machines only)")
def test_compare_variants_end_to_end_with_a_fake_gpu(monkeypatch, tmp_path, capsys):
    """A whole --compare-variants run (rows, comparison table, JSON, CSV, --from-json) on CPU
    tensors: the Triton interpreter computes, a fake timer gives each cell its time."""
    import functools

    def timer(run, num_sets, config):
        run(0)
        case = current[0]
        us = 2.0 + case.seqlen_k / 64 if case.window < 0 else 3.0
        return Timing(device_us=us, eager_us=1.0, method="graph")

    current = []
    real_bench_one = runner.bench_one

    def bench_one(contender, case, *a, **kw):
        current[:] = [case]
        return real_bench_one(contender, case, *a, **kw)

    info = device.DeviceInfo("Fake H200", 132, 1024, 0, 4.8e12, "datasheet", False)
    monkeypatch.setattr(device, "cuda_available", lambda: True)
    monkeypatch.setattr(contenders, "cuda_available", lambda: True)
    monkeypatch.setattr(device, "device_info", lambda: info)
    monkeypatch.setattr(runner, "synchronize", lambda: None)
    monkeypatch.setattr(runner, "bench_one", bench_one)
    monkeypatch.setattr(runner, "RunOptions", functools.partial(runner.RunOptions, timer=timer))
    json_path, csv_path = tmp_path / "r.json", tmp_path / "r.csv"
    code = cli.main(["--compare-variants", "--window", "40", "--sinks", "--contenders", "triton", "--heads", "4/2",
                     "--head-dim", "64", "--dtype", "fp16", "--batch", "2", "--seqlen", "41", "256", "--no-ceiling",
                     "--json", str(json_path), "--csv", str(csv_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    report = rows.report_from_json(json_path.read_text())
    assert [(r.seqlen_k, r.variant_label, r.status) for r in report.rows] == [
        (41, "plain", "ok"), (41, "window 40 + sinks", "ok"), (256, "plain", "ok"), (256, "window 40 + sinks", "ok")]
    assert all(r.rel_err < 1e-2 for r in report.rows)
    (at41, at256) = report.variants
    assert at256.ratio == pytest.approx(3.0 / 6.0) and at256.short_seqlen == 41
    assert at256.short_ratio == pytest.approx(3.0 / (2.0 + 41 / 64))
    assert at41.short_us is None
    assert any(n.startswith("attention variants:") for n in report.header.notes)
    assert (tmp_path / "r.variants.csv").exists() and "attention variants: time against plain decode" in out
    assert cli.main(["--from-json", str(json_path), str(json_path), "--json", str(tmp_path / "m.json")]) == 0
    assert len(rows.report_from_json((tmp_path / "m.json").read_text()).variants) == 4, "--from-json merges them"


def test_eager_timer_runs_on_through_the_sets(monkeypatch):
    """A windowed cell rotates more sets than one eager sample calls: each sample goes on where
    the last stopped, so no sample re-reads KV the previous one left in L2."""
    from flashsplit.bench import timing

    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda: None)
    seen = []
    timing.time_eager(seen.append, 10, timing.TimingConfig(eager_repeats=3), calls=4)
    assert seen == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5]


def test_flashinfer_takes_window_and_softcap_where_its_plan_has_them(monkeypatch, clear_import_cache):
    def make(params):
        module = types.ModuleType("flashinfer")
        src = f"def plan(self, indptr, indices, last_page_len, *, {', '.join(f'{p}=None' for p in params)}): pass\n"
        namespace = {}
        exec(src, namespace)
        module.BatchDecodeWithPagedKVCacheWrapper = type("BatchDecodeWithPagedKVCacheWrapper", (),
                                                         {"plan": namespace["plan"]})
        monkeypatch.setitem(sys.modules, "flashinfer", module)
        contenders._import_reason.cache_clear()

    fi = contenders.FlashInferContender()
    both = Case(1, 4096, 32, 8, 128, window=128, softcap=30.0)
    make(["pos_encoding_mode", "window_left", "logits_soft_cap"])
    assert fi.variant_reason(both) is None
    assert fi._plan_variant(both) == {"window_left": 128, "logits_soft_cap": 30.0}
    assert fi._plan_variant(Case(1, 4096, 32, 8, 128)) == {}
    make(["pos_encoding_mode", "window_left"])
    assert fi.variant_reason(both) == "flashinfer has no softcap input in this release's decode plan()"
    assert "batch-invariant" in fi.variant_reason(Case(1, 4096, 32, 8, 128, batch_invariant=True))
