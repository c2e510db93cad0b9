"""The contenders: everything the bench times, behind one small interface.

Each contender has a ``name``, ``available() -> reason or None`` (static facts: package
importable, backend registered, a CUDA GPU present) and ``prepare(case, inputs) -> Prepared``,
which does all setup outside the timed region (layout views or copies, planning, compiling)
and returns a callable that runs one call on input set ``i``. ``prepare`` raises
:class:`Unsupported` when a contender cannot run a case (a skip, not a failure).

Cache formats: ``format_reason(case)`` says why a contender cannot take a case's paged or fp8
cache (None: it can). Such a cell is skipped with that reason, never timed on a dense or
16-bit copy instead: a row's time is always for the format its row names. Likewise
``variant_reason(case)`` for an attention variant and ``queries_reason(case)`` for several
queries per row (``L_q > 1``: causal, bottom-right aligned, as FlashAttention's ``causal=True``).

Optional packages (FlashInfer, FlashAttention) are imported lazily, only when asked about.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import importlib
import inspect
from dataclasses import dataclass, field
from typing import Callable

import torch

from .cases import KV_DTYPES, Case
from .device import cuda_available, synchronize
from .inputs import InputSets
from .masks import flex_block_mask, sdpa_causal_mask, sdpa_refused

NO_GPU_REASON = "needs a CUDA GPU; none found"

#: Attention-variant features (:class:`~.cases.Variant` field names) and their names in reasons.
VARIANT_FEATURES = {"window": "sliding-window", "softcap": "softcap", "sinks": "sinks",
                    "batch_invariant": "batch-invariant", "append": "new-key append", "rotary": "rotary"}


def case_features(case: Case) -> list[str]:
    """The :data:`VARIANT_FEATURES` keys ``case`` uses (empty for plain attention)."""
    used = {"window": case.window >= 0, "softcap": case.softcap > 0, "sinks": case.sinks,
            "batch_invariant": case.batch_invariant, "append": case.append > 0, "rotary": case.rotary}
    return [f for f in VARIANT_FEATURES if used[f]]


def _no_input(library: str, features: list[str], where: str = "in the bench's call") -> str:
    return f"{library} has no {'/'.join(VARIANT_FEATURES[f] for f in features)} input {where}"


def _signature_params(fn) -> frozenset | None:
    """The parameter names of ``fn`` (None when its signature cannot be read, e.g. a C builtin)."""
    try:
        return frozenset(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


class Unsupported(Exception):
    """A contender cannot run a case; its message says why (the row is skipped, not failed)."""


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def _noop() -> None:
    return None


@dataclass
class Prepared:
    """A contender ready to run one case.

    ``run(i)`` runs one call on input set ``i`` and returns its raw output; ``to_bshd`` turns
    that output into ``[B, L_q, H, D]`` for the correctness check (outside timing); ``close``
    undoes setup (e.g. leaves an ``sdpa_kernel`` context).
    """

    run: Callable[[int], object]
    to_bshd: Callable[[object], torch.Tensor] = _identity
    num_splits: int | None = None
    note: str = ""
    close: Callable[[], None] = field(default=_noop)

    def __call__(self, i: int):
        return self.run(i)


class Contender(abc.ABC):
    """One thing to time. Subclasses set ``name`` and ``family`` and implement the hooks."""

    name: str = ""
    #: "flashsplit", "torch" or "external": how the renderer groups and colours rows.
    family: str = ""
    #: What skip reasons call the library ("torch SDPA"); defaults to ``name``.
    library: str = ""
    #: Cache formats taken besides a dense 16-bit cache: a subset of {"paged", "fp8"}.
    formats: frozenset = frozenset()
    #: Attention variants taken besides plain attention: a subset of :data:`VARIANT_FEATURES`.
    variants: frozenset = frozenset()
    #: Takes several queries per row (``L_q > 1``), attending causally, bottom-right aligned.
    multi_query: bool = False
    #: Computes attention, so its output is checked against the reference before it is timed.
    checks_output: bool = True

    def format_reason(self, case: Case) -> str | None:
        """Why this contender cannot take ``case``'s cache format (None: it can)."""
        missing = [f for f, wanted in (("paged", case.paged), ("fp8", case.fp8)) if wanted and f not in self.formats]
        if not missing:
            return None
        return f"{self.library or self.name} has no {'/'.join(missing)} KV input"

    def variant_reason(self, case: Case) -> str | None:
        """Why this contender cannot run ``case``'s attention variant (None: it can)."""
        missing = [f for f in case_features(case) if f not in self.variants]
        return _no_input(self.library or self.name, missing) if missing else None

    def queries_reason(self, case: Case) -> str | None:
        """Why this contender cannot run ``case``'s ``L_q`` queries per row (None: it can)."""
        if case.seqlen_q == 1 or self.multi_query:
            return None
        return f"{self.library or self.name} has no causal multi-query (L_q > 1) input in the bench's call"

    def skip_reason(self, case: Case) -> str | None:
        """The first of the format, variant and queries reasons (None: it can run ``case``)."""
        return self.format_reason(case) or self.variant_reason(case) or self.queries_reason(case)

    def static_reason(self) -> str | None:
        """Why this contender cannot run here regardless of the GPU (None: it can)."""
        return None

    def available(self) -> str | None:
        """``None`` when this contender can run on this machine, else a sentence saying why not."""
        return self.static_reason() or (None if cuda_available() else NO_GPU_REASON)

    def plan(self, case: Case, num_sms: int):
        """The flashsplit :class:`~flashsplit.SplitPlan` for ``case`` (None for other libraries)."""
        return None

    @abc.abstractmethod
    def prepare(self, case: Case, inputs: InputSets) -> Prepared:
        """Set up ``case`` on ``inputs`` (outside timing); raise :class:`Unsupported` to skip."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


# -- flashsplit ------------------------------------------------------------------------------

class FlashsplitContender(Contender):
    """``flashsplit.decode(..., backend=backend, num_splits=num_splits)`` (0: the heuristic), with
    ``block_table`` / ``k_descale`` / ``v_descale`` for paged / fp8 caches and ``window_size`` /
    ``softcap`` / ``sinks`` / ``batch_invariant`` / ``k``, ``v`` and the rotary tables for a
    variant, ``causal=True`` for several queries per row (a backend that refuses the format,
    variant or queries is skipped with the registry's reason; so is a fixed ``num_splits`` under
    batch-invariant decode, which fixes the split length itself)."""

    family = "flashsplit"
    formats = frozenset({"paged", "fp8"})
    variants = frozenset(VARIANT_FEATURES)
    multi_query = True

    def __init__(self, name: str, backend: str, num_splits: int = 0):
        self.name = name
        self.backend = backend
        self.num_splits = num_splits

    def static_reason(self) -> str | None:
        from ..registry import names

        if self.backend != "auto" and self.backend not in names():
            return f"flashsplit backend {self.backend!r} is not registered in this build (registered: {names()})"
        return None

    def plan(self, case: Case, num_sms: int):
        import flashsplit

        try:
            return flashsplit.plan(case.batch, case.capacity, case.num_heads, case.num_heads_kv, case.head_dim,
                                   seqlen_q=case.seqlen_q, causal=case.causal, dtype=case.torch_dtype,
                                   has_cache_seqlens=True, page_size=case.page_size,
                                   kv_dtype=KV_DTYPES[case.kv_dtype], num_splits=self.num_splits,
                                   num_sms=num_sms, device="cuda", backend=self.backend,
                                   window_size=case.window_size, softcap=case.softcap, has_sinks=case.sinks,
                                   batch_invariant=case.batch_invariant, seqlen_new=case.append,
                                   rotary_dim=case.head_dim if case.rotary else 0)
        except ValueError as e:  # the registry's refusal carries the backend's reason
            raise Unsupported(str(e)) from None

    def prepare(self, case: Case, inputs: InputSets) -> Prepared:
        import flashsplit

        device = inputs.q[0].device
        num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132
        the_plan = self.plan(case, num_sms)
        q, k, v, lens = inputs.q, inputs.k, inputs.v, inputs.cache_seqlens
        backend, num_splits = self.backend, self.num_splits
        variant = inputs.variant_kwargs()  # window_size, softcap, sinks, batch_invariant, causal (plain: none)
        # + block_table, descales; an append's k, v (and rotary tables)
        extra = [{**inputs.cache_kwargs(i), **variant, **inputs.append_kwargs(i)} for i in range(len(inputs))]

        def run(i: int):
            return flashsplit.decode(q[i], k[i], v[i], cache_seqlens=lens, num_splits=num_splits, backend=backend,
                                     **extra[i])

        note = f"backend {the_plan.backend}"
        if case.window >= 0:
            note += f"; splits cover {the_plan.span} keys"
        return Prepared(run, num_splits=the_plan.num_splits, note=note)


# -- torch -----------------------------------------------------------------------------------

def _bhld_views(inputs: InputSets, contiguous: bool):
    """SDPA's layout: q ``[B, H, L_q, D]``, k/v ``[B, H_kv, L, D]``; views of the cache (flash
    SDPA's native layout is ours, so no copy) or contiguous copies when a kernel needs them."""
    def conv(t: torch.Tensor) -> torch.Tensor:
        t = t.transpose(1, 2)
        return t.contiguous() if contiguous else t

    return [conv(t) for t in inputs.q], [conv(t) for t in inputs.k], [conv(t) for t in inputs.v]


