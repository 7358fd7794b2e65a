"""Generic GPU timing utilities: CUDA-graph replay timing, cold L2, arm interleaving, copy bandwidth.

Used by `rltbench kernels` (one op per call) and meant to be reused unchanged by `rltbench profile`
(one whole decode step per call: pass a `DecodeBenchmark(...).replay` as the runner, calls=1).

Why each piece exists (docs/measurement.md):
- `GraphCalls` captures K calls, each on a different input set, in ONE CUDA graph; replay time / K is
  the per-call time with no launch overhead and, when the K sets total > 3x L2, a cold cache.
- `L2Flusher` covers what rotation cannot (tiny inputs would need thousands of sets): it overwrites a
  buffer larger than L2 *outside* the timed region before each sample.
- `interleave_order` / `time_interleaved` time arms as A B C C B A A B C ... so clock drift, thermal
  state and neighbours hit every arm alike; `summarize` (rltbench.results.quantiles) reports median
  and spread (p10/p90, IQR).
- `time_calls` / `time_consecutive` / `time_windows` / `time_synced_call` are the plain loops (one
  runner, no interleaving) the step benchmarks, the attention tuner and the diagnostics use, so every
  CUDA event of the package is created here.
- `measure_copy_bandwidth` gives the device-to-device copy rate of *this* run, the yardstick for GB/s.
- `count_graph_kernels` / `count_kernels_profiler` count kernels per call instead of assuming them.

The pure-logic parts (order, statistics, rotation sizing) run anywhere; the rest needs CUDA.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from rltbench.results.quantiles import Quantiles, summarize
from rltbench.results.stats import abba_order

DEFAULT_L2_BYTES = 50 * 1024 * 1024  # H100/H200 when the device cannot be asked
T = TypeVar("T")


# ----------------------------------------------------------------------------------------------
# pure logic
# ----------------------------------------------------------------------------------------------
def interleave_order(names: Sequence[str], rounds: int) -> list[str]:
    """Arm order for `rounds` rounds, alternating forward and reverse: A B C C B A A B C ...

    Every arm gets the same number of slots and, over two rounds, the same average position, so a
    slow drift of the device (clocks, temperature) does not favour the arm that runs first.
    (rltbench.results.stats.abba_order, the one definition every benchmark shares.)
    """
    return abba_order(list(names), rounds)


def is_tie(a: Quantiles, b: Quantiles) -> bool:
    """True when the medians differ by less than either arm's own p10-p90 spread."""
    if a.n == 0 or b.n == 0:
        return True
    return abs(a.median - b.median) < max(a.p90 - a.p10, b.p90 - b.p10)


@dataclass(frozen=True)
class RotationPlan:
    """How many input sets one timed replay rotates through, and whether an L2 flush is needed."""

    sets: int
    bytes_per_set: int
    l2_bytes: int
    factor: float

    @property
    def rotated_bytes(self) -> int:
        return self.sets * self.bytes_per_set

    @property
    def covers_l2(self) -> bool:
        """True when the sets alone total > factor x L2 (the cache is cold without a flush)."""
        return self.rotated_bytes > self.factor * self.l2_bytes

    @property
    def needs_flush(self) -> bool:
        return not self.covers_l2


def rotation_sets(bytes_per_set: int, l2_bytes: int, factor: float = 3.0, min_sets: int = 2,
                  max_sets: int = 256) -> RotationPlan:
    """Smallest number of input sets whose total exceeds `factor` x L2, clamped to [min_sets, max_sets].

    When the clamp at `max_sets` stops short (tiny inputs), `plan.needs_flush` is True and the caller
    flushes L2 before each sample instead (every set in the replay is then read from DRAM once).
    """
    if bytes_per_set <= 0:
        raise ValueError("bytes_per_set must be positive")
    if min_sets < 1 or max_sets < min_sets:
        raise ValueError("need 1 <= min_sets <= max_sets")
    needed = math.floor(factor * l2_bytes / bytes_per_set) + 1
    return RotationPlan(max(min_sets, min(max_sets, needed)), int(bytes_per_set), int(l2_bytes), factor)


