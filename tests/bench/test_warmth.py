"""ColdWork: the one proof that a timed window was warm (engine captures, Triton compiles, CUDA mallocs)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from rltbench.bench import warmth


class _Engine:
    """The engine API ColdWork and frozen_window use: counters, freeze, recording."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.counters = {"graph_captures": 2, "prefill_graph_captures": 1, "buffer_growths": 0}
        self.frozen = False
        self.recording = False

    def cold_counters(self) -> dict[str, int]:
        return dict(self.counters)

    def freeze(self, frozen: bool = True) -> None:
        self.frozen = frozen

    def start_recording(self) -> None:
        self.recording = True

    def stop_recording(self) -> str:
        self.recording = False
        return "schedule"


def test_cold_work_counts_engine_captures_and_compiles(monkeypatch) -> None:
    monkeypatch.setattr(warmth.TRITON_COMPILES, "available", True)
    eng = _Engine()
    with warmth.ColdWork(eng) as warm:
        pass
    assert warm.counts == {"graph_captures": 0, "prefill_graph_captures": 0, "buffer_growths": 0,
                           "compiles": 0, "device_mallocs": None}  # CPU: no allocator segments
    assert warm.warm and warm.record() == {"cold_work": warm.counts, "warm": True}
    with warmth.ColdWork(eng) as cold:
        eng.counters["prefill_graph_captures"] += 1
        warmth.TRITON_COMPILES.count += 1
    assert cold.counts["prefill_graph_captures"] == 1 and cold.counts["compiles"] == 1 and not cold.warm
    assert warmth.cold_cells([{"arm": "a", **warm.record()}, {"arm": "b", **cold.record()}]) == [
        {"arm": "b", **cold.record()}]
    with warmth.ColdWork(device=torch.device("cpu")) as no_engine:
        pass
    assert no_engine.counts["graph_captures"] is None and no_engine.warm  # unobservable is not cold


def test_frozen_window_freezes_records_and_reports_even_when_cut() -> None:
    eng = _Engine()
    with warmth.frozen_window(eng) as window:
        assert eng.frozen and eng.recording
        eng.counters["graph_captures"] += 1
    assert not eng.frozen and window["schedule"] == "schedule" and window["cold_work"]["graph_captures"] == 1
    with pytest.raises(KeyboardInterrupt), warmth.frozen_window(eng) as cut:
        raise KeyboardInterrupt
    assert not eng.frozen and not eng.recording and cut["cold_work"]["graph_captures"] == 0


def test_is_cold_ignores_unobservable_counts() -> None:
    assert not warmth.is_cold({"compiles": None, "device_mallocs": 0})
    assert warmth.is_cold({"compiles": None, "device_mallocs": 1}) and not warmth.is_cold(None)


@triton.jit
def _fill(out_ptr, VALUE: tl.constexpr):
    tl.store(out_ptr + tl.arange(0, 16), tl.full((16,), VALUE, tl.float32))


@pytest.mark.gpu
def test_cold_work_sees_a_real_triton_compile_and_device_malloc():
    """On the GPU the listener really fires: a kernel specialised for a new constexpr compiles (or
    loads from the disk cache) inside the first window, not inside the second; a new allocation is a
    new allocator segment (a cudaMalloc)."""
    out = torch.empty(16, device="cuda")
    dev = torch.device("cuda")
    value = float(torch.randint(1, 10**6, ()).item())  # a specialisation this process has not built
    with warmth.ColdWork(device=dev) as first:
        _fill[(1,)](out, VALUE=value)
    with warmth.ColdWork(device=dev) as second:
        _fill[(1,)](out, VALUE=value)
    assert first.counts["compiles"] == 1 and not first.warm
    assert second.counts["compiles"] == 0 and second.counts["device_mallocs"] == 0 and second.warm
    torch.cuda.empty_cache()  # no cached block may serve the allocation below
    with warmth.ColdWork(device=dev) as grows:
        big = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    assert grows.counts["device_mallocs"] >= 1 and not grows.warm
    del big