def _with_layout_fallback(make_run: Callable[[bool], Callable[[int], object]]) -> tuple[Callable[[int], object], str]:
    """Try a contender on zero-copy views; if a kernel rejects the strides, on contiguous copies."""
    run = make_run(False)
    try:
        run(0)
        synchronize()
        return run, "strided views"
    except RuntimeError as first:
        try:
            run = make_run(True)
            run(0)
            synchronize()
        except Exception:
            raise first from None
        return run, f"contiguous [B,H,L,D] copies (views failed: {str(first).splitlines()[0][:80]})"


class SdpaContender(Contender):
    """``torch.nn.functional.scaled_dot_product_attention`` pinned to one backend; several queries
    per row get a bottom-right causal mask (:func:`~.masks.sdpa_causal_mask`), or are skipped where the
    backend has no kernel for it."""

    family = "torch"
    library = "torch SDPA"
    multi_query = True

    def __init__(self, name: str, backend_attr: str):
        self.name = name
        self.backend_attr = backend_attr  # an SDPBackend member name

    def static_reason(self) -> str | None:
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
        except ImportError as e:
            return f"torch {torch.__version__} has no torch.nn.attention.sdpa_kernel ({e})"
        if not hasattr(SDPBackend, self.backend_attr):
            return f"torch {torch.__version__} has no SDPBackend.{self.backend_attr}"
        return None

    def available(self) -> str | None:
        reason = super().available()
        if reason is None and self.backend_attr == "CUDNN_ATTENTION" and not torch.backends.cudnn.is_available():
            return "cuDNN is not available in this torch build"
        return reason

    def prepare(self, case: Case, inputs: InputSets) -> Prepared:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        # The backend flags are process-global: enter the context once here (not per call, which
        # would add host time to every eager call) and leave it in close().
        stack = contextlib.ExitStack()
        stack.enter_context(sdpa_kernel(getattr(SDPBackend, self.backend_attr)))
        mask, mask_note = sdpa_causal_mask(self.backend_attr, case, inputs.q[0].device)
        masked = {} if mask is None else {"attn_mask": mask}  # L_q = 1: exactly the plain call

        def make_run(contiguous: bool):
            qs, ks, vs = _bhld_views(inputs, contiguous)
            return lambda i: sdpa(qs[i], ks[i], vs[i], enable_gqa=True, **masked)

        try:
            run, note = _with_layout_fallback(make_run)
        except BaseException as e:
            stack.close()
            if mask is not None and sdpa_refused(e):
                first = str(e).strip().splitlines()[0][:120]
                raise Unsupported(f"torch SDPA's {self.backend_attr} backend has no kernel for a bottom-right causal "
                                  f"mask of {case.seqlen_q} queries ({first})") from None
            raise
        note = "; ".join(p for p in (note, mask_note) if p)
        return Prepared(run, to_bshd=lambda o: o.transpose(1, 2), note=note, close=stack.close)