def gbps(nbytes: float, seconds: float) -> float:
    """Bytes per second in GB/s (1e9); NaN when the time is not a measurement."""
    if not math.isfinite(seconds) or seconds <= 0:
        return float("nan")
    return nbytes / seconds / 1e9


# ----------------------------------------------------------------------------------------------
# CUDA
# ----------------------------------------------------------------------------------------------
def l2_cache_bytes(device: torch.device | str | int | None = None) -> int:
    """L2 size of the CUDA device as the driver reports it (50 MiB if it cannot be read)."""
    try:
        props = torch.cuda.get_device_properties(torch.device("cuda", torch.cuda.current_device())
                                                 if device is None else device)
        size = int(getattr(props, "L2_cache_size", 0))
        return size if size > 0 else DEFAULT_L2_BYTES
    except (RuntimeError, AssertionError, AttributeError):
        return DEFAULT_L2_BYTES


class L2Flusher:
    """Evicts L2 by zeroing a buffer of `factor` x L2 bytes; call `flush()` outside timed regions."""

    def __init__(self, device: torch.device | str, l2_bytes: int | None = None, factor: float = 3.0):
        l2 = l2_bytes if l2_bytes is not None else l2_cache_bytes(device)
        self.buffer = torch.empty(int(factor * l2) // 4 + 1, dtype=torch.int32, device=device)

    def flush(self) -> None:
        self.buffer.zero_()


class OutputWindow:
    """Which captured calls' outputs stay alive: all of them (``window=None``), or call 0's (for the
    correctness check) plus the last ``window - 1``. A dropped output's block goes back to the
    graph's private pool and serves the call ``window`` places later, so outputs rotate over
    ``window`` buffers the way inputs rotate over their sets, instead of every call writing a fresh
    buffer (k outputs of a big case are hundreds of MB of addresses no real step touches)."""

    def __init__(self, window: int | None) -> None:
        if window is not None and window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self.kept: list[Any] = []
        self._recent: list[Any] = []

    def add(self, i: int, out: Any) -> None:
        if self.window is None or i == 0:
            self.kept.append(out)
            return
        self._recent.append(out)
        if len(self._recent) > self.window - 1:
            self._recent.pop(0)   # freed here: the next call may reuse its memory


class GraphCalls:
    """`call(i)` for i in range(k) captured into one CUDA graph (each call reads input set i).

    Warm-up runs every call eagerly on a side stream first (compiles Triton kernels, settles the
    allocator), so nothing compiles or autotunes during capture. `outputs[i]` holds call i's result
    tensors, rewritten by every replay (used to check that the captured path is still correct);
    with ``keep_outputs=w`` only ``outputs[0]`` is kept and the outputs rotate over w buffers
    (OutputWindow).
    """

    def __init__(self, call: Callable[[int], Any], k: int, warmup: int = 2, keep_graph: bool = True,
                 keep_outputs: int | None = None):
        if k < 1:
            raise ValueError("k must be >= 1")
        self.k = k
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                for i in range(k):
                    call(i)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        self._kept = False
        try:
            self.graph = torch.cuda.CUDAGraph(keep_graph=keep_graph)
            self._kept = keep_graph
        except TypeError:  # older torch without keep_graph
            self.graph = torch.cuda.CUDAGraph()
        window = OutputWindow(keep_outputs)
        with torch.cuda.graph(self.graph):
            for i in range(k):
                window.add(i, call(i))
        self.outputs = window.kept
        self.kernel_nodes = count_graph_kernels(self.graph) if self._kept else None
        if self._kept and hasattr(self.graph, "instantiate"):
            self.graph.instantiate()
        torch.cuda.synchronize()

    def replay(self) -> None:
        self.graph.replay()


def _libcuda() -> ctypes.CDLL | None:
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def count_graph_kernels(graph: Any) -> int | None:
    """Kernel nodes in a captured (kept, not yet destroyed) CUDA graph via the driver API.

    Counts CU_GRAPH_NODE_TYPE_KERNEL (0) nodes only; memcpy/memset/event nodes are not kernels.
    Returns None when the raw graph or the driver library is not available.
    """
    try:
        raw = int(graph.raw_cuda_graph())
    except (AttributeError, RuntimeError, TypeError):
        return None
    lib = _libcuda()
    if lib is None or raw == 0:
        return None
    handle = ctypes.c_void_p(raw)
    n = ctypes.c_size_t(0)
    if lib.cuGraphGetNodes(handle, None, ctypes.byref(n)) != 0:
        return None
    nodes = (ctypes.c_void_p * max(1, n.value))()
    if lib.cuGraphGetNodes(handle, nodes, ctypes.byref(n)) != 0:
        return None
    kernels = 0
    kind = ctypes.c_int(-1)
    for i in range(n.value):
        if lib.cuGraphNodeGetType(ctypes.c_void_p(nodes[i]), ctypes.byref(kind)) != 0:
            return None
        kernels += int(kind.value == 0)
    return kernels


def count_kernels_profiler(run: Callable[[], Any], calls: int = 1) -> float | None:
    """Device kernels launched by `run()` (eager calls or a graph replay) / `calls`, via torch.profiler.

    Memcpy/Memset device events are not counted. None when CUDA or the profiler is not available.
    """
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        events = prof.events()
    except (RuntimeError, AssertionError):
        return None
    n = 0
    for ev in events:
        if getattr(ev, "device_type", None) != DeviceType.CUDA:
            continue
        if ev.name.startswith(("Memcpy", "Memset")):
            continue
        n += 1
    return n / calls


def time_interleaved(runners: Mapping[str, Callable[[], Any]], calls: Mapping[str, int] | int = 1,
                     rounds: int = 10, reps: int = 10, warmup: int = 3,
                     before_sample: Callable[[], Any] | None = None,
                     window: AbstractContextManager[Any] | None = None,
                     before_slot: Callable[[], Any] | None = None) -> dict[str, list[float]]:
    """Time each runner with CUDA events, arms interleaved; returns per-call microseconds per sample.

    One sample = `runner()` between two CUDA events, divided by its `calls` (e.g. K graph-captured
    calls). Each round visits the arms in `interleave_order` and takes `reps` samples per arm.
    `warmup` untimed runs per arm come first. `before_sample()` (e.g. an L2 flush) runs before each
    sample, outside the events. `before_slot()` runs once at the start of each slot, before its
    primer: an L2 flush there gives every slot the same cache state whichever arm ran before it
    (see _timed_rounds). Events are read once at the end so host syncs do not gate the GPU.
    `window` (e.g. a rltbench.bench.warmth.ColdWork) is entered after the warm-up and left after the
    last sample: it sees the timed samples only.
    """
    names = list(runners)
    per_call = {n: (calls if isinstance(calls, int) else calls[n]) for n in names}
    for name in names:
        for _ in range(warmup):
            if before_sample is not None:
                before_sample()
            runners[name]()
    torch.cuda.synchronize()
    pairs: dict[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = {n: [] for n in names}
    with window if window is not None else nullcontext():
        _timed_rounds(runners, pairs, interleave_order(names, rounds), reps, before_sample, before_slot)
    return {n: [s.elapsed_time(e) * 1000.0 / per_call[n] for s, e in pairs[n]] for n in names}


def _timed_rounds(runners: Mapping[str, Callable[[], Any]],
                  pairs: dict[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]], order: Sequence[str],
                  reps: int, before_sample: Callable[[], Any] | None,
                  before_slot: Callable[[], Any] | None = None) -> None:
    """`reps` event-timed samples per slot of `order`, a device sync after each slot.

    Each slot starts with one untimed run: after the sync the device is idle, so a first timed
    sample would include the host's launch of the runner (microseconds for a graph) between its
    start event and its first kernel. Behind the untimed run the timed ones are already queued
    when the device reaches them, as every later sample of the slot is. Without it, with few
    samples per slot, that gap is in a large share of the samples and moves the median.

    `before_slot()` comes first. Why: what the previous slot left in L2 outlasts a primer. On the
    H200 the exact norm at 4096 x 2048, whose loads are marked evict-first, ran faster for
    milliseconds after its own slot than after torch's, a copy's or an L2 flush
    (results/gpu/carryover), so without a common start an arm's figure depended on which arms
    stood next to it in the order."""
    for name in order:
        run = runners[name]
        if before_slot is not None:
            before_slot()
        run()   # the slot's primer (see above)
        for _ in range(reps):
            if before_sample is not None:
                before_sample()
            start, end = _event(), _event()
            start.record()
            run()
            end.record()
            pairs[name].append((start, end))
        torch.cuda.synchronize()  # bounded queue depth; keeps host and device within a round


def _event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)


