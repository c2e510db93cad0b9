"""The eager decode path: validate once per call signature, plan, pick a backend, launch.

:func:`decode_into` is what :func:`flashsplit.decode` runs outside torch.compile (and what the
``flashsplit::decode_into`` operator runs inside it). Validation, backend choice and the plan read
only static facts of the arguments (shapes, strides, dtypes, devices, 16-byte alignment, the
options), so they run once per call signature and are cached with the backend's prepared
launcher: a decode loop pays them on its first step only.
"""

from __future__ import annotations

import functools

import torch

from . import native, registry
from .native.steps import HostSteps
from .call import DecodeOptions, DecodeTensors
from .plan import (BATCH_INVARIANT_MIN_SPLIT, BATCH_INVARIANT_SPLITS, MAX_SPLITS, SPLIT_GRANULE, SplitPlan, cdiv,
                   choose_num_splits, splits_used, tokens_per_split)
from .problem import DecodeProblem
from .validation import check_decode_inputs, check_lse_out, check_softmax_scale
from .registry import Backend, select


@functools.lru_cache(maxsize=4096)  # static facts in, frozen plan out: one dict lookup per decode step
def make_plan(problem: DecodeProblem, backend: Backend, rule: str, backend_reason: str, num_splits: int) -> SplitPlan:
    """The :class:`SplitPlan` of ``problem`` on ``backend`` (``num_splits`` 0: the heuristic's)."""
    num_sms = problem.num_sms
    block_m = backend.block_m(problem)
    row_blocks = cdiv(problem.packed_rows, block_m)
    work_units = problem.work_units(block_m)
    units_per_sm = backend.units_per_sm(problem)
    span, invariant = problem.span, problem.batch_invariant
    if invariant:
        num_splits = max(1, splits_used(span, 0, invariant=True))
        split_reason = (f"batch-invariant: each row in up to {BATCH_INVARIANT_SPLITS} splits of "
                        f">= {BATCH_INVARIANT_MIN_SPLIT} keys, from its own length")
    elif num_splits == 0:
        cap = backend.split_cap(problem)
        num_splits, split_reason = choose_num_splits(work_units, span, num_sms, units_per_sm,
                                                     max_splits=cap[0] if cap else MAX_SPLITS)
        if cap and num_splits == cap[0]:
            split_reason += f"; at most {cap[0]} splits: {cap[1]}"
    else:
        split_reason = "requested"
    return SplitPlan(
        backend=backend.name,
        rule=rule,
        backend_reason=backend_reason,
        num_splits=num_splits,
        split_reason=split_reason,
        granule=SPLIT_GRANULE,
        tokens_per_split=tokens_per_split(span, num_splits, invariant=invariant),
        block_m=block_m,
        row_blocks=row_blocks,
        work_units=work_units,
        grid=(num_splits, problem.batch, problem.num_heads_kv * row_blocks),
        num_sms=num_sms,
        units_per_sm=units_per_sm,
        runs_combine=num_splits > 1,
        gpu=problem.target.name if problem.target is not None else problem.device_type,
        span=span,
        seqlen_q=problem.seqlen_q,
        window_left=problem.window_left,
        batch_invariant=invariant,
    )


def decode_into(tensors: DecodeTensors, options: DecodeOptions, fresh_out: bool = False) -> None:
    """Decode ``tensors`` (outputs included) with ``options``; validates every argument.

    ``fresh_out``: ``tensors.out`` is ``torch.empty_like(q)``, made by :func:`flashsplit.decode`
    (its facts then follow from q's, so the signature need not read them).
    """
    key = signature(tensors, options, fresh_out)
    last_key, run = _PREPARED.last
    if key is None or key != last_key:
        run = _PREPARED.get_or_make(key, prepare, tensors, options)  # (no closure: it would cost every call)
    run(tensors)
    if fresh_out and _NATIVE:
        HOST_STEPS.offer(key, run, tensors, options)


class SignatureCache(dict):
    """Values by call signature (:func:`signature`; a None key is never cached), at most
    ``max_size`` of them (then cleared), with the last one looked up kept aside as ``last``.

    A decode loop repeats one signature: comparing its key with the last one (0.28 us on a
    2-core x86 host) spares hashing it for a lookup (0.59 us, of the 3.8 us an eager call's layer
    above the launch takes there). Every change of the dict forgets ``last``, so it is never
    stale.
    """

    _EMPTY = (object(), None)  # a key no signature equals

    def __init__(self, max_size: int, on_change=None):
        super().__init__()
        self.max_size = max_size
        self.last = self._EMPTY
        self._on_change = on_change  # called after every change of the dict

    def get_or_make(self, key, make, *args):
        """The value of ``key``, or ``make(*args)``'s, cached under ``key`` (an unhashable key, an
        option like a list: made, not cached; validation inside ``make`` explains it)."""
        try:
            value = self.get(key) if key is not None else None
        except TypeError:
            key = value = None
        if value is None:
            value = make(*args)
            if key is not None:
                if len(self) >= self.max_size:
                    self.clear()
                self[key] = value
        elif key is not None:
            self.last = key, value
        return value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.last = key, value
        self._changed()

    def __delitem__(self, key):
        super().__delitem__(key)
        self.last = self._EMPTY
        self._changed()

    def clear(self):
        super().clear()
        self.last = self._EMPTY
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    def _refuse(self, *args, **kwargs):
        raise TypeError("SignatureCache: change entries by item assignment, del or clear()")

    pop = popitem = setdefault = update = __ior__ = _refuse


