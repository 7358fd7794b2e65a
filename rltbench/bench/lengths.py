"""Request lengths of an open-loop load: fixed, random ranges, or drawn from recorded lengths.

- fixed: every request `input_len` prompt tokens and `output_len` generated tokens;
- random ranges (vLLM's `--random-range-ratio r`): each length uniform over the integers of
  [L (1 - r), L (1 + r)], never below 1;
- recorded: (input, output) pairs of a length distribution shipped in `workloads/lengths/`, of a
  session preset's trace, or of any JSONL file whose rows have `input_length` and `output_length`
  (a Mooncake trace has them); only the lengths are used (no arrival times, no shared prefixes), each
  request draws one pair at random, and pairs too long for the model are left out (counted).

Draws come from the generator the caller passes, so lengths are deterministic given the seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rltbench.bench.workload import WORKLOAD_DIR, read_jsonl, resolve_trace
from rltbench.errors import UsageError

LENGTHS_DIR = WORKLOAD_DIR / "lengths"


@dataclass(frozen=True)
class LengthSource:
    """Where each request's (prompt tokens, output tokens) come from: `pairs` when recorded lengths
    were given, else `input_len` / `output_len` varied by `range_ratio`."""

    input_len: int
    output_len: int
    range_ratio: float = 0.0
    pairs: tuple[tuple[int, int], ...] = ()
    origin: str = ""  # the distribution or trace the pairs came from ("" for fixed or random)
    info: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def label(self) -> str:
        """How the manifest and the report name the lengths."""
        if self.pairs:
            return f"lengths of {self.origin} ({len(self.pairs)} pairs)"
        if self.range_ratio > 0:
            return (f"random: {self.input_len} in / {self.output_len} out, each uniform within "
                    f"+-{self.range_ratio:.0%}")
        return f"fixed: {self.input_len} in / {self.output_len} out"

    @property
    def fixed(self) -> bool:
        """Every request has the same lengths (one prefill shape: prefill graphs can be warmed)."""
        return not self.pairs and self.range_ratio == 0

    def longest(self) -> int:
        """The most tokens (prompt + output) one request can need."""
        if self.pairs:
            return max(i + o for i, o in self.pairs)
        return _range(self.input_len, self.range_ratio)[1] + _range(self.output_len, self.range_ratio)[1]

    def draw(self, n: int, rng: np.random.Generator) -> list[tuple[int, int]]:
        """(prompt tokens, output tokens) of `n` requests."""
        if self.pairs:
            return [self.pairs[int(k)] for k in rng.integers(0, len(self.pairs), size=n)]
        if self.range_ratio == 0:
            return [(self.input_len, self.output_len)] * n
        ins = rng.integers(*_closed(_range(self.input_len, self.range_ratio)), size=n)
        outs = rng.integers(*_closed(_range(self.output_len, self.range_ratio)), size=n)
        return [(int(i), int(o)) for i, o in zip(ins, outs, strict=True)]


def _range(length: int, ratio: float) -> tuple[int, int]:
    """[L (1 - r), L (1 + r)] in whole tokens, at least 1."""
    return max(1, math.floor(length * (1 - ratio))), max(1, math.ceil(length * (1 + ratio)))


def _closed(bounds: tuple[int, int]) -> tuple[int, int]:
    """numpy's half-open `integers(lo, hi)` arguments for the closed range [lo, hi]."""
    return bounds[0], bounds[1] + 1


def resolve_lengths(name: str) -> tuple[Path, float]:
    """`--lengths NAME|PATH` -> (file, default length scale): a distribution of workloads/lengths/
    (scale 1), a session preset (its trace and its length scale) or a file."""
    shipped = LENGTHS_DIR / f"{name}.jsonl"
    if "/" not in name and shipped.is_file():
        return shipped, 1.0
    try:
        path, preset = resolve_trace(name)
    except UsageError:
        names = ", ".join(sorted(p.stem for p in LENGTHS_DIR.glob("*.jsonl")))
        raise UsageError(f"--lengths {name}: no such file, length distribution ({names}) or session "
                         "preset") from None
    return path, float(preset.get("length_scale", 1.0))


def _length_pair(row: Any, where: str) -> tuple[int, int]:
    pair = int(row["input_length"]), int(row["output_length"])
    if min(pair) < 1:
        raise UsageError(f"{where}: lengths must be >= 1")
    return pair


def read_length_pairs(path: Path) -> list[tuple[int, int]]:
    """The (input_length, output_length) of every row of a JSONL file; other fields are ignored."""
    return read_jsonl(path, _length_pair, "no input_length / output_length", "no rows")


def recorded_lengths(name: str, scale: float | None, context: int) -> LengthSource:
    """The pairs of `--lengths NAME|PATH`, multiplied by `scale` (default: the preset's, else 1), the
    pairs longer than `context` left out and counted; a UsageError when none is left."""
    path, default_scale = resolve_lengths(name)
    scale = default_scale if scale is None else scale
    if not (math.isfinite(scale) and scale > 0):
        raise UsageError(f"--trace-length-scale must be a finite number > 0, not {scale}")
    raw = read_length_pairs(path)
    scaled = [(max(1, round(i * scale)), max(1, round(o * scale))) for i, o in raw]
    kept = tuple(p for p in scaled if sum(p) <= context)
    if not kept:
        raise UsageError(f"--lengths {name}: no pair fits the model's context of {context} tokens at length "
                         f"scale {scale:g}: lower --trace-length-scale")
    info = {"file": str(path), "length_scale": scale, "pairs": len(raw),
            "dropped_too_long": len(raw) - len(kept), "mean_input": sum(i for i, _ in kept) / len(kept),
            "mean_output": sum(o for _, o in kept) / len(kept)}
    return LengthSource(kept[0][0], kept[0][1], pairs=kept, origin=name, info=info)
