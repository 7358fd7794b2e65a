"""A small fake engine with the Engine API subset the e2e backend uses (tests only).

Tokens are a deterministic function of (prompt, position) so identity is checkable; knobs make an
arm diverge, a request never start / stall / come up short, add_request reject, or step raise.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace

from rltbench.engine.schedule import DECODE, Schedule, StepRecord


@dataclass
class FakeRunner:
    """The runner's warm-ups (the e2e backend warms the engine's runner before timed cells)."""

    engine: FakeEngine

    def warmup(self, batch_sizes=None) -> None:
        self.engine.warmed.append(self.engine.arm)

    def warmup_prefill(self, prompt_len: int) -> int:
        return 0

    def warmup_prefill_steps(self) -> None:
        pass


@dataclass
class FakeEngine:
    vocab: int = 97
    step_sleep: float = 0.0
    diverge: dict = field(default_factory=dict)  # arm -> position where its tokens differ
    silent: set = field(default_factory=set)  # request index suffixes that never get a token
    stall_after: dict = field(default_factory=dict)  # index -> tokens after which it stalls
    stall_arms: set | None = None  # arms where stall_after applies (None: every arm)
    short: dict = field(default_factory=dict)  # index -> number of tokens before "finished"
    reject: set = field(default_factory=set)  # index -> add_request raises ValueError
    fail_step: int | None = None  # raise on this step number
    arm: str = "torch"

    def __post_init__(self):
        self.live: dict[str, dict] = {}
        self.steps = 0
        self.hist: dict[int, int] = {}
        self.warmed: list[str] = []
        self.resets = 0
        self.arm_log: list[str] = []
        self.frozen = False
        self.recording: Schedule | None = None
        self.replays: list[str] = []
        self.device = SimpleNamespace(type="cpu")
        self.fused_ops = None
        self.captures_in_timed = 0  # set > 0 to make timed cells report cold work
        self.runner = FakeRunner(self)

    def freeze(self, frozen: bool = True) -> None:
        self.frozen = frozen

    def start_recording(self) -> None:
        self.recording = Schedule()

    def stop_recording(self) -> Schedule:
        rec, self.recording = self.recording, None
        return rec

    def replay(self, schedule, prompts, max_tokens, eager_ops=None, row_invariant_tile=None):
        """Tokens of the current arm for the recorded number of steps of each request."""
        self.replays.append(self.arm)
        return {
            rid: [self.token(list(prompts[rid]), i, self.arm) for i in range(n)]
            for rid, n in schedule.emitted().items()
        }

    def _idx(self, rid: str) -> str:
        return rid.rsplit("/", 1)[-1]

    def set_arm(self, name: str) -> None:
        assert not self.live, "set_arm needs an idle engine"
        self.arm = name
        self.arm_log.append(name)

    def reset_prefix_cache(self) -> None:
        self.resets += 1

    def add_request(self, rid, prompt, params) -> None:
        if self._idx(rid) in self.reject:
            raise ValueError(f"request {rid!r}: rejected by the fake")
        assert rid not in self.live
        self.live[rid] = {"prompt": list(prompt), "n": 0, "max": params.max_tokens}

    def abort_request(self, rid) -> bool:
        return self.live.pop(rid, None) is not None

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def token(self, prompt: list[int], pos: int, arm: str) -> int:
        t = (sum(prompt) * 31 + pos * 7) % self.vocab
        if arm in self.diverge and pos >= self.diverge[arm]:
            t = (t + 1) % self.vocab
        return t

    def step(self):
        self.steps += 1
        if self.fail_step is not None and self.steps == self.fail_step:
            raise RuntimeError("fake engine failure")
        if self.step_sleep:
            time.sleep(self.step_sleep)
        now = time.perf_counter()
        events = []
        active = [r for r in self.live if self._idx(r) not in self.silent]
        self.hist[len(active)] = self.hist.get(len(active), 0) + 1
        rows = []
        for rid in active:
            st = self.live[rid]
            idx = self._idx(rid)
            stalls = self.stall_arms is None or self.arm in self.stall_arms
            if stalls and idx in self.stall_after and st["n"] >= self.stall_after[idx]:
                continue
            tok = self.token(st["prompt"], st["n"], self.arm)
            rows.append((rid,))
            st["n"] += 1
            limit = min(st["max"], self.short.get(idx, st["max"]))
            done = st["n"] >= limit
            events.append(
                SimpleNamespace(
                    request_id=rid,
                    token_ids=[tok],
                    time=now,
                    finished=done,
                    finish_reason="length" if done else None,
                    prefix_hit_tokens=0,
                )
            )
            if done:
                del self.live[rid]
        if self.recording is not None and rows:
            self.recording.steps.append(StepRecord(DECODE, tuple(rows)))
        if self.frozen:
            self.captures += self.captures_in_timed
        return events

    captures = 0

    def cold_counters(self):
        return {"graph_captures": self.captures}

    def stats(self):
        return {
            "batch_size_hist": dict(self.hist),
            "prefix_hit_tokens": 0,
            "prefix_query_tokens": 0,
            "graph_captures": self.captures,
        }
