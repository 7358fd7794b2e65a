"""Serving workloads: burst prompt sets and Mooncake session replays, as token-id requests, and the
interleaved order in which arms run their cells.

Prompts are token ids (never text), so every arm sees byte-identical inputs. Everything here is
pure and deterministic given the seed: the same flags give the same prompts in every run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from rltbench.backends.base import Request
from rltbench.bench.workload_defaults import (
    BURST_INPUT_LEN,
    BURST_OUTPUT_LEN,
    DEFAULT_TRACE,
    SMALL_MODEL_TRACE,
)
from rltbench.errors import UsageError

TRACE_BLOCK = 512  # Mooncake hash ids cover 512-token blocks
WORKLOAD_DIR = Path(__file__).resolve().parents[2] / "workloads"
T = TypeVar("T")

# Special-token id ranges known per family (clipped to the vocab): never put these in random prompts.
# Ouro's SmolLM2-style tokenizer keeps its specials at ids 0..16; Huginn's at 65504 and above.
_FAMILY_SPECIAL = {"ouro": (0, 17), "huginn": (65504, 1 << 30)}


@dataclass
class SessionTrace:
    """A materialized session: requests in arrival order plus the trace-level facts for the report."""

    requests: list[Request]
    block_size: int
    dropped_too_long: int = 0
    source: str = ""
    info: dict[str, Any] = field(default_factory=dict)



def fit_burst_lengths(input_len: int | None, output_len: int | None, context: int,
                      model: str = "the model") -> tuple[int, int, str | None]:
    """(input_len, output_len, note) of a burst on a model of `context` tokens.

    Why: the defaults (512 in, 128 out) do not fit a tiny preset's 512-token context, and a newcomer's
    first run should work. A length left at its default (None) shrinks to fit, and the note says what
    was chosen; a length the user gave is kept, and one that cannot fit is a UsageError naming the
    flag and a value that works.
    """
    out = output_len if output_len is not None else min(BURST_OUTPUT_LEN, max(1, context // 4))
    inp = input_len if input_len is not None else min(BURST_INPUT_LEN, context - out)
    if inp + out > context or inp < 1:
        if input_len is not None and context - out >= 1:
            fix = f"use --input-len {context - out} or less"
        elif context - inp >= 1 and inp >= 1:
            fix = f"use --output-len {context - inp} or less"
        else:
            fix = f"use --output-len {max(1, context // 4)} or less"
        raise UsageError(f"--input-len {inp} + --output-len {out} = {inp + out} tokens exceeds {model}'s "
                         f"context of {context}: {fix}")
    note = None
    if (input_len is None and inp != BURST_INPUT_LEN) or (output_len is None and out != BURST_OUTPUT_LEN):
        note = (f"--input-len {inp} --output-len {out}: the default {BURST_INPUT_LEN} + {BURST_OUTPUT_LEN} "
                f"tokens do not fit {model}'s context of {context}")
    return inp, out, note


@dataclass
class Cell:
    """One load point of a serving run: its name and concurrency C (0 for a session replay: open loop
    by trace time; 0 or the concurrency limit for an open-loop rate). A rate cell has its target
    `rate` (requests/s); `max_concurrency` holds requests back client-side while that many are in
    flight; a `probe` cell (the synchronous and saturated runs that place a sweep's rates) is no
    measurement of its own."""

    name: str
    C: int
    rate: float | None = None
    max_concurrency: int | None = None
    probe: bool = False


def schedule(arms: list[str], cells: list[Cell], repeats: int) -> list[tuple[int, Cell, str]]:
    """(rep, cell, arm) in run order: per (repetition, cell) block every arm runs the cell once, and
    blocks alternate forward/backward (A B C, C B A), also from one cell to the next, so no arm always
    runs first on a warming device (the serving form of results.stats.abba_order)."""
    out = []
    for rep in range(repeats):
        for ci, cell in enumerate(cells):
            order = arms if (rep + ci) % 2 == 0 else list(reversed(arms))
            out.extend((rep, cell, arm) for arm in order)
    return out

def special_ids(config: Any) -> set[int]:
    """Ids a random prompt must not contain: eos/bos/pad of the config plus the family's special range."""
    vocab = int(config.vocab_size)
    out: set[int] = set(int(t) for t in getattr(config, "eos_token_ids", ()) or ())
    for key in ("bos_token_id", "pad_token_id"):
        val = getattr(config, key, None)
        if val is not None:
            out.add(int(val))
    lo, hi = _FAMILY_SPECIAL.get(getattr(config, "family", ""), (0, 0))
    if vocab > hi or vocab > 4096:  # real vocabularies only: tiny test vocabs would lose most ids
        out.update(range(lo, min(hi, vocab)))
    return {t for t in out if 0 <= t < vocab}


def allowed_ids(config: Any) -> np.ndarray:
    """Sorted array of the token ids random prompts draw from."""
    bad = special_ids(config)
    ids = np.array([t for t in range(int(config.vocab_size)) if t not in bad], dtype=np.int64)
    if ids.size < 2:
        raise UsageError(f"vocab of {config.vocab_size} leaves no ids for random prompts")
    return ids


def _rng(*keys: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(k) & 0xFFFFFFFF for k in keys])))


