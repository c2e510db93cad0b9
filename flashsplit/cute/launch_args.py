"""The launch arguments of the CuTe kernels, declared once per kernel.

A kernel's ``__call__`` takes raw pointers, Int32/Int64 sizes and strides, a Float32 scale and
the stream, in the order of its schema here (:data:`SPLIT_ARGS`, :data:`COMBINE_ARGS`; a CPU
test checks each ``__call__`` against its schema). Everything else is derived from the schema:

* the compile step's placeholder arguments (:func:`cute_args` without values);
* the raw tuple of plain values a launch hands ``FastLauncher`` (:func:`packer`: the per-call
  addresses and stream, by name, around the static sizes, strides and scale of a prepared launch);
* the CuTeDSL objects of the fallback call, where no FastLauncher fits (:func:`cute_args`).

Pure Python at import (cutlass is imported inside :func:`cute_args`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Arg:
    """One kernel argument: ``kind`` "ptr", "i32", "i64", "f32" or "stream". A pointer has an
    element type (a dtype name, or a role its kernel's config names: :func:`split_elements`)
    and the byte alignment the kernel is compiled to assume (placeholders and fallback both
    promise it). Pointers and the stream change per call; scalars are fixed per prepared launch."""

    name: str
    kind: str
    elem: str = ""
    align: int = 16

    @property
    def per_call(self) -> bool:
        return self.kind in ("ptr", "stream")


def _ptr(name: str, elem: str, align: int = 16) -> Arg:
    return Arg(name, "ptr", elem, align)


def _scalars(kind: str, *names: str) -> tuple[Arg, ...]:
    return tuple(Arg(n, kind) for n in names)


#: ``SplitKVDecodeKernel.__call__``. Element roles: "q" (q's dtype), "kv" (the cache's), "o"
#: (fp32 partials, or q's dtype for a one-split launch's final output), "sinks" (the sinks'
#: dtype; fp32 where a configuration has none: the pointer is then never read).
SPLIT_ARGS: tuple[Arg, ...] = (
    _ptr("q_ptr", "q"), _ptr("k_ptr", "kv"), _ptr("v_ptr", "kv"), _ptr("o_ptr", "o"),
    _ptr("lse_ptr", "float32", 4), _ptr("seqlens_ptr", "int32", 4), _ptr("block_table_ptr", "int32", 4),
    *_scalars("i32", "batch", "seqlen_q", "seqlen_k", "num_heads", "num_heads_kv", "num_splits", "split_ctas",
              "cache_rows", "cache_len", "max_pages"),
    *_scalars("i64", "block_table_stride_b", "q_stride_b", "q_stride_l", "q_stride_h", "k_stride_b", "k_stride_l",
              "k_stride_h", "v_stride_b", "v_stride_l", "v_stride_h", "o_stride_s", "o_stride_b", "o_stride_l",
              "o_stride_h"),
    Arg("softmax_scale_log2", "f32"),
    _ptr("k_descale_ptr", "float32", 4), _ptr("v_descale_ptr", "float32", 4),
    *_scalars("i64", "k_descale_stride_b", "k_descale_stride_h", "v_descale_stride_b", "v_descale_stride_h"),
    _ptr("out_ptr", "q"), _ptr("out_lse_ptr", "float32", 4), _ptr("arrivals_ptr", "int32", 4),
    *_scalars("i64", "out_stride_b", "out_stride_l", "out_stride_h"),
    *_scalars("i32", "window_left", "window_right"), Arg("softcap_log2", "f32"), _ptr("sinks_ptr", "sinks", 2),
    _ptr("leftpad_ptr", "int32", 4),
    Arg("stream", "stream"),
)

#: ``CombineKernel.__call__``. Element roles "out": the output's dtype (the config's), "sinks"
#: as for the split kernel.
COMBINE_ARGS: tuple[Arg, ...] = (
    _ptr("op_ptr", "float32"), _ptr("lp_ptr", "float32", 4), _ptr("o_ptr", "out"), _ptr("lse_ptr", "float32", 4),
    *_scalars("i32", "num_splits", "batch", "seqlen_q", "num_heads"),
    *_scalars("i64", "op_stride_s", "op_stride_b", "op_stride_l", "op_stride_h", "lp_stride_s", "lp_stride_b",
              "lp_stride_h", "lp_stride_l", "o_stride_b", "o_stride_l", "o_stride_h"),
    _ptr("sinks_ptr", "sinks", 2),
    Arg("stream", "stream"),
)


def split_elements(config) -> dict[str, str]:
    """The split kernel's pointer element roles for a :class:`~flashsplit.cute.configs.SplitConfig`."""
    kv = config.dtype if config.kv_dtype == "same" else config.kv_dtype
    return {"q": config.dtype, "kv": kv, "o": "float32" if config.write_partials else config.dtype,
            "sinks": config.sinks or "float32"}


def combine_elements(config) -> dict[str, str]:
    """The combine kernel's pointer element roles for a :class:`~flashsplit.cute.configs.CombineConfig`."""
    return {"out": config.dtype, "sinks": config.sinks or "float32"}


def static_names(schema: Sequence[Arg]) -> tuple[str, ...]:
    """The arguments fixed per prepared launch (sizes, strides, scale), in schema order."""
    return tuple(a.name for a in schema if not a.per_call)


def packer(schema: Sequence[Arg]) -> Callable[..., tuple]:
    """``pack(static, **per_call)`` -> the raw tuple in schema order: ``static`` holds the values
    of :func:`static_names` in that order, the keywords are the per-call arguments (plain
    ``int`` addresses and the stream handle) by name. One tuple build per call."""
    fields, calls, i = [], [], 0
    for a in schema:
        if a.per_call:
            fields.append(a.name)
            calls.append(a.name)
        else:
            fields.append(f"static[{i}]")
            i += 1
    source = f"def pack(static, *, {', '.join(calls)}):\n    return ({', '.join(fields)},)\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<flashsplit.cute.launch_args:{len(schema)} args>", "exec"), namespace)  # noqa: S102
    return namespace["pack"]


def cute_args(schema: Sequence[Arg], elements: Mapping[str, str], raw: Sequence[Any] | None = None) -> tuple:
    """The schema's arguments as CuTeDSL objects: ``make_ptr`` pointers (gmem, the element type
    and alignment of the schema), ``Int32``/``Int64``/``Float32`` scalars and a ``CUstream``
    from ``raw`` (plain values in schema order: the fallback call); without ``raw``, the
    placeholders a compile takes (address 16, scalars 1, a fake stream)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    dtypes = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16, "float32": cutlass.Float32,
              "int32": cutlass.Int32, "float8_e4m3fn": cutlass.Float8E4M3FN, "float8_e5m2": cutlass.Float8E5M2}
    scalars = {"i32": cutlass.Int32, "i64": cutlass.Int64, "f32": cutlass.Float32}
    if raw is not None and len(raw) != len(schema):
        raise ValueError(f"raw: expected {len(schema)} values, got {len(raw)}")
    out = []
    for i, a in enumerate(schema):
        if a.kind == "ptr":
            dtype = dtypes[elements.get(a.elem, a.elem)]
            out.append(make_ptr(dtype, 16 if raw is None else raw[i], cute.AddressSpace.gmem, assumed_align=a.align))
        elif a.kind == "stream":
            if raw is None:
                out.append(make_fake_stream())
            else:
                from cuda.bindings import driver

                out.append(driver.CUstream(raw[i]))
        else:
            placeholder = 1.0 if a.kind == "f32" else 1
            out.append(scalars[a.kind](placeholder if raw is None else raw[i]))
    return tuple(out)
