"""Launching the CuTe kernels: static raw arguments once, then addresses per call.

:class:`CuteLauncher` turns a call's tensors and a kernel variant into a compiled kernel and its
static raw arguments (sizes, strides, scale: :class:`SplitLaunch`, :class:`CombineLaunch`),
and owns the per-stream workspace and arrival counters the launches use.
:class:`PreparedCuteDecode` is one static configuration's decode (what the api caches per call
signature). Launches take raw pointers and Int32/Int64 sizes and strides through
:class:`~flashsplit.cute.fastcall.FastLauncher`, read no tensor values on the host and run on
the current torch stream, so they are CUDA-graph capturable. cutlass is imported on the first
launch, not here.
"""

from __future__ import annotations

import math

import torch

from ..call import DecodeTensors
from ..problem import Variant
from ..triton.cache_update import append_new_keys
from ..workspace import ARRIVALS, Workspace, stream_key
from . import configs, launch_args
from .choice import LaunchChoice

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
_OUT_DTYPE_NAMES = {**_DTYPE_NAMES, torch.float32: "float32"}  # the combine may write fp32
_FP8_NAMES = {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}
_SINK_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _sinks_name(sinks) -> str:
    """The compile key's sinks dtype: "" without sinks."""
    return "" if sinks is None else _SINK_NAMES[sinks.dtype]


def variant_keys(variant: Variant, causal: bool, seqlen_q: int, sinks=None) -> dict:
    """The split config's mask and variant keys for a launch: ``causal`` (also a right window
    bound of 0: the same mask), ``right_bound`` (a right bound > 0 that hides keys from some
    of the ``seqlen_q`` queries), ``left_bound``, ``softcap``, ``sinks`` (the dtype of the
    ``sinks`` this launch applies, "" for none), ``invariant`` and ``leftpad``."""
    causal = causal or variant.window_right == 0
    return dict(causal=causal, right_bound=not causal and 0 <= variant.window_right < seqlen_q - 1,
                left_bound=variant.window_left >= 0, softcap=variant.softcap > 0, sinks=_sinks_name(sinks),
                invariant=variant.batch_invariant, leftpad=variant.has_leftpad)


