"""The e2e schedule: warm-up per arm, then cells (arm x concurrency x repetition) interleaved A B C C B A,
then, per block of one cell and repetition, the identity replays.

Works with any `backends.base.Backend` (EngineBackend, OpenAIBackend). A backend with
`supports_replay` (the in-process engine, a `ReplayBackend`) also gives each timed cell's schedule and
cold-work counts in its `CellResult` and runs `replay(arm, schedule, requests)`: after every arm has run
a block's timed cell, each other arm runs the reference arm's exact batches untimed, and that token
comparison is the identity verdict (free-running identity stays as information: session batches
depend on timing).
Each finished cell and replay is appended to its JSONL file at once, so a crash or Ctrl-C keeps it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import pandas as pd

from rltbench.backends.base import (
    Backend,
    CellProgress,
    DeadlineReached,
    ReplayBackend,
    Request,
    Timeouts,
)
from rltbench.bench.workload import Cell, SessionTrace, schedule, theoretical_prefix_hit_rate
from rltbench.commands.e2e.display import RunDisplay
from rltbench.engine.row_invariant import DEFAULT_TILE_TOKENS
from rltbench.results.serving import cell_summary, compute_cells
from rltbench.results.serving_stats import (
    REPLAY_FILE,
    ROW_INVARIANT_FILE,
    compare_pair,
    replay_divergences,
)

SCHEDULE_NOTE = (
    "arms alternate A B C, C B A per (repetition, cell) block; each cell's order flips between "
    "repetitions; warm-up per arm before any measured cell (decode graphs for every batch bucket and "
    "context class, every prefill bucket's graph, a small burst; sessions: "
    "one untimed pass over the trace by the first arm and by every arm whose eager steps run other "
    "kernels); timed cells run frozen (no graph capture) and record their cold work"
)


# per arm of one (cell, repetition) block: its timed cell's schedule, requests by id and records
BlockRuns = dict[str, tuple[Any, dict[str, Request], list[dict[str, Any]]]]
PROBE_REQUESTS_FILE = "probe_requests.jsonl"  # the records of probe cells (no measurement of their own)
PROBE_META_FILE = "probe_meta.jsonl"


class CellOrder(Protocol):
    """Cells in run order decided while the run goes (the rate sweep): (rep, cell, arm) items, each
    finished cell reported back (`record` returns a short line for the live view, or None), the arms
    of each (repetition, cell) block, and what was decided (`summary`, kept in the manifest)."""

    def __iter__(self) -> Iterator[tuple[int, Cell, str]]: ...

    def record(self, arm: str, cell: Cell, rep: int, records: list[dict[str, Any]]) -> str | None: ...

    def block_arms(self, rep: int, cell: Cell) -> list[str]: ...

    def summary(self) -> dict[str, Any]: ...


@dataclass
class Plan:
    """What to run. `prompts(cell, rep)` returns the requests of one cell-repetition (same for every arm)."""

    workload: str
    arms: list[str]
    ref: str
    repeats: int
    cells: list[Cell]
    prompts: Callable[[Cell, int], list[Request]]
    warmup_requests: list[Request]
    timeouts: Timeouts
    exact_arms: set[str] = field(default_factory=set)
    session: SessionTrace | None = None
    # arms that replay the whole workload once, untimed, before any measured cell (sessions: their
    # eager prefill shapes vary with timing, so only a pass over the trace meets the kernel
    # specialisations, cuBLAS shapes and allocator sizes a timed cell will need)
    warmup_pass_arms: set[str] = field(default_factory=set)
    # the arm whose timed schedule the others replay (default `ref`): the cache-on run when the
    # prefix cache is varied, because a cache-on schedule also replays with the cache off
    replay_ref: str | None = None
    # prefix cache varied: (cache-on arm, cache-off arm) pairs of one engine arm that replay the
    # reference schedule with row-invariant prefill (once per cell, first clean block), and its tile
    row_invariant_pairs: list[tuple[str, str]] = field(default_factory=list)
    row_invariant_tile: int = DEFAULT_TILE_TOKENS
    # arms compared with another reference than `ref`: with the exit mode varied, the compute-saving
    # arms are compared with the reference's own compute-saving run (`torch+stop`), which maps to
    # itself; their tokens are not meant to match every-loop runs
    identity_refs: dict[str, str] = field(default_factory=dict)
    # the cells in run order decided as the run goes (CellOrder); None: `schedule` of `cells`
    order: CellOrder | None = None
    # False: each cell is replayed once, at its first block whose reference cell finished cleanly
    # (open-loop cells are long; identity is a property of the kernels on one schedule)
    replay_every_rep: bool = True
    # the requests of the untimed warm-up pass (None: the first cell's, repetition 0); a cache-busted
    # session passes over requests of its own, so a server's cache keeps nothing a timed cell can hit
    pass_prompts: list[Request] | None = None

    def reference_of(self, arm: str) -> str:
        """The arm whose tokens `arm`'s are compared with (itself for a reference)."""
        return self.identity_refs.get(arm, self.ref)

    def replay_reference_of(self, arm: str) -> str:
        """The arm whose timed schedule `arm` replays (itself for a reference)."""
        return self.identity_refs.get(arm) or self.replay_ref or self.ref


