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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rltbench.commands.gsm8k.backends import BackendStats, Generation
from rltbench.engine.coldwork import ColdWorkProbe
from rltbench.engine.schedule import first_divergence
from rltbench.results.stats import abba_order

CHUNKS_FILE = "chunks.jsonl"  # one timing row per (chunk, arm)
REPLAY_FILE = "replay.jsonl"  # one identity row per (chunk, non-reference arm)


@dataclass
class InterleavedGenerator:
    """Generates every arm's answers for one request list, chunk-interleaved (see module doc).

    `backends` maps arm -> a generation backend (gsm8k.backends); `engine` is the shared in-process
    engine when the backends are engine backends (None for servers: then only timing is
    interleaved, and identity is the served text)."""

    backends: dict[str, Any]
    ref: str
    chunk: int
    engine: Any = None
    write: Callable[[str, dict[str, Any]], None] = lambda name, row: None
    note: Callable[[str], None] = lambda text: None
    results: dict[str, list[Generation]] = field(default_factory=dict)
    key: tuple | None = None

    def generate(
        self, prompts: list[str], until: list[list[str]], max_new: list[int]
    ) -> dict[str, list[Generation]]:
        """Every arm's generations for these requests (computed once; later calls with the same
        requests return the same generations)."""
        key = (tuple(prompts), tuple(map(tuple, until)), tuple(max_new))
        if self.key == key:
            return self.results
        arms = list(self.backends)
        out: dict[str, list[Generation]] = {a: [] for a in arms}
        n_chunks = -(-len(prompts) // self.chunk)
        for c in range(n_chunks):
            lo, hi = c * self.chunk, min(len(prompts), (c + 1) * self.chunk)
            order = abba_order(arms, c + 1)[-len(arms):]
            runs: dict[str, Any] = {}
            for pos, arm in enumerate(order):
                self.note(f"chunk {c + 1}/{n_chunks}: {arm} ({hi - lo} questions)")
                gens, row, run = self._timed(arm, prompts[lo:hi], until[lo:hi], max_new[lo:hi])
                row.update(chunk=c, order=pos, first_question=lo)
                self.write(CHUNKS_FILE, row)
                out[arm].extend(gens)
                runs[arm] = (gens, run)
            if self.engine is not None:
                self._replay_chunk(c, lo, runs)
        self.key, self.results = key, out
        return out

    def _timed(
        self, arm: str, prompts: list[str], until: list[list[str]], max_new: list[int]
    ) -> tuple[list[Generation], dict[str, Any], Any]:
        """One arm's timed chunk: frozen engine, cold work counted, schedule recorded."""
        backend, eng = self.backends[arm], self.engine
        probe = None
        if eng is not None:
            eng.set_arm(arm)  # also empties the prefix cache: every chunk starts alike
            eng.freeze(True)
            probe = ColdWorkProbe(eng)
            probe.start()
            eng.start_recording()
        seconds_before = backend.stats.seconds
        try:
            gens = backend.generate(prompts, until, max_new)
        finally:
            schedule = eng.stop_recording() if eng is not None else None
            if eng is not None:
                eng.freeze(False)
        row: dict[str, Any] = {
            "arm": arm,
            "questions": len(prompts),
            "seconds": backend.stats.seconds - seconds_before,
            "generated_tokens": sum(g.num_tokens for g in gens),
        }
        if probe is not None:
            row["cold_work"] = probe.delta()
        return gens, row, (schedule, dict(getattr(backend, "last_requests", {})))

    def _replay_chunk(self, c: int, lo: int, runs: dict[str, Any]) -> None:
        """Replay the reference's schedule of chunk `c` on every other arm (untimed) and compare."""
        eng = self.engine
        ref_gens, (sched, requests) = runs[self.ref]
        if sched is None or not requests:
            return
        prompts = {rid: ids for rid, (ids, _) in requests.items()}
        max_tokens = {rid: m for rid, (_, m) in requests.items()}
        order = list(requests)  # rids in question order
        for arm in runs:
            if arm == self.ref:
                continue
            eng.set_arm(arm)
            fused = eng.fused_ops if eng.device.type == "cuda" else None
            got = eng.replay(sched, prompts, max_tokens, eager_ops=fused)
            divergences = []
            for i, rid in enumerate(order):
                want = ref_gens[i].token_ids or []
                d = first_divergence(got.get(rid, []), want)
                if d is not None:
                    divergences.append(
                        {"question": lo + i, "token_index": d, "step": sched.step_of_token(rid, d)}
                    )
            self.write(
                REPLAY_FILE,
                {
                    "arm": arm,
                    "chunk": c,
                    "compared": len(order),
                    "identical": len(order) - len(divergences),
                    "divergences": divergences,
                    "kernels_in_eager_steps": fused is not None,
                },
            )


@dataclass
class CachedArmBackend:
    """The generation backend lm-eval sees for one arm: answers come from the interleaved run."""

    generator: InterleavedGenerator
    arm: str
    stats: BackendStats = field(default_factory=BackendStats)

    def generate(self, prompts: list[str], until: list[list[str]], max_new: list[int]) -> list[Generation]:
        gens = self.generator.generate(prompts, until, max_new)[self.arm]
        inner = self.generator.backends[self.arm].stats
        self.stats = inner
        return gens