class CuteLauncher:
    """Builds launches and owns what they share: the per-stream fp32 ``workspace`` (partials and
    lse scratch), the ``arrivals`` counters of the in-kernel merge, and full-length
    ``cache_seqlens`` tensors for calls without them."""

    def __init__(self) -> None:
        self.workspace = Workspace()
        self.arrivals = ARRIVALS
        self._full_seqlens: dict[tuple, torch.Tensor] = {}

    def split_launch(self, q, k, v, cache_seqlens, block_table, num_splits, scale, causal, o, lse,
                     write_partials, k_descale=None, v_descale=None, out=None, one_per_sm=False,
                     one_wave=False, swap=False, variant: Variant = Variant(), sinks=None,
                     split_ctas: int = 0, heads_first: bool = False, cluster: bool = False) -> SplitLaunch:
        """The compiled split kernel for this call's static facts and its static raw arguments;
        with ``out`` (partials only), the kernel's last CTA per row tile merges into it; with
        ``one_per_sm``, the one-CTA-per-SM tile; with ``one_wave``, ``configs.ONE_WAVE_STAGES``;
        with ``swap``, swapped operands; ``split_ctas``: CTAs per row tile, each running a run of
        consecutive splits (batch-invariant configs; 0: one per split); ``heads_first``: the CTAs'
        launch order (``SplitConfig.heads_first``); ``cluster`` (with ``out``): the merge through
        one cluster of the ``num_splits`` splits (``SplitConfig.cluster``). ``variant``: the window,
        softcap and split rule; with ``variant.has_sinks``, ``sinks`` (its dtype) join the final
        results this launch writes (one split, or the merge): a partials launch that a combine
        follows leaves them to it."""
        from .compile import compile_split

        batch, seqlen_q, num_heads, head_dim = q.shape
        cache_rows, cache_len, num_heads_kv = k.shape[:3]
        paged = block_table is not None
        if paged:
            # The capacity of a row is its page table's span; the kernel reads only the entries
            # of the tiles it loads (never past a row's last page).
            max_pages = block_table.shape[1]
            seqlen_k = max_pages * cache_len
        else:
            seqlen_k, max_pages = cache_len, 1
        kv_dtype = _FP8_NAMES.get(k.dtype, "same")
        merge = out is not None
        keys = variant_keys(variant, causal, seqlen_q, sinks if merge or not write_partials else None)
        config = configs.split_config(_DTYPE_NAMES[q.dtype], head_dim, keys.pop("causal"), write_partials, paged,
                                      kv_dtype, cache_len if paged else None, merge=merge, one_per_sm=one_per_sm,
                                      one_wave=one_wave, swap_rows=configs.SWAP_AB_ROWS if swap else 0,
                                      heads_first=heads_first, cluster=num_splits if cluster else 0, **keys)
        if lse.stride() != compact_strides(lse.shape):
            raise ValueError(f"lse: expected a contiguous tensor, got strides {lse.stride()}")
        o_strides = o.stride()[:4] if write_partials else (0, *o.stride()[:3])
        static = dict(
            batch=batch, seqlen_q=seqlen_q, seqlen_k=seqlen_k, num_heads=num_heads, num_heads_kv=num_heads_kv,
            num_splits=num_splits, split_ctas=split_ctas if config.invariant and split_ctas else num_splits,
            cache_rows=cache_rows, cache_len=cache_len, max_pages=max_pages,
            block_table_stride_b=block_table.stride(0) if paged else 0,
            softmax_scale_log2=scale * math.log2(math.e),
            window_left=max(variant.window_left, 0), window_right=max(variant.window_right, 0),
            softcap_log2=variant.softcap * math.log2(math.e),
        )
        for name, t in (("q", q), ("k", k), ("v", v)):
            static.update(zip((f"{name}_stride_b", f"{name}_stride_l", f"{name}_stride_h"), t.stride()[:3]))
        static.update(zip(("o_stride_s", "o_stride_b", "o_stride_l", "o_stride_h"), o_strides))
        # fp8 descales: one element (strides 0) or [B, H_kv]; a 16-bit launch passes lse (never read).
        for name, t in (("k_descale", k_descale), ("v_descale", v_descale)):
            strides = (0, 0) if t is None or t.numel() == 1 else (t.stride(0), t.stride(1))
            static.update(zip((f"{name}_stride_b", f"{name}_stride_h"), strides))
        static.update(zip(("out_stride_b", "out_stride_l", "out_stride_h"),
                          (0, 0, 0) if out is None else out.stride()[:3]))
        full = self.full_length(q.device, batch, seqlen_k) if cache_seqlens is None else None
        return SplitLaunch(compile_split(config), static, launch_args.split_elements(config), full)

    def combine_launch(self, out_partial, lse_partial, out, sinks=None) -> CombineLaunch:
        """The compiled combine for these shapes and its static raw arguments (sizes, strides);
        ``sinks`` (its dtype) join each row's merged softmax."""
        from .compile import compile_combine

        num_splits, batch, seqlen_q, num_heads, head_dim = out_partial.shape
        config = configs.CombineConfig(_OUT_DTYPE_NAMES[out.dtype], head_dim, _sinks_name(sinks))
        static = dict(
            num_splits=num_splits, batch=batch, seqlen_q=seqlen_q, num_heads=num_heads,
            **dict(zip(("op_stride_s", "op_stride_b", "op_stride_l", "op_stride_h"), out_partial.stride()[:4])),
            **dict(zip(("lp_stride_s", "lp_stride_b", "lp_stride_h", "lp_stride_l"), lse_partial.stride())),
            **dict(zip(("o_stride_b", "o_stride_l", "o_stride_h"), out.stride()[:3])),
        )
        return CombineLaunch(compile_combine(config), static, launch_args.combine_elements(config))

    def full_length(self, device, batch: int, seqlen_k: int) -> torch.Tensor:
        """A cached ``[batch]`` tensor of ``seqlen_k`` (cache_seqlens=None: every slot is live)."""
        key = (device, batch, seqlen_k)
        t = self._full_seqlens.get(key)
        if t is None:
            t = torch.full((batch,), seqlen_k, dtype=torch.int32, device=device)
            self._full_seqlens[key] = t
        return t


