"""Rotary embedding on the device, for the split kernel: q as it is loaded, and a call's new keys.

Device code only. A table row ``p`` of ``rotary_cos``/``rotary_sin`` ``[L_ro, rotary_dim / 2]``
rotates the features of a token at position ``p``: column ``d < rotary_dim`` becomes
``x[d] * cos + x[partner] * signed_sin``; later columns pass through (cos 1, sin 0).
INTERLEAVED (GPT-J): pair ``j`` is columns ``(2j, 2j + 1)``; else (GPT-NeoX) ``(j, j + rotary_dim / 2)``.
"""

import triton
import triton.language as tl


@triton.jit
def row_rotary_start(SEQLENS, LEFTPAD, b, seqlen, HAS_LEFTPAD: tl.constexpr):
    """The rotary position of row ``b``'s first new key: its old length ``SEQLENS[b]`` counted
    from its first real key, ``LEFTPAD[b]`` clamped into ``[0, seqlen]`` (``seqlen``: the row's
    length with its new keys, clamped into the capacity) as the attention range clamps it."""
    position = tl.load(SEQLENS + b)
    if HAS_LEFTPAD:
        position -= tl.minimum(tl.maximum(tl.load(LEFTPAD + b), 0), seqlen)
    return position


@triton.jit
def rotary_pairs(offs_d, rotary_half, INTERLEAVED: tl.constexpr):
    """``(rotated, pair, first, partner)`` ``[BLOCK_D]`` for columns ``offs_d``: whether the column
    rotates, its table column, whether it is its pair's first, and the column it mixes with
    (itself where it does not rotate)."""
    rotated = offs_d < 2 * rotary_half
    if INTERLEAVED:
        pair = offs_d // 2
        partner = offs_d ^ 1
        first = offs_d % 2 == 0
    else:
        first = offs_d < rotary_half
        pair = tl.where(first, offs_d, offs_d - rotary_half)
        partner = tl.where(first, offs_d + rotary_half, offs_d - rotary_half)
    return rotated, pair, first, tl.where(rotated, partner, offs_d)


@triton.jit
def rotary_factors(COS, SIN, stride_cos, position, seqlen_ro, rotary_half, offs_d, INTERLEAVED: tl.constexpr):
    """``(cos, signed sin, partner column)`` ``[BLOCK_D]`` of one token at ``position`` (clamped
    into the table)."""
    rotated, pair, first, partner = rotary_pairs(offs_d, rotary_half, INTERLEAVED)
    row = tl.minimum(tl.maximum(position, 0), seqlen_ro - 1).to(tl.int64) * stride_cos
    cos = tl.load(COS + row + pair, mask=rotated, other=1.0).to(tl.float32)
    sin = tl.load(SIN + row + pair, mask=rotated, other=0.0).to(tl.float32)
    return cos, tl.where(first, -sin, sin), partner


@triton.jit
def load_rows_and_partners(row_ptrs, mask_r, partner, head_dim, offs_d):
    """fp32 ``(x, x[:, partner])`` ``[R, BLOCK_D]`` of the rows at ``row_ptrs`` (zeros where
    ``mask_r`` or the head dim masks them)."""
    mask = mask_r[:, None] & (offs_d < head_dim)[None, :]
    x = tl.load(row_ptrs[:, None] + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    x_partner = tl.load(row_ptrs[:, None] + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    return x, x_partner


@triton.jit
def load_rotated_rows(row_ptrs, mask_r, positions, COS, SIN, stride_cos, seqlen_ro, rotary_half, head_dim, offs_d,
                      INTERLEAVED: tl.constexpr):
    """Rows ``[R, BLOCK_D]`` at ``row_ptrs`` ``[R]`` (each a token's first feature), row ``r``
    rotated at ``positions[r]`` (clamped into the table), in fp32 (zeros where ``mask_r`` or the
    head dim masks them)."""
    rotated, pair, first, partner = rotary_pairs(offs_d, rotary_half, INTERLEAVED)
    x, x_partner = load_rows_and_partners(row_ptrs, mask_r, partner, head_dim, offs_d)
    rows = (tl.minimum(tl.maximum(positions, 0), seqlen_ro - 1).to(tl.int64) * stride_cos)[:, None] + pair[None, :]
    table_mask = mask_r[:, None] & rotated[None, :]
    cos = tl.load(COS + rows, mask=table_mask, other=1.0).to(tl.float32)
    sin = tl.load(SIN + rows, mask=table_mask, other=0.0).to(tl.float32)
    return x * cos + x_partner * tl.where(first[None, :], -sin, sin)


@triton.jit
def load_rows_rotated_at(row_ptrs, mask_r, position, COS, SIN, stride_cos, seqlen_ro, rotary_half, head_dim, offs_d,
                         INTERLEAVED: tl.constexpr):
    """:func:`load_rotated_rows` for rows that share one ``position``: the table row is loaded once
    (``[BLOCK_D]``, broadcast over the rows) instead of once per row."""
    cos, signed_sin, partner = rotary_factors(COS, SIN, stride_cos, position, seqlen_ro, rotary_half, offs_d,
                                              INTERLEAVED)
    x, x_partner = load_rows_and_partners(row_ptrs, mask_r, partner, head_dim, offs_d)
    return x * cos[None, :] + x_partner * signed_sin[None, :]