def _engine_prefix(stats: dict[str, Any]) -> tuple[int, int] | None:
    if "prefix_hit_tokens" in stats and "prefix_query_tokens" in stats:
        return int(stats["prefix_hit_tokens"]), int(stats["prefix_query_tokens"])
    return None


def _max_batch(before: dict[str, Any], after: dict[str, Any]) -> int | None:
    hb, ha = before.get("batch_size_hist") or {}, after.get("batch_size_hist") or {}
    grew = [int(k) for k, v in ha.items() if v > hb.get(k, 0)]
    return max(grew) if grew else None


def _decode_loops(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int] | None:
    """The cell's decode steps per loops run (the compute-saving exit), from the engine's counters."""
    hb, ha = before.get("decode_loops_hist") or {}, after.get("decode_loops_hist") or {}
    grew = {str(k): int(v) - int(hb.get(k, 0)) for k, v in ha.items() if v > hb.get(k, 0)}
    return grew or None


def run_plan(plan: Plan, backend: Backend, run: Any, display: RunDisplay) -> str:
    """Run the plan into `run` (a RunDir). Returns "complete", or "deadline" if the deadline cut it."""
    theo = None
    if plan.session is not None:
        theo = theoretical_prefix_hit_rate(plan.session.requests, plan.session.block_size)
    for arm in plan.arms:
        display.note(f"warm-up {arm} ({len(plan.warmup_requests)} requests, graphs if any; not measured)")
        backend.warmup(arm, plan.warmup_requests, plan.timeouts)
        if arm in plan.warmup_pass_arms and plan.cells:
            reqs = plan.pass_prompts if plan.pass_prompts is not None else plan.prompts(plan.cells[0], 0)
            display.note(f"warm-up {arm}: one untimed pass over the {len(reqs)} requests of the workload")
            backend.run_cell(arm, "warmup-pass", reqs, plan.timeouts, reset_prefix_cache=True, timed=False)
    idents: dict[tuple[str, str], list[int | None]] = {}
    stored: dict[tuple[str, str, int], dict[int, list[int] | None]] = {}
    sched: Iterable[tuple[int, Cell, str]] = (plan.order if plan.order is not None
                                              else schedule(plan.arms, plan.cells, plan.repeats))
    total = len(sched) if isinstance(sched, list) else None
    status = "complete"
    replay = bool(getattr(backend, "supports_replay", False))
    block_runs: BlockRuns = {}
    block_key: tuple[int, str] | None = None
    row_invariant_done: set[str] = set()
    replayed: set[str] = set()
    for order, (rep, cell, arm) in enumerate(sched):
        if plan.timeouts.deadline_passed():
            run.update_manifest(skipped_cells=None if total is None else total - order)
            status = "deadline"
            break
        if block_key != (rep, cell.name):
            block_key, block_runs = (rep, cell.name), {}
        reqs = plan.prompts(cell, rep)
        prog = CellProgress()
        display.start_cell(arm, cell.name, rep, prog)
        display.note(f"cell {order + 1}/{total or '?'}: {arm} {cell.name} rep {rep}"
                     + (" (probe: places the sweep's rates, not measured)" if cell.probe else ""))
        before = backend.stats(arm)
        started = time.time()
        meta: dict[str, Any] = {
            "arm": arm,
            "cell": cell.name,
            "C": cell.C,
            "rep": rep,
            "order": order,
            "workload": plan.workload,
            "started": started,
        }
        meta.update({k: v for k, v in (("rate", cell.rate), ("max_concurrency", cell.max_concurrency)) if v})
        files = ("requests.jsonl", "cell_meta.jsonl")
        if cell.probe:
            files = (PROBE_REQUESTS_FILE, PROBE_META_FILE)
        try:
            result = backend.run_cell(
                arm, f"{cell.name}/r{rep}", reqs, plan.timeouts, reset_prefix_cache=True, progress=prog,
                **({"max_concurrency": cell.max_concurrency} if cell.max_concurrency else {}),
            )
        except DeadlineReached as exc:
            result, status = exc.result, "deadline"
            meta["note"] = "global deadline reached"
        except KeyboardInterrupt:
            meta.update(interrupted=True, wall_s=time.time() - started)
            run.append_jsonl(files[1], meta)
            raise
        after = backend.stats(arm)
        meta["wall_s"] = time.time() - started
        recs = result.records
        if replay:
            meta["cold_work"] = dict(result.cold_work)
            meta["schedule"] = result.schedule.summary()
            block_runs[arm] = (result.schedule, result.requests, recs)
        pb, pa = _engine_prefix(before), _engine_prefix(after)
        if pb is not None and pa is not None and pa[1] > pb[1]:
            meta["engine_prefix_hit_rate"] = (pa[0] - pb[0]) / (pa[1] - pb[1])
        mb = _max_batch(before, after)
        if mb is not None:
            meta["max_decode_batch"] = mb
        loops = _decode_loops(before, after)
        if loops is not None:
            meta["decode_loops_hist"] = loops
        if theo is not None:
            meta["theoretical_prefix_hit_rate"] = theo
        for r in recs:
            r.update(arm=arm, cell=cell.name, C=cell.C, rep=rep)
            run.append_jsonl(files[0], r)
        run.append_jsonl(files[1], meta)
        _write_cells_so_far(run)
        row = _display_row(plan, arm, cell, rep, recs, stored, idents)
        if plan.order is not None:
            row["load"] = plan.order.record(arm, cell, rep, recs)
            run.update_manifest(sweep=plan.order.summary())
        display.finish_cell(row)
        if status == "deadline":
            run.update_manifest(skipped_cells=None if total is None else total - order - 1)
            break
        block = plan.order.block_arms(rep, cell) if plan.order is not None else plan.arms
        if replay and not cell.probe and set(block) <= set(block_runs):
            if plan.replay_every_rep or cell.name not in replayed:
                if _replay_block(plan, backend, run, display, cell, rep, block_runs):
                    replayed.add(cell.name)
            if plan.row_invariant_pairs and cell.name not in row_invariant_done:
                if _row_invariant_block(plan, backend, run, display, (cell, rep), block_runs):
                    row_invariant_done.add(cell.name)
            block_runs = {}
    if plan.order is not None:  # what the order decided after the last cell (why it stopped)
        run.update_manifest(sweep=plan.order.summary())
    return status