class PreparedCuteDecode:
    """Decode for one static configuration (the api caches one per call signature).

    The first call compiles (or finds) the split and combine kernels of ``tile`` (a
    :class:`~flashsplit.cute.choice.LaunchChoice`) and computes their static raw arguments;
    every call then only gathers the tensors' addresses, takes the partials (and an lse scratch
    when none is asked for) from the stream's reusable workspace (a fresh tensor while a CUDA
    graph is being captured) and launches through the kernels' FastLaunchers. Workspace layout
    (fp32): ``out_partial`` ``[S, B, L_q, H, D]``, ``lse_partial`` ``[S, B, H, L_q]`` (S > 1
    only), then the lse scratch ``[B, H, L_q]``. A merging launch (``tile.merge``) is one split
    launch whose last CTAs merge (arrival counters from
    :class:`~flashsplit.workspace.ArrivalCounters`); otherwise the combine kernel merges. A
    batch-invariant decode (``variant.batch_invariant``) always writes partials and combines
    them, even with one split: every row takes the same path in any launch. Cache updates:
    a call's new keys (``variant.seqlen_new``) are written, and q rotated, by
    :func:`~flashsplit.triton.cache_update.append_new_keys` first (the attention then reads
    ``cache_seqlens + L_new`` keys); ``cache_batch_idx`` reads the dense cache as pages of its
    whole capacity, page ``cache_batch_idx[b]`` for row b; ``cache_leftpad`` is the kernel's.
    """

    def __init__(self, launcher: CuteLauncher, tile: LaunchChoice, num_splits: int, softmax_scale: float,
                 causal: bool, variant: Variant = Variant()):
        self.launcher = launcher
        self.tile = tile
        self.num_splits = num_splits
        self.softmax_scale = softmax_scale
        self.causal = causal
        self.variant = variant
        #: The split kernel writes the final out/lse itself (one split, not batch-invariant).
        self.direct = num_splits == 1 and not variant.batch_invariant
        self.split: SplitLaunch | None = None
        self.combine: CombineLaunch | None = None
        #: :func:`~flashsplit.cute.eager.eager_path` once the first CUDA launch is made (False
        #: where this configuration has none): later eager calls take it.
        self.eager = None

    def __call__(self, tensors: DecodeTensors) -> None:
        eager = self.eager
        if eager and eager(tensors):
            return
        q, k_cache, v_cache, out, lse, cache_seqlens, block_table, k_descale, v_descale, sinks = tensors[:10]
        variant = self.variant
        if variant.seqlen_new:  # the new keys (and q's rotation) by the shared small kernel, first
            q, cache_seqlens = append_new_keys(tensors, variant)
        if variant.has_batch_idx:  # the dense cache's rows as one-page rows: row b reads page cache_batch_idx[b]
            block_table = tensors.cache_batch_idx.unsqueeze(1)
        leftpad = tensors.cache_leftpad if variant.has_leftpad else None
        batch, seqlen_q, num_heads, head_dim = q.shape
        splits = self.num_splits
        rows = batch * seqlen_q * num_heads
        partial_rows = 0 if self.direct else splits * rows
        scratch_lse = lse is None
        numel = partial_rows * (head_dim + 1) + rows * scratch_lse or 1
        if q.is_cuda:  # one read of the stream for the workspace and the launches
            key = stream_key(q.get_device())
            stream, buffer = key[1], self.launcher.workspace.stream_buffer(key, numel)
        else:
            key, stream, buffer = None, 0, self.launcher.workspace.buffer(q.device, numel)
        op = buffer.data_ptr()
        lp = op + partial_rows * head_dim * 4
        lse_ptr = lp + partial_rows * 4 if scratch_lse else lse.data_ptr()
        out_ptr = out.data_ptr()
        if self.split is None:
            self._first_launch_setup(q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, out, lse,
                                     buffer, partial_rows, rows, sinks)
        # One split writes the final outputs; several write the partials, which the split
        # kernel's last CTAs (merge) or the combine merge.
        if self.direct:
            self.split.launch(q, k_cache, v_cache, out_ptr, lse_ptr, cache_seqlens, block_table, k_descale,
                              v_descale, None, stream, sinks, leftpad)
        elif self.tile.merge:
            arrivals = self.launcher.arrivals.address_for(key, q)
            self.split.launch(q, k_cache, v_cache, op, lp, cache_seqlens, block_table, k_descale, v_descale,
                              (out_ptr, lse_ptr, arrivals), stream, sinks, leftpad)
        else:
            self.split.launch(q, k_cache, v_cache, op, lp, cache_seqlens, block_table, k_descale, v_descale,
                              None, stream, None, leftpad)
            self.combine.launch(op, lp, out_ptr, lse_ptr, stream, sinks)
        if eager is None and key is not None:
            from .eager import eager_path

            self.eager = eager_path(self, tensors, key[0]) or False

    def host_program(self, tensors: DecodeTensors):
        """The eager path's launches for a native caller (:func:`~flashsplit.cute.eager.host_program`),
        or None before the eager path exists (False where this configuration has none)."""
        if not self.eager:
            return self.eager
        from .eager import host_program

        return host_program(self, tensors) or False

    def _first_launch_setup(self, q, k_cache, v_cache, cache_seqlens, block_table, k_descale, v_descale, out, lse,
                            buffer, partial_rows, rows, sinks=None) -> None:
        """Compile/find the kernels and their static arguments, from views of the workspace."""
        batch, seqlen_q, num_heads, head_dim = q.shape
        splits, tile, variant = self.num_splits, self.tile, self.variant
        sinks = sinks if variant.has_sinks else None
        if lse is None:
            start = partial_rows * (head_dim + 1)
            lse = buffer[start: start + rows].view(batch, num_heads, seqlen_q)
        elif lse.stride() != compact_strides(lse.shape):
            raise ValueError(f"lse: expected a contiguous [B, H, L_q] tensor, got strides {lse.stride()}")
        if self.direct:
            self.split = self.launcher.split_launch(q, k_cache, v_cache, cache_seqlens, block_table, 1,
                                                    self.softmax_scale, self.causal, out, lse, False, k_descale,
                                                    v_descale, one_per_sm=tile.one_per_sm, swap=tile.swap,
                                                    variant=variant, sinks=sinks, heads_first=tile.heads_first)
            return
        out_partial = buffer[: partial_rows * head_dim].view(splits, batch, seqlen_q, num_heads, head_dim)
        lse_partial = buffer[partial_rows * head_dim: partial_rows * (head_dim + 1)].view(
            splits, batch, num_heads, seqlen_q)
        self.split = self.launcher.split_launch(q, k_cache, v_cache, cache_seqlens, block_table, splits,
                                                self.softmax_scale, self.causal, out_partial, lse_partial, True,
                                                k_descale, v_descale, out if tile.merge else None,
                                                one_per_sm=tile.one_per_sm, one_wave=tile.one_wave, swap=tile.swap,
                                                variant=variant, sinks=sinks, split_ctas=tile.split_ctas,
                                                heads_first=tile.heads_first, cluster=tile.cluster)
        if not tile.merge:
            self.combine = self.launcher.combine_launch(out_partial, lse_partial, out, sinks)


