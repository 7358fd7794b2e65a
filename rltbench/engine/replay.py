"""Schedule record and replay on the engine, and the row-invariant prefill mode.

Recording: the engine appends `step_record(batch)` for every batch it runs (and an abort record for
every abort) to the `Schedule` it is recording (rltbench.engine.schedule says why schedules exist).
Replay (`replay_schedule`, called by `Engine.replay`): the current arm runs exactly the recorded
batches, untimed and frozen (graphs replayed where captured, never captured), so a token difference
between two arms is a property of their kernels alone. Row-invariant mode (`row_invariant`): every
prefill step runs as fixed-size tiles of one-query rows (rltbench.engine.row_invariant says why).

The engine is reached through `ReplayHost`, the few members a replay drives, so this module does not
import the engine module (which composes it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from collections.abc import Sequence as Seq
from typing import Any, Protocol

from torch import Tensor

from rltbench.engine.row_invariant import DEFAULT_TILE_TOKENS, check_model, check_tile_tokens
from rltbench.engine.runner import ModelRunner
from rltbench.engine.schedule import ABORT, DECODE, PREFILL, ReplayError, Schedule, StepRecord
from rltbench.engine.scheduler import DecodeBatch, PrefillBatch, Scheduler, Sequence
from rltbench.engine.types import SamplingParams, TokenEvent


class ReplayHost(Protocol):
    """What a replay drives: request admission and batch running (`rltbench.engine.engine.Engine`)."""

    runner: ModelRunner
    scheduler: Scheduler

    @property
    def prefix_caching(self) -> bool: ...

    def reset_prefix_cache(self) -> None: ...

    def add_request(self, request_id: str, prompt_ids: Seq[int] | Tensor,
                    params: SamplingParams | None = None, arrival_time: float | None = None) -> Sequence: ...

    def abort_request(self, request_id: str) -> bool: ...

    def run_batch(self, batch: PrefillBatch | DecodeBatch) -> list[TokenEvent]: ...


def step_record(batch: PrefillBatch | DecodeBatch) -> StepRecord:
    """The record of a scheduled batch, taken before it runs (num_computed is still the chunk start)."""
    if isinstance(batch, PrefillBatch):
        return StepRecord(
            PREFILL,
            tuple(
                (seq.request_id, seq.num_computed, n, seq.num_computed + n == seq.prompt_len)
                for seq, n in batch.chunks
            ),
        )
    return StepRecord(DECODE, tuple((seq.request_id,) for seq in batch.seqs))


@contextlib.contextmanager
def row_invariant(runner: ModelRunner, tile_tokens: int = DEFAULT_TILE_TOKENS) -> Iterator[None]:
    """Within the block every prefill step runs eagerly as forwards of exactly `tile_tokens`
    tokens with one-query attention per token (rltbench.engine.row_invariant), so a token's K/V
    and logits do not depend on the step's other rows or chunking. Decode steps are unchanged.
    Refused (UsageError) for a model whose K/V depend on the tiling (Huginn "compress")."""
    check_tile_tokens(tile_tokens)
    check_model(runner.model)
    prev, runner.row_tile = runner.row_tile, tile_tokens
    try:
        yield
    finally:
        runner.row_tile = prev


def replay_schedule(
    host: ReplayHost,
    schedule: Schedule,
    prompts: Mapping[str, Seq[int]],
    max_tokens: Mapping[str, int],
    eager_ops: Any = None,
    row_invariant_tile: int | None = None,
) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Run the current arm through exactly the batches of `schedule` (recorded on any arm of this
    engine, from an empty prefix cache); returns each request's generated ids and, with an exit gate,
    their exit depths.

    `prompts` and `max_tokens` (the request's SamplingParams.max_tokens when it was recorded: it
    sizes its KV blocks, so the pool and prefix cache evolve as they did) are keyed by the
    schedule's request ids. Each request stops where the recorded run stopped it, whatever it
    generates. Graphs are replayed where captured and never captured here; eager steps use
    `eager_ops` when given (e.g. the arm's kernels forced on outside graphs, so prefill is
    compared too). A schedule recorded with the prefix cache on replays on an engine with it off
    as `Schedule.recomputing_prefix_hits` (each hit prefix computed in a step of its own).
    `row_invariant_tile` runs every prefill step under `row_invariant` with that tile size.
    Raises ReplayError when the schedule cannot be reproduced."""
    host.runner.require_idle("replay")
    if not schedule.clean_start:
        raise ReplayError("the schedule was recorded on a warm prefix cache and cannot be replayed")
    if row_invariant_tile is not None:
        with row_invariant(host.runner, row_invariant_tile):
            return replay_schedule(host, schedule, prompts, max_tokens, eager_ops)
    if not host.prefix_caching:
        schedule = schedule.recomputing_prefix_hits()
    host.reset_prefix_cache()
    emitted = schedule.emitted()
    aborted = {st.rows[0][0] for st in schedule.steps if st.kind == ABORT}
    seqs: dict[str, Sequence] = {}
    out: dict[str, list[int]] = {}
    depths: dict[str, list[int]] = {}
    runner = host.runner
    frozen, runner.frozen, runner.eager_ops = runner.frozen, True, eager_ops
    try:
        for i, st in enumerate(schedule.steps):
            if st.kind == ABORT:
                host.abort_request(st.rows[0][0])
                continue
            if st.kind == DECODE:
                batch: PrefillBatch | DecodeBatch = DecodeBatch([seqs[r[0]] for r in st.rows])
            else:
                chunks = []
                for rid, start, n, _done in st.rows:
                    if rid not in seqs:
                        seqs[rid] = _admit(host, rid, prompts[rid], max_tokens[rid], emitted.get(rid, 0),
                                           rid in aborted)
                    seq = seqs[rid]
                    if seq.num_computed != start:
                        raise ReplayError(
                            f"step {i}: request {rid} starts at token {seq.num_computed}, recorded "
                            f"{start} (prefix cache differs from the recorded run)"
                        )
                    chunks.append((seq, n))
                batch = PrefillBatch(chunks)
            for ev in host.run_batch(batch):
                out.setdefault(ev.request_id, []).extend(ev.token_ids)
                if ev.exit_depths is not None:
                    depths.setdefault(ev.request_id, []).extend(ev.exit_depths)
    finally:
        runner.frozen, runner.eager_ops = frozen, None
        for rid in seqs:  # requests the recorded run left unfinished (a no-op for finished ones)
            host.abort_request(rid)
    return out, depths


def _admit(host: ReplayHost, rid: str, prompt: Seq[int], max_tokens: int, emitted: int,
           aborted: bool) -> Sequence:
    """Queue and admit a replayed request with the recorded block budget (`max_tokens`), then make
    it finish after `emitted` tokens (or run on until its recorded abort) and ignore stop ids."""
    seq = host.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    if not host.scheduler.admit(seq):
        raise ReplayError(f"request {rid} could not be admitted where the recorded run admitted it")
    seq.max_new = emitted + 1 if aborted else emitted
    seq.stop_ids = frozenset()
    return seq
