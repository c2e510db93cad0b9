"""How fast can a Triton split kernel read a dense cache, and do TMA loads or swapped dots help?

A bare split kernel: B = ``--batch`` rows of ``--keys`` keys, 32/8 heads, d = 128, every split a
whole number of key tiles, no lengths, masks or merge: program ``(split, b, kv head)`` writes its
fp32 partial and LSE, nothing else. It is timed three ways, each a variant
``[swap]BLOCK_N:WARPS:STAGES`` with ``--loads ptr`` and/or ``tma``:

- ``ptr``: K and V tiles by pointer loads, which Triton pipelines with ``cp.async`` (flashsplit's
  Triton kernel does this);
- ``tma``: the same tiles through tensor descriptors (``TensorDescriptor``: TMA copies);
- ``swap...``: the dots transposed, ``S^T = K Q^T`` and ``O^T += V^T P^T``, so the keys are the
  dot's M (cute's swapped-operand kernel does this with wgmma).

An fp8 cache (``--dtype fp8``, e4m3) converts its tiles to fp16 in registers, V read as int16
pairs of columns as flashsplit does (:func:`flashsplit.triton.attend.fp8_pairs_to_fp16`). Beside
the variants, in the same interleaved replays: ``flashsplit.decode`` on the same inputs (its own
plan and merge included), and the read floor of the same bytes (``scripts/read_floor.py``).
Every variant is first checked against a float64 reference (its partials merged in PyTorch),
output poisoned with NaN.

    python scripts/bare_split_kernel.py --dtype fp8 --keys 128k --splits 32 16 \\
        --configs 128:4:3 64:4:3 swap128:4:3
    python scripts/bare_split_kernel.py --dtype bf16 --keys 4k 16k --splits 16 --configs 64:4:3 swap64:4:3

Without a GPU, ``TRITON_INTERPRET=1`` runs the checks alone through the Triton interpreter (small
shapes; fp8 or fp16: the interpreter's ``tl.dot`` is wrong for bf16).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from read_floor import read_times  # noqa: E402

import flashsplit  # noqa: E402
from flashsplit.bench.cases import parse_seqlen, rotation_count  # noqa: E402
from flashsplit.bench.timing import TimingConfig, time_side_by_side  # noqa: E402
from flashsplit.triton.attend import fp8_pairs_to_fp16  # noqa: E402

LOG2E = 1.4426950408889634
HEADS_KV, GROUP, HEAD_DIM = 8, 4, 128
DTYPES = {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16, "fp16": torch.float16}


@triton.jit
def _tile(K, V, k_desc, v_desc, row0, n0, h, H_kv, offs_n, offs_d, offs_v,
          D: tl.constexpr, DV: tl.constexpr, TMA: tl.constexpr, KEYS_FIRST: tl.constexpr):
    """K ``[BLOCK_N, D]`` (KEYS_FIRST) or ``[D, BLOCK_N]`` and V ``[BLOCK_N, DV]`` of keys ``n0 + offs_n``."""
    if TMA:
        k = k_desc.load([(row0 + n0).to(tl.int32), h * D])
        v = v_desc.load([(row0 + n0).to(tl.int32), h * DV])
        if not KEYS_FIRST:
            k = tl.trans(k)
    else:
        rows = (row0 + n0 + offs_n) * H_kv + h
        if KEYS_FIRST:
            k = tl.load(K + rows[:, None] * D + offs_d[None, :])
        else:
            k = tl.load(K + rows[None, :] * D + offs_d[:, None])
        v = tl.load(V + rows[:, None] * DV + offs_v[None, :])
    return k, v


@triton.jit
def bare_split_kernel(Q, K, V, k_desc, v_desc, OP, LSE, L, H_kv, split_len, qk_scale_log2,
                      G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                      TMA: tl.constexpr, STAGES: tl.constexpr, FP8: tl.constexpr, PTX: tl.constexpr,
                      SWAP: tl.constexpr):
    """Program ``(s, b, h)``: keys ``[s * split_len, (s + 1) * split_len)`` of row b, KV head h,
    for its G q heads (rows of a BLOCK_M tile) -> ``OP[s, b, hq, :]`` (fp32), ``LSE[s, b, hq]``."""
    s = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    B = tl.num_programs(1)
    H_q = H_kv * G
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_m = offs_m < G
    hq = h * G + offs_m
    q = tl.load(Q + (b * H_q + hq)[:, None] * D + offs_d[None, :], mask=mask_m[:, None], other=0.0)
    DV: tl.constexpr = D // 2 if FP8 else D  # fp8 V: int16 pairs of columns
    offs_v = tl.arange(0, DV)
    if FP8:
        q = q.to(tl.float16)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    start = s * split_len
    row0 = b.to(tl.int64) * L
    if SWAP:  # accumulators transposed: [DV, BLOCK_M]
        qt = tl.trans(q)
        acc_t = tl.zeros([DV, BLOCK_M], tl.float32)
        acc_t_odd = tl.zeros([DV, BLOCK_M], tl.float32)
        for n0 in tl.range(start, start + split_len, BLOCK_N, num_stages=STAGES):
            k, v = _tile(K, V, k_desc, v_desc, row0, n0, h, H_kv, offs_n, offs_d, offs_v, D, DV, TMA, True)
            if FP8:
                k = k.to(tl.float16)
            st = tl.dot(k, qt) * qk_scale_log2
            m_new = tl.maximum(m_i, tl.max(st, axis=0))
            p = tl.math.exp2(st - m_new[None, :])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            if FP8:
                v_even, v_odd = fp8_pairs_to_fp16(v, False, PTX)
                p16 = p.to(tl.float16)
                acc_t = acc_t * alpha[None, :] + tl.dot(tl.trans(v_even), p16)
                acc_t_odd = acc_t_odd * alpha[None, :] + tl.dot(tl.trans(v_odd), p16)
            else:
                acc_t = acc_t * alpha[None, :] + tl.dot(tl.trans(v), p.to(v.dtype))
            m_i = m_new
        acc = tl.trans(acc_t)
        acc_odd = tl.trans(acc_t_odd)
    else:
        acc = tl.zeros([BLOCK_M, DV], tl.float32)
        acc_odd = tl.zeros([BLOCK_M, DV], tl.float32)
        for n0 in tl.range(start, start + split_len, BLOCK_N, num_stages=STAGES):
            kt, v = _tile(K, V, k_desc, v_desc, row0, n0, h, H_kv, offs_n, offs_d, offs_v, D, DV, TMA, False)
            if FP8:
                kt = kt.to(tl.float16)
            sc = tl.dot(q, kt) * qk_scale_log2
            m_new = tl.maximum(m_i, tl.max(sc, axis=1))
            p = tl.math.exp2(sc - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if FP8:
                v_even, v_odd = fp8_pairs_to_fp16(v, False, PTX)
                p16 = p.to(tl.float16)
                acc = acc * alpha[:, None] + tl.dot(p16, v_even)
                acc_odd = acc_odd * alpha[:, None] + tl.dot(p16, v_odd)
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
    if FP8:  # even and odd columns interleaved back
        acc = tl.reshape(tl.join(acc, acc_odd), [BLOCK_M, D])
    out = acc / l_i[:, None]
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
    base = (s * B + b) * H_q + hq
    tl.store(OP + base[:, None] * D + offs_d[None, :], out, mask=mask_m[:, None])
    tl.store(LSE + base, lse, mask=mask_m)


def bare_split(q, k, v, splits: int, config: str, tma: bool, op, lse) -> None:
    """One launch of :func:`bare_split_kernel` over ``k``/``v`` ``[B, L, H_kv, D]`` (L a multiple of
    ``splits`` x BLOCK_N) for ``q`` ``[B, 1, H_q, D]``; ``config`` is ``[swap]BLOCK_N:WARPS:STAGES``."""
    swap = config.startswith("swap")
    block_n, warps, stages = map(int, config.removeprefix("swap").split(":"))
    batch, keys, heads_kv, head_dim = k.shape
    fp8 = k.dtype == torch.float8_e4m3fn
    v_elems = v.view(torch.int16) if fp8 else v
    v_cols = v_elems.shape[-1]
    k2 = k.view(batch * keys, heads_kv * head_dim)
    v2 = v_elems.view(batch * keys, heads_kv * v_cols)
    k_desc = TensorDescriptor.from_tensor(k2, [block_n, head_dim]) if tma else k2
    v_desc = TensorDescriptor.from_tensor(v2, [block_n, v_cols]) if tma else v2
    group = q.shape[2] // heads_kv
    bare_split_kernel[(splits, batch, heads_kv)](
        q, k, v_elems, k_desc, v_desc, op, lse, keys, heads_kv, keys // splits, head_dim ** -0.5 * LOG2E,
        G=group, BLOCK_M=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, D=head_dim, TMA=tma,
        STAGES=stages, FP8=fp8, PTX=q.is_cuda, SWAP=swap, num_warps=warps)


def merged(op: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """The partials ``[S, B, H, D]`` merged by their LSEs ``[S, B, H]``."""
    return (op * torch.softmax(lse, dim=0)[..., None]).sum(0)


def reference(q, k, v) -> torch.Tensor:
    """float64 attention of one query per row: ``[B, H_q, D]``."""
    group = q.shape[2] // k.shape[2]
    kf = k.double().repeat_interleave(group, dim=2)
    vf = v.double().repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,blhd->bhl", q[:, 0].double(), kf) * k.shape[-1] ** -0.5
    return torch.einsum("bhl,blhd->bhd", torch.softmax(scores, -1), vf)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", nargs="+", default=["128k"], help="keys per row (1k = 1024)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp8")
    parser.add_argument("--splits", nargs="+", type=int, default=[32])
    parser.add_argument("--configs", nargs="+", default=["128:4:3"], help="[swap]BLOCK_N:WARPS:STAGES")
    parser.add_argument("--loads", nargs="+", choices=["ptr", "tma"], default=["ptr", "tma"])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = DTYPES[args.dtype]
    for keys in map(parse_seqlen, args.keys):
        shape = (args.batch, keys, HEADS_KV, HEAD_DIM)
        kv_bytes = 2 * math.prod(shape) * dtype.itemsize
        sets = rotation_count(kv_bytes) if cuda else 1
        q_dtype = torch.float16 if dtype == torch.float16 else torch.bfloat16
        inputs = [(torch.randn(args.batch, 1, HEADS_KV * GROUP, HEAD_DIM, device=device, dtype=q_dtype),
                   torch.randn(shape, device=device).to(dtype), torch.randn(shape, device=device).to(dtype))
                  for _ in range(sets)]
        ones = torch.ones(args.batch, HEADS_KV, device=device)
        for splits in args.splits:
            op = torch.empty(splits, args.batch, HEADS_KV * GROUP, HEAD_DIM, device=device)
            lse = torch.empty(splits, args.batch, HEADS_KV * GROUP, device=device)
            runs = {f"{loads} {config}": (lambda i, config=config, tma=loads == "tma":
                                          bare_split(*inputs[i], splits, config, tma, op, lse))
                    for config in args.configs for loads in args.loads}
            expected = reference(*inputs[0])
            for name, run in runs.items():
                op.fill_(float("nan"))
                run(0)
                error = ((merged(op, lse).double() - expected).abs().max() / expected.abs().max()).item()
                print(f"{args.dtype} B = {args.batch} x {keys} keys, {splits} splits, {name}: max error {error:.2e}"
                      f" of the largest output")
            if not cuda:
                continue
            descales = {"k_descale": ones, "v_descale": ones} if dtype == torch.float8_e4m3fn else {}
            runs["flashsplit.decode"] = lambda i: flashsplit.decode(*inputs[i], **descales)
            flat = [torch.ones(kv_bytes // 2, dtype=torch.bfloat16, device=device) for _ in range(sets)]
            floor = read_times(flat, TimingConfig(replays=30))[0][0]
            del flat
            times = time_side_by_side(runs, sets, kv_bytes, args.rounds)
            print(f"{torch.cuda.get_device_name()}: {args.dtype} B = {args.batch} x {keys} keys, {splits} splits;"
                  f" read floor {floor:.2f} us")
            for name, us in times.items():
                print(f"  {name:20s} {us:9.2f} us  {us / floor:6.3f}x the read")


if __name__ == "__main__":
    main()
