"""Proof that a timed window was warm: the work that must never land inside one, counted around it.

Why: one prefill-graph capture inside a measured burst cell cost its first request 388 ms of TTFT
against 29 ms for every later one, and such a cell looks like a slow arm. A warm-up is supposed to
cover every shape a timed window runs; `ColdWork` proves that it did (every timed cell records its
counts, and reports flag any cell where one is non-zero) instead of trusting it. Counted:

- graph captures and static-buffer growths (which drop captured graphs): the engine's public counters
  (`Engine.cold_counters`), None without an engine;
- compiles: Triton kernel specialisations compiled or loaded from its disk cache, through Triton's
  compilation listener (process-wide, chained to any listener already installed), None where this
  Triton has no listener; the Triton interpreter compiles nothing;
- device mallocs: new segments of torch's CUDA caching allocator (each a cudaMalloc), None off CUDA.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any

import torch

ENGINE_KEYS = ("graph_captures", "prefill_graph_captures", "buffer_growths")


class _TritonCompiles:
    """A process-wide count of Triton compilations (chained to any listener already installed)."""

    def __init__(self) -> None:
        self.count = 0
        self.available: bool | None = None

    def install(self) -> bool:
        if self.available is not None:
            return self.available
        try:
            from triton import knobs  # optional: Triton < 3.4 has no knobs (and compiles stay unobserved)
        except ImportError:
            self.available = False
            return False
        comp = getattr(knobs, "compilation", None)
        if comp is None or not hasattr(comp, "listener"):
            self.available = False
            return False
        previous = comp.listener

        def listener(*args: Any, **kwargs: Any) -> None:
            self.count += 1
            if previous is not None:
                previous(*args, **kwargs)

        comp.listener = listener
        self.available = True
        return True


TRITON_COMPILES = _TritonCompiles()


def cuda_segments(device: Any) -> int | None:
    """Segments the CUDA caching allocator has allocated so far on `device` (None off CUDA)."""
    if getattr(device, "type", str(device).split(":")[0]) != "cuda":
        return None
    return int(torch.cuda.memory_stats(device).get("segment.all.allocated", 0))


def is_cold(counts: Mapping[str, Any] | None) -> bool:
    """Whether a timed window's counts show any cold work (unobservable counts do not count)."""
    return any(bool(v) for v in (counts or {}).values() if v is not None)


class ColdWork:
    """`with ColdWork(engine) as cold: <timed window>`; then `cold.counts` (cold work inside it, None
    where not observable) and `cold.warm`. Without an engine, pass the `device` (no capture counts)."""

    def __init__(self, engine: Any = None, device: Any = None) -> None:
        self.engine = engine
        self.device = device if device is not None else getattr(engine, "device", None)
        self.counts: dict[str, int | None] = {}
        self._before: dict[str, int | None] = {}
        TRITON_COMPILES.install()

    def _read(self) -> dict[str, int | None]:
        engine = dict(self.engine.cold_counters()) if self.engine is not None else {}
        out: dict[str, int | None] = {k: engine.get(k) for k in ENGINE_KEYS}
        out["compiles"] = TRITON_COMPILES.count if TRITON_COMPILES.available else None
        out["device_mallocs"] = cuda_segments(self.device) if self.device is not None else None
        return out

    def __enter__(self) -> ColdWork:
        self._before = self._read()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        after = self._read()
        self.counts = {
            k: None if v is None or self._before.get(k) is None else v - int(self._before[k] or 0)
            for k, v in after.items()
        }

    @property
    def warm(self) -> bool:
        return not is_cold(self.counts)

    def record(self) -> dict[str, Any]:
        """What a timed cell stores: the counts (`cold_work`) and the verdict (`warm`)."""
        return {"cold_work": dict(self.counts), "warm": self.warm}


@contextmanager
def frozen_window(engine: Any) -> Iterator[dict[str, Any]]:
    """A timed window on the engine: frozen (no graph capture: a shape the warm-up missed runs eagerly,
    counted), its schedule recorded (for replays on other arms), its cold work counted. Yields a dict
    that holds `schedule` and `cold_work` once the window closes."""
    out: dict[str, Any] = {}
    cold = ColdWork(engine)
    engine.freeze(True)
    try:
        with cold:
            engine.start_recording()
            try:
                yield out
            finally:
                out["schedule"] = engine.stop_recording()
    finally:  # also when the window is cut (deadline, Ctrl-C): its cold work is still reported
        out["cold_work"] = cold.counts
        engine.freeze(False)

def cold_cells(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The timed cells (records holding a `ColdWork.record()`) that did cold work."""
    return [r for r in records if r.get("warm") is False]