def _replay_reference(
    ref: str, runs: BlockRuns
) -> tuple[str, Any, dict[str, Request], list[dict[str, Any]], Callable[[int, int], int | None]]:
    """Replay reference `ref` of this block: its name, timed schedule, requests and records, and
    step_of(request index, token index): the schedule step that produced a token."""
    ref_sched, ref_reqs, ref_recs = runs[ref]
    index_to_rid = {r.index: rid for rid, r in ref_reqs.items()}

    def step_of(index: int, token_index: int) -> int | None:
        return ref_sched.step_of_token(index_to_rid[index], token_index)

    return ref, ref_sched, ref_reqs, ref_recs, step_of


def _replay_block(
    plan: Plan,
    backend: ReplayBackend,
    run: Any,
    display: RunDisplay,
    cell: Cell,
    rep: int,
    runs: BlockRuns,
) -> bool:
    """Replay the reference arm's schedule of this block on every other arm of the block (untimed) and
    append one identity row per arm to replay.jsonl. Skipped, with the reason, where the reference
    cell did not finish cleanly (a cut cell's schedule stops mid-request), and not run where the
    block has no reference cell (an open-loop rate the reference no longer runs). Returns whether
    every reference cell of the block finished cleanly (and the replays ran)."""
    all_clean = True
    for arm in plan.arms:
        if plan.replay_reference_of(arm) == arm or arm not in runs:
            continue
        if plan.replay_reference_of(arm) not in runs:
            all_clean = False
            continue
        ref, ref_sched, ref_reqs, ref_recs, step_of = _replay_reference(plan.replay_reference_of(arm), runs)
        clean = all(r.get("status") == "ok" for r in ref_recs)
        all_clean = all_clean and clean
        ref_sig = ref_sched.signature()
        row: dict[str, Any] = {"arm": arm, "cell": cell.name, "C": cell.C, "rep": rep, "ref": ref}
        row["same_schedule_free_running"] = runs[arm][0].signature() == ref_sig
        if not clean:
            row["skipped"] = f"the {ref} cell has unfinished requests: its schedule cannot be replayed"
            run.append_jsonl(REPLAY_FILE, row)
            continue
        display.note(f"identity replay: {arm} on {ref}'s schedule ({cell.name} rep {rep}, untimed)")
        t0 = time.perf_counter()
        try:
            got = backend.replay(arm, ref_sched, ref_reqs)
        except Exception as exc:  # a replay failure is reported, never taken for identity
            row["skipped"] = f"replay failed: {type(exc).__name__}: {exc}"
            run.append_jsonl(REPLAY_FILE, row)
            continue
        row["seconds"] = time.perf_counter() - t0
        divergences = replay_divergences(
            ref_recs, got, getattr(backend, "last_replay_depths", {}), step_of
        )
        row.update(
            compared=len(ref_recs),
            identical=len(ref_recs) - len(divergences),
            divergences=divergences,
            exact_arm=arm in plan.exact_arms,
            steps=ref_sched.summary()["steps"],
        )
        run.append_jsonl(REPLAY_FILE, row)
    return all_clean


