"""Ouro's compute-saving exit in the engine: a decode step that stops its loops once every row exited.

Why a step of stages: whether loop j + 1 runs depends on the exit gates of loop j, which only the
device knows. The step therefore runs as one stage per loop, each ending in a device flag ("every
row has exited"), and a finishing stage (sampling, and the K/V copy of `copy_exit_planes`).

With CUDA graphs each loop is its own graph (the last one also finishes the step; a separate
finishing graph serves steps that stop earlier), captured in order into the engine's pool, and the
host reads the flag between them: one device-to-host read and one launch per loop run, which a plain
step does not pay (`docs/scenarios.md` has the measured cost). The tensors a later stage reads live
in the step's `OuroRun` (updated in place), which the captured step keeps alive. CUDA graph IF
nodes would let the device decide inside one graph; torch 2.11 cannot capture them.

A token's semantics differ from the reference (which runs every loop): the planes after its exit
hold its exit loop's K/V. `docs/scenarios.md` says what that costs and what it saves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rltbench.engine.paged_context import PagedAttentionContext, copy_exit_planes


@dataclass
class StagedDecode:
    """One compute-saving decode step: `loops[j]()` runs loop j (the first also builds the step's
    inputs) and returns the device flag "every real row has exited" (None after the last loop);
    `finish()` returns the step's device output."""

    loops: list[Callable[[], Tensor | None]]
    finish: Callable[[], Tensor]
    state: dict[str, Any]


def staged_decode(model: Any, kv: Tensor, inputs: Callable[[], tuple[Tensor, Tensor, PagedAttentionContext]],
                  ops: Any, output: Callable[[Tensor], Tensor]) -> StagedDecode:
    """The stages of one decode step of `model` (Ouro with an exit threshold). `inputs()` gives the step's
    token ids, positions and attention context (read from the engine's static buffers); `output(ids)`
    turns the sampled ids into the step's output (ids and exit depths)."""
    num_loops = int(model.config.num_loops)
    state: dict[str, Any] = {}

    def loop(j: int) -> Tensor | None:
        if j == 0:
            ids, pos, ctx = inputs()
            run = model.start(ids, pos, ctx, ops, stepwise=True)
            state.update(run=run, ctx=ctx, real=ctx.slot_mapping >= 0)
        state["run"].loop(j)
        return state["run"].all_exited(state["real"]) if j + 1 < num_loops else None

    def finish() -> Tensor:
        hidden = state["run"].finish()
        out = output(model.compute_logits(hidden).argmax(-1))
        copy_exit_planes(kv, state["ctx"].slot_mapping, model.last_exit_depths, num_loops)
        return out

    return StagedDecode([lambda j=j: loop(j) for j in range(num_loops)], finish, state)


def run_eagerly(step: StagedDecode) -> tuple[Tensor, int]:
    """Run the stages until every row has exited; (the step's output, loops run)."""
    ran = 0
    for stage in step.loops:
        flag = stage()
        ran += 1
        if flag is not None and bool(flag):
            break
    return step.finish(), ran


class StagedDecodeGraphs:
    """A compute-saving decode step captured as one CUDA graph per loop, the last of which also
    finishes the step, and a finishing graph for steps that stop earlier (both finishes write the
    same output tensor). `replay()` replays loop graphs until a flag says every row has exited, and
    returns the loops run (a plain graph's `replay()` returns None). Why the last loop finishes the
    step itself: a step that runs every loop (most steps of a large batch) then pays one host round
    trip fewer."""

    def __init__(self, loops: list[torch.cuda.CUDAGraph], flags: list[Tensor],
                 finish: torch.cuda.CUDAGraph, keep: StagedDecode) -> None:
        self.loops, self.flags, self.finish = loops, flags, finish
        self._keep = keep  # the step's tensors: the graphs read and write them at these addresses

    def replay(self) -> int:
        for j, graph in enumerate(self.loops[:-1]):
            graph.replay()
            if bool(self.flags[j]):
                self.finish.replay()
                return j + 1
        self.loops[-1].replay()
        return len(self.loops)


def _warm(make: Callable[[Any], StagedDecode], warm_ops: Any, ops: Any, device: torch.device) -> None:
    """Run every stage with `warm_ops` (compiles the arm's kernels) and with `ops` (warms the rest)."""
    for warm in (warm_ops, ops):
        step = make(warm)
        for stage in step.loops:
            stage()
        step.finish()
    torch.cuda.synchronize(device)


def capture(make: Callable[[Any], StagedDecode], warm_ops: Any, ops: Any, pool: Any,
            new_graph: Callable[[], torch.cuda.CUDAGraph], device: torch.device) -> tuple[StagedDecodeGraphs,
                                                                                          Tensor]:
    """Capture the stages of `make(ops)` into graphs of `pool` (`StagedDecodeGraphs`), after warm runs
    of every stage; returns the replayable step and its output tensor."""
    with torch.no_grad():
        _warm(make, warm_ops, ops, device)
        step = make(ops)
        graphs: list[torch.cuda.CUDAGraph] = []
        flags: list[Tensor] = []
        for stage in step.loops:
            graph = new_graph()
            with torch.cuda.graph(graph, pool=pool):
                flag = stage()
                if flag is not None:
                    flags.append(flag)
                else:  # the last loop: finish the step in the same graph
                    out = step.finish()
            graphs.append(graph)
        finish = new_graph()
        with torch.cuda.graph(finish, pool=pool):
            out.copy_(step.finish())
        for graph in (*graphs, finish):
            if hasattr(graph, "instantiate"):
                graph.instantiate()
        torch.cuda.synchronize(device)
    return StagedDecodeGraphs(graphs, flags, finish, step), out