#: The native host steps :func:`flashsplit.decode` tries first: each is built from a prepared
#: launcher, so every change of the prepared launchers drops them.
HOST_STEPS = HostSteps()
_NATIVE = native.enabled()
_PREPARED = SignatureCache(max_size=4096, on_change=HOST_STEPS.clear)  # call signature -> prepared launcher
registry.on_change(_PREPARED.clear)  # a prepared launcher embeds the backend choice
registry.on_change(make_plan.cache_clear)  # a backend's split cap may follow its launch rules' settings


_FRESH_OUT = "out = torch.empty_like(q)"  # the marker a fresh output is keyed by
_Tensor = torch.Tensor


def _facts(t):
    """What validation and the kernels' specialization read of a tensor argument: everything but
    its values and its address (beyond 16-byte alignment). A tensor of another layout than strided
    has no ``data_ptr()`` (sparse, mkldnn) or no ``shape`` (nested): it raises here, so it is never
    cached."""
    if t is None:
        return None
    if type(t) is not _Tensor:
        raise TypeError  # a subclass or a wrong type: validation explains, nothing cached
    return t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15


def signature(tensors: DecodeTensors, options: DecodeOptions, fresh_out: bool = False) -> tuple | None:
    """A key of one call's static facts (:func:`_facts` of every tensor, the options with their
    types and the window bounds' types, so ``True`` and ``1`` differ), or None (then nothing is
    cached). The types precede the options: comparing a key with a cached one (valid options)
    never asks an odd option, a tensor say, whether it equals a valid one. It can still be
    unhashable (an unhashable option): the lookup catches that. A ``fresh_out``
    (``torch.empty_like(q)``) is keyed by a marker: its facts follow from q's.

    This runs on every eager call, so it reads each fact once, inline, and an absent optional
    tensor costs one comparison: a plain call's key (q, caches, ``cache_seqlens``) takes 1.95 us on
    a 2-core x86 host, where mapping :func:`_facts` over every field took 3.3.

    Negated views (``is_neg()``, refused by validation) are keyed apart where public ops can make
    one with a valid tensor's facts: the descales, which may have any strides. Elsewhere they
    cannot: ``.conj().imag`` has a last-dim stride of 2, never that of a valid q, cache, out, lse
    or sinks, and there are no complex int32 tensors."""
    try:
        (q, k, v, out, lse, seqlens, block_table, k_descale, v_descale, sinks,
         k_new, v_new, rotary_cos, rotary_sin, batch_idx, leftpad) = tensors
        if not (type(q) is type(k) is type(v) is _Tensor):
            return None  # a subclass or a wrong type: validation explains, nothing cached
        if (k_new is None and v_new is None and rotary_cos is None and rotary_sin is None and batch_idx is None
                and leftpad is None):
            updates = None  # the cache-update tensors: usually all absent
        else:
            updates = tuple(None if u is None else _facts(u) for u in tensors[10:])
        if seqlens is not None:
            if type(seqlens) is not _Tensor:
                return None
            seqlens = seqlens.shape, seqlens.stride(), seqlens.dtype, seqlens.device, seqlens.data_ptr() & 15
        return (q.shape, q.stride(), q.dtype, q.device, q.data_ptr() & 15,
                k.shape, k.stride(), k.dtype, k.device, k.data_ptr() & 15,
                v.shape, v.stride(), v.dtype, v.device, v.data_ptr() & 15,
                _FRESH_OUT if fresh_out else _facts(out),
                None if lse is None else _facts(lse),
                seqlens,
                None if block_table is None else _facts(block_table),
                None if k_descale is None else (_facts(k_descale), k_descale.is_neg()),
                None if v_descale is None else (_facts(v_descale), v_descale.is_neg()),
                None if sinks is None else _facts(sinks), updates,
                tuple(map(type, options)), tuple(map(type, options[4])), options)
    except Exception:  # a wrong type, a sparse tensor's stride(), ...: validation explains
        return None


def prepare(tensors: DecodeTensors, options: DecodeOptions):
    """Validate one call and return ``run(tensors)`` that decodes every call with the same static
    facts."""
    backend = options.backend
    problem = check_decode_inputs(tensors, options)
    check_lse_out(tensors.lse, problem.batch, problem.num_heads, problem.seqlen_q, tensors.q.device)
    softmax_scale = check_softmax_scale(options.softmax_scale, problem.head_dim)
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a str, got {type(backend).__name__}")
    chosen, rule, reason = select(problem, backend)
    if problem.batch == 0 or problem.num_heads == 0:
        return _nothing_to_do
    if problem.seqlen_k == 0:
        return _no_keys
    the_plan = make_plan(problem, chosen, rule, reason, options.num_splits)
    return chosen.prepare(problem, the_plan.num_splits, softmax_scale)


def _nothing_to_do(tensors: DecodeTensors) -> None:
    pass


def _no_keys(tensors: DecodeTensors) -> None:
    """A cache with no slots: every row is empty (O = 0, LSE = -inf, or each q head's sink)."""
    tensors.out.zero_()
    if tensors.lse is not None:
        if tensors.sinks is None:
            tensors.lse.fill_(float("-inf"))
        else:
            tensors.lse.copy_(tensors.sinks.float()[None, :, None].expand_as(tensors.lse))
