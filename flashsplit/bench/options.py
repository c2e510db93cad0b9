"""The bench's option parsers: argparse ``type=`` callables (they raise ``ArgumentTypeError``, which
argparse reports as a usage error, exit 2), and the helpers that turn ``nargs`` values into the
lists the grid is built from. Pure Python, and the bottom of the bench package: it imports no
other bench module (:mod:`.cases` maps the names it accepts to torch dtypes).
"""

from __future__ import annotations

import argparse
import math
import re

#: Most queries per row ``--seqlen-q`` takes (speculative decoding drafts a few tokens).
MAX_SEQLEN_Q = 16

#: ``--kv-dtype`` names: "same" (q's dtype) or an fp8 format (:data:`.cases.KV_DTYPES` maps them).
SAME_KV = "same"
KV_DTYPE_NAMES = (SAME_KV, "fp8e4m3", "fp8e5m2")

_SEQLEN_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_seqlen(text: str) -> int:
    """``"16k"`` -> 16384, ``"1m"`` -> 1048576, ``"4096"`` -> 4096 (k = 1024: cache sizes are binary)."""
    match = _SEQLEN_RE.match(str(text))
    if not match:
        raise argparse.ArgumentTypeError(f"expected a key count like 4096, 16k or 1m, got {text!r}")
    number, suffix = float(match.group(1)), match.group(2).lower()
    value = number * {"": 1, "k": 1024, "m": 1024 * 1024}[suffix]
    if value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number of keys, got {text!r}")
    return int(value)


def format_seqlen(n: int) -> str:
    """Inverse of :func:`parse_seqlen` where exact: 16384 -> ``"16k"``, 1000 -> ``"1000"``."""
    if n >= 1024 * 1024 and n % (1024 * 1024) == 0:
        return f"{n // (1024 * 1024)}m"
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}k"
    return str(n)


def _split_list(text: str) -> list[str]:
    parts = [p for p in re.split(r"[,\s]+", str(text).strip()) if p]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected a non-empty list, got {text!r}")
    return parts


def parse_seqlen_list(text: str) -> list[int]:
    """``"1k,16k"`` -> ``[1024, 16384]`` (use with ``nargs="+"``; lists are flattened later)."""
    return [parse_seqlen(p) for p in _split_list(text)]


def parse_positive_int(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def parse_int_list(text: str) -> list[int]:
    """``"1,4,16"`` -> ``[1, 4, 16]``."""
    return [parse_positive_int(p) for p in _split_list(text)]


def parse_seqlen_q(text: str) -> int:
    """``--seqlen-q``: queries per row, an int in ``1..MAX_SEQLEN_Q``."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected queries per row, an integer in 1..{MAX_SEQLEN_Q}, "
                                         f"got {text!r}") from None
    if not 1 <= value <= MAX_SEQLEN_Q:
        raise argparse.ArgumentTypeError(f"expected queries per row in 1..{MAX_SEQLEN_Q}, got {text!r}")
    return value


def parse_seqlen_q_list(text: str) -> list[int]:
    """``"1,4"`` -> ``[1, 4]``."""
    return [parse_seqlen_q(p) for p in _split_list(text)]


def parse_splits(text: str) -> list[int]:
    """num_splits list for ``--sweep-splits``: ``"1-64"``, ``"1..64"`` or ``"1,2,4,30"``."""
    out: list[int] = []
    for part in _split_list(text):
        m = re.match(r"^(\d+)\s*(?:-|\.\.)\s*(\d+)$", part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo < 1 or hi < lo:
                raise argparse.ArgumentTypeError(f"expected a range lo-hi with 1 <= lo <= hi, got {part!r}")
            out.extend(range(lo, hi + 1))
        else:
            out.append(parse_positive_int(part))
    from ..plan import MAX_SPLITS

    if max(out) > MAX_SPLITS:
        raise argparse.ArgumentTypeError(f"num_splits above {MAX_SPLITS} are not supported, got {max(out)}")
    return sorted(set(out))


def parse_heads(text: str) -> tuple[int, int]:
    """``"32/8"`` -> ``(32, 8)``; q heads must be a multiple of KV heads."""
    m = re.match(r"^\s*(\d+)\s*/\s*(\d+)\s*$", str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"expected Q/KV heads like 32/8, got {text!r}")
    q, kv = int(m.group(1)), int(m.group(2))
    if q < 1 or kv < 1 or q % kv:
        raise argparse.ArgumentTypeError(f"expected q heads a positive multiple of KV heads, got {text!r}")
    return q, kv


def parse_head_dim(text: str) -> int:
    from ..problem import MAX_HEAD_DIM

    value = parse_positive_int(text)
    if value % 8 or value > MAX_HEAD_DIM:
        raise argparse.ArgumentTypeError(f"expected a head dim that is a multiple of 8 up to {MAX_HEAD_DIM}, "
                                         f"got {text!r}")
    return value


def parse_page_size(text: str) -> int:
    """``--page-size``: keys per page, 0 for a dense cache."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a page size (keys per page, 0 = dense), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a page size >= 0 (0 = dense), got {text!r}")
    return value


