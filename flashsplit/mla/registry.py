"""The MLA backend registry: every MLA backend says what it supports; ``"auto"`` picks among them.

An MLA backend has the :class:`MlaBackend` interface and is registered once by name.
``"auto"`` asks each whether it supports a problem, then lets :mod:`flashsplit.mla.selection`
pick among the able ones. Backends import GPU libraries lazily, inside their methods.
"""

from __future__ import annotations

import abc
import functools

import torch

from .problem import MlaProblem


class MlaBackend(abc.ABC):
    """Interface of an MLA backend.

    Partials (the contract of :func:`flashsplit.combine`): ``out_partial`` fp32 ``[S, B, s_q,
    H_q, 512]``, ``lse_partial`` fp32 ``[S, B, H_q, s_q]``, natural log, ``-inf`` for a split
    that saw no key; split boundaries follow :func:`flashsplit.plan.split_bounds`.
    """

    name: str = ""
    #: Listing order, and auto's fallback order.
    priority: int = 0

    @abc.abstractmethod
    def supports(self, problem: MlaProblem) -> str | None:
        """None when this backend can run ``problem``, else a sentence saying why not."""

    @abc.abstractmethod
    def block_m(self, problem: MlaProblem) -> int:
        """Packed rows (query tokens x q heads) per CTA tile."""

    def units_per_sm(self, problem: MlaProblem) -> int:
        """Split-kernel CTAs one SM runs at once (an input of the split heuristic)."""
        return 1

    @abc.abstractmethod
    def run(self, q: torch.Tensor, kv_cache: torch.Tensor, cache_seqlens: torch.Tensor,
            block_table: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor | None, *, num_splits: int,
            softmax_scale: float, causal: bool, kv_descale: torch.Tensor | None) -> None:
        """Decode into ``out`` ``[B, s_q, H_q, 512]`` and, unless None, ``lse`` fp32 ``[B, H_q,
        s_q]`` with ``num_splits`` splits (the plan's). Inputs are validated; never synchronizes."""

    @abc.abstractmethod
    def forward_partials(self, q, kv_cache, cache_seqlens, block_table, *, num_splits: int, softmax_scale: float,
                         causal: bool, kv_descale=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The split kernel alone: ``(out_partial, lse_partial)`` of every split of every row."""


_REGISTRY: dict[str, MlaBackend] = {}


def register(backend: MlaBackend) -> MlaBackend:
    if backend.name in _REGISTRY:
        raise ValueError(f"MLA backend {backend.name!r} is already registered")
    _REGISTRY[backend.name] = backend
    select.cache_clear()
    return backend


def names() -> list[str]:
    """Registered MLA backend names, best first."""
    return [b.name for b in sorted(_REGISTRY.values(), key=lambda b: -b.priority)]


def get(name: str) -> MlaBackend:
    if name not in _REGISTRY:
        raise ValueError(f"backend: expected 'auto' or one of {names()}, got {name!r}")
    return _REGISTRY[name]


@functools.lru_cache(maxsize=1024)  # supports() reads static facts only
def select(problem: MlaProblem, name: str = "auto") -> tuple[MlaBackend, str, str]:
    """``(backend, rule, reason)`` for ``problem``: a named backend (rule ``"requested"``; a
    ``ValueError`` with its reason when it cannot run the problem) or auto's choice."""
    from . import selection

    if name != "auto":
        backend = get(name)
        reason = backend.supports(problem)
        if reason is not None:
            raise ValueError(f"backend: {name!r} cannot run this MLA problem: {reason} (choices: 'auto', {names()})")
        return backend, "requested", "requested"
    able, refusals = [], []
    for candidate in sorted(_REGISTRY.values(), key=lambda b: -b.priority):
        reason = candidate.supports(problem)
        (able.append(candidate) if reason is None else refusals.append(f"{candidate.name}: {reason}"))
    if not able:
        raise ValueError("backend: no MLA backend supports this problem: " + "; ".join(refusals))
    best, rule, why = selection.choose(problem, able)
    if refusals:
        why += " (" + "; ".join(refusals) + ")"
    return best, rule, why
