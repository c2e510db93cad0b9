"""Timers: device time by CUDA-graph replay (or CUDA events), eager host + device time, and the
host time of an eager call alone.

All timers take ``run(i)``, one call on input set ``i``, and cycle ``i`` through the
``num_sets`` input sets so consecutive calls read different KV (see
:func:`flashsplit.bench.cases.rotation_count`: the sets together exceed 3x the L2).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class TimingConfig:
    """How hard to time. Defaults: 20 calls per graph, 50 timed replays (median), 5 warm-up.

    ``budget_ms`` bounds one graph replay and one eager sample: a slow contender (compiled
    FlexAttention took 4.4 ms per call at B = 1, 128k keys on the H200) gets fewer calls per
    graph / per eager sample, never fewer replays, so one row stays within seconds.
    """

    calls_per_graph: int = 20
    warmup: int = 5
    replays: int = 50
    eager_calls: int = 50
    eager_repeats: int = 5
    budget_ms: float = 25.0


@dataclass(frozen=True)
class Timing:
    """Per-call times in microseconds; ``method`` is "graph" or "events" (how device_us was taken);
    ``host_us``: the host's share of an eager call (None where not measured)."""

    device_us: float
    eager_us: float
    method: str
    note: str = ""
    host_us: float | None = None


def calls_per_graph(config: TimingConfig, num_sets: int, per_call_us: float | None = None) -> int:
    """Calls captured in one graph: ``config.calls_per_graph``, fewer when ``per_call_us`` says a
    replay would exceed ``config.budget_ms``, but always enough to touch every input set once.

    >>> calls_per_graph(TimingConfig(), 45), calls_per_graph(TimingConfig(), 1, per_call_us=4400.0)
    (45, 6)
    """
    calls = config.calls_per_graph
    if per_call_us:
        calls = min(calls, max(1, math.ceil(config.budget_ms * 1e3 / per_call_us)))
    return max(calls, num_sets)


def eager_calls(config: TimingConfig, per_call_us: float | None = None) -> int:
    """Calls per eager sample: ``config.eager_calls``, fewer (at least 3) for slow calls."""
    if not per_call_us:
        return config.eager_calls
    return min(config.eager_calls, max(3, math.ceil(config.budget_ms * 1e3 / per_call_us)))


def estimate_us(run: Callable[[int], object], num_sets: int, calls: int = 3) -> float:
    """Rough microseconds per call (events around a few eager calls), to size the timed loops."""
    run(0)
    torch.cuda.synchronize()
    return statistics.median(_event_times_ms(lambda: [run(i % num_sets) for i in range(calls)], 1)) * 1e3 / calls


def _event_times_ms(launch: Callable[[], None], reps: int) -> list[float]:
    """Milliseconds of ``launch()`` per repetition, from CUDA events; synchronizes once at the end."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        launch()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


def capture_graph(run: Callable[[int], object], num_sets: int, calls: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` captured calls cycling the ``num_sets`` input sets.

    Warms up on a side stream first: lazy init (cuBLAS handles, autotuning, JIT) must not happen
    inside the capture. Raises whatever capture raises."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(min(calls, max(3, num_sets))):
            run(i % num_sets)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            run(i % num_sets)
    return graph


def time_graph(run: Callable[[int], object], num_sets: int, config: TimingConfig, calls: int) -> float:
    """Median device microseconds per call, from replays of a graph of ``calls`` captured calls.

    A graph removes launch overhead, so this is the kernels' own time even for 5 us calls.
    Raises whatever capture raises (the caller falls back to :func:`time_events`).
    """
    graph = capture_graph(run, num_sets, calls)
    try:
        for _ in range(config.warmup):
            graph.replay()
        torch.cuda.synchronize()
        times_ms = _event_times_ms(graph.replay, config.replays)
    finally:
        del graph
    return statistics.median(times_ms) * 1e3 / calls


def time_interleaved(graphs: dict[str, torch.cuda.CUDAGraph], calls: int, rounds: int) -> dict[str, float]:
    """Median us per call of each graph of ``calls`` captured calls, the graphs replayed in turn
    (order reversed every other round), ``rounds`` times: side by side, so a drift of the card
    moves every graph's figure alike."""
    samples: dict[str, list[float]] = {name: [] for name in graphs}
    names = list(graphs)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[name].replay()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) * 1e3 / calls)
    return {name: statistics.median(s) for name, s in samples.items()}


