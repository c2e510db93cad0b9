"""Interleaved A/B timing of decode launches in one process: auto, a named backend, forced cute
launch choices, cuDNN SDPA.

The bench times one contender after another; a 1% question (is 16 splits faster than 32?) needs
the launches timed side by side. Here each variant's CUDA graph (calls over input sets rotated so
the KV never sits in L2) is captured once, then the graphs are replayed in turn, in alternating
order, ``--rounds`` times; the figure is the median per call. Every variant is first checked
against the float64 reference on fresh random inputs, its output poisoned with NaN before.

    python scripts/interleaved_ab.py --heads 32/8 --batch 1 --seqlen 4k \\
        --variant auto --variant cute:splits=16 --variant cute:splits=32,one_wave=0 --variant cudnn
    python scripts/interleaved_ab.py --heads 32/8 --batch 16 --seqlen 64k --page-size 128 \\
        --variant auto --variant cute:splits=1,one_per_sm=1 --variant cute:splits=2,one_per_sm=0
    python scripts/interleaved_ab.py --heads 32/8 --batch 1 --seqlen 128k --kv-dtype fp8e4m3 \\
        --variant triton --variant cute:splits=32,swap=1 --variant cute:splits=32,swap=0

Variants: ``auto``, ``triton``, ``cute`` (``flashsplit.decode`` with that backend; append
``:splits=N`` for a split count), ``cute:splits=N[,one_per_sm=0|1][,one_wave=0|1][,swap=0|1]
[,heads_first=0|1][,cluster=0|1]`` with any of the flags (a cute launch of N splits whose :class:`~flashsplit.cute.choice.LaunchChoice`
fields are forced; the others follow the rules), ``triton:heads_first=0|1[,splits=N]`` (a Triton
launch whose split programs run in that order, ``TritonBackend.heads_first``), ``cudnn`` (torch
SDPA's cuDNN backend; dense caches at one query only).

    python scripts/interleaved_ab.py --heads 32/32 --batch 64 --seqlen 4k \\
        --variant triton:heads_first=0 --variant triton:heads_first=1 \\
        --variant cute:splits=1,heads_first=0 --variant cute:splits=1,heads_first=1 --variant cudnn
"""

from __future__ import annotations

import argparse

import torch

import flashsplit
from flashsplit.bench.cases import KV_DTYPES, Case, rotation_count
from flashsplit.bench.check import check_output
from flashsplit.bench.contenders import SdpaContender
from flashsplit.bench.inputs import make_inputs
from flashsplit.bench.options import parse_seqlen
from flashsplit.bench.timing import replay_calls, time_side_by_side
from flashsplit.call import DecodeOptions, DecodeTensors
from flashsplit.cute import choice
from flashsplit.cute.backend import CuteBackend
from flashsplit.cute.launcher import PreparedCuteDecode
from flashsplit.triton.backend import PreparedDecode, TritonBackend
from flashsplit.validation import check_decode_inputs

FORCED_FLAGS = ("one_per_sm", "one_wave", "swap", "heads_first", "cluster")


def parse_variant(text: str) -> tuple[str, dict]:
    """``"cute:splits=16,one_wave=0"`` -> ``("cute", {"splits": 16, "one_wave": False})``."""
    name, _, spec = text.partition(":")
    if name not in ("auto", "triton", "cute", "cudnn"):
        raise argparse.ArgumentTypeError(f"expected auto, triton, cute or cudnn, got {name!r}")
    fields = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        if key == "splits" and value.isdigit() and int(value) > 0:
            fields[key] = int(value)
        elif key in FORCED_FLAGS and value in ("0", "1") and name == "cute":
            fields[key] = value == "1"
        elif key == "heads_first" and value in ("0", "1") and name == "triton":
            fields[key] = value == "1"
        else:
            raise argparse.ArgumentTypeError(f"{text!r}: expected splits=N, (cute) {'/'.join(FORCED_FLAGS)}=0|1 or "
                                             f"(triton) heads_first=0|1, got {item!r}")
    if name == "cute" and any(k in fields for k in FORCED_FLAGS) and "splits" not in fields:
        raise argparse.ArgumentTypeError(f"{text!r}: a forced cute launch needs splits=N")
    return name, fields


def tensors(inputs, outs, i: int) -> DecodeTensors:
    """Input set ``i`` and its output as one launch's tensors (block table, fp8 descales)."""
    cache = inputs.cache_kwargs(i)
    return DecodeTensors(inputs.q[i], inputs.k[i], inputs.v[i], outs[i], None, inputs.cache_seqlens,
                         cache.get("block_table"), cache.get("k_descale"), cache.get("v_descale"))


