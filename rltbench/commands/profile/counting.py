"""Kernels per decode step from a parsed trace, the class breakdown, and the graph-vs-profiler check.

Vocabulary used in every output:
- a *step* is one decode step of the engine: one graph replay, generating B tokens at batch B;
- *kernels per step* = kernel nodes of the captured graph + device work launched outside the graph
  by the engine per step (metadata H2D copy, sampled-id D2H copy, ...);
- *kernels per token* = kernels per step / B. The study's figure (torch ~5,600) is per step at
  batch 1, where both are the same.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rltbench.commands.profile.classify import CLASSES, FLOOR_CLASSES, classify_sequence
from rltbench.commands.profile.trace import DeviceEvent, ParsedTrace, group_by_launch, split_phase


@dataclass
class ReplayCounts:
    """Device events per graph replay seen by the profiler (phase of back-to-back replays)."""

    replays: int
    kernels_per_replay: float
    memcpy_per_replay: float
    memset_per_replay: float
    per_replay_kernels: list[int] = field(default_factory=list)  # one entry per replay seen
    outside_events: int = 0  # device events in this phase not launched by a graph replay

    @property
    def consistent(self) -> bool:
        """Every replay showed the same number of kernels (nothing dropped by the profiler)."""
        return len(set(self.per_replay_kernels)) <= 1 and len(self.per_replay_kernels) == self.replays

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["consistent"] = self.consistent
        return d


def replay_counts(parsed: ParsedTrace, phase: str | None) -> ReplayCounts:
    """Kernels/memcpy/memset per replay, from the device events launched by `cudaGraphLaunch`."""
    ph = split_phase(parsed, phase)
    n = ph.graph_launches
    groups = group_by_launch(parsed, ph.in_graph)
    per = [sum(1 for e in g if e.kind == "kernel") for g in groups]
    per += [0] * max(0, n - len(groups))  # replays whose kernels the profiler did not see
    k = sum(1 for e in ph.in_graph if e.kind == "kernel")
    mc = sum(1 for e in ph.in_graph if e.kind == "memcpy")
    ms = sum(1 for e in ph.in_graph if e.kind == "memset")
    div = n if n else float("nan")
    return ReplayCounts(n, k / div, mc / div, ms / div, per, len(ph.outside))


@dataclass
class OutsideCounts:
    """Device work per engine step that is not part of the graph replay (from real engine steps)."""

    steps: int
    kernels_per_step: float
    copies_per_step: float  # memcpy + memset
    names: dict[str, float] = field(default_factory=dict)  # name -> per step

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def outside_counts(parsed: ParsedTrace, phase: str, steps: int) -> OutsideCounts:
    """Per-step device events launched outside any graph replay inside annotation `phase`."""
    ph = split_phase(parsed, phase)
    if steps <= 0:
        return OutsideCounts(0, float("nan"), float("nan"))
    names: dict[str, float] = defaultdict(float)
    for e in ph.outside:
        names[e.name] += 1.0 / steps
    k = sum(1 for e in ph.outside if e.kind == "kernel") / steps
    c = sum(1 for e in ph.outside if e.kind != "kernel") / steps
    return OutsideCounts(steps, k, c, dict(sorted(names.items(), key=lambda kv: -kv[1])))


@dataclass
class ClassRow:
    cls: str
    count: float  # per step
    time_us: float  # per step (sum of kernel durations)


def breakdown(groups: Sequence[Sequence[DeviceEvent]]) -> tuple[list[ClassRow], list[dict[str, Any]]]:
    """Class breakdown and top kernels averaged over replays (each group = one replay, in order).

    Returns (rows per class in CLASSES order, top kernels by time: name, class, count/step,
    time_us/step, share of the step's kernel time).
    """
    n = len(groups)
    if n == 0:
        return [ClassRow(c, 0.0, 0.0) for c in CLASSES], []
    cnt: dict[str, float] = defaultdict(float)
    tim: dict[str, float] = defaultdict(float)
    by_name: dict[str, dict[str, Any]] = {}
    for g in groups:
        classes = classify_sequence([e.name for e in g])
        for e, c in zip(g, classes, strict=False):
            cnt[c] += 1
            tim[c] += e.dur_us
            row = by_name.setdefault(e.name, {"name": e.name, "class": c, "count": 0.0, "time_us": 0.0})
            row["count"] += 1
            row["time_us"] += e.dur_us
    rows = [ClassRow(c, cnt[c] / n, tim[c] / n) for c in CLASSES]
    total = sum(r.time_us for r in rows) or float("nan")
    top = sorted(by_name.values(), key=lambda r: -r["time_us"])
    for r in top:
        r["count"] /= n
        r["time_us"] /= n
        r["share"] = r["time_us"] / total
    return rows, top


def floor_time_us(rows: Sequence[ClassRow]) -> float:
    """GEMM floor of one step: summed kernel time of the GEMM and attention classes."""
    return sum(r.time_us for r in rows if r.cls in FLOOR_CLASSES)


def agreement(graph_kernel_nodes: int | None, profiler: ReplayCounts) -> tuple[bool | None, str]:
    """Do the graph-node count and the profiler's kernels per replay agree? (verdict, reason)."""
    if graph_kernel_nodes is None:
        return None, "graph node count unavailable (raw cudaGraph_t not kept or driver API missing)"
    if profiler.replays == 0:
        return False, "the profiler saw no graph launch"
    if profiler.kernels_per_replay == 0:
        return False, "the profiler saw no kernels in the replays (CUPTI collected no graph kernels)"
    if not profiler.consistent:
        return False, (
            f"replays showed different kernel counts {sorted(set(profiler.per_replay_kernels))}: "
            "the profiler dropped events (buffer full?)"
        )
    if profiler.kernels_per_replay == graph_kernel_nodes:
        return True, "graph kernel nodes == profiler kernels per replay"
    diff = profiler.kernels_per_replay - graph_kernel_nodes
    return False, (
        f"profiler saw {profiler.kernels_per_replay:g} kernels per replay, the graph has "
        f"{graph_kernel_nodes} kernel nodes ({diff:+g})"
    )