def replay_calls(num_sets: int, kv_bytes: float) -> int:
    """Calls per captured graph for a call that reads ``kv_bytes``: as many as the bench's replay
    budget holds, the call's time estimated from a 4 TB/s read."""
    return calls_per_graph(TimingConfig(), num_sets, per_call_us=max(1.0, kv_bytes / 4.0e6))


def time_side_by_side(runs: dict[str, Callable[[int], object]], num_sets: int, kv_bytes: float,
                      rounds: int) -> dict[str, float]:
    """Median us per call of each run (``run(i)`` uses input set ``i``): each captured as a graph
    over the ``num_sets`` rotated sets (:func:`replay_calls` calls), warmed up, then replayed
    interleaved (:func:`time_interleaved`)."""
    calls = replay_calls(num_sets, kv_bytes)
    graphs = {name: capture_graph(run, num_sets, calls) for name, run in runs.items()}
    for graph in graphs.values():
        for _ in range(3):
            graph.replay()
    torch.cuda.synchronize()
    return time_interleaved(graphs, calls, rounds)


def time_events(run: Callable[[int], object], num_sets: int, config: TimingConfig, calls: int) -> float:
    """Median microseconds per call of back-to-back eager launches, from CUDA events.

    The fallback when a contender cannot be captured; for short kernels it includes launch
    gaps whenever the host is slower than the device.
    """

    def burst():
        for i in range(calls):
            run(i % num_sets)

    for _ in range(config.warmup):
        burst()
    torch.cuda.synchronize()
    return statistics.median(_event_times_ms(burst, config.replays)) * 1e3 / calls


def time_eager(run: Callable[[int], object], num_sets: int, config: TimingConfig, calls: int) -> float:
    """Host + device microseconds per call without a graph: wall clock around ``calls``
    back-to-back calls and one final synchronize, divided by the call count (median of repeats)."""
    return time_eager_and_host(run, num_sets, config, calls)[0]


def time_eager_and_host(run: Callable[[int], object], num_sets: int, config: TimingConfig,
                        calls: int) -> tuple[float, float]:
    """``(eager_us, host_us)`` per call from the same bursts of ``calls`` back-to-back calls:
    eager is the wall clock up to the synchronize after the burst (median of repeats); host is
    the wall clock of the loop alone, before that synchronize (fastest of repeats): what the host
    spends to check and launch a call while the GPU runs behind. A burst enqueues at most a few
    hundred launches, which the driver queues without making the host wait.

    The set index runs on across warm-up and samples: with more sets than calls per sample (a
    short window over a long cache rotates hundreds of sets), each sample reads sets the
    previous one did not, as the graph replays do."""
    warm = min(calls, max(3, num_sets))
    for i in range(warm):
        run(i % num_sets)
    torch.cuda.synchronize()
    eager, host, next_set = [], [], warm
    for _ in range(config.eager_repeats):
        t0 = time.perf_counter()
        for i in range(next_set, next_set + calls):
            run(i % num_sets)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        eager.append((time.perf_counter() - t0) * 1e6 / calls)
        host.append((t1 - t0) * 1e6 / calls)
        next_set += calls
    return statistics.median(eager), min(host)


def measure(run: Callable[[int], object], num_sets: int, config: TimingConfig) -> Timing:
    """Device time (graph replay, else CUDA events) and eager time of one prepared contender."""
    rough = estimate_us(run, num_sets)
    calls = calls_per_graph(config, num_sets, rough)
    reduced = calls < max(config.calls_per_graph, num_sets)  # the budget cut it
    notes = [f"{calls} calls per graph (slow call)"] if reduced else []
    try:
        device_us, method = time_graph(run, num_sets, config, calls), "graph"
    except Exception as e:  # not capturable: host syncs, allocator calls outside the pool, ...
        torch.cuda.synchronize()  # surface (and fail on) sticky errors before going on
        notes.append(f"graph capture failed ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})")
        device_us, method = time_events(run, num_sets, config, calls), "events"
    eager_us, host_us = time_eager_and_host(run, num_sets, config, eager_calls(config, rough))
    return Timing(device_us, eager_us, method, "; ".join(notes), host_us=host_us)
