"""The backend registry: every backend declares what it supports; ``"auto"`` picks among them.

A backend is an object with the :class:`Backend` interface, registered once by name with a
priority. ``"auto"`` asks every backend whether it supports a problem, then lets
:mod:`flashsplit.selection` (the one place that holds auto's rules and their measurements) pick
among those that can. Backends that need optional packages import them lazily, inside their
methods, so ``import flashsplit`` needs neither a GPU nor cutlass.
"""

from __future__ import annotations

import abc
import functools

import torch

from .problem import DecodeProblem


class Backend(abc.ABC):
    """Interface every backend implements.

    Partial contract (identical for every backend, so combines can be mixed and matched):
    ``out_partial`` fp32 ``[num_splits, batch, seqlen_q, num_heads, head_dim]``,
    ``lse_partial`` fp32 ``[num_splits, batch, num_heads, seqlen_q]``, natural log, ``-inf`` for
    a split with no visible key (its ``out_partial`` slice is then never read and may hold
    anything). Split boundaries follow :mod:`flashsplit.plan` exactly.
    """

    name: str = ""
    #: Order of the registry's listings, and ``"auto"``'s fallback order when the backend its
    #: rule names cannot run a problem.
    priority: int = 0

    @abc.abstractmethod
    def supports(self, problem: DecodeProblem) -> str | None:
        """``None`` when this backend can run ``problem``, else a sentence saying why not."""

    @abc.abstractmethod
    def block_m(self, problem: DecodeProblem) -> int:
        """Packed rows (query positions x q heads of one KV head) per CTA tile."""

    def units_per_sm(self, problem: DecodeProblem) -> int:
        """How many split-kernel CTAs one SM runs at once (an input of the split heuristic)."""
        return 1

    def split_cap(self, problem: DecodeProblem) -> tuple[int, str] | None:
        """``(most splits, why)`` where this backend runs ``problem`` best with at most that many
        splits (the split heuristic then chooses among those); None: no cap."""
        return None

    @abc.abstractmethod
    def prepare(self, problem: DecodeProblem, num_splits: int, softmax_scale: float):
        """A callable ``run(tensors)`` that decodes a :class:`~flashsplit.call.DecodeTensors` of
        ``problem``'s static facts with ``num_splits`` splits (the plan's): writes ``tensors.out``
        ``[B, L_q, H_q, D]`` and, when given, ``tensors.lse`` fp32 ``[B, H_q, L_q]``.

        Inputs are already validated and ``supports`` accepted the problem. The dispatcher caches
        ``run`` per call signature, so it may keep launch handles; it must not synchronize with the
        host. A paged cache comes with ``block_table`` int32 ``[B, max_pages]`` (then ``k_cache``
        is ``[num_pages, page_size, H_kv, D]``); an fp8 cache with fp32 ``k_descale``/``v_descale``
        (one element, or ``[B, H_kv]``). With one split no partials are written; rows that use a
        single split may also skip the partials and write ``out`` directly.
        """

    @abc.abstractmethod
    def forward_partials(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        cache_seqlens: torch.Tensor | None,
        num_splits: int,
        softmax_scale: float,
        causal: bool,
        block_table: torch.Tensor | None = None,
        k_descale: torch.Tensor | None = None,
        v_descale: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the split kernel alone; return ``(out_partial, lse_partial)`` for every split of
        every row (no single-split shortcut), for parity tests and mix-and-match combines."""

    @abc.abstractmethod
    def combine(
        self,
        out_partial: torch.Tensor,
        lse_partial: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor | None,
    ) -> None:
        """Merge partials (contract above) into ``out`` ``[B, L_q, H_q, D]`` and ``lse``."""


_REGISTRY: dict[str, Backend] = {}
_ON_CHANGE: list = []  # caches built from backend choices (the api's prepared launchers)


def on_change(clear) -> None:
    """Call ``clear()`` whenever backend choices may have changed (see :func:`invalidate`)."""
    _ON_CHANGE.append(clear)


def invalidate() -> None:
    """Forget every cached backend choice: :func:`select`'s and those of :func:`on_change`
    listeners. Called on :func:`register`; call it after changing what a backend supports."""
    select.cache_clear()
    for clear in _ON_CHANGE:
        clear()


def register(backend: Backend) -> Backend:
    if backend.name in _REGISTRY:
        raise ValueError(f"backend {backend.name!r} is already registered")
    _REGISTRY[backend.name] = backend
    invalidate()
    return backend


def names() -> list[str]:
    """Registered backend names, best first."""
    return [b.name for b in sorted(_REGISTRY.values(), key=lambda b: -b.priority)]


def get(name: str) -> Backend:
    if name not in _REGISTRY:
        raise ValueError(f"backend: expected 'auto' or one of {names()}, got {name!r}")
    return _REGISTRY[name]


@functools.lru_cache(maxsize=4096)  # supports() reads only static facts; decode asks every step
def select(problem: DecodeProblem, name: str = "auto") -> tuple[Backend, str, str]:
    """``(backend, rule, reason)``: the backend that runs ``problem``, the selection rule that
    picked it (``"requested"`` for a named backend; :mod:`flashsplit.selection` for ``"auto"``)
    and a sentence saying why.

    A named backend that cannot run the problem raises ``ValueError`` with its reason.
    """
    from . import selection

    if name != "auto":
        backend = get(name)
        reason = backend.supports(problem)
        if reason is not None:
            raise ValueError(f"backend: {name!r} cannot run this problem: {reason} (choices: 'auto', {names()})")
        return backend, "requested", "requested"
    refusals, able = [], []
    for candidate in sorted(_REGISTRY.values(), key=lambda b: -b.priority):
        reason = candidate.supports(problem)
        if reason is None:
            able.append(candidate)
        else:
            refusals.append(f"{candidate.name}: {reason}")
    if not able:
        raise ValueError("backend: no backend supports this problem: " + "; ".join(refusals))
    best, rule, why = selection.choose(problem, able)
    others = [b.name for b in able if b is not best]
    if others:
        why += " (also able: " + ", ".join(others) + ")"
    if refusals:
        why += " (" + "; ".join(refusals) + ")"
    return best, rule, why