def burst_prompts(
    config: Any, n: int, input_len: int, output_len: int, seed: int, rep: int, concurrency: int
) -> list[Request]:
    """`n` prompts of exactly `input_len` ids, fresh per (seed, repetition, concurrency), shared by arms."""
    if input_len < 1 or output_len < 1:
        raise UsageError("--input-len and --output-len must be >= 1")
    ids = allowed_ids(config)
    rng = _rng(seed, 0xB0857, rep, concurrency)
    picks = rng.integers(0, ids.size, size=(n, input_len))
    return [Request(index=i, prompt=ids[picks[i]].tolist(), output_len=output_len) for i in range(n)]


def open_loop_prompts(config: Any, arrivals: Any, lengths: list[tuple[int, int]], seed: int,
                      key: tuple[int, ...], ignore_eos: bool = True) -> list[Request]:
    """The requests of one open-loop cell: request i arrives at `arrivals[i]` (seconds after the cell
    starts) with a prompt of `lengths[i][0]` random ids (no special ids) and `lengths[i][1]` output
    tokens; fresh per `key` (repetition and cell), the same for every arm."""
    ids = allowed_ids(config)
    rng = _rng(seed, 0x0A7E, *key)
    return [
        Request(index=i, prompt=ids[rng.integers(0, ids.size, size=n_in)].tolist(), output_len=n_out,
                arrival=float(t), ignore_eos=ignore_eos)
        for i, (t, (n_in, n_out)) in enumerate(zip(arrivals, lengths, strict=True))
    ]


def warmup_prompts(config: Any, n: int, input_len: int, output_len: int, seed: int) -> list[Request]:
    """A small burst for warm-up (distinct seed stream from every measured cell)."""
    ids = allowed_ids(config)
    rng = _rng(seed, 0x3A2F)
    picks = rng.integers(0, ids.size, size=(n, input_len))
    return [Request(index=i, prompt=ids[picks[i]].tolist(), output_len=output_len) for i in range(n)]


# -- session traces ------------------------------------------------------------------------------
def resolve_trace(trace: str) -> tuple[Path, dict[str, Any]]:
    """A trace path or a preset name from workloads/presets.json -> (path, preset values)."""
    presets_file = WORKLOAD_DIR / "presets.json"
    presets = json.loads(presets_file.read_text()) if presets_file.is_file() else {}
    if trace in presets and not trace.startswith("_"):
        preset = dict(presets[trace])
        return WORKLOAD_DIR / preset.pop("trace"), preset
    path = Path(trace)
    if not path.is_file():
        names = ", ".join(k for k in presets if not k.startswith("_"))
        raise UsageError(f"--trace {trace}: no such file or preset (presets: {names})")
    return path, {}


def read_jsonl(path: Path, parse: Callable[[Any, str], T], malformed: str, empty: str,
               most: int | None = None) -> list[T]:
    """The items of a JSONL file, one per non-blank line: `parse(row, where)` with `where` = "path:line".
    A line that is not JSON or that `parse` cannot read (ValueError, KeyError, TypeError) is a UsageError
    naming its place and `malformed`; `parse` raises its own UsageError for a value out of range. Stops
    after `most` items; a file with none is a UsageError naming it and `empty`."""
    items: list[T] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                item = parse(json.loads(line), where)
            except (ValueError, KeyError, TypeError) as exc:
                raise UsageError(f"{where}: {malformed} ({exc})") from None
            items.append(item)
            if most is not None and len(items) >= most:
                break
    if not items:
        raise UsageError(f"{path}: {empty}")
    return items


def _mooncake_record(r: Any, where: str) -> dict[str, Any]:
    rec = {
        "timestamp": float(r["timestamp"]),
        "input_length": int(r["input_length"]),
        "output_length": int(r["output_length"]),
        "hash_ids": [int(h) for h in r["hash_ids"]],
    }
    if rec["input_length"] < 1 or rec["output_length"] < 1 or not rec["hash_ids"]:
        raise UsageError(f"{where}: lengths must be >= 1 and hash_ids non-empty")
    return rec


