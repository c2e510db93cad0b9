"""An MLA decode problem: the static facts of one ``mla_decode`` call, what the plan and the MLA
backends decide on (:func:`flashsplit.mla.validation.check_mla_inputs` builds it)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..problem import OnTarget
from ..target import GpuTarget

#: q and key width: 512 latent features then 64 rotary ones (DeepSeek-V3's MLA).
MLA_HEAD_DIM = 576
#: Value width: the latent, the first 512 features of each cached key.
MLA_HEAD_DIM_V = 512
#: Rotary features at the end of each q row and key (``MLA_HEAD_DIM - MLA_HEAD_DIM_V``).
MLA_ROPE_DIM = MLA_HEAD_DIM - MLA_HEAD_DIM_V
#: Query tokens per row: one decode step, or a few with multi-token prediction / speculation.
MLA_MAX_SEQLEN_Q = 4
#: Bytes of a key in FlashMLA's fp8 token format (DeepSeek-V3.2): 512 e4m3 latent values, 4 fp32
#: scales (one per 128 of them), 64 rotary values in q's 16-bit dtype.
MLA_FP8_TOKEN_BYTES = 656
#: Latent values per scale of that format.
MLA_FP8_SCALE_TILE = 128


@dataclass(frozen=True)
class MlaProblem(OnTarget):
    """Static facts of one MLA decode call.

    Shapes: q ``[batch, seqlen_q, num_heads_q, head_dim]``; the latent cache dense ``[batch,
    capacity, 1, head_dim]`` or paged ``[num_pages, page_size, 1, head_dim]`` with ``capacity =
    max_pages_per_row * page_size``; out ``[batch, seqlen_q, num_heads_q, head_dim_v]``. Every
    q head of every query token attends the one latent KV head: ``seqlen_q x num_heads_q``
    packed rows share each key read.
    """

    batch: int
    seqlen_q: int
    num_heads_q: int
    dtype: torch.dtype
    #: the cache's dtype: q's, or ``torch.float8_e4m3fn`` (with ``kv_descale``).
    kv_dtype: torch.dtype
    #: keys per page of a paged cache; 0 for a dense cache.
    page_size: int
    #: the most keys a row can hold (static): dense ``L``, paged ``max_pages_per_row * page_size``.
    capacity: int
    causal: bool
    #: 0: the plan chooses; else the caller's split count.
    num_splits: int
    device_type: str
    head_dim: int = MLA_HEAD_DIM
    head_dim_v: int = MLA_HEAD_DIM_V
    #: the GPU a CUDA problem runs on or is planned for; None: the current device's.
    gpu: GpuTarget | None = None
    #: the cache holds FlashMLA's 656-byte fp8 tokens (their own scales; ``kv_dtype`` e4m3).
    fp8_tokens: bool = False

    @property
    def paged(self) -> bool:
        return self.page_size > 0

    @property
    def fp8(self) -> bool:
        return self.kv_dtype != self.dtype

    @property
    def packed_rows(self) -> int:
        """Rows of one latent head's tile: every query token of every q head."""
        return self.seqlen_q * self.num_heads_q

    @property
    def right_bound(self) -> bool:
        """Causal with several query tokens: some query does not see the row's last keys."""
        return self.causal and self.seqlen_q > 1

    def work_units(self, block_m: int) -> int:
        """CTAs of one split: batch rows x blocks of ``block_m`` packed rows (one KV head)."""
        return self.batch * -(-self.packed_rows // block_m)

    def cute_facts(self) -> dict:
        """The facts the cute MLA kernel's ``mla_supports`` takes (keyword arguments; dtypes by
        name, ``"bfloat16"``, ``"float8_e4m3fn"``)."""
        return dict(dtype=_name(self.dtype), kv_dtype=_name(self.kv_dtype), head_dim=self.head_dim,
                    head_dim_v=self.head_dim_v, num_heads_q=self.num_heads_q, seqlen_q=self.seqlen_q,
                    paged=self.paged, page_size=self.page_size)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
