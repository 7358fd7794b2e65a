"""Counters of work that must never land inside a timed window: graph captures, kernel compiles and
device-memory growth.

Why: one prefill-graph capture inside a measured burst cell cost its first request 388 ms of TTFT
against 29 ms for every later one, and such a cell looks like a slow arm. A warm-up is supposed to
cover every shape a timed cell runs; these counters prove that it did (every timed cell records
them, and reports flag any cell where one is non-zero) instead of trusting it.

- graph captures: the engine's own counters (decode and prefill graphs) and static-buffer growths
  (which drop captured graphs);
- compiles: Triton kernel specialisations compiled or loaded from its disk cache, through
  Triton's compilation listener where this Triton has one (None where it cannot be observed);
- device mallocs: new segments of torch's CUDA caching allocator (each a cudaMalloc; None on CPU).
"""

from __future__ import annotations

from typing import Any

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
            from triton import knobs
        except ImportError:  # an older Triton without knobs: compiles are not observable
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
    import torch

    return int(torch.cuda.memory_stats(device).get("segment.all.allocated", 0))


class ColdWorkProbe:
    """Snapshot before a timed window, `delta()` after: counts of cold work inside it."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        TRITON_COMPILES.install()
        self._before: dict[str, int | None] = {}

    def _read(self) -> dict[str, int | None]:
        counters = self.engine.stats()
        out: dict[str, int | None] = {k: int(counters.get(k, 0)) for k in ENGINE_KEYS}
        out["compiles"] = TRITON_COMPILES.count if TRITON_COMPILES.available else None
        out["device_mallocs"] = cuda_segments(self.engine.device)
        return out

    def start(self) -> None:
        self._before = self._read()

    def delta(self) -> dict[str, int | None]:
        after = self._read()
        return {
            k: (None if v is None or self._before.get(k) is None else v - int(self._before[k] or 0))
            for k, v in after.items()
        }


def is_cold(counts: dict[str, Any] | None) -> bool:
    """Whether a timed window's counts show any cold work (unobservable counts do not count)."""
    return any(bool(v) for v in (counts or {}).values() if v is not None)
