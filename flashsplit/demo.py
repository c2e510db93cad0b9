"""``python -m flashsplit demo``: one model-shaped decode step, checked and (on a GPU) timed.

On a GPU: Llama-3-8B attention (32 q heads, 8 KV heads, head dim 128, bf16) over a 32k-key cache
for 4 sequences of different lengths. On a CPU: a small shape through the Triton interpreter.
The output is judged against the float64 reference by the test suite's error rule
(:func:`flashsplit.testing.check_against_reference`).
"""

from __future__ import annotations

import time

import torch

from .api import decode, plan
from .reference import attention_ref
from .testing import check_against_reference, max_abs_err


class BackendUnavailable(ValueError):
    """The backend asked for cannot run the demo's problem on this machine (the reason is the message)."""


def run_demo(backend: str = "auto") -> int:
    """Run, check and time the demo step on ``backend``; prints a report and returns the exit
    code: 0 when the output is within the error budget, 1 when it is not. Raises
    :class:`BackendUnavailable` when ``backend`` cannot run here."""
    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    if on_gpu:
        batch, seqlen_k, heads, heads_kv, dim, dtype = 4, 32768, 32, 8, 128, torch.bfloat16
        lengths = [32768, 20000, 4097, 1]
        shape_name = "Llama-3-8B attention, 32k-key cache"
    else:
        batch, seqlen_k, heads, heads_kv, dim, dtype = 2, 1024, 8, 2, 64, torch.float16
        lengths = [1024, 300]
        shape_name = "small shape (no GPU: Triton interpreter)"
    try:
        the_plan = plan(batch, seqlen_k, heads, heads_kv, dim, dtype=dtype, device=device, backend=backend)
    except ValueError as e:
        raise BackendUnavailable(str(e)) from None
    torch.manual_seed(0)
    q = torch.randn(batch, 1, heads, dim, device=device, dtype=dtype)
    k = torch.randn(batch, seqlen_k, heads_kv, dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)

    print(f"flashsplit demo: {shape_name}")
    print(f"  q {list(q.shape)}, k/v cache {list(k.shape)} {str(dtype).replace('torch.', '')}, cache_seqlens {lengths}")
    print(f"  plan: {the_plan}")
    if not on_gpu:
        print(f"  a GPU's plan from here: flashsplit.plan({batch}, {seqlen_k}, {heads}, {heads_kv}, {dim}, gpu=\"h200\")")
    started = time.perf_counter()
    out, lse = decode(q, k, v, cache_seqlens=cache_seqlens, return_lse=True, backend=backend)
    if on_gpu:
        torch.cuda.synchronize()
    first_call_s = time.perf_counter() - started
    ref, ref_lse = attention_ref(q, k, v, cache_seqlens)
    print(f"  max |out - float64 reference| = {max_abs_err(out, ref):.2e}, "
          f"max |lse - reference| = {max_abs_err(lse, ref_lse):.2e}")
    try:
        check_against_reference(out, lse, q, k, v, cache_seqlens)
    except AssertionError as e:
        print(f"  FAILED the reference check: {e}")
        return 1
    print(f"  first call (compile included): {first_call_s:.2f} s")
    if on_gpu:
        from .bench.timing import TimingConfig, time_eager, time_graph

        # Device time from CUDA-graph replay: events around one eager call would measure the
        # host's launch time whenever that is longer than the kernels. The live KV (234 MB)
        # is 4x the L2, so one input set is not served from cache.
        step = lambda _: decode(q, k, v, cache_seqlens=cache_seqlens, backend=backend)  # noqa: E731
        us = time_graph(step, 1, TimingConfig(), calls=20)
        eager_us = time_eager(step, 1, TimingConfig(), calls=50)
        kv_bytes = 2 * sum(lengths) * heads_kv * dim * q.element_size()
        print(f"  device time per call: {us:.1f} us ({kv_bytes / us / 1e3:.0f} GB/s of live KV read, "
              f"CUDA-graph replay); eager call: {eager_us:.1f} us")
    return 0
