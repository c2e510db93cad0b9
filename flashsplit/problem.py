"""A decode problem: the static facts of one ``decode`` call, what the plan and the backends
decide on (:func:`flashsplit.validation.check_decode_inputs` builds it from the arguments)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from .plan import DEFAULT_NUM_SMS, planned_span
from .target import GpuTarget, device_target

#: Query dtypes (and 16-bit cache dtypes).
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
#: fp8 cache dtypes, read with a 16-bit query and fp32 dequantization scales.
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
MAX_HEAD_DIM = 256


class Variant(NamedTuple):
    """Which keys each query sees and how its scores are formed, beyond plain attention (static
    facts the kernels specialize on; see :class:`DecodeProblem`'s fields of the same names; the
    attention kernels see ``cache_seqlens + seqlen_new`` keys per row)."""

    window_left: int = -1
    window_right: int = -1
    softcap: float = 0.0
    has_sinks: bool = False
    batch_invariant: bool = False
    #: New keys appended before the attention: a row's kernels see ``cache_seqlens + seqlen_new`` keys.
    seqlen_new: int = 0
    #: Rows start at ``cache_leftpad[b]``.
    has_leftpad: bool = False
    #: Dense row b reads cache row ``cache_batch_idx[b]``.
    has_batch_idx: bool = False
    #: q (and the new keys) rotated over this many features; 0: no rotary.
    rotary_dim: int = 0
    #: GPT-J pairs (True) or GPT-NeoX halves (False).
    rotary_interleaved: bool = True
    #: q row ``m`` rotated at its own position (else every q row at the row's length).
    rotary_q_per_token: bool = False


class OnTarget:
    """The machine a problem runs on, from its ``device_type`` and ``gpu`` fields (shared by
    :class:`DecodeProblem` and :class:`~flashsplit.mla.problem.MlaProblem`)."""

    device_type: str
    gpu: GpuTarget | None

    @property
    def target(self) -> GpuTarget | None:
        """The GPU this problem runs on: ``gpu`` where one is named, else the current CUDA device;
        None for a problem on another device type (the CPU)."""
        if self.device_type != "cuda":
            return None
        return self.gpu if self.gpu is not None else device_target()

    @property
    def num_sms(self) -> int:
        """SMs of :attr:`target` (the machine size the split heuristic fills); an H200's otherwise."""
        target = self.target
        return target.num_sms if target is not None else DEFAULT_NUM_SMS


@dataclass(frozen=True)
class DecodeProblem(OnTarget):
    """Static facts of one decode call; what backends and the plan decide on.

    Shapes: q ``[batch, seqlen_q, num_heads, head_dim]``; k/v cache
    ``[batch, seqlen_k, num_heads_kv, head_dim]``, or paged ``[num_pages, page_size, num_heads_kv,
    head_dim]`` with ``seqlen_k = max_pages_per_row * page_size`` (the plan's static capacity).
    """

    batch: int
    seqlen_q: int
    seqlen_k: int
    num_heads: int
    num_heads_kv: int
    head_dim: int
    dtype: torch.dtype
    causal: bool
    has_cache_seqlens: bool
    device_type: str
    #: q, k_cache, v_cache start on 16-byte boundaries and every stride but the last is a
    #: multiple of 16 bytes (what TMA descriptors need).
    aligned_16b: bool = True
    #: the cache's dtype; None means q's dtype. fp8 caches come with fp32 descales.
    kv_dtype: torch.dtype | None = None
    #: keys per page of a paged cache (``block_table`` given); 0 for a dense cache.
    page_size: int = 0
    #: the GPU a CUDA problem runs on (or is planned for); None: the current device's
    #: (:func:`~flashsplit.target.device_target`, an H200's without CUDA).
    gpu: GpuTarget | None = None
    #: Keys before (``window_left``) and after (``window_right``) each query's position that it
    #: sees; -1: unbounded. ``causal`` sets ``window_right`` 0 (check_decode_inputs normalizes it).
    window_left: int = -1
    window_right: int = -1
    #: Scores become ``softcap * tanh(score / softcap)``; 0: off.
    softcap: float = 0.0
    #: A learned per-q-head logit joins each softmax's denominator (``sinks`` given).
    has_sinks: bool = False
    #: Each row's splits from its own length (:func:`flashsplit.plan.tokens_per_split`) and fixed kernel
    #: configurations: a row's result does not depend on the batch it is decoded in.
    batch_invariant: bool = False
    #: New keys and values per row (``k``/``v`` given: ``L_new``), written into the cache at
    #: ``[cache_seqlens[b], cache_seqlens[b] + L_new)`` before the attention, which covers them.
    seqlen_new: int = 0
    #: ``cache_leftpad`` given: row b's keys are ``[cache_leftpad[b], cache_seqlens[b])``.
    has_leftpad: bool = False
    #: ``cache_batch_idx`` given (dense caches): row b reads and writes cache row ``cache_batch_idx[b]``.
    has_batch_idx: bool = False
    #: Features rotated by ``rotary_cos``/``rotary_sin`` (new keys and q); 0: no rotary.
    rotary_dim: int = 0
    #: GPT-J pairs (True) or GPT-NeoX halves (False).
    rotary_interleaved: bool = True

    @property
    def has_new_kv(self) -> bool:
        """New keys and values are appended (``k``/``v`` given)."""
        return self.seqlen_new > 0

    @property
    def has_rotary(self) -> bool:
        """Rotary embedding of the new keys and of q (``rotary_cos``/``rotary_sin`` given)."""
        return self.rotary_dim > 0

    @property
    def rotary_q_per_token(self) -> bool:
        """q row ``m`` is rotated at its own position (causal or windowed attention, as
        FlashAttention does); otherwise every q row at the row's length. False without rotary."""
        return self.has_rotary and (self.causal or self.window_left >= 0 or self.window_right >= 0)

    @property
    def left_bound(self) -> bool:
        """A left window bound applies (queries do not see the whole prefix)."""
        return self.window_left >= 0

    @property
    def right_bound(self) -> bool:
        """A right bound (causal, or a window) hides keys from some query: only when L_q > 1
        and the bound ends before the last key for query 0."""
        return 0 <= self.window_right < self.seqlen_q - 1

    @property
    def span(self) -> int:
        """The most keys a row's splits cover (:func:`flashsplit.plan.planned_span`)."""
        return planned_span(self.seqlen_k, self.seqlen_q, self.window_left)

    @property
    def variant(self) -> Variant:
        """This problem's fields of the same names as :class:`Variant`'s (read by name, so the two
        cannot drift apart)."""
        return Variant(*(getattr(self, name) for name in Variant._fields))

    @property
    def cache_dtype(self) -> torch.dtype:
        return self.kv_dtype if self.kv_dtype is not None else self.dtype

    @property
    def paged(self) -> bool:
        return self.page_size > 0

    @property
    def qhead_per_kvhead(self) -> int:
        return self.num_heads // self.num_heads_kv

    @property
    def packed_rows(self) -> int:
        """Rows of one GQA-packed tile: every query position of every q head of one KV head."""
        return self.seqlen_q * self.qhead_per_kvhead

    def work_units(self, block_m: int) -> int:
        """CTAs of one split (the plan's work units): batch rows x KV heads x blocks of
        ``block_m`` packed rows."""
        return self.batch * self.num_heads_kv * -(-self.packed_rows // block_m)

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V at full capacity (what a decode step must read at least)."""
        itemsize = torch.empty((), dtype=self.cache_dtype).element_size()
        return 2 * self.batch * self.seqlen_k * self.num_heads_kv * self.head_dim * itemsize
