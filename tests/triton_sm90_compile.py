"""Compile every Triton kernel variant the launcher can select for sm_90, without a GPU.

Run as a script (the test process runs Triton through the interpreter, which never compiles):
``TRITON_INTERPRET=0 python tests/triton_sm90_compile.py [--every N]`` (N: one variant in N, in
enumeration order; the default test run takes a share, ``pytest --full`` all of them). Prints
one line per split variant and exits non-zero on the first failure. The interpreter is more lenient than the compiler (a
``None`` pointer in a branch that is not taken, say), so CI needs this check.
"""

import itertools
import os
import re
import sys
import time

assert os.environ.get("TRITON_INTERPRET") == "0", "run with TRITON_INTERPRET=0"

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from flashsplit.triton.backend import (FP8_FORMATS, TritonBackend, _page_chunk, _pairs_for_tile,  # noqa: E402
                                       choose_tiles, combine_warps, new_key_tile)
from flashsplit.triton.combine_kernel import combine_kernel  # noqa: E402
from flashsplit.triton.split_kernel import split_kv_kernel  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


#: Integer arguments that real launches pass as multiples of 16 (Triton specializes on that, and
#: vectorizes and pipelines through it): strides of 16-byte aligned rows, the head dim, capacity.
DIV16_INTS = ("stride_qb", "stride_qm", "stride_qh", "stride_kb", "stride_kn", "stride_kh", "stride_vb",
              "stride_vn", "stride_vh", "stride_ops", "stride_opb", "stride_opm", "stride_oph", "stride_ob",
              "stride_om", "stride_oh", "head_dim", "seqlen_k")


def compile_variant(fn, pointers: dict, constexprs: dict, floats=(), num_warps=4, num_stages=3):
    """Compile ``fn`` with ``pointers`` (name -> type, or None for an absent pointer), pointers
    16-byte aligned and DIV16_INTS multiples of 16, as a typical launch specializes them."""
    signature, constants, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in pointers and pointers[name] is not None:
            signature[name] = pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in pointers or name in constexprs:
            signature[name] = "constexpr"
            constants[(i,)] = constexprs.get(name)
        else:
            signature[name] = "fp32" if name in floats else "i32"
            if name in DIV16_INTS:
                attrs[(i,)] = [["tt.divisibility", 16]]
    kernel = triton.compile(ASTSource(fn, signature, constants, attrs), target=TARGET,
                            options=dict(num_warps=num_warps, num_stages=num_stages))
    return kernel.asm["ptx"]