def load_trace(path: Path, max_requests: int | None = None) -> list[dict[str, Any]]:
    """Mooncake-style records: timestamp (ms), input_length, output_length, hash_ids."""
    return read_jsonl(path, _mooncake_record, "not a Mooncake record", "no records", max_requests)


def scaled_block_size(length_scale: float) -> int:
    return max(1, round(TRACE_BLOCK * length_scale))


def _hash_block(hash_id: int, block_size: int, ids: np.ndarray, seed: int) -> list[int]:
    rng = _rng(seed, 0x5E55, hash_id, block_size)
    return ids[rng.integers(0, ids.size, size=block_size)].tolist()


def _record_lengths(rec: dict[str, Any], length_scale: float, block_size: int,
                    output_len: int | None = None) -> tuple[int, int]:
    """(prompt tokens, output tokens) of one trace record at `length_scale`."""
    n_hash = len(rec["hash_ids"])
    n_in = min(max(1, round(rec["input_length"] * length_scale)), n_hash * block_size)
    n_in = max(n_in, (n_hash - 1) * block_size + 1)  # keep every hash block represented
    n_out = output_len if output_len is not None else max(1, round(rec["output_length"] * length_scale))
    return n_in, n_out


def default_trace(max_model_len: int) -> tuple[str, str | None]:
    """The session trace when --trace is not given: DEFAULT_TRACE, or SMALL_MODEL_TRACE (with a note
    saying so) for a model whose context holds none of DEFAULT_TRACE's records (the tiny presets:
    every Mooncake conversation is longer than their 512 tokens)."""
    path, preset = resolve_trace(DEFAULT_TRACE)
    scale = preset.get("length_scale", 1.0)
    bs = scaled_block_size(scale)
    for rec in load_trace(path, preset.get("max_requests")):
        if sum(_record_lengths(rec, scale, bs)) <= max_model_len:
            return DEFAULT_TRACE, None
    return SMALL_MODEL_TRACE, (f"--trace {SMALL_MODEL_TRACE}: no record of the {DEFAULT_TRACE} trace fits "
                               f"the model's context of {max_model_len} tokens")


def materialize_session(
    config: Any,
    records: list[dict[str, Any]],
    seed: int,
    time_scale: float = 1.0,
    length_scale: float = 1.0,
    max_model_len: int | None = None,
    output_len: int | None = None,
) -> SessionTrace:
    """Turn trace records into token-id requests; each hash id is one fixed block of ids.

    The prompt is the concatenation of its hash blocks cut to the (scaled) input length, so two
    records sharing their first k hash ids share their first k blocks exactly. Records whose
    prompt + output would exceed `max_model_len` are dropped (counted, shown in the report).
    """
    if time_scale < 0 or length_scale <= 0:
        raise UsageError("--trace-time-scale must be >= 0 and --trace-length-scale > 0")
    bs = scaled_block_size(length_scale)
    ids = allowed_ids(config)
    blocks: dict[int, list[int]] = {}
    reqs: list[Request] = []
    dropped = 0
    t0 = records[0]["timestamp"]
    for rec in records:
        hids = rec["hash_ids"]
        n_in, n_out = _record_lengths(rec, length_scale, bs, output_len)
        if max_model_len is not None and n_in + n_out > max_model_len:
            dropped += 1
            continue
        prompt: list[int] = []
        for h in hids:
            if h not in blocks:
                blocks[h] = _hash_block(h, bs, ids, seed)
            prompt.extend(blocks[h])
        reqs.append(
            Request(
                index=len(reqs),
                prompt=prompt[:n_in],
                output_len=n_out,
                arrival=(rec["timestamp"] - t0) / 1000.0 * time_scale,
                hash_ids=tuple(hids),
            )
        )
    if not reqs:
        raise UsageError(
            f"every trace record exceeds the model length {max_model_len}: use --trace {SMALL_MODEL_TRACE} "
            "(the preset for small models) or lower --trace-length-scale"
        )
    return SessionTrace(requests=reqs, block_size=bs, dropped_too_long=dropped)


def theoretical_prefix_hit_rate(requests: list[Request], block_size: int) -> float:
    """Share of prompt tokens an infinite prefix cache could serve, at trace-block granularity.

    Hash ids are prefix hashes, so a request hits its longest run of leading hash ids already seen
    (by earlier requests, in arrival order), capped at its own prompt length.
    """
    seen: set[int] = set()
    hit = total = 0
    for r in sorted(requests, key=lambda r: (r.arrival, r.index)):
        k = 0
        while k < len(r.hash_ids) and r.hash_ids[k] in seen:
            k += 1
        hit += min(k * block_size, len(r.prompt))
        total += len(r.prompt)
        seen.update(r.hash_ids)
    return hit / total if total else math.nan
