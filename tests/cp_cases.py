"""Context-parallel decode cases: a whole cache, its shards over the ranks, and a worker that
checks every rank's ``cp_decode`` against single-process ``decode`` over the whole cache and
against the float64 reference (shared by the CPU (gloo) and GPU (NCCL) tests)."""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flashsplit
from flashsplit.reference import dequantize
from flashsplit.testing import check_against_reference, quantize_fp8, to_paged

NAN = float("nan")


def _cuts(total: int, world: int, g: torch.Generator, empty: bool, tail_cuts: bool) -> list[int]:
    """``world + 1`` sorted piece boundaries of a row of ``total`` keys."""
    cuts = sorted(torch.randint(0, total + 1, (world - 1,), generator=g).tolist())
    if tail_cuts and world > 1:  # the last pieces hold a key or two: shards end among the last L_q keys
        fixed = [max(total - 2, 0), max(total - 1, 0)][-(world - 1):]
        cuts = sorted(cuts[:world - 1 - len(fixed)] + fixed)
    if empty and world > 1:
        cuts[0] = 0  # the first piece is empty
    return [0] + cuts + [total]


def build_case(name: str, world: int, seed: int, *, batch: int = 2, seqlen_q: int = 1, heads=(4, 2),
               head_dim: int = 32, totals=(300, 37), causal: bool = False, window_size=(-1, -1),
               sinks: bool = False, softcap: float = 0.0, page_size: int = 0, fp8: torch.dtype | None = None,
               layout: str = "contiguous", empty: bool = True, tail_cuts: bool = False, pass_offset: bool = True,
               merges=("gather", "reduce"), device: str = "cpu") -> dict:
    """A case: q, the whole cache, each rank's shard, and single-process decode's result.

    ``layout``: ``"contiguous"`` (pieces in rank order), ``"permuted"`` (pieces in a random rank
    order) or ``"interleaved"`` (rank r holds keys r, r + W, ...: a disjoint cover that is no
    range, only for masks that see every key). With ``empty`` the first rank's piece of row 0 and
    the last rank's piece of row 1 are empty. Local capacities differ by rank; slots past a
    shard's length hold NaN.
    """
    g = torch.Generator().manual_seed(seed)
    num_heads, num_heads_kv = heads
    capacity = max(totals) + 5

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(torch.float16)

    q = rand(batch, seqlen_q, num_heads, head_dim)
    k, v = rand(batch, capacity, num_heads_kv, head_dim), rand(batch, capacity, num_heads_kv, head_dim)
    dead = torch.arange(capacity)[None, :] >= torch.tensor(totals)[:, None]
    k[dead], v[dead] = NAN, NAN
    k_descale = v_descale = None
    k_ref, v_ref = k, v
    if fp8 is not None:
        k, k_descale = quantize_fp8(k, fp8, per_head=True, generator=g)
        v, v_descale = quantize_fp8(v, fp8, per_head=True, generator=g)
        k_ref, v_ref = dequantize(k, k_descale), dequantize(v, v_descale)
    sink_logits = torch.randn(num_heads, generator=g) if sinks else None
    totals_t = torch.tensor(totals, dtype=torch.int32)
    options = dict(causal=causal, window_size=window_size, softcap=softcap, sinks=sink_logits, k_descale=k_descale,
                   v_descale=v_descale)
    # Single-process decode over the whole cache, on the device the case runs on.
    expected_out, expected_lse = flashsplit.decode(*_to((q, k, v), device), cache_seqlens=totals_t.to(device),
                                                   return_lse=True, **_to(options, device))

    keys = [[None] * batch for _ in range(world)]  # keys[rank][row]: the row's global key ids on that rank
    offsets = torch.zeros(world, batch, dtype=torch.int32)
    for b, total in enumerate(totals):
        if layout == "interleaved":
            for r in range(world):
                keys[r][b] = torch.arange(r, total, world)
            continue
        cuts = _cuts(total, world, g, empty and b == 0, tail_cuts)
        if empty and b == 1 and world > 1:
            cuts[-2] = total  # the last piece is empty
        owner = torch.randperm(world, generator=g).tolist() if layout == "permuted" else list(range(world))
        for piece, r in enumerate(owner):
            keys[r][b] = torch.arange(cuts[piece], cuts[piece + 1])
            offsets[r, b] = cuts[piece]
    shards = []
    for r in range(world):
        lengths = [len(keys[r][b]) for b in range(batch)]
        local_capacity = max(lengths) + 1 + 2 * r
        k_local = torch.full((batch, local_capacity, num_heads_kv, head_dim), NAN).to(k.dtype)
        v_local = k_local.clone()
        for b in range(batch):
            k_local[b, :lengths[b]] = k[b, keys[r][b]]
            v_local[b, :lengths[b]] = v[b, keys[r][b]]
        shard = dict(cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
                     kv_offset=offsets[r].clone() if pass_offset else None, block_table=None)
        if page_size:
            k_local, v_local, shard["block_table"], _, _ = to_paged(k_local, v_local, lengths, page_size, g,
                                                                    share_first_page=False)
        shard.update(k_cache=k_local, v_cache=v_local)
        shards.append(shard)
    case = dict(name=name, q=q, totals=totals_t, options=options, merges=merges, shards=shards,
                expected=(expected_out, expected_lse), reference=(k_ref, v_ref))
    return _to(case, device) if device != "cpu" else case


