"""Which keys a packed q row sees: every key before its limit, the rest masked by selection.

The limit of a row is the end of this CTA's split (the row's live keys cap it), and with a
causal mask (bottom-right aligned: query ``m`` of ``L_q`` sees the keys up to ``n_keys - L_q +
m``) the smaller of the two. Masking selects ``-inf`` instead of the score (cache slots past the
live length may hold NaN, which a multiply by 0 would keep). Another mask (a sliding window)
would narrow the limit here, and give rows a first key too.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32


class KeyMask:
    """The key mask of one configuration (``causal`` or not)."""

    def __init__(self, causal: bool):
        self.causal = causal

    @cute.jit
    def set_limit(self, key_limit, i, end, n_keys, seqlen_q, group, packed_row):
        """``key_limit[i]`` = the first key a packed row may not see; ``packed_row()`` gives the
        row's index (query ``packed_row() // group``), computed only where the mask needs it."""
        key_limit[i] = end
        if cutlass.const_expr(self.causal):
            m = packed_row() // group
            key_limit[i] = cutlass.min(end, n_keys - seqlen_q + m + 1)

    @cute.jit
    def apply(self, s, key, limit):
        """``s``, or ``-inf`` where ``key`` is at or past ``limit``."""
        if key >= limit:
            s = -Float32.inf
        return s
