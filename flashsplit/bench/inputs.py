"""Random decode inputs, several sets per case so timed loops can rotate through them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .cases import Case


@dataclass
class InputSets:
    """``len(q)`` input sets of one case, on one device.

    ``q[i]`` ``[B, 1, H, D]``, ``k[i]``/``v[i]`` ``[B, L_k, H_kv, D]`` (flashsplit's and
    FlashAttention's cache layout), ``cache_seqlens`` int32 ``[B]`` (every row full).
    """

    case: Case
    q: list[torch.Tensor]
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    cache_seqlens: torch.Tensor
    #: float64 reference outputs of set 0, by batch row (filled by :mod:`.check`, shared by
    #: every contender and every num_splits of a sweep).
    ref_cache: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.q)


def make_inputs(case: Case, num_sets: int, device: str | torch.device = "cuda", seed: int = 0) -> InputSets:
    """``num_sets`` independent standard-normal input sets for ``case``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    dtype = case.torch_dtype
    kv_shape = (case.batch, case.seqlen_k, case.num_heads_kv, case.head_dim)
    q_shape = (case.batch, 1, case.num_heads, case.head_dim)

    def randn(shape):
        return torch.randn(shape, generator=gen, device=device, dtype=dtype)

    qs, ks, vs = [], [], []
    for _ in range(num_sets):
        qs.append(randn(q_shape))
        ks.append(randn(kv_shape))
        vs.append(randn(kv_shape))
    lens = torch.full((case.batch,), case.seqlen_k, dtype=torch.int32, device=device)
    return InputSets(case, qs, ks, vs, lens)
