"""Recorded engine schedules: what each step ran, so another arm can run exactly the same batches.

Why: greedy outputs are not batch-invariant (GEMM and attention kernels are chosen per batch
shape), and under a session load batch composition depends on each arm's speed. Comparing two
arms' free-running tokens therefore mixes a kernel difference with a schedule difference. A
`Schedule` recorded during the reference arm's run lists every step (which requests, which prompt
chunk of each, which rows decode) and every abort; `Engine.replay` then runs another arm through
those same batches, untimed, so any token difference is a property of the kernels alone.

A schedule refers to requests by id; `Engine.replay` takes the prompts by the same ids. A request's
number of generated tokens is implied by the steps (a prefill row that completes its prompt emits
one token, every decode row one), so the replay stops each request where the reference stopped it,
whatever tokens the replayed arm produces.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

PREFILL, DECODE, ABORT = "prefill", "decode", "abort"


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token of two generations (a length difference counts), None
    when identical: how replayed tokens are compared with the recorded run's."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class ReplayError(RuntimeError):
    """A schedule that cannot be replayed as recorded (a bug, never a kernel difference): e.g. the
    prefix cache holds a different hit than it did for the reference run."""


@dataclass(frozen=True)
class StepRecord:
    """One engine step (or an abort between steps).

    prefill: ``rows`` = ((request_id, context start, chunk tokens, completes prompt), ...)
    decode:  ``rows`` = ((request_id,), ...) in batch order
    abort:   ``rows`` = ((request_id,),)
    """

    kind: str
    rows: tuple[tuple[Any, ...], ...]


@dataclass
class Schedule:
    """The steps of one recorded run, in order. `clean_start`: recording began on an empty prefix
    cache (a replay resets the cache first, so only such a schedule reproduces prefix hits).
    `prefix_caching`: the engine served prefix hits while recording (a request's first prefill chunk
    may then start after token 0)."""

    steps: list[StepRecord] = field(default_factory=list)
    clean_start: bool = True
    prefix_caching: bool = False

    def recomputing_prefix_hits(self) -> Schedule:
        """This schedule for an engine with the prefix cache off. A recorded prefix hit cannot be
        replayed there (no KV exists before the request's first chunk), so each request whose first
        prefill chunk starts at token h > 0 gets its tokens 0..h computed in a step of their own,
        inserted just before that chunk's step (hit requests of one step share the inserted step).
        Every recorded step keeps its exact shape and companions, so replaying both schedules differs
        only in where the prefix's KV came from: cached from an earlier request, or recomputed."""
        if not self.prefix_caching:
            return self
        steps: list[StepRecord] = []
        started: set[str] = set()
        for st in self.steps:
            if st.kind == PREFILL:
                prefix = tuple(
                    (rid, 0, start, False)
                    for rid, start, _n, _done in st.rows
                    if rid not in started and start > 0
                )
                started.update(row[0] for row in st.rows)
                if prefix:
                    steps.append(StepRecord(PREFILL, prefix))
            steps.append(st)
        return Schedule(steps, clean_start=self.clean_start, prefix_caching=False)

    def request_ids(self) -> list[str]:
        """Every request that ran, in first-appearance order."""
        seen: dict[str, None] = {}
        for st in self.steps:
            for row in st.rows:
                seen.setdefault(row[0], None)
        return list(seen)

    def emitted(self) -> dict[str, int]:
        """Tokens each request generated: one per completing prefill row, one per decode row."""
        out: dict[str, int] = {}
        for st in self.steps:
            for row in st.rows:
                rid = row[0]
                if st.kind == PREFILL:
                    out[rid] = out.get(rid, 0) + int(row[3])
                elif st.kind == DECODE:
                    out[rid] = out.get(rid, 0) + 1
        return out

    def token_steps(self) -> Iterator[tuple[int, str, int]]:
        """(step index, request id, token index) for every generated token, in order: names the step
        where a replayed arm's first divergent token was produced."""
        count: dict[str, int] = {}
        for i, st in enumerate(self.steps):
            if st.kind == ABORT:
                continue
            for row in st.rows:
                if st.kind == PREFILL and not row[3]:
                    continue
                rid = row[0]
                k = count.get(rid, 0)
                count[rid] = k + 1
                yield i, rid, k

    def step_of_token(self, request_id: str, token_index: int) -> int | None:
        for step, rid, k in self.token_steps():
            if rid == request_id and k == token_index:
                return step
        return None

    def signature(self) -> list[tuple[str, tuple[tuple[Any, ...], ...]]]:
        """The steps as plain tuples with request ids replaced by first-appearance numbers: two runs of
        the same requests under different id prefixes compare equal when their batches were equal."""
        num = {rid: i for i, rid in enumerate(self.request_ids())}
        return [(st.kind, tuple((num[r[0]], *r[1:]) for r in st.rows)) for st in self.steps]

    def summary(self) -> dict[str, int]:
        """Step counts for the run record."""
        kinds = [st.kind for st in self.steps]
        return {
            "steps": sum(k != ABORT for k in kinds),
            "prefill_steps": kinds.count(PREFILL),
            "decode_steps": kinds.count(DECODE),
            "aborts": kinds.count(ABORT),
            "requests": len(self.request_ids()),
        }

    def to_json(self, request_index: dict[str, int] | None = None) -> dict[str, Any]:
        """Compact JSON: request ids replaced by `request_index` values where given."""
        idx = request_index or {}
        return {
            "clean_start": self.clean_start,
            "prefix_caching": self.prefix_caching,
            "steps": [[st.kind, [[idx.get(r[0], r[0]), *r[1:]] for r in st.rows]] for st in self.steps],
        }