def split_variants():
    """Flag sets the launcher uses: decode with one split (no partials), decode with several
    (partials; rows that fit one split finish directly when cache_seqlens is given), and
    forward_partials (partials only: no OUT, no LSE)."""
    for has_seqlens, causal, write_lse in itertools.product([False, True], repeat=3):
        common = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_D=128, HAS_SEQLENS=has_seqlens, RIGHT_BOUND=causal)
        yield dict(common, HAS_PARTIALS=False, FINAL_FOR_SINGLE_SPLIT_ROWS=False, WRITE_LSE=write_lse, HAS_OUT=True)
        for merge in (False, True):  # a combine kernel follows, or the last split merges
            yield dict(common, HAS_PARTIALS=True, FINAL_FOR_SINGLE_SPLIT_ROWS=has_seqlens, WRITE_LSE=write_lse,
                       HAS_OUT=True, MERGE_IN_LAST_SPLIT=merge)
        yield dict(common, HAS_PARTIALS=True, FINAL_FOR_SINGLE_SPLIT_ROWS=False, WRITE_LSE=False, HAS_OUT=False)
    for paged, kv in itertools.product([False, True], ["same", "fp8e4nv", "fp8e5"]):
        yield dict(BLOCK_M=16, BLOCK_N=64, BLOCK_D=128, HAS_SEQLENS=True, HAS_PARTIALS=True, RIGHT_BOUND=False,
                   FINAL_FOR_SINGLE_SPLIT_ROWS=True, WRITE_LSE=True, HAS_OUT=True, PAGED=paged, KV=kv)
    for paged in (False, True):  # fp8, long splits: 128-key tiles (pages of 16 and 1 when paged)
        for page in ((16, 1) if paged else (0,)):
            yield dict(BLOCK_M=16, BLOCK_N=128, BLOCK_D=128, HAS_SEQLENS=True, HAS_PARTIALS=True, RIGHT_BOUND=False,
                       FINAL_FOR_SINGLE_SPLIT_ROWS=True, WRITE_LSE=True, HAS_OUT=True, KV="fp8e4nv", PAGED=paged,
                       **({"PAGE": page} if paged else {}))
    yield dict(BLOCK_M=16, BLOCK_N=64, BLOCK_D=128, HAS_SEQLENS=True, HAS_PARTIALS=True, RIGHT_BOUND=False,  # fp8,
               FINAL_FOR_SINGLE_SPLIT_ROWS=True, WRITE_LSE=True, HAS_OUT=True, KV="fp8e4nv",  # merged in the
               MERGE_IN_LAST_SPLIT=True)  # last split
    for kv in ("fp8e4nv", "fp8e5"):  # fp8 pairs converted by integer ops (GPUs before sm_89), causal rows
        yield dict(BLOCK_M=16, BLOCK_N=64, BLOCK_D=128, HAS_SEQLENS=True, HAS_PARTIALS=True, RIGHT_BOUND=True,
                   FINAL_FOR_SINGLE_SPLIT_ROWS=True, WRITE_LSE=True, HAS_OUT=True, KV=kv, PAIRS_PTX=False)
    for dim in (64, 96, 256):  # fp8 at other head dims (96: column masks on the pairs)
        tiles = choose_tiles(4, dim, fp8_cache=True)
        yield dict(BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_D=tiles.block_d, HAS_SEQLENS=True,
                   HAS_PARTIALS=True, RIGHT_BOUND=False, FINAL_FOR_SINGLE_SPLIT_ROWS=True, WRITE_LSE=True, HAS_OUT=True,
                   KV="fp8e4nv", EVEN_D=tiles.block_d == dim)
    for page_size in (1, 48, 128):  # page sizes are constexprs (16 above)
        yield dict(BLOCK_M=16, BLOCK_N=64, BLOCK_D=128, HAS_SEQLENS=True, HAS_PARTIALS=True, RIGHT_BOUND=False,
                   FINAL_FOR_SINGLE_SPLIT_ROWS=True, WRITE_LSE=True, HAS_OUT=True, PAGED=True, PAGE=page_size)
    for paged in (False, True):  # 32-key tiles: splits of one granule
        yield dict(BLOCK_M=16, BLOCK_N=32, BLOCK_D=128, HAS_SEQLENS=True, HAS_PARTIALS=True, RIGHT_BOUND=False,
                   FINAL_FOR_SINGLE_SPLIT_ROWS=True, WRITE_LSE=True, HAS_OUT=True, PAGED=paged)
    for window, paged, kv in itertools.product([False, True], [False, True], ["same", "fp8e4nv"]):
        # sliding windows (a left bound: masked first tiles, unmasked middle for fp8), softcap,
        # sinks (the final store, the merge and the combine add them) and fixed splits
        yield dict(BLOCK_M=16, BLOCK_N=64, BLOCK_D=128, HAS_SEQLENS=True, HAS_PARTIALS=True, RIGHT_BOUND=window,
                   FINAL_FOR_SINGLE_SPLIT_ROWS=True, WRITE_LSE=True, HAS_OUT=True, PAGED=paged, KV=kv,
                   LEFT_BOUND=window, SOFTCAP=not window, HAS_SINKS=True, MERGE_IN_LAST_SPLIT=paged,
                   INVARIANT=window and not paged)
    for paged, kv, new in itertools.product([False, True], ["same", "fp8e4nv", "fp8e5"], [1, 3]):
        # appended keys (SEQLEN_ADD: attended and written by the split kernel), left padding, cache
        # rows by index (dense), rotated q and new keys
        yield dict(BLOCK_M=16, BLOCK_N=64, BLOCK_D=128, HAS_SEQLENS=True, HAS_PARTIALS=True, RIGHT_BOUND=new > 1,
                   FINAL_FOR_SINGLE_SPLIT_ROWS=True, WRITE_LSE=True, HAS_OUT=True, PAGED=paged, KV=kv,
                   MERGE_IN_LAST_SPLIT=new == 1, SEQLEN_ADD=new, HAS_LEFTPAD=True, HAS_BATCH_IDX=not paged,
                   LEFT_BOUND=paged, ROTARY=True, ROTARY_INTERLEAVED=new == 1,
                   ROTARY_PER_TOKEN=new > 1)
    yield dict(BLOCK_M=16, BLOCK_N=64, BLOCK_D=128, HAS_SEQLENS=True, HAS_PARTIALS=False, RIGHT_BOUND=False,  # one
               FINAL_FOR_SINGLE_SPLIT_ROWS=False, WRITE_LSE=True, HAS_OUT=True, HAS_LEFTPAD=True,  # split,
               HAS_BATCH_IDX=True, SEQLEN_ADD=1)  # padded rows of a larger cache
    for merge in (False, True):  # programs launched KV heads first; merged in the last split, or combined
        yield dict(BLOCK_M=16, BLOCK_N=64, BLOCK_D=128, HAS_SEQLENS=True, HAS_PARTIALS=True, RIGHT_BOUND=False,
                   FINAL_FOR_SINGLE_SPLIT_ROWS=True, WRITE_LSE=True, HAS_OUT=True, MERGE_IN_LAST_SPLIT=merge,
                   HEADS_FIRST=True)
    for rows, dim in itertools.product([1, 4, 20, 64], [64, 96, 128, 256]):
        tiles = choose_tiles(rows, dim)
        yield dict(BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_D=tiles.block_d, HAS_SEQLENS=True,
                   HAS_PARTIALS=True, RIGHT_BOUND=True, FINAL_FOR_SINGLE_SPLIT_ROWS=True, WRITE_LSE=True, HAS_OUT=True,
                   EVEN_D=tiles.block_d == dim)