def _row_invariant_block(plan: Plan, backend: ReplayBackend, run: Any, display: RunDisplay,
                         block: tuple[Cell, int], runs: BlockRuns) -> bool:
    """Replay the reference schedule of this block, untimed, with row-invariant prefill on each
    (cache-on, cache-off) pair and append one row per pair to ROW_INVARIANT_FILE: the cache-off
    tokens against the cache-on ones. False (nothing run) when the reference cell did not finish
    cleanly, so a later block of the cell is used instead."""
    cell, rep = block
    ref, ref_sched, ref_reqs, ref_recs, step_of = _replay_reference(plan.replay_ref or plan.ref, runs)
    if not all(r.get("status") == "ok" for r in ref_recs):
        return False
    tile = plan.row_invariant_tile
    for on, off in plan.row_invariant_pairs:
        row: dict[str, Any] = {"cell": cell.name, "C": cell.C, "rep": rep, "ref": ref, "arm_on": on,
                               "arm_off": off, "tile_tokens": tile}
        display.note(f"row-invariant replay: {on} and {off} on {ref}'s schedule ({cell.name} rep {rep}, "
                     "untimed)")
        t0 = time.perf_counter()
        try:
            got: dict[str, dict[int, list[int]]] = {}
            depths: dict[str, dict[int, list[int]]] = {}
            for arm in (on, off):
                got[arm] = backend.replay(arm, ref_sched, ref_reqs, row_invariant_tile=tile)
                depths[arm] = dict(getattr(backend, "last_replay_depths", {}))
        except Exception as exc:  # a replay failure is reported, never taken for identity
            row["skipped"] = f"replay failed: {type(exc).__name__}: {exc}"
            run.append_jsonl(ROW_INVARIANT_FILE, row)
            continue
        row["seconds"] = time.perf_counter() - t0
        base = [{"request": i, "token_ids": t, "exit_depths": depths[on].get(i)} for i, t in got[on].items()]
        divergences = replay_divergences(base, got[off], depths[off], step_of)
        row.update(compared=len(base), identical=len(base) - len(divergences), divergences=divergences,
                   steps=ref_sched.summary()["steps"])
        run.append_jsonl(ROW_INVARIANT_FILE, row)
    return True


def _write_cells_so_far(run: Any) -> None:
    """cells.csv/json after every cell, so a run cut short still has its cell table (render redoes it)."""
    cells = compute_cells(run.read_jsonl("requests.jsonl"), run.read_jsonl("cell_meta.jsonl"))
    if cells:
        run.write_table("cells", pd.DataFrame(cells))


def _display_row(
    plan: Plan, arm: str, cell: Cell, rep: int, recs: list[dict[str, Any]], stored: dict, idents: dict
) -> dict[str, Any]:
    """Cell summary for the live table, with identity so far (this arm vs the reference, all reps)."""
    summ = cell_summary(recs, burst=plan.workload == "burst")
    row = {"arm": arm, "cell": cell.name, "rep": rep, **summ}
    stored[(arm, cell.name, rep)] = {
        r["request"]: {"token_ids": r.get("token_ids"), "exit_depths": r.get("exit_depths"),
                       "status": r.get("status")}
        for r in recs
    }
    ref = plan.reference_of(arm)
    others = [arm] if arm != ref else [a for a in plan.arms if a != ref and plan.reference_of(a) == ref]
    for other in others:
        ref_recs = stored.get((ref, cell.name, rep))
        recs_o = stored.get((other, cell.name, rep))
        if ref_recs is None or recs_o is None:
            continue
        pairs = [compare_pair(recs_o[i], ref_recs[i]) for i in recs_o if i in ref_recs]
        idents.setdefault((other, cell.name), []).extend(d for ok, d in pairs if ok)
    if arm == ref:
        row["identity"] = "(ref)"
    else:
        divs = idents.get((arm, cell.name), [])
        same = sum(d is None for d in divs)
        row["identity"] = f"{same}/{len(divs)}" if divs else "-"
        # live view: loud only where batches are identical across arms (bursts); see serving_stats.identity
        row["exact_mismatch"] = plan.workload == "burst" and arm in plan.exact_arms and same < len(divs)
    return row