class FlexContender(Contender):
    """``torch.compile(flex_attention)`` (FlexDecoding at L_q = 1; several queries per row get a
    bottom-right causal block mask, :func:`~.masks.flex_block_mask`); compiled at prepare time."""

    family = "torch"
    name = "flex"
    library = "torch FlexAttention"
    multi_query = True

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._compiled = None

    def static_reason(self) -> str | None:
        if not self.enabled:
            return "disabled (--no-flex)"
        try:
            from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
        except ImportError as e:
            return f"torch {torch.__version__} has no flex_attention ({e})"
        return None

    def _compile(self):
        if self._compiled is None:
            import torch._dynamo
            from torch.nn.attention.flex_attention import flex_attention

            # Every grid cell is a new static shape, hence a recompile; the default limit (8)
            # would silently fall back to eager flex, which materialises the scores.
            for knob in ("recompile_limit", "cache_size_limit"):
                if hasattr(torch._dynamo.config, knob):
                    setattr(torch._dynamo.config, knob, max(256, getattr(torch._dynamo.config, knob)))
            self._compiled = torch.compile(flex_attention, dynamic=False)
        return self._compiled

    def prepare(self, case: Case, inputs: InputSets) -> Prepared:
        flex = self._compile()
        block_mask = flex_block_mask(case, inputs.q[0].device)
        masked = {} if block_mask is None else {"block_mask": block_mask}

        def make_run(contiguous: bool):
            qs, ks, vs = _bhld_views(inputs, contiguous)
            return lambda i: flex(qs[i], ks[i], vs[i], enable_gqa=True, **masked)

        run, note = _with_layout_fallback(make_run)  # the first call compiles (outside timing)
        if block_mask is not None:
            note += "; bottom-right causal block mask"
        return Prepared(run, to_bshd=lambda o: o.transpose(1, 2), note=note)