class SplitLaunch:
    """One split-kernel launch configuration: the compiled kernel and the raw arguments that do
    not change between calls with the same static facts (sizes, strides, scale), by the names of
    :data:`~flashsplit.cute.launch_args.SPLIT_ARGS`."""

    __slots__ = ("elements", "full_seqlens", "kernel", "static")

    def __init__(self, kernel, static: dict, elements: dict[str, str], full_seqlens):
        self.kernel, self.elements, self.full_seqlens = kernel, elements, full_seqlens
        self.static = tuple(static[name] for name in _SPLIT_STATIC)  # KeyError: a missing argument
        if len(static) != len(_SPLIT_STATIC):
            raise ValueError(f"static: unknown arguments {sorted(set(static) - set(_SPLIT_STATIC))}")

    def raw(self, q, k, v, o_ptr: int, lse_ptr: int, cache_seqlens, block_table, k_descale, v_descale,
            merge_into: tuple | None, stream: int, sinks=None, leftpad=None) -> tuple:
        """Every argument of the compiled host function as a plain value, in its order: the
        addresses, the static part, the stream. ``o_ptr``/``lse_ptr`` address the partial
        buffers or the final outputs; ``merge_into`` is ``(out, lse, arrival counters)``
        addresses for a merging kernel. Arguments a configuration never reads get placeholders:
        a dense launch passes ``cache_seqlens`` as its block table, a 16-bit one the lse address
        as its descales, a launch that does not merge ``o_ptr``/``lse_ptr`` as the merge's, one
        without ``sinks`` the lse address as theirs, one without ``leftpad`` ``cache_seqlens``."""
        seqlens = (self.full_seqlens if cache_seqlens is None else cache_seqlens).data_ptr()
        merge_out, merge_lse, arrivals = merge_into or (o_ptr, lse_ptr, lse_ptr)
        return _pack_split(
            self.static, q_ptr=q.data_ptr(), k_ptr=k.data_ptr(), v_ptr=v.data_ptr(), o_ptr=o_ptr, lse_ptr=lse_ptr,
            seqlens_ptr=seqlens, block_table_ptr=seqlens if block_table is None else block_table.data_ptr(),
            k_descale_ptr=lse_ptr if k_descale is None else k_descale.data_ptr(),
            v_descale_ptr=lse_ptr if v_descale is None else v_descale.data_ptr(),
            out_ptr=merge_out, out_lse_ptr=merge_lse, arrivals_ptr=arrivals,
            sinks_ptr=lse_ptr if sinks is None else sinks.data_ptr(),
            leftpad_ptr=seqlens if leftpad is None else leftpad.data_ptr(), stream=stream,
        )

    def launch(self, q, k, v, o_ptr: int, lse_ptr: int, cache_seqlens, block_table, k_descale, v_descale,
               merge_into: tuple | None, stream: int, sinks=None, leftpad=None) -> None:
        """Launch the split kernel with :meth:`raw`'s arguments."""
        raw = self.raw(q, k, v, o_ptr, lse_ptr, cache_seqlens, block_table, k_descale, v_descale, merge_into,
                       stream, sinks, leftpad)
        _run(self.kernel, raw, lambda: launch_args.cute_args(launch_args.SPLIT_ARGS, self.elements, raw))

    def fixed(self):
        """A launch taking only the per-call values of :data:`~flashsplit.cute.launch_args.SPLIT_ARGS`
        (the addresses and the stream, in schema order), the static part packed once
        (:func:`~flashsplit.cute.fixed_launch.fixed_launch`); None before the first launch or
        where the kernel has no fast launcher."""
        return _fixed(self.kernel, _pack_split(self.static, **_SPLIT_PLACEHOLDERS), _SPLIT_PER_CALL)