def parse_append_list(text: str) -> list[int]:
    """``--append``: new keys per row that each call writes, ``"0,1,4"`` -> ``[0, 1, 4]`` (0: none)."""
    out = []
    for part in _split_list(text):
        try:
            value = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected new keys per row (0 = no append), got {part!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"expected new keys per row >= 0 (0 = no append), got {part!r}")
        out.append(value)
    return out


def parse_page_size_list(text: str) -> list[int]:
    """``"0,1,16"`` -> ``[0, 1, 16]``."""
    return [parse_page_size(p) for p in _split_list(text)]


def parse_kv_dtype_list(text: str) -> list[str]:
    """``"same,fp8e4m3"`` -> ``["same", "fp8e4m3"]`` (names of :data:`KV_DTYPE_NAMES`)."""
    out = []
    for part in _split_list(text):
        name = part.lower()
        if name not in KV_DTYPE_NAMES:
            raise argparse.ArgumentTypeError(f"expected a KV dtype among {', '.join(KV_DTYPE_NAMES)}, got {part!r}")
        out.append(name)
    return out


def parse_window(text: str) -> int:
    """``--window``: keys left of the query, ``-1`` or ``none`` for no window."""
    t = str(text).strip().lower()
    if t == "none":
        return -1
    try:
        value = int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a window of keys >= 0, or -1 / none for no window, "
                                         f"got {text!r}") from None
    if value < -1:
        raise argparse.ArgumentTypeError(f"expected a window of keys >= 0, or -1 / none for no window, got {text!r}")
    return value


def parse_window_list(text: str) -> list[int]:
    """``"none,128"`` -> ``[-1, 128]``."""
    return [parse_window(p) for p in _split_list(text)]


def parse_softcap_list(text: str) -> list[float]:
    """``"0,30"`` -> ``[0.0, 30.0]`` (``--softcap``: finite values >= 0, 0 = off)."""
    out = []
    for part in _split_list(text):
        try:
            value = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a softcap >= 0 (0 = off), got {part!r}") from None
        if not (value >= 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"expected a finite softcap >= 0 (0 = off), got {part!r}")
        out.append(value)
    return out


_SWITCHES = {"on": True, "off": False}


def parse_switch(text: str) -> bool:
    """``--sinks`` / ``--batch-invariant`` values: ``on`` or ``off``."""
    name = str(text).strip().lower()
    if name not in _SWITCHES:
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return _SWITCHES[name]


def switch_values(values) -> list[bool]:
    """An ``nargs="*"`` switch as the values to run: absent (None) -> off; bare -> on; else as given."""
    if values is None:
        return [False]
    return list(dict.fromkeys(values)) if values else [True]


def flatten(lists) -> list[int]:
    """Flatten ``nargs="+"`` values of list-typed options, keeping order, dropping repeats."""
    seen: list[int] = []
    for item in lists:
        for v in item if isinstance(item, (list, tuple)) else [item]:
            if v not in seen:
                seen.append(v)
    return seen