# -- other libraries -------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _import_reason(module: str) -> str | None:
    """None if ``module`` imports, else why not (cached: importing some libraries is slow)."""
    try:
        importlib.import_module(module)
    except Exception as e:  # ImportError, or a broken install raising anything else
        return f"{module} is not importable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return None


def _in_dtype(tensor, dtype):
    """``tensor`` cast to ``dtype`` (None stays None)."""
    return None if tensor is None else tensor.to(dtype)


class FlashAttnContender(Contender):
    """FlashAttention's ``flash_attn_with_kvcache`` (``flash_attn`` = FA2, ``flash_attn_interface`` = FA3).

    The block table goes in as ``block_table`` (FA2) or ``page_table`` (FA3), by the signature;
    so do the variants: ``window_size=(w, 0)``, ``softcap``, sinks (whichever of
    :data:`SINK_PARAMS` the build has), for batch-invariant decode ``num_splits=1``, and an
    append's ``k``, ``v``, ``rotary_cos``, ``rotary_sin`` (sinks and tables in q's dtype, as
    FlashAttention-3 requires); several queries per row get
    ``causal=True`` (FlashAttention's causal mask is bottom-right aligned).
    """

    family = "external"
    formats = frozenset({"paged"})
    multi_query = True
    #: FA2's paged path needs pages of a multiple of 256 keys; FA3 takes any page size.
    FA2_PAGE_MULTIPLE = 256
    #: Names builds of flash_attn_with_kvcache give a per-q-head sink logit parameter.
    SINK_PARAMS = ("sinks", "s_aux", "learnable_sink")
    #: Inputs FlashAttention-3 takes in q's dtype only (it refuses fp32 rotary tables); the sinks too.
    Q_DTYPE_PARAMS = frozenset({"rotary_cos", "rotary_sin"})

    def __init__(self, name: str, module: str):
        self.name = name
        self.module = module
        self.library = f"{module}.flash_attn_with_kvcache"

    def format_reason(self, case: Case) -> str | None:
        if case.fp8:
            return f"{self.library} has no fp8 KV input with a 16-bit q (its fp8 path is all-fp8, q included)"
        if case.paged and self.module == "flash_attn" and case.page_size % self.FA2_PAGE_MULTIPLE:
            return (f"{self.library} (FA2) has no paged KV input with page size {case.page_size} "
                    f"(needs a multiple of {self.FA2_PAGE_MULTIPLE})")
        return super().format_reason(case)

    def static_reason(self) -> str | None:
        return _import_reason(self.module)

    def _function(self):
        return importlib.import_module(self.module).flash_attn_with_kvcache

    def _variant_param(self, feature: str, params: frozenset) -> str | None:
        """The keyword that carries ``feature`` in this build (None: it has none)."""
        if feature == "sinks":
            return next((p for p in self.SINK_PARAMS if p in params), None)
        wanted = {"window": "window_size", "softcap": "softcap", "batch_invariant": "num_splits", "append": "k",
                  "rotary": "rotary_cos"}[feature]
        return wanted if wanted in params else None

    def variant_reason(self, case: Case) -> str | None:
        features = case_features(case)
        if not features or _import_reason(self.module):  # plain, or available() says why not
            return None
        params = _signature_params(self._function())
        if params is None:
            return f"{self.library}'s signature cannot be read, so no variant input can be passed"
        missing = [f for f in features if self._variant_param(f, params) is None]
        return _no_input(self.library, missing, "in this build") if missing else None

    def queries_reason(self, case: Case) -> str | None:
        if not case.causal or _import_reason(self.module):  # L_q = 1, or available() says why not
            return None
        params = _signature_params(self._function())
        if params is not None and "causal" not in params:
            return f"{self.library} has no causal input in this build (needed for L_q > 1)"
        return None

    def prepare(self, case: Case, inputs: InputSets) -> Prepared:
        fn = self._function()
        params = _signature_params(fn) or frozenset()
        q, k, v = inputs.q, inputs.k, inputs.v
        dtype = q[0].dtype
        kwargs = {"cache_seqlens": inputs.cache_seqlens}
        if inputs.block_table is not None:
            kwargs["page_table" if "page_table" in params and "block_table" not in params else "block_table"] = \
                inputs.block_table
        note = "num_splits chosen by the library"
        if case.causal:
            if "causal" not in params:
                raise Unsupported(f"{self.library} has no causal input in this build (needed for L_q > 1)")
            kwargs["causal"] = True
        for feature in case_features(case):
            name = self._variant_param(feature, params)
            if name is None:
                raise Unsupported(_no_input(self.library, [feature], "in this build"))
            if feature in ("append", "rotary"):  # per input set: append_kwargs below
                continue
            kwargs[name] = {"window": case.window_size, "softcap": case.softcap,
                            "sinks": _in_dtype(inputs.sinks, dtype), "batch_invariant": 1}[feature]
            if feature == "batch_invariant":
                note = "num_splits=1 (one split per row: batch-invariant by construction)"
        extra = [{name: _in_dtype(value, dtype) if name in self.Q_DTYPE_PARAMS else value
                  for name, value in inputs.append_kwargs(i).items()} for i in range(len(inputs))]

        def run(i: int):
            return fn(q[i], k[i], v[i], **kwargs, **extra[i])

        # Some versions return (out, lse); the check wants the output only.
        return Prepared(run, to_bshd=lambda o: o[0] if isinstance(o, (tuple, list)) else o, note=note)


