"""The conversations of a session trace: which request continues which (its previous turn), think
time between turns, and cache busting. Pure and deterministic given the seed.

**Turns.** A Mooncake-format trace has no conversation ids; its hash ids are prefix hashes of 512-token
blocks, and a conversation's next turn repeats the previous turn's prompt (and reply) before its new
text. So a request continues the latest earlier request whose hash ids, all but the last, begin its
own (a turn's last block is partial: its hash changes once the next turn extends it), where those
are at least MIN_SHARED_BLOCKS blocks: a system prompt of one block begins most conversations of the
shipped Mooncake trace (with one block, 12014 of its 12031 requests would continue another; with
two, 3974). The first request of a conversation continues none.

**Think time** (AIPerf's multi-turn delays): a later turn is sent a delay after its previous turn's
response ended (its last token), instead of at its trace arrival; the delay is fixed, or drawn from
a normal distribution (mean, standard deviation) clipped at 0, one draw per request and repetition,
the same for every arm. First turns keep their trace arrival.

**Cache busting.** The first tokens of each prompt are overwritten by a number written in token ids
(unique per run, repetition, and conversation or request), so a prefix cache can only serve what the
busting allows: `session`, a conversation's own earlier turns (nothing from other conversations, other
repetitions, another arm's run on the same server, or the warm-up); `request`, nothing at all. Prompt
lengths are unchanged. The hash ids are renamed the same way, so the theoretical hit rate is the
busted load's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from rltbench.backends.base import Request

CACHE_BUST_OFF, CACHE_BUST_SESSION, CACHE_BUST_REQUEST = "off", "session", "request"
CACHE_BUST_MODES = (CACHE_BUST_OFF, CACHE_BUST_SESSION, CACHE_BUST_REQUEST)
MIN_SHARED_BLOCKS = 2  # full blocks a later turn must share with its previous turn
_UNIT_BITS = 20  # conversations (or requests) per cell; repetitions take the bits above
_KEY_BITS = 40  # what a busting prefix must be able to number


@dataclass(frozen=True)
class ThinkTime:
    """The delay (seconds) between a turn's response and the next turn: `mean`, and `stddev` > 0 for
    normal draws clipped at 0."""

    mean: float
    stddev: float = 0.0

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.stddev == 0:
            return np.full(n, self.mean)
        return np.clip(rng.normal(self.mean, self.stddev, size=n), 0.0, None)

    @property
    def label(self) -> str:
        ms = f"{self.mean * 1e3:g} ms"
        return ms if self.stddev == 0 else f"{ms} +- {self.stddev * 1e3:g} ms (normal, clipped at 0)"


def previous_turns(requests: Sequence[Request]) -> list[int | None]:
    """Per request (in arrival order) the position of its previous turn, or None (module docstring)."""
    by_key: dict[tuple[int, ...], int] = {}
    out: list[int | None] = []
    for j, req in enumerate(requests):
        h = tuple(req.hash_ids)
        out.append(next((by_key[h[:k]] for k in range(len(h), 0, -1) if h[:k] in by_key), None))
        if len(h) - 1 >= MIN_SHARED_BLOCKS:
            by_key[h[:-1]] = j
    return out


def conversations(previous: Sequence[int | None]) -> list[int]:
    """Per request the position of its conversation's first turn."""
    roots: list[int] = []
    for j, p in enumerate(previous):
        roots.append(j if p is None else roots[p])
    return roots


def with_think_time(requests: Sequence[Request], think: ThinkTime, rng: np.random.Generator) -> list[Request]:
    """The requests with each later turn waiting for its previous one (`after`) plus a think time."""
    previous = previous_turns(requests)
    delays = think.draw(len(requests), rng)
    return [req if p is None else replace(req, after=requests[p].index, think=float(d))
            for req, p, d in zip(requests, previous, delays, strict=True)]


def bust_width(n_ids: int) -> int:
    """Token ids needed to write every busting number in base `n_ids`."""
    return max(1, math.ceil(_KEY_BITS / math.log2(n_ids)))


def bust_prefix(number: int, ids: np.ndarray, width: int) -> list[int]:
    """`number` written in `width` digits of base len(ids), each digit one allowed token id."""
    digits = []
    for _ in range(width):
        number, d = divmod(number, int(ids.size))
        digits.append(int(ids[d]))
    return digits


def cache_bust(requests: Sequence[Request], mode: str, rep: int, ids: np.ndarray) -> list[Request]:
    """The requests with the first tokens of each prompt unique per (`rep`, conversation) for
    `session`, per (`rep`, request) for `request` (module docstring); `rep` may be negative (warm-up
    passes). Unchanged for `off`."""
    if mode == CACHE_BUST_OFF:
        return list(requests)
    units = (conversations(previous_turns(requests)) if mode == CACHE_BUST_SESSION
             else list(range(len(requests))))
    width = bust_width(int(ids.size))
    stride = 1 + max((h for r in requests for h in r.hash_ids), default=0)
    out = []
    for req, unit in zip(requests, units, strict=True):
        prefix = bust_prefix(((rep + 4) << _UNIT_BITS) + unit, ids, width)
        prompt = list(req.prompt)
        k = min(width, len(prompt))
        out.append(replace(req, prompt=prefix[:k] + prompt[k:],
                           hash_ids=tuple(h + stride * (1 + unit) for h in req.hash_ids)))
    return out
