"""A call's new keys written into the cache by a small kernel of their own, for backends whose
attention kernel does not write them (cute), and q rotated beside them.

The Triton split kernel writes a call's new keys itself (:mod:`flashsplit.triton.new_keys`),
one launch in all. :func:`append_new_keys` does the same update as one launch of
:func:`cache_update_kernel` ahead of the attention, on the same stream (so the attention reads
the written slots): new token ``t`` of row ``b`` lands at key ``cache_seqlens[b] + t`` (dense,
through ``cache_batch_idx``, or through the block table), rotated and, for an fp8 cache,
stored as ``k / k_descale`` rounded to its format, bit for bit what the split kernel stores;
with rotary, q's rows are rotated at the same positions into a new tensor. It also writes
``cache_seqlens + L_new``, the row lengths the attention then sees. No host sync: it can be
captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..call import DecodeTensors, cache_capacity
from ..problem import Variant
from .backend import new_key_tile
from .launch import descale_strides, strides_or_zeros
from .new_keys import FP8_FORMATS, row_cache_bases, row_descales, write_new_keys
from .rotary import load_rotated_rows, load_rows_rotated_at, row_rotary_start

#: q rows rotated per step of the rotation loop (registers: BLOCK_R x BLOCK_D fp32, twice).
Q_ROWS = 16
#: The most new keys a tile holds (:func:`~flashsplit.triton.backend.new_key_tile`'s cap).
NEW_KEYS_MAX_TILE = 64


@triton.jit
def cache_update_kernel(
    Q, Q_OUT, K, V, K_NEW, V_NEW, SEQLENS, SEQLENS_OUT, LEFTPAD, BATCH_IDX, BLOCK_TABLE, K_DESCALE, V_DESCALE,
    COS, SIN,
    stride_qb, stride_qm, stride_qh, stride_ob, stride_om, stride_oh,
    stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
    stride_knb, stride_knt, stride_knh, stride_vnb, stride_vnt, stride_vnh,
    stride_btb, stride_kdb, stride_kdh, stride_vdb, stride_vdh, stride_cos,
    seqlen_q, seqlen_new, group, head_dim, capacity, num_pages, seqlen_ro, rotary_half,
    BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr, HAS_LEFTPAD: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, HAS_DESCALE: tl.constexpr,
    ROTARY: tl.constexpr, INTERLEAVED: tl.constexpr, PER_TOKEN: tl.constexpr,
    FP8_EMIN: tl.constexpr, FP8_MBITS: tl.constexpr, FP8_MAX: tl.constexpr,
):
    """Program ``(b, kvh)``: row b's new keys and values of KV head kvh into the cache, then (ROTARY)
    q's rows of that KV head's q heads rotated into ``Q_OUT``; program ``(b, 0)`` also writes
    ``SEQLENS_OUT[b] = SEQLENS[b] + seqlen_new``.

    Q/Q_OUT ``[B, L_q, H_q, D]``; K/V ``[B_cache, capacity, H_kv, D]``, or pages ``[num_pages,
    PAGE_SIZE, H_kv, D]`` (PAGED, ``BLOCK_TABLE [B, pages per row]``); K_NEW/V_NEW ``[B, L_new,
    H_kv, D]``; SEQLENS/SEQLENS_OUT/LEFTPAD/BATCH_IDX int32 ``[B]``; descales fp32 (fp8 caches);
    COS/SIN ``[seqlen_ro, rotary_half]``. Rotary positions count from ``LEFTPAD[b]`` (clamped into
    the row, as the attention clamps it: :func:`~flashsplit.triton.rotary.row_rotary_start`): new
    token t at ``SEQLENS[b] - LEFTPAD[b] + t``, q row m at the same position as token m (PER_TOKEN) or
    at token 0's. Keys past the capacity are not written; page ids and cache rows are clamped
    into the cache (a wrong value writes a wrong slot of the cache, never stray memory).
    """
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    seqlen0 = tl.load(SEQLENS + b)
    if kvh == 0:
        tl.store(SEQLENS_OUT + b, seqlen0 + seqlen_new)
    k_base, v_base = row_cache_bases(K, V, BATCH_IDX, b, kvh, num_pages, stride_kb, stride_kh, stride_vb, stride_vh,
                                     PAGED, HAS_BATCH_IDX)
    bt_row = BLOCK_TABLE  # the row's page table (PAGED)
    if PAGED:
        bt_row = BLOCK_TABLE + b * stride_btb
    k_scale, v_scale = row_descales(K_DESCALE, V_DESCALE, b, kvh, stride_kdb, stride_kdh, stride_vdb, stride_vdh,
                                    HAS_DESCALE)
    total = tl.minimum(tl.maximum(seqlen0 + seqlen_new, 0), capacity)
    rot_position = row_rotary_start(SEQLENS, LEFTPAD, b, total, HAS_LEFTPAD)
    lo = tl.minimum(tl.maximum(seqlen0, 0), total)
    write_new_keys(K_NEW + b * stride_knb + kvh * stride_knh, V_NEW + b * stride_vnb + kvh * stride_vnh, k_base,
                   v_base, bt_row, lo, total, seqlen0, rot_position, k_scale, v_scale, num_pages, stride_knt,
                   stride_vnt, stride_kb, stride_kn, stride_vb, stride_vn, COS, SIN, stride_cos, seqlen_ro,
                   rotary_half, head_dim, BLOCK_N, BLOCK_D, PAGED, PAGE_SIZE, ROTARY, INTERLEAVED, HAS_DESCALE,
                   False, False, FP8_EMIN, FP8_MBITS, FP8_MAX)

    if ROTARY:  # the packed rows (query m, q head kvh * group + r % group) of this KV head
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < head_dim
        for r0 in range(0, seqlen_q * group, BLOCK_R):
            offs_r = r0 + tl.arange(0, BLOCK_R)
            mask_r = offs_r < seqlen_q * group
            offs_m = offs_r // group
            offs_h = kvh * group + offs_r % group
            rows = Q + b * stride_qb + offs_m * stride_qm + offs_h * stride_qh
            if PER_TOKEN:
                q = load_rotated_rows(rows, mask_r, rot_position + offs_m, COS, SIN, stride_cos, seqlen_ro,
                                      rotary_half, head_dim, offs_d, INTERLEAVED)
            else:
                q = load_rows_rotated_at(rows, mask_r, rot_position, COS, SIN, stride_cos, seqlen_ro, rotary_half,
                                         head_dim, offs_d, INTERLEAVED)
            out = Q_OUT + b * stride_ob + offs_m[:, None] * stride_om + offs_h[:, None] * stride_oh + offs_d[None, :]
            tl.store(out, q.to(Q_OUT.dtype.element_ty), mask=mask_r[:, None] & mask_d[None, :])


def append_new_keys(tensors: DecodeTensors, variant: Variant) -> tuple[torch.Tensor, torch.Tensor]:
    """Write ``tensors.k_new``/``v_new`` (``variant.seqlen_new`` tokens a row) into the cache as
    :func:`cache_update_kernel` says; returns ``(q, cache_seqlens)`` for the attention that
    follows: q itself, or (rotary) a rotated copy ``[B, L_q, H_q, D]``, and the int32 ``[B]``
    lengths ``cache_seqlens + L_new`` (new tensors, on q's device)."""
    t = tensors
    q, k_cache, v_cache = t.q, t.k_cache, t.v_cache
    batch, seqlen_q, num_heads, head_dim = q.shape
    num_heads_kv = k_cache.shape[2]
    rotary = variant.rotary_dim > 0
    q_out = torch.empty_like(q) if rotary else q
    seqlens_out = torch.empty_like(t.cache_seqlens)
    paged = t.block_table is not None
    fp8 = FP8_FORMATS.get(k_cache.dtype, (0, 0, 0.0))
    any_ptr = t.cache_seqlens  # what a pointer the configuration never reads points at
    grid = (batch, num_heads_kv)
    cache_update_kernel[grid](
        q, q_out, k_cache, v_cache, t.k_new, t.v_new, t.cache_seqlens, seqlens_out,
        t.cache_leftpad if variant.has_leftpad else any_ptr, t.cache_batch_idx if variant.has_batch_idx else any_ptr,
        t.block_table if paged else any_ptr, t.k_descale if t.k_descale is not None else any_ptr,
        t.v_descale if t.v_descale is not None else any_ptr,
        t.rotary_cos if rotary else any_ptr, t.rotary_sin if rotary else any_ptr,
        *q.stride()[:3], *q_out.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3],
        *t.k_new.stride()[:3], *t.v_new.stride()[:3], *strides_or_zeros(t.block_table, 1),
        *descale_strides(t.k_descale), *descale_strides(t.v_descale), t.rotary_cos.stride(0) if rotary else 0,
        seqlen_q, variant.seqlen_new, num_heads // num_heads_kv, head_dim, cache_capacity(k_cache, t.block_table),
        k_cache.shape[0], t.rotary_cos.shape[0] if rotary else 1, t.rotary_cos.shape[1] if rotary else 0,
        BLOCK_N=new_key_tile(variant.seqlen_new, NEW_KEYS_MAX_TILE), BLOCK_R=Q_ROWS,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), PAGED=paged, PAGE_SIZE=k_cache.shape[1] if paged else 1,
        HAS_LEFTPAD=variant.has_leftpad, HAS_BATCH_IDX=variant.has_batch_idx, HAS_DESCALE=t.k_descale is not None,
        ROTARY=rotary, INTERLEAVED=variant.rotary_interleaved,
        PER_TOKEN=variant.rotary_q_per_token and seqlen_q > 1,
        FP8_EMIN=fp8[0], FP8_MBITS=fp8[1], FP8_MAX=fp8[2],
        num_warps=4,
    )
    return q_out, seqlens_out
