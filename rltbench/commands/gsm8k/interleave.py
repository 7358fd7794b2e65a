"""Every arm generates the same GSM8K questions chunk by chunk, arms interleaved, before lm-eval scores.

Why: run one arm after another and the first pays for warming the device while a slow drift
(clocks, temperature, allocator) lands on whichever arm runs last; that is how a questions/s ratio
above the engine's own decode speedups came out. Here the questions are split into chunks of
`--batch-size` (one full batch each); chunk c runs every arm in ABBA order (forward on even chunks,
reversed on odd ones), so each chunk is one paired repetition of the throughput comparison.

On the in-process engine each timed chunk runs frozen (no graph capture) with its cold work counted
and its schedule recorded; afterwards every other arm replays the reference arm's schedule of that
chunk untimed, with its kernels on in every step (prefill included), and that token comparison is
the identity the report shows beside the served sequences. lm-eval then scores each arm from the
cached generations (`CachedArmBackend`), so scoring never runs inside a timed window.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rltbench.backends.base import CellResult, Request, Timeouts
from rltbench.commands.gsm8k.generation import BackendStats, Generation, QuestionCodec
from rltbench.engine.schedule import first_divergence
from rltbench.results.stats import abba_order

CHUNKS_FILE = "chunks.jsonl"  # one timing row per (chunk, arm)
REPLAY_FILE = "replay.jsonl"  # one identity row per (chunk, non-reference arm)


@dataclass
class InterleavedGenerator:
    """Generates every arm's answers for one request list, chunk-interleaved (see module doc).

    `backend` serves every arm (rltbench.backends: the in-process engine, or one server per arm);
    `questions` turns questions into its requests. Only the engine replays schedules: with servers
    only timing is interleaved, and identity is the served text."""

    backend: Any
    arms: list[str]
    questions: QuestionCodec
    ref: str
    chunk: int
    timeouts: Timeouts = field(default_factory=lambda: Timeouts(float("inf"), float("inf")))
    write: Callable[[str, dict[str, Any]], None] = lambda name, row: None
    note: Callable[[str], None] = lambda text: None
    results: dict[str, list[Generation]] = field(default_factory=dict)
    stats: dict[str, BackendStats] = field(default_factory=dict)
    key: tuple | None = None

    def __post_init__(self) -> None:
        self.stats = {a: BackendStats() for a in self.arms}

    @property
    def replays(self) -> bool:
        return bool(getattr(self.backend, "supports_replay", False))

    def warmup(self, prompts: list[str], until: list[list[str]], max_new: list[int]) -> None:
        """Every arm warm before any timed chunk: on the engine its decode graphs and largest eager
        prefill; on a server the model name, the accepted fields and one short question."""
        probe: list[Request] = []
        if not self.replays and prompts:
            reqs, _ = self.questions.requests(prompts[:1], until[:1], [min(2, max_new[0])])
            probe = reqs
        for arm in self.arms:
            graphs = bool(getattr(getattr(self.backend, "engine", None), "use_graphs", False))
            what = " (graph capture)" if graphs else ""
            self.note(f"[bold]arm {arm}[/]: warming up{what} ...")
            self.backend.warmup(arm, probe, self.timeouts)

    def generate(
        self, prompts: list[str], until: list[list[str]], max_new: list[int]
    ) -> dict[str, list[Generation]]:
        """Every arm's generations for these requests (computed once; later calls with the same
        requests return the same generations)."""
        key = (tuple(prompts), tuple(map(tuple, until)), tuple(max_new))
        if self.key == key:
            return self.results
        out: dict[str, list[Generation]] = {a: [] for a in self.arms}
        n_chunks = -(-len(prompts) // self.chunk)
        for c in range(n_chunks):
            lo, hi = c * self.chunk, min(len(prompts), (c + 1) * self.chunk)
            order = abba_order(self.arms, c + 1)[-len(self.arms):]
            runs: dict[str, Any] = {}
            for pos, arm in enumerate(order):
                self.note(f"chunk {c + 1}/{n_chunks}: {arm} ({hi - lo} questions)")
                gens, row, result = self._timed(arm, c, prompts[lo:hi], until[lo:hi], max_new[lo:hi])
                row.update(chunk=c, order=pos, first_question=lo)
                self.write(CHUNKS_FILE, row)
                out[arm].extend(gens)
                runs[arm] = (gens, result.schedule, dict(result.requests)) if self.replays \
                    else (gens, None, {})
            if self.replays:
                self._replay_chunk(c, lo, runs)
        self.key, self.results = key, out
        return out

    def _timed(
        self, arm: str, c: int, prompts: list[str], until: list[list[str]], max_new: list[int]
    ) -> tuple[list[Generation], dict[str, Any], CellResult]:
        """One arm's timed chunk (on the engine: frozen, cold work counted, schedule recorded): its
        generations, its chunks-file row and the cell's result (the schedule a replay needs)."""
        reqs, truncated = self.questions.requests(prompts, until, max_new)
        t0 = time.perf_counter()
        result = self.backend.run_cell(arm, f"chunk{c}", reqs, self.timeouts, timed=True)
        seconds = time.perf_counter() - t0
        gens = self.questions.generations(arm, reqs, truncated, result.records, until)
        self.stats[arm].account(gens, seconds)
        row: dict[str, Any] = {
            "arm": arm,
            "questions": len(prompts),
            "seconds": seconds,
            "generated_tokens": sum(g.num_tokens for g in gens),
        }
        if self.replays:
            row["cold_work"] = dict(result.cold_work)
        return gens, row, result

    def _kernels_in_eager(self) -> bool:
        """Whether the replay that just ran had the arm's kernels on in its eager steps: on a GPU the
        replay forces them on; elsewhere the arm's own scope decides (`all`: on)."""
        engine = self.backend.engine
        selection = getattr(engine.ops, "selection", None)
        return engine.device.type == "cuda" or getattr(selection, "scope", None) == "all"

    def _replay_chunk(self, c: int, lo: int, runs: dict[str, Any]) -> None:
        """Replay the reference's schedule of chunk `c` on every other arm (untimed) and compare."""
        ref_gens, sched, requests = runs[self.ref]
        if sched is None or not requests:
            return
        rid_of = {r.index: rid for rid, r in requests.items()}
        for arm in runs:
            if arm == self.ref:
                continue
            got = self.backend.replay(arm, sched, requests)
            divergences = []
            for i in range(len(rid_of)):
                want = ref_gens[i].token_ids or []
                d = first_divergence(got.get(i, []), want)
                if d is not None:
                    divergences.append(
                        {"question": lo + i, "token_index": d, "step": sched.step_of_token(rid_of[i], d)}
                    )
            self.write(
                REPLAY_FILE,
                {
                    "arm": arm,
                    "chunk": c,
                    "compared": len(rid_of),
                    "identical": len(rid_of) - len(divergences),
                    "divergences": divergences,
                    "kernels_in_eager_steps": self._kernels_in_eager(),
                },
            )


@dataclass
class CachedArmBackend:
    """The generation backend lm-eval sees for one arm: answers come from the interleaved run."""

    generator: InterleavedGenerator
    arm: str

    @property
    def stats(self) -> BackendStats:
        return self.generator.stats[self.arm]

    def generate(self, prompts: list[str], until: list[list[str]], max_new: list[int]) -> list[Generation]:
        if self.generator.key is None:
            self.generator.warmup(prompts, until, max_new)
        return self.generator.generate(prompts, until, max_new)[self.arm]
