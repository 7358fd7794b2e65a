"""Per-arm state of the engine: an arm's ops, its graph sets (decode and prefill) and its counters.

Why one state per arm (and per exit mode): a CUDA graph captures one arm's kernels and one exit
mode's work, so switching arm or mode switches graph sets, never recaptures. The decode graphs are
keyed by (batch bucket, context class); the prefill graphs by the step's exact shape, under the
capture-on-second-sight policy of `PrefillGraphSet`. The runner (rltbench.engine.runner) captures
and replays them; the engine (rltbench.engine.engine) picks the current state.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from torch import Tensor

from rltbench.arms import ARMS, REFERENCE, ArmSpec
from rltbench.errors import UsageError
from rltbench.kernels.ops import make_ops

# Prefill shapes remembered for the capture-on-second-sight policy (LRU; bounds host memory when every
# step of a session has a new shape).
PREFILL_SEEN_CAP = 4096
# (per row (context start, chunk tokens), block-table width, indices of the rows whose prompt completes)
PrefillKey = tuple[tuple[tuple[int, int], ...], int, tuple[int, ...]]
# ("bucket", padded token count): the graph of a token-count bucket, serving steps of any shape
BucketKey = tuple[str, int]


def _plain(stats: Any) -> Any:
    """Ops stats as JSON-friendly data, whatever container the kernels package uses."""
    for name in ("as_dict", "to_dict", "snapshot"):
        fn = getattr(stats, name, None)
        if callable(fn):
            return fn()
    if isinstance(stats, Mapping):
        return {str(k): _plain(v) for k, v in stats.items()}
    if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        return dataclasses.asdict(stats)
    if isinstance(stats, (int, float, str, bool)) or stats is None:
        return stats
    return repr(stats)


class PrefillGraphSet:
    """One arm's captured prefill graphs and the policy that fills it. Bucket graphs (`BucketKey`,
    captured at warm-up) are all kept: evicting one would put a capture inside a measured window.
    Exact-shape graphs (LRU, at most `cap`): a shape is captured the second time it is seen, so a
    repeating burst gets replays while sessions of unique shapes stay eager and pay no capture. Keys
    whose capture failed stay eager for good."""

    def __init__(self, cap: int, seen_cap: int = PREFILL_SEEN_CAP) -> None:
        self.cap = cap
        self.seen_cap = seen_cap
        self.graphs: OrderedDict[PrefillKey | BucketKey, tuple[Any, Tensor | None]] = OrderedDict()
        self.seen: OrderedDict[PrefillKey | BucketKey, int] = OrderedDict()
        self.bad: set[PrefillKey | BucketKey] = set()

    def get(self, key: PrefillKey | BucketKey) -> tuple[Any, Tensor | None] | None:
        """The captured graph for `key` (marked most recently used), or None."""
        entry = self.graphs.get(key)
        if entry is not None:
            self.graphs.move_to_end(key)
        return entry

    def should_capture(self, key: PrefillKey | BucketKey) -> bool:
        """Count one sighting of an uncaptured `key`; True from the second sighting on."""
        n = self.seen.pop(key, 0) + 1
        self.seen[key] = n
        while len(self.seen) > self.seen_cap:
            self.seen.popitem(last=False)
        return n >= 2 and key not in self.bad

    def put(self, key: PrefillKey | BucketKey, entry: tuple[Any, Tensor | None]) -> None:
        """Keep a new graph, evicting the least recently used exact-shape graph beyond `cap` (its pool
        memory is reused); bucket graphs are never evicted."""
        self.graphs[key] = entry
        self.graphs.move_to_end(key)
        shaped = [k for k in self.graphs if not is_bucket(k)]
        for k in shaped[: max(0, len(shaped) - self.cap)]:
            del self.graphs[k]

    def clear(self) -> None:
        """Drop the graphs (their static input moved); sighting counts stay, so hot keys recapture."""
        self.graphs.clear()


def is_bucket(key: PrefillKey | BucketKey) -> bool:
    """Whether a prefill graph key names a token-count bucket (not an exact step shape)."""
    return isinstance(key[0], str)


class ArmState:
    """Ops, the graph sets (decode and prefill) and the counters of one arm in one exit mode."""

    def __init__(self, name: str, ops: Any, warm_ops: Any, prefill_graph_cap: int = 16) -> None:
        self.name = name
        self.ops = ops
        self.warm_ops = warm_ops  # fused paths on in eager mode: compiles Triton kernels before capture
        # decode graphs: a CUDA graph, or with the compute-saving exit an exit_stop.StagedDecodeGraphs
        self.graphs: dict[tuple[int, int], tuple[Any, Tensor]] = {}
        self.prefill = PrefillGraphSet(prefill_graph_cap)
        self.counters: dict[str, Any] = {}
        self.reset_counters()

    def ops_stats(self) -> Any:
        """The ops' own counters (fused calls, fallbacks by reason, ...) as JSON-friendly data."""
        return _plain(getattr(self.ops, "stats", None))

    def reset_counters(self) -> None:
        self.counters = dict(
            steps=0,
            prefill_steps=0,
            decode_steps=0,
            prefill_tokens=0,
            decode_tokens=0,
            graph_replays=0,
            graph_captures=0,
            eager_fallbacks=0,
            prefill_graph_replays=0,
            prefill_graph_captures=0,
            prefill_graph_failures=0,
            prefill_eager=0,
            row_invariant_tiles=0,
            frozen_graph_misses=0,
            buffer_growths=0,
            batch_size_hist={},
            decode_loops_hist={},  # compute-saving exit only: loops run -> decode steps
        )


def arm_states(arms: Mapping[str, Any] | Iterable[str] | None, prefill_graph_cap: int) -> dict[str, ArmState]:
    """One ArmState per arm: an ArmSpec (or an arm name, default the reference arm) becomes its Ops
    and the same ops with scope "all" (warm_ops); an Ops object given directly serves as both."""
    if arms is None:
        arms = {REFERENCE: ARMS[REFERENCE]}
    elif not isinstance(arms, Mapping):
        names = list(arms)
        unknown = [a for a in names if a not in ARMS]
        if unknown:
            raise UsageError(f"unknown arm(s) {unknown}; known: {sorted(ARMS)}")
        arms = {a: ARMS[a] for a in names}
    if not arms:
        raise UsageError("at least one arm is needed")
    out = {}
    for name, spec in arms.items():
        if isinstance(spec, ArmSpec):
            ops, warm = make_ops(spec), make_ops(spec.replace(scope="all"))
        else:
            ops = warm = spec
        out[name] = ArmState(name, ops, warm, prefill_graph_cap)
    return out
