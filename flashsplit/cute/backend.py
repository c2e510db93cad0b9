"""``backend="cute"``: the CuTeDSL split kernel and combine on Hopper (sm_90a).

This module imports neither cutlass nor the kernels at import time; the first call that needs
them compiles (once per :class:`~flashsplit.cute.configs.SplitConfig` /
:class:`~flashsplit.cute.configs.CombineConfig`) and caches. Launches take raw pointers and
Int32/Int64 sizes and strides, read no tensor values on the host and run on the current torch
stream, so ``decode`` is CUDA-graph capturable.
"""

from __future__ import annotations

import importlib.util

import torch

from ..problem import FP8_DTYPES, DecodeProblem
from ..registry import Backend
from . import configs

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
_OUT_DTYPE_NAMES = {**_DTYPE_NAMES, torch.float32: "float32"}  # the combine may write fp32
_FP8_NAMES = {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}


def cutlass_available() -> bool:
    return importlib.util.find_spec("cutlass") is not None


class CuteBackend(Backend):
    name = "cute"
    priority = 10

    def __init__(self) -> None:
        self._full_seqlens: dict[tuple, torch.Tensor] = {}

    # ------------------------------------------------------------------ capability
    def supports(self, problem: DecodeProblem) -> str | None:
        if problem.head_dim not in configs.HEAD_DIMS:
            return f"head_dim {problem.head_dim} is not one of {configs.HEAD_DIMS}"
        if problem.dtype not in _DTYPE_NAMES:
            return f"dtype {problem.dtype} is not float16 or bfloat16"
        if not problem.aligned_16b:
            return "q/k_cache/v_cache/out need 16-byte aligned pointers and strides (TMA, vector stores)"
        if problem.paged and not configs.PAGED_VERIFIED_ON_GPU:
            return "the paged cute kernel is compile-checked but not yet verified on a GPU; paged KV uses triton"
        if problem.paged and not configs.paged_supported(problem.page_size, problem.head_dim):
            tile_n = configs.split_tile(problem.head_dim)[0]
            sub = configs.subtile_page_sizes(problem.head_dim)
            if problem.page_size not in sub:
                return (
                    f"paged KV with page_size {problem.page_size}: the cute kernel needs a multiple of its "
                    f"{tile_n}-key tile or one of {sub} (TMA boxes on 8-key swizzle atoms); other pages use "
                    f"the triton backend"
                )
            if not configs.SUBTILE_PAGES_VERIFIED_ON_GPU:
                return (
                    f"paged KV with page_size {problem.page_size} (smaller than the {tile_n}-key tile): the cute "
                    f"sub-tile kernel is compile-checked but not yet verified on a GPU; such pages use triton"
                )
        if problem.cache_dtype in FP8_DTYPES and not configs.FP8_VERIFIED_ON_GPU:
            return "the fp8 cute kernel is compile-checked but not yet verified on a GPU; fp8 KV uses triton"
        if problem.cache_dtype != problem.dtype and problem.cache_dtype not in _FP8_NAMES:
            return f"{problem.cache_dtype} caches are not implemented in the cute backend yet"
        if not cutlass_available():
            return "nvidia-cutlass-dsl is not installed"
        if problem.device_type != "cuda":
            return f"needs a CUDA device, got {problem.device_type}"
        if not torch.cuda.is_available():
            return "CUDA is not available"
        major, minor = torch.cuda.get_device_capability()
        if (major, minor) != (9, 0):
            return f"needs compute capability 9.0 (Hopper, sm_90a), got {major}.{minor}"
        return None

    def block_m(self, problem: DecodeProblem) -> int:
        return 64

    def preference(self, problem: DecodeProblem) -> tuple[int, str]:
        # Measured on the H200 (docs/performance.md, 2026-11-29, 32/8 heads, d = 128): paged
        # 16-bit caches run at dense speed here, whole-tile pages (128: 1.00x dense) and sub-tile
        # pages alike (16: 1.00-1.01x), but 1.06-1.22x slower in Triton; dense 16-bit caches are
        # as fast or faster in Triton at every batch (B = 1, 4k: 10.1 vs 12.7 us; B >= 16 within
        # 0.5%); fp8 caches are about 2x slower here than in Triton.
        if problem.paged and problem.cache_dtype not in FP8_DTYPES:
            return 20, "paged 16-bit KV: the cute TMA kernel reads pages at dense speed (H200)"
        return -10, "cute supports it but was measured slower than triton here (H200)"

    def units_per_sm(self, problem: DecodeProblem) -> int:
        return configs.split_tile(problem.head_dim)[2] if problem.head_dim in configs.HEAD_DIMS else 1

    # ------------------------------------------------------------------ launches
    def decode(self, q, k_cache, v_cache, cache_seqlens, num_splits, softmax_scale, causal, out, lse,
               block_table=None, k_descale=None, v_descale=None) -> None:
        lse_buf = lse if lse is not None else self._lse_scratch(q)
        if num_splits == 1:
            self._launch_split(q, k_cache, v_cache, cache_seqlens, block_table, 1, softmax_scale, causal, out,
                               lse_buf, False, k_descale, v_descale)
            return
        out_partial, lse_partial = self._alloc_partials(q, num_splits)
        self._launch_split(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, softmax_scale, causal,
                           out_partial, lse_partial, True, k_descale, v_descale)
        self.combine(out_partial, lse_partial, out, lse_buf)

    def forward_partials(self, q, k_cache, v_cache, cache_seqlens, num_splits, softmax_scale, causal,
                         block_table=None, k_descale=None, v_descale=None):
        out_partial, lse_partial = self._alloc_partials(q, num_splits)
        self._launch_split(q, k_cache, v_cache, cache_seqlens, block_table, num_splits, softmax_scale, causal,
                           out_partial, lse_partial, True, k_descale, v_descale)
        return out_partial, lse_partial

    def combine(self, out_partial, lse_partial, out, lse) -> None:
        import cutlass

        from .compile import compile_combine

        num_splits, batch, seqlen_q, num_heads, head_dim = out_partial.shape
        config = configs.CombineConfig(_OUT_DTYPE_NAMES[out.dtype], head_dim)
        kernel = compile_combine(config)
        lse_buf = lse if lse is not None else self._lse_scratch(out)
        if lse_buf.stride() != _compact_strides(lse_buf.shape):
            raise ValueError(f"lse: expected a contiguous [B, H, L_q] tensor, got strides {lse_buf.stride()}")
        raw = (
            out_partial.data_ptr(), lse_partial.data_ptr(), out.data_ptr(), lse_buf.data_ptr(),
            num_splits, batch, seqlen_q, num_heads,
            *out_partial.stride()[:4], *lse_partial.stride(), *out.stride()[:3],
            _raw_stream(out),
        )

        def library_args():
            I32, I64 = cutlass.Int32, cutlass.Int64
            return (
                _ptr(out_partial, cutlass.Float32, 4), _ptr(lse_partial, cutlass.Float32, 4),
                _ptr(out, _cutlass_dtype(out.dtype), out.element_size()), _ptr(lse_buf, cutlass.Float32, 4),
                I32(num_splits), I32(batch), I32(seqlen_q), I32(num_heads),
                *(I64(s) for s in out_partial.stride()[:4]),
                *(I64(s) for s in lse_partial.stride()),
                *(I64(s) for s in out.stride()[:3]),
                _stream(),
            )

        _run(kernel, raw, library_args)

    # ------------------------------------------------------------------ helpers
    def _launch_split(self, q, k, v, cache_seqlens, block_table, num_splits, scale, causal, o, lse,
                      write_partials, k_descale=None, v_descale=None) -> None:
        import math

        import cutlass

        from .compile import compile_split

        batch, seqlen_q, num_heads, head_dim = q.shape
        cache_rows, cache_len, num_heads_kv = k.shape[:3]
        paged = block_table is not None
        if paged:
            # The capacity of a row is its page table's span; the kernel reads only the entries
            # of the tiles it loads (never past a row's last page).
            max_pages = block_table.shape[1]
            seqlen_k = max_pages * cache_len
            assert configs.paged_supported(cache_len, head_dim) or configs.subtile_paged_supported(
                cache_len, head_dim), "supports() refuses this page size"
        else:
            seqlen_k, max_pages = cache_len, 1
        kv_dtype = _FP8_NAMES.get(k.dtype, "same")
        config = configs.split_config(_DTYPE_NAMES[q.dtype], head_dim, causal, write_partials, paged, kv_dtype,
                                      cache_len if paged else None)
        kernel = compile_split(config)
        if cache_seqlens is None:
            cache_seqlens = self._full_length(q.device, batch, seqlen_k)
        if lse.stride() != _compact_strides(lse.shape):
            raise ValueError(f"lse: expected a contiguous tensor, got strides {lse.stride()}")
        if write_partials:
            o_strides = o.stride()[:4]
        else:
            o_strides = (0, *o.stride()[:3])
        dt = _cutlass_dtype(q.dtype)
        kv_dt = _cutlass_dtype(k.dtype)
        # fp8 descales: one element (strides 0) or [B, H_kv]; a 16-bit launch passes lse (never read).
        descales = []
        for t in (k_descale, v_descale):
            if t is None:
                descales.append((lse, 0, 0))
            elif t.numel() == 1:
                descales.append((t, 0, 0))
            else:
                descales.append((t, t.stride(0), t.stride(1)))
        scale_log2 = scale * math.log2(math.e)
        table = block_table if paged else cache_seqlens  # a dense launch passes cache_seqlens (never read)
        raw = (
            q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), cache_seqlens.data_ptr(),
            table.data_ptr(),
            batch, seqlen_q, seqlen_k, num_heads, num_heads_kv, num_splits, cache_rows, cache_len, max_pages,
            block_table.stride(0) if paged else 0,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o_strides,
            scale_log2,
            *(t.data_ptr() for t, _, _ in descales),
            *(s for _, sb, sh in descales for s in (sb, sh)),
            _raw_stream(q),
        )

        def library_args():
            I32, I64 = cutlass.Int32, cutlass.Int64
            return (
                _ptr(q, dt), _ptr(k, kv_dt), _ptr(v, kv_dt),
                _ptr(o, cutlass.Float32, 16) if write_partials else _ptr(o, dt, o.element_size()),
                _ptr(lse, cutlass.Float32, 4), _ptr(cache_seqlens, cutlass.Int32, 4), _ptr(table, cutlass.Int32, 4),
                I32(batch), I32(seqlen_q), I32(seqlen_k), I32(num_heads), I32(num_heads_kv), I32(num_splits),
                I32(cache_rows), I32(cache_len), I32(max_pages), I64(block_table.stride(0) if paged else 0),
                *(I64(q.stride(i)) for i in (0, 1, 2)),
                *(I64(k.stride(i)) for i in (0, 1, 2)),
                *(I64(v.stride(i)) for i in (0, 1, 2)),
                *(I64(s) for s in o_strides),
                cutlass.Float32(scale_log2),
                *(_ptr(t, cutlass.Float32, 4) for t, _, _ in descales),
                *(I64(s) for _, sb, sh in descales for s in (sb, sh)),
                _stream(),
            )

        _run(kernel, raw, library_args)

    def _full_length(self, device, batch: int, seqlen_k: int) -> torch.Tensor:
        """A cached ``[batch]`` tensor of ``seqlen_k`` (cache_seqlens=None: every slot is live)."""
        key = (device, batch, seqlen_k)
        t = self._full_seqlens.get(key)
        if t is None:
            t = torch.full((batch,), seqlen_k, dtype=torch.int32, device=device)
            self._full_seqlens[key] = t
        return t

    @staticmethod
    def _lse_scratch(q: torch.Tensor) -> torch.Tensor:
        batch, seqlen_q, num_heads, _ = q.shape
        return torch.empty((batch, num_heads, seqlen_q), dtype=torch.float32, device=q.device)

    @staticmethod
    def _alloc_partials(q: torch.Tensor, num_splits: int):
        batch, seqlen_q, num_heads, head_dim = q.shape
        out_partial = torch.empty(
            (num_splits, batch, seqlen_q, num_heads, head_dim), dtype=torch.float32, device=q.device
        )
        lse_partial = torch.empty((num_splits, batch, num_heads, seqlen_q), dtype=torch.float32, device=q.device)
        return out_partial, lse_partial


def compile_cache_size() -> int:
    """Number of compiled CuTe kernels in this process (0 before any cute launch)."""
    import sys

    mod = sys.modules.get("flashsplit.cute.compile")
    return 0 if mod is None else mod.cache_size()


def _compact_strides(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for extent in reversed(shape):
        strides.append(acc)
        acc *= extent
    return tuple(reversed(strides))


def _cutlass_dtype(dtype: torch.dtype):
    import cutlass

    return {
        torch.float16: cutlass.Float16, torch.bfloat16: cutlass.BFloat16, torch.float32: cutlass.Float32,
        torch.float8_e4m3fn: cutlass.Float8E4M3FN, torch.float8_e5m2: cutlass.Float8E5M2,
    }[dtype]


def _ptr(t: torch.Tensor, dtype, align: int = 16):
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    return make_ptr(dtype, t.data_ptr(), cute.AddressSpace.gmem, assumed_align=align)


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


def _raw_stream(t: torch.Tensor) -> int:
    return torch._C._cuda_getCurrentRawStream(t.device.index) if t.is_cuda else 0


def _stream():
    from cuda.bindings import driver

    return driver.CUstream(torch.cuda.current_stream().cuda_stream)