class CombineLaunch:
    """One combine launch configuration: the compiled kernel and its static raw arguments by the
    names of :data:`~flashsplit.cute.launch_args.COMBINE_ARGS`."""

    __slots__ = ("elements", "kernel", "static")

    def __init__(self, kernel, static: dict, elements: dict[str, str]):
        self.kernel, self.elements = kernel, elements
        self.static = tuple(static[name] for name in _COMBINE_STATIC)
        if len(static) != len(_COMBINE_STATIC):
            raise ValueError(f"static: unknown arguments {sorted(set(static) - set(_COMBINE_STATIC))}")

    def launch(self, op: int, lp: int, out_ptr: int, lse_ptr: int, stream: int, sinks=None) -> None:
        """Merge the partials at ``op``/``lp`` into ``out_ptr`` and ``lse_ptr`` (``sinks``: the
        tensor a sinks configuration reads)."""
        raw = _pack_combine(self.static, op_ptr=op, lp_ptr=lp, o_ptr=out_ptr, lse_ptr=lse_ptr,
                            sinks_ptr=lse_ptr if sinks is None else sinks.data_ptr(), stream=stream)
        _run(self.kernel, raw, lambda: launch_args.cute_args(launch_args.COMBINE_ARGS, self.elements, raw))

    def fixed(self):
        """:meth:`SplitLaunch.fixed` for the combine (per-call values of
        :data:`~flashsplit.cute.launch_args.COMBINE_ARGS`)."""
        return _fixed(self.kernel, _pack_combine(self.static, **_COMBINE_PLACEHOLDERS), _COMBINE_PER_CALL)