def time_calls(run: Callable[[], Any], iters: int, warmup: int = 0,
               device: torch.device | None = None) -> list[float]:
    """Milliseconds of each of `iters` calls of `run()`, an event pair around each.

    `warmup` untimed calls come first. The device is synchronised once, after the last call, so the
    host queues the calls ahead of the device the way a serving loop does (`device`: the one to wait
    for, the current one by default)."""
    for _ in range(warmup):
        run()
    pairs = [(_event(), _event()) for _ in range(iters)]
    for start, end in pairs:
        start.record()
        run()
        end.record()
    torch.cuda.synchronize(device)
    return [start.elapsed_time(end) for start, end in pairs]


def time_consecutive(run: Callable[[], Any], calls: int) -> list[float]:
    """Milliseconds of each of `calls` back-to-back calls, one event between neighbours (calls + 1 in
    all): the position of a call in the run is kept, for effects that fade call by call (e.g. what an
    earlier kernel left in L2)."""
    events = [_event() for _ in range(calls + 1)]
    events[0].record()
    for j in range(calls):
        run()
        events[j + 1].record()
    torch.cuda.synchronize()
    return [events[j].elapsed_time(events[j + 1]) for j in range(calls)]


def time_windows(run: Callable[[], Any], windows: int, calls_per_window: int) -> list[float]:
    """Milliseconds of each of `windows` windows of `calls_per_window` calls; the host waits for the
    end of each window before it starts the next."""
    start, end = _event(), _event()
    times = []
    for _ in range(windows):
        start.record()
        for _ in range(calls_per_window):
            run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def time_synced_call(run: Callable[[], T]) -> tuple[float, float, T]:
    """(device ms by CUDA events, wall ms, result) of one call of `run()` followed by a device sync:
    the wall time shows the host work the device time does not."""
    start, end = _event(), _event()
    t0 = time.perf_counter()
    start.record()
    result = run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end), (time.perf_counter() - t0) * 1e3, result


def measure_copy_bandwidth(device: torch.device | str = "cuda", nbytes: int | None = None,
                           samples: int = 30) -> dict[str, float]:
    """Device-to-device copy rate of this run (GB/s = (read + write bytes) / median time).

    The buffer defaults to max(4 x L2, 256 MiB) so the copy runs from DRAM, not from the cache.
    """
    if nbytes is None:
        nbytes = max(4 * l2_cache_bytes(device), 256 * 1024 * 1024)
    src = torch.empty(nbytes // 4, dtype=torch.int32, device=device).random_(0, 1 << 30)
    dst = torch.empty_like(src)
    times = time_interleaved({"copy": lambda: dst.copy_(src)}, rounds=1, reps=samples, warmup=3)["copy"]
    stats = summarize(times)
    moved = 2 * src.numel() * src.element_size()
    return {"bytes": moved, "median_us": stats.median, "p10_us": stats.p10, "p90_us": stats.p90,
            "gbps": gbps(moved, stats.median * 1e-6)}