def _to(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {key: _to(value, device) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(value, device) for value in obj)
    return obj


def check_case(case: dict, rank: int, world: int, group=None) -> None:
    """Run ``cp_decode`` on this rank's shard of ``case`` once per merge and check it."""
    import flashsplit.distributed as fd

    shard = case["shards"][rank]
    q = case["q"]
    expected_out, expected_lse = case["expected"]
    k_ref, v_ref = case["reference"]
    options = case["options"]
    for i, merge in enumerate(case["merges"]):
        what = f"{case['name']} merge={merge} rank={rank}/{world}"
        given = torch.full_like(q, NAN) if i % 2 else None
        out, lse = fd.cp_decode(q, shard["k_cache"], shard["v_cache"], group=group, return_lse=True, merge=merge,
                                out=given, cache_seqlens=shard["cache_seqlens"], kv_offset=shard["kv_offset"],
                                block_table=shard["block_table"], **options)
        try:
            if given is not None:
                assert out.data_ptr() == given.data_ptr(), "cp_decode did not write into out="
            # One decode over the whole cache: partials rounded to q's dtype once more than decode's own.
            torch.testing.assert_close(out.float(), expected_out.float(), atol=1e-3, rtol=2e-3)
            assert torch.equal(torch.isneginf(lse), torch.isneginf(expected_lse)), "lse: -inf pattern differs"
            torch.testing.assert_close(lse, expected_lse, atol=2e-5, rtol=1e-5)
            check_against_reference(out, lse, q, k_ref, v_ref, case["totals"], options["causal"],
                                    window_size=options["window_size"], softcap=options["softcap"],
                                    sinks=options["sinks"])
            _check_same_on_every_rank(out, lse, world, group)
        except AssertionError as error:
            raise AssertionError(f"{what}: {error}") from None


def check_graph_replay(case: dict, rank: int, world: int, group=None, merge: str = "reduce") -> None:
    """Capture one ``cp_decode`` step in a CUDA graph (its collectives included), replay it, check
    it; then zero the shard's lengths on the device and replay: every row is empty (O = 0, LSE
    -inf or the sink), so the graph follows ``cache_seqlens``' values, not the capture's."""
    import flashsplit.distributed as fd

    shard = case["shards"][rank]
    q, options = case["q"], case["options"]
    seqlens = shard["cache_seqlens"].clone()

    def step():
        return fd.cp_decode(q, shard["k_cache"], shard["v_cache"], group=group, return_lse=True, merge=merge,
                            cache_seqlens=seqlens, kv_offset=shard["kv_offset"], block_table=shard["block_table"],
                            **options)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    graph.replay()
    torch.cuda.synchronize()
    what = f"{case['name']} graph merge={merge} rank={rank}/{world}"
    expected_out, expected_lse = case["expected"]
    try:
        torch.testing.assert_close(out.float(), expected_out.float(), atol=1e-3, rtol=2e-3)
        torch.testing.assert_close(lse, expected_lse, atol=2e-5, rtol=1e-5)
        seqlens.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, torch.zeros_like(out)), "rows of no keys: expected O = 0"
        sinks = options["sinks"]
        empty = (torch.full_like(lse, float("-inf")) if sinks is None
                 else sinks.float()[None, :, None].expand_as(lse))
        assert torch.equal(lse, empty), "rows of no keys: expected LSE -inf (the sink with sinks)"
    except AssertionError as error:
        raise AssertionError(f"{what}: {error}") from None


def _check_same_on_every_rank(out: torch.Tensor, lse: torch.Tensor, world: int, group) -> None:
    mine = torch.cat([lse.reshape(-1).view(torch.uint8), out.reshape(-1).view(torch.uint8)])
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    assert all(torch.equal(theirs, mine) for theirs in every), "ranks ended with different outputs"


def _worker(rank: int, world: int, store_path: str, backend: str, cases: list, graphs: bool = False) -> None:
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        for case in cases:
            if backend == "nccl":
                case = _to(case, f"cuda:{rank}")
            check_case(case, rank, world)
            if graphs:
                for merge in case["merges"]:
                    check_graph_replay(case, rank, world, merge=merge)
    finally:
        dist.destroy_process_group()


def spawn_cases(world: int, cases: list, tmp_dir, backend: str = "gloo", graphs: bool = False) -> None:
    """Check ``cases`` on ``world`` processes (one spawn for them all; ``graphs``: also captured in
    CUDA graphs, with NCCL); a failure re-raises here."""
    cases = _to(cases, "cpu")  # pickled to the workers; each moves them to its own GPU
    os.makedirs(str(tmp_dir), exist_ok=True)
    store_path = os.path.join(str(tmp_dir), f"store-{backend}-{world}")
    mp.spawn(_worker, args=(world, store_path, backend, cases, graphs), nprocs=world, join=True)


@contextlib.contextmanager
def group_of_one(backend: str):
    """A ``backend`` process group of this process alone (the world), destroyed on exit."""
    with tempfile.NamedTemporaryFile() as store:
        dist.init_process_group(backend, store=dist.FileStore(store.name, 1), rank=0, world_size=1)
        try:
            yield dist.group.WORLD
        finally:
            dist.destroy_process_group()
