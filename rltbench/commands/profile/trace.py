"""Reading torch.profiler chrome traces: device events, the runtime calls that launched them, phases.

Why the chrome trace and not `prof.events()`: its schema ("traceEvents" with `cat` kernel /
gpu_memcpy / gpu_memset / cuda_runtime / user_annotation and `args.correlation`) has been stable
across torch 2.5-2.13, it is what we keep on disk anyway (trace-<arm>.json.gz), and recorded traces
make the counting logic testable on a CPU machine. Each device event is linked to the runtime call
that launched it by its correlation id: a kernel whose launch call is `cudaGraphLaunch` ran inside
a CUDA-graph replay; anything else (cudaMemcpyAsync, cudaLaunchKernel, ...) ran outside the graph.
Phases are `record_function` ranges (user annotations) around parts of the profiled work; a device
event belongs to the phase that contains its launch call on the CPU timeline.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEVICE_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
GRAPH_LAUNCH_NAMES = ("cudaGraphLaunch", "cuGraphLaunch")


@dataclass(frozen=True)
class DeviceEvent:
    """One kernel, memcpy or memset that ran on the device."""

    name: str
    kind: str  # kernel | memcpy | memset
    ts_us: float
    dur_us: float
    correlation: int | None = None


@dataclass(frozen=True)
class RuntimeCall:
    """A CUDA runtime/driver API call on the host (cudaGraphLaunch, cudaLaunchKernel, ...)."""

    name: str
    ts_us: float
    dur_us: float
    correlation: int | None = None

    @property
    def is_graph_launch(self) -> bool:
        return self.name.startswith(GRAPH_LAUNCH_NAMES)


@dataclass(frozen=True)
class Annotation:
    """A `record_function` range on the CPU timeline."""

    name: str
    ts_us: float
    dur_us: float

    def contains(self, ts_us: float) -> bool:
        return self.ts_us <= ts_us <= self.ts_us + self.dur_us


@dataclass
class ParsedTrace:
    device: list[DeviceEvent] = field(default_factory=list)
    runtime: list[RuntimeCall] = field(default_factory=list)
    annotations: list[Annotation] = field(default_factory=list)

    def launch_of(self) -> dict[int, RuntimeCall]:
        return {r.correlation: r for r in self.runtime if r.correlation is not None}


def _corr(args: dict[str, Any] | None) -> int | None:
    if not args:
        return None
    for key in ("correlation", "correlation id", "correlationId"):
        if key in args:
            try:
                return int(args[key])
            except (TypeError, ValueError):
                return None
    return None


def load_trace(source: str | Path | dict[str, Any]) -> dict[str, Any]:
    """A chrome trace as a dict (from a path or an already-loaded dict)."""
    if isinstance(source, dict):
        return source
    with open(source, encoding="utf-8") as fh:
        return json.load(fh)


def parse_trace(source: str | Path | dict[str, Any]) -> ParsedTrace:
    """Device events, runtime calls and user annotations of a chrome trace, sorted by time."""
    trace = load_trace(source)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    out = ParsedTrace()
    for ev in events:
        if ev.get("ph") != "X":
            continue
        cat = str(ev.get("cat", ""))
        name = str(ev.get("name", ""))
        ts = float(ev.get("ts", 0.0))
        dur = float(ev.get("dur", 0.0))
        args = ev.get("args")
        if cat in DEVICE_CATS:
            out.device.append(DeviceEvent(name, DEVICE_CATS[cat], ts, dur, _corr(args)))
        elif cat in ("cuda_runtime", "cuda_driver"):
            out.runtime.append(RuntimeCall(name, ts, dur, _corr(args)))
        elif cat == "user_annotation":  # (gpu_user_annotation is the device-side copy: skip)
            out.annotations.append(Annotation(name, ts, dur))
    out.device.sort(key=lambda e: e.ts_us)
    out.runtime.sort(key=lambda e: e.ts_us)
    out.annotations.sort(key=lambda e: e.ts_us)
    return out


@dataclass
class PhaseEvents:
    """Device events of one phase, split by whether a graph replay launched them."""

    graph_launches: int = 0
    in_graph: list[DeviceEvent] = field(default_factory=list)
    outside: list[DeviceEvent] = field(default_factory=list)
    unlinked: list[DeviceEvent] = field(default_factory=list)  # no launch call found (dropped runtime events)


def split_phase(parsed: ParsedTrace, phase: str | None) -> PhaseEvents:
    """Device events whose launch call lies in annotation `phase` (None: the whole trace)."""
    ranges = [a for a in parsed.annotations if phase is None or a.name == phase]
    if phase is not None and not ranges:
        return PhaseEvents()

    def in_phase(ts: float) -> bool:
        return phase is None or any(a.contains(ts) for a in ranges)

    launches = parsed.launch_of()
    res = PhaseEvents()
    res.graph_launches = sum(1 for r in parsed.runtime if r.is_graph_launch and in_phase(r.ts_us))
    for ev in parsed.device:
        call = launches.get(ev.correlation) if ev.correlation is not None else None
        if call is None:
            if phase is None:
                res.unlinked.append(ev)
            continue
        if not in_phase(call.ts_us):
            continue
        (res.in_graph if call.is_graph_launch else res.outside).append(ev)
    return res


def group_by_launch(parsed: ParsedTrace, events: Iterable[DeviceEvent]) -> list[list[DeviceEvent]]:
    """Device events grouped per launch call (one group per graph replay), in launch order."""
    groups: dict[int, list[DeviceEvent]] = {}
    for ev in events:
        if ev.correlation is not None:
            groups.setdefault(ev.correlation, []).append(ev)
    launches = parsed.launch_of()
    order = sorted(groups, key=lambda c: launches[c].ts_us if c in launches else 0.0)
    return [sorted(groups[c], key=lambda e: e.ts_us) for c in order]


def one_replay_trace(trace: dict[str, Any], correlation: int) -> dict[str, Any]:
    """A copy of `trace` keeping only metadata events and the events of one launch (one replay).

    The full trace of several replays of a ~5,600-kernel step is tens of MB; one replay is enough
    to look at in Perfetto / chrome://tracing.
    """
    kept = []
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") == "M":
            kept.append(ev)
        elif _corr(ev.get("args")) == correlation:
            kept.append(ev)
    out = {k: v for k, v in trace.items() if k != "traceEvents"}
    out["traceEvents"] = kept
    return out
