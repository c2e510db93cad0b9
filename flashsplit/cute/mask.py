"""Which keys a packed q row sees: ``[first, limit)``, the rest masked by selection.

Query ``m`` of ``L_q`` sits at position ``p = n_keys - L_q + m`` (bottom-right aligned). The limit
of a row is the end of this CTA's split (the row's live keys cap it), and with a causal mask
(keys up to ``p``) or a right window bound (up to ``p + window_right``) the smaller of the two.
A left window bound gives the row a first key, ``p - window_left``; left padding, the row's
first key ``leftpad[b]`` (with both, the later of the two). Masking selects ``-inf``
instead of the score (cache slots past the live length or before a window may hold NaN, which a
multiply by 0 would keep).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32


class KeyMask:
    """The key mask of one configuration: ``causal`` (right bound 0), ``right_bound`` (a runtime
    ``window_right``), ``left_bound`` (a runtime ``window_left``)."""

    def __init__(self, causal: bool, left_bound: bool = False, right_bound: bool = False):
        self.causal = causal
        self.left_bound = left_bound
        self.right_bound = right_bound

    @cute.jit
    def set_limit(self, key_limit, i, end, n_keys, seqlen_q, group, packed_row, window_right=None):
        """``key_limit[i]`` = the first key a packed row may not see; ``packed_row()`` gives the
        row's index (query ``packed_row() // group``), computed only where the mask needs it."""
        key_limit[i] = end
        if cutlass.const_expr(self.causal):
            m = packed_row() // group
            key_limit[i] = cutlass.min(end, n_keys - seqlen_q + m + 1)
        if cutlass.const_expr(self.right_bound):
            m = packed_row() // group
            key_limit[i] = cutlass.min(end, n_keys - seqlen_q + m + window_right + 1)

    @cute.jit
    def set_first(self, key_first, i, n_keys, seqlen_q, group, packed_row, window_left, leftpad=None):
        """``key_first[i]`` = the first key a packed row sees: under the left window bound
        (``window_left`` not None), its query's; with left padding (``leftpad``), at least the
        row's first key."""
        if cutlass.const_expr(window_left is not None):
            m = packed_row() // group
            key_first[i] = n_keys - seqlen_q + m - window_left
            if cutlass.const_expr(leftpad is not None):
                key_first[i] = cutlass.max(key_first[i], leftpad)
        else:
            key_first[i] = leftpad

    @cute.jit
    def apply(self, s, key, limit, first=None):
        """``s``, or ``-inf`` where ``key`` is at or past ``limit`` (or, given ``first``, before it)."""
        if key >= limit:
            s = -Float32.inf
        if cutlass.const_expr(first is not None):
            if key < first:
                s = -Float32.inf
        return s