class FlashInferContender(Contender):
    """FlashInfer's ``BatchDecodeWithPagedKVCacheWrapper`` (tensor-core decode, NHD pages).

    Dense cells: our ``[B, L, H_kv, D]`` cache is already ``B * L / 16`` contiguous pages of
    ``[16, H_kv, D]``, so the paged cache is a view; row b owns pages ``[b * L/16, (b+1) * L/16)``.
    Paged cells: the bench's own shuffled pages, the block table flattened into FlashInfer's
    CSR page indices.
    """

    family = "external"
    name = "flashinfer"
    formats = frozenset({"paged"})
    #: Variant features and the ``plan`` keyword that carries each (where the release has it).
    PLAN_PARAMS = {"window": "window_left", "softcap": "logits_soft_cap"}
    PAGE_SIZE = 16
    WORKSPACE_BYTES = 128 * 1024 * 1024

    def format_reason(self, case: Case) -> str | None:
        if case.fp8:
            return ("flashinfer has no fp8 KV input with per-(row, KV head) scales (its decode takes one k/v "
                    "scale per call)")
        return super().format_reason(case)

    def static_reason(self) -> str | None:
        return _import_reason("flashinfer")

    def queries_reason(self, case: Case) -> str | None:
        if not case.causal:
            return None
        return (f"flashinfer's BatchDecodeWithPagedKVCacheWrapper is decode-only: one query per row, not L_q = "
                f"{case.seqlen_q} (its prefill wrapper is not in the bench)")

    def variant_reason(self, case: Case) -> str | None:
        features = case_features(case)
        unsupported = [f for f in features if f not in self.PLAN_PARAMS]
        if unsupported:
            return _no_input("flashinfer", unsupported, "in the bench's call (BatchDecodeWithPagedKVCacheWrapper)")
        if not features or _import_reason("flashinfer"):  # plain, or available() says why not
            return None
        import flashinfer

        params = _signature_params(flashinfer.BatchDecodeWithPagedKVCacheWrapper.plan) or frozenset()
        missing = [f for f in features if self.PLAN_PARAMS[f] not in params]
        return _no_input("flashinfer", missing, "in this release's decode plan()") if missing else None

    def _plan_variant(self, case: Case) -> dict:
        """``plan`` keywords of ``case``'s window and softcap (empty for plain attention)."""
        kwargs = {}
        if case.window >= 0:
            kwargs["window_left"] = case.window
        if case.softcap > 0:
            kwargs["logits_soft_cap"] = case.softcap
        return kwargs

    def prepare(self, case: Case, inputs: InputSets) -> Prepared:
        import flashinfer

        device = inputs.q[0].device
        batch = case.batch
        if case.paged:
            page, pages_per_row = case.page_size, case.pages_per_row
            indices = inputs.block_table.reshape(-1).contiguous()  # row-major: row b's pages in order
            last = case.seqlen_k - (pages_per_row - 1) * page
        else:
            page = self.PAGE_SIZE
            if case.seqlen_k % page:
                raise Unsupported(f"seqlen_k {case.seqlen_k} is not a multiple of the page size {page}")
            pages_per_row, last = case.seqlen_k // page, page
            indices = torch.arange(batch * pages_per_row, dtype=torch.int32, device=device)
        workspace = torch.empty(self.WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
        indptr = torch.arange(batch + 1, dtype=torch.int32, device=device) * pages_per_row
        last_page_len = torch.full((batch,), last, dtype=torch.int32, device=device)
        args = (indptr, indices, last_page_len, case.num_heads, case.num_heads_kv, case.head_dim, page)
        variant = self._plan_variant(case)
        try:
            wrapper.plan(*args, pos_encoding_mode="NONE", q_data_type=case.torch_dtype, kv_data_type=case.torch_dtype,
                         **variant)
        except TypeError:  # older releases name the dtype argument data_type
            wrapper.plan(*args, pos_encoding_mode="NONE", data_type=case.torch_dtype, **variant)
        paged_shape = (batch * pages_per_row, page, case.num_heads_kv, case.head_dim)
        kv = [(k.view(paged_shape), v.view(paged_shape)) for k, v in zip(inputs.k, inputs.v)]  # paged: no-op views
        qs = [q[:, 0] for q in inputs.q]  # [B, H, D]
        call = wrapper.run if hasattr(wrapper, "run") else wrapper.forward

        def run(i: int):
            return call(qs[i], kv[i])

        run.keepalive = (workspace, wrapper, indptr, indices, last_page_len)  # buffers the plan points at
        note = f"page size {page}, tensor cores" + ("" if case.paged else " (dense cache viewed as pages)")
        return Prepared(run, to_bshd=lambda o: o.unsqueeze(1), note=note)


# -- the roster ------------------------------------------------------------------------------

def all_contenders(flex: bool = True) -> list[Contender]:
    """Every contender, in display order: flashsplit first, then torch, then other libraries."""
    return [
        FlashsplitContender("triton", "triton"),
        FlashsplitContender("cute", "cute"),
        FlashsplitContender("triton-nosplit", "triton", num_splits=1),
        FlashsplitContender("auto", "auto"),
        SdpaContender("sdpa-flash", "FLASH_ATTENTION"),
        SdpaContender("sdpa-cudnn", "CUDNN_ATTENTION"),
        FlexContender(enabled=flex),
        FlashInferContender(),
        FlashAttnContender("flash-attn", "flash_attn"),
        FlashAttnContender("flash-attn3", "flash_attn_interface"),
    ]


def contender_names() -> list[str]:
    return [c.name for c in all_contenders()]


def select_contenders(names: list[str] | None = None, flex: bool = True) -> list[Contender]:
    """The contenders named (all when ``names`` is None), in roster order; unknown names raise ValueError."""
    roster = all_contenders(flex=flex)
    if names is None:
        return roster
    known = {c.name for c in roster}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown contender(s) {unknown}; choose from {sorted(known)}")
    return [c for c in roster if c.name in names]