_SPLIT_STATIC = launch_args.static_names(launch_args.SPLIT_ARGS)
_COMBINE_STATIC = launch_args.static_names(launch_args.COMBINE_ARGS)
_pack_split = launch_args.packer(launch_args.SPLIT_ARGS)
_pack_combine = launch_args.packer(launch_args.COMBINE_ARGS)
_SPLIT_PER_CALL = tuple(a.per_call for a in launch_args.SPLIT_ARGS)
_COMBINE_PER_CALL = tuple(a.per_call for a in launch_args.COMBINE_ARGS)
_SPLIT_PLACEHOLDERS = {a.name: 0 for a in launch_args.SPLIT_ARGS if a.per_call}
_COMBINE_PLACEHOLDERS = {a.name: 0 for a in launch_args.COMBINE_ARGS if a.per_call}


def compact_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for extent in reversed(shape):
        strides.append(acc)
        acc *= extent
    return tuple(reversed(strides))


_LAUNCHERS: dict = {}  # compiled kernel -> FastLauncher, or None where one cannot be built


def _run(kernel, raw: tuple, library_args) -> None:
    """Launch ``kernel`` with ``raw`` (plain ints/floats: addresses, sizes, strides, scale, stream)
    through a cached :class:`~flashsplit.cute.fastcall.FastLauncher` (a few microseconds), or,
    where none can be built, through CuteDSL's own call with ``library_args()``."""
    launcher = _LAUNCHERS.get(kernel, False)
    if launcher is False:
        from .fastcall import FastLauncher

        try:
            launcher = FastLauncher.from_raw(kernel, raw)
        except Exception:  # noqa: BLE001  (not a compiled CuteDSL function, unknown internals: the plain call)
            launcher = None
        _LAUNCHERS[kernel] = launcher
    if launcher is not None:
        launcher.launch(*raw)
    else:
        kernel(*library_args())


def _fixed(kernel, values: tuple, per_call: tuple):
    launcher = _LAUNCHERS.get(kernel)
    if launcher is None:
        return None
    from .fixed_launch import fixed_launch

    return fixed_launch(launcher, values, per_call)


def raw_stream(t: torch.Tensor) -> int:
    return stream_key(t.get_device())[1] if t.is_cuda else 0