def make_run(name: str, fields: dict, inputs, outs, cute: CuteBackend):
    """(``run(i)``: one call on input set ``i``, returning SDPA's ``[B, H, L_q, D]`` output or
    None when it wrote ``outs[i]``; a label of what it launches)."""
    case = inputs.case
    if name == "cudnn":
        return SdpaContender("cudnn", "CUDNN_ATTENTION").prepare(case, inputs).run, "torch SDPA, cuDNN"
    if name == "cute" and any(k in fields for k in FORCED_FLAGS):
        splits = fields["splits"]
        forced = {k: fields[k] for k in FORCED_FLAGS if k in fields}
        problem = check_decode_inputs(tensors(inputs, outs, 0), DecodeOptions(num_splits=splits, causal=case.causal))
        tile = choice.choose(problem, splits, problem.num_sms, **forced)
        prepared = PreparedCuteDecode(cute.launcher, tile, splits, case.head_dim ** -0.5, case.causal, problem.variant)

        def forced_run(i):
            prepared(tensors(inputs, outs, i))
        return forced_run, f"cute, {splits} splits, {tile}"
    splits = fields.get("splits", 0)
    if "heads_first" in fields:  # a launch of its own, whatever the class attribute says later
        backend = TritonBackend()
        backend.heads_first = fields["heads_first"]
        splits = splits or flashsplit.plan(case.batch, case.seqlen_k, case.num_heads, case.num_heads_kv,
                                           case.head_dim, seqlen_q=case.seqlen_q, causal=case.causal,
                                           page_size=case.page_size, backend="triton").num_splits
        prepared = PreparedDecode(backend, splits, case.head_dim ** -0.5, case.causal)

        def ordered_run(i):
            prepared(tensors(inputs, outs, i))
        order = "KV heads first" if fields["heads_first"] else "splits first"
        return ordered_run, f"triton, {splits} splits, programs {order}"

    def run(i):
        flashsplit.api.decode_into(inputs.q[i], inputs.k[i], inputs.v[i], outs[i], None,
                                   cache_seqlens=inputs.cache_seqlens, backend=name, num_splits=splits,
                                   **inputs.cache_kwargs(i), **inputs.variant_kwargs())
    plan = flashsplit.plan(case.batch, case.seqlen_k, case.num_heads, case.num_heads_kv, case.head_dim,
                           seqlen_q=case.seqlen_q, dtype=case.torch_dtype, causal=case.causal,
                           page_size=case.page_size, kv_dtype=case.cache_torch_dtype, backend=name, num_splits=splits)
    return run, f"{plan.backend}, {plan.num_splits} splits, rule {plan.rule}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", default="32/8", help="q/KV heads (default 32/8)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seqlen", type=parse_seqlen, default=4096, help="keys per row, e.g. 4k")
    ap.add_argument("--seqlen-q", type=int, default=1, help="queries per row (> 1: causal)")
    ap.add_argument("--page-size", type=int, default=0, help="0: a dense cache")
    ap.add_argument("--kv-dtype", choices=list(KV_DTYPES), default="same",
                    help="the cache's dtype (fp8: per-(row, KV head) descales; default: q's)")
    ap.add_argument("--variant", type=parse_variant, action="append", required=True)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args(argv)
    heads, heads_kv = map(int, args.heads.split("/"))
    case = Case(args.batch, args.seqlen, num_heads=heads, num_heads_kv=heads_kv, head_dim=args.head_dim,
                seqlen_q=args.seqlen_q, page_size=args.page_size, kv_dtype=args.kv_dtype)
    num_sets = rotation_count(case.kv_bytes, mem_cap_bytes=60e9)
    inputs = make_inputs(case, num_sets)
    outs = [torch.full_like(q, float("nan")) for q in inputs.q]
    cute = CuteBackend()
    runs, labels, errors = {}, {}, {}
    for name, fields in args.variant:
        key = name + (":" + ",".join(f"{k}={int(v)}" for k, v in fields.items()) if fields else "")
        runs[key], labels[key] = make_run(name, fields, inputs, outs, cute)
    for key, run in runs.items():
        for out in outs:
            out.fill_(float("nan"))
        result = run(0)
        torch.cuda.synchronize()
        checked = check_output(outs[0] if result is None else result.transpose(1, 2), inputs)
        errors[key] = checked.detail.split(" (")[0] + ("" if checked.ok else " FAILED")
    times = time_side_by_side(runs, num_sets, case.kv_bytes, args.rounds)
    calls = replay_calls(num_sets, case.kv_bytes)
    first = next(iter(times))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: {args.heads} heads, d = {args.head_dim}, "
          f"B = {args.batch} x {args.seqlen} keys, L_q = {args.seqlen_q}, page size {args.page_size}, "
          f"cache {args.kv_dtype}; "
          f"{case.kv_bytes / 1e6:.1f} MB of KV, {num_sets} input sets, {calls} calls per graph, "
          f"{args.rounds} rounds")
    for key, us in times.items():
        print(f"  {key:40s} {us:10.2f} us  {us / times[first]:6.3f}x  {errors[key]:24s} {labels[key]}")


if __name__ == "__main__":
    main()