def main(every: int = 1) -> int:
    count = 0
    order = itertools.count()

    def take() -> bool:  # one variant in `every`, counted over every kernel and dtype
        return next(order) % every == 0

    for dtype in ("bf16", "fp16"):
        for flags in split_variants():
            if not take():
                continue
            has_out = flags.pop("HAS_OUT")
            kv = flags.pop("KV", "same")
            kv = dtype if kv == "same" else kv
            flags.setdefault("PAGED", False)
            page_size = flags.pop("PAGE", 16) if flags["PAGED"] else 0
            flags["PAGE_SIZE"] = page_size
            flags["CHUNK_TILES"], flags["CHUNK_PAGES"] = _page_chunk(page_size, flags["BLOCK_N"])
            flags["HAS_DESCALE"] = kv != dtype
            flags.setdefault("MERGE_IN_LAST_SPLIT", False)
            for name in ("LEFT_BOUND", "SOFTCAP", "HAS_SINKS"):
                flags.setdefault(name, False)
            flags.setdefault("INVARIANT", False)
            for name in ("HAS_LEFTPAD", "HAS_BATCH_IDX"):
                flags.setdefault(name, False)
            flags.setdefault("SEQLEN_ADD", 0)
            flags.setdefault("HEADS_FIRST", False)
            flags["FP8_EMIN"], flags["FP8_MBITS"], flags["FP8_MAX"] = (0, 0, 0.0)
            if flags["SEQLEN_ADD"] and flags["HAS_DESCALE"]:  # new keys rounded to the cache's fp8 format
                fp8_dtype = {"fp8e4nv": "float8_e4m3fn", "fp8e5": "float8_e5m2"}[kv]
                flags["FP8_EMIN"], flags["FP8_MBITS"], flags["FP8_MAX"] = FP8_FORMATS[getattr(torch, fp8_dtype)]
            flags["NEW_BLOCK_N"] = new_key_tile(flags["SEQLEN_ADD"], flags["BLOCK_N"])
            flags.setdefault("ROTARY", False)
            flags.setdefault("ROTARY_INTERLEAVED", True)
            flags.setdefault("ROTARY_PER_TOKEN", False)
            flags.setdefault("EVEN_D", True)  # head dims of a power of two (the variants above: 128)
            flags["FULL_TILES"] = flags["HAS_DESCALE"] and TritonBackend.full_tiles_fp8  # as the launcher sets it
            # fp8 V read as int16 pairs, converted by PTX cvt on sm_90 (the launcher's choice there);
            # PAIRS_PTX=False (the integer path of older GPUs) where a variant asks for it.
            flags["V_PAIRS"] = (flags["HAS_DESCALE"] and TritonBackend.fp8_v_pairs
                                and _pairs_for_tile(flags["BLOCK_M"], flags.get("LEFT_BOUND", False),
                                                    flags["RIGHT_BOUND"]))
            flags["V_E5M2"] = kv == "fp8e5"
            flags["PAIRS_PTX"] = flags["V_PAIRS"] and flags.pop("PAIRS_PTX", True)
            if flags["MERGE_IN_LAST_SPLIT"]:  # 4 packed rows, 32 splits: two chunks of 16 (merge_tiles)
                flags.update(MERGE_ROWS=4, MERGE_SPLITS=32, MERGE_CHUNK=16)
            else:  # the launcher passes the merge tile to every launch (the kernel's defaults here)
                flags.update(MERGE_ROWS=16, MERGE_SPLITS=16, MERGE_CHUNK=16)
            # decode without merging: the combine follows (PDL)
            flags["LAUNCH_DEPENDENTS"] = flags["HAS_PARTIALS"] and has_out and not flags["MERGE_IN_LAST_SPLIT"]
            pointers = {"Q": f"*{dtype}", "K": f"*{kv}", "V": "*i16" if flags["V_PAIRS"] else f"*{kv}",
                        "OUT": f"*{dtype}" if has_out else None,
                        "BLOCK_TABLE": "*i32" if flags["PAGED"] else None,
                        "K_DESCALE": "*fp32" if flags["HAS_DESCALE"] else None,
                        "V_DESCALE": "*fp32" if flags["HAS_DESCALE"] else None,
                        "SEQLENS": "*i32" if flags["HAS_SEQLENS"] else None,
                        "OUT_PARTIAL": "*fp32" if flags["HAS_PARTIALS"] else None,
                        "LSE_PARTIAL": "*fp32" if flags["HAS_PARTIALS"] else None,
                        "LSE": "*fp32" if flags["WRITE_LSE"] else None,
                        "ARRIVALS": "*i32" if flags["MERGE_IN_LAST_SPLIT"] else None,
                        "SINKS": "*fp32" if flags.get("HAS_SINKS") else None,
                        "LEFTPAD": "*i32" if flags["HAS_LEFTPAD"] else None,
                        "BATCH_IDX": "*i32" if flags["HAS_BATCH_IDX"] else None,
                        "COS": "*fp32" if flags["ROTARY"] else None, "SIN": "*fp32" if flags["ROTARY"] else None,
                        "K_NEW": f"*{dtype}" if flags["SEQLEN_ADD"] else None,
                        "V_NEW": f"*{dtype}" if flags["SEQLEN_ADD"] else None}
            started = time.perf_counter()
            ptx = compile_variant(split_kv_kernel, pointers, {**flags, "GRANULE": 128, "RUNTIME_BOUND_WHILE": False},
                                  floats=("qk_scale_log2", "softcap_log2"))
            assert "mma" in ptx, "the split kernel's dots should use tensor cores"
            if flags["MERGE_IN_LAST_SPLIT"]:
                # The last split's merge: a gpu-scope acq_rel count, partials read through L2.
                assert re.search(r"atom\.global\.gpu\.acq_rel\.add", ptx), f"no arrival count: {flags}"
                assert "ld.global.cg" in ptx, f"merge reads partials through L1: {flags}"
            if flags["PAIRS_PTX"]:
                # V's tile: 16-bit elements through a transposing ldmatrix, one cvt per pair, no byte gathers.
                assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx, f"V not via ldmatrix.trans: {flags}"
                assert f"cvt.rn.f16x2.{'e5m2' if flags['V_E5M2'] else 'e4m3'}x2" in ptx, f"no pair cvt: {flags}"
                assert "ld.shared.b8" not in ptx, f"fp8 bytes gathered from shared memory: {flags}"
            if flags["BLOCK_N"] == 64 and flags["HAS_PARTIALS"] and has_out and kv == dtype:
                # K/V tiles stream through a 3-stage cp.async pipeline, two tiles in flight, in the
                # dense and the paged kernel alike (paged used to wait for every tile: wait_group 0).
                assert re.search(r"cp\.async\.wait_group\s+2;", ptx), f"K/V loads not pipelined: {flags}"
            print(f"split {dtype} {flags}: {time.perf_counter() - started:.2f} s", flush=True)
            count += 1
        for skip, write_lse, block_d, chunk in itertools.product([False, True], [False, True], [64, 128, 256],
                                                                 [32, 8]):
            pointers = {"OUT_PARTIAL": "*fp32", "LSE_PARTIAL": "*fp32", "OUT": f"*{dtype}",
                        "SEQLENS": "*i32" if skip else None, "LSE": "*fp32" if write_lse else None, "SINKS": None,
                        "LEFTPAD": None}
            # BLOCK_S 32: one chunk (CHUNK_S 32) or a loop over chunks (8); decode waits on the split (PDL).
            plain = dict(LEFT_BOUND=False, INVARIANT=False, HAS_SINKS=False, SEQLEN_ADD=0, HAS_LEFTPAD=False)
            if take():
                compile_variant(combine_kernel, pointers, dict(BLOCK_D=block_d, BLOCK_S=32, CHUNK_S=chunk,
                                                               GRANULE=128, SKIP_SINGLE_SPLIT_ROWS=skip,
                                                               WRITE_LSE=write_lse, WAIT_FOR_PRIOR_GRID=skip, **plain),
                                num_warps=combine_warps(32, block_d))
                count += 1
            if chunk == 32 and take():  # up to 16 splits: BLOCK_S 16, one warp where a lane holds it all
                compile_variant(combine_kernel, pointers, dict(BLOCK_D=block_d, BLOCK_S=16, CHUNK_S=16, GRANULE=128,
                                                               SKIP_SINGLE_SPLIT_ROWS=skip, WRITE_LSE=write_lse,
                                                               WAIT_FOR_PRIOR_GRID=skip, **plain),
                                num_warps=combine_warps(16, block_d))
                count += 1
        for window, invariant, padded in ((True, False, False), (False, True, False), (True, True, False),
                                          (True, False, True), (False, False, True)):
            # windows, invariant, sinks; appended keys and left padding
            if not take():
                continue
            pointers = {"OUT_PARTIAL": "*fp32", "LSE_PARTIAL": "*fp32", "OUT": f"*{dtype}", "SEQLENS": "*i32",
                        "LSE": "*fp32", "SINKS": "*fp32", "LEFTPAD": "*i32" if padded else None}
            compile_variant(combine_kernel, pointers, dict(BLOCK_D=128, BLOCK_S=32, CHUNK_S=32, GRANULE=128,
                                                           SKIP_SINGLE_SPLIT_ROWS=True, WRITE_LSE=True,
                                                           WAIT_FOR_PRIOR_GRID=True, LEFT_BOUND=window,
                                                           INVARIANT=invariant, HAS_SINKS=True,
                                                           SEQLEN_ADD=3 if padded else 0, HAS_LEFTPAD=padded),
                            num_warps=4)
            count += 1
    print(f"compiled {count} Triton kernel variants for sm_90")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[sys.argv.index("--every") + 1]) if "--every" in sys.argv else 1))
