"""Which differences between kernel arms are evidence: paired per-round ratios against the A/A spread.

A timing mode of one case times every arm interleaved in rounds (ABBA order, `reps` samples per arm
and round, kernel_sweep.time_case); each sample record stores `rounds`. An arm's median within a round is
one observation, and the same round of two arms ran side by side, so their ratio cancels whatever
drifted between rounds (clocks, temperature, neighbours on the device). The estimate is the median
of the per-round ratios, with its order-statistic interval (rltbench.results.stats).

The A/A arm is an arm named twice (`--arms ...,torch` gives `torch#2`, the default `--arms all`
includes it): two identical computations at two positions of the interleaving. How far their ratio
reaches from 1 is this case's noise floor, and a difference whose interval reaches into it is
"within noise", never "faster" or "slower". Without an A/A arm no comparison gets a direction.

An arm with scope graph runs torch's ops outside a CUDA graph, so its eager comparisons time torch:
they read NOT_EXERCISED (`mark_unexercised`), never faster or slower.

Pairs compared: every arm against torch (the speedup), and every other kernel arm (cuda, approx, the
Liger peer, custom arms) against exact, because the open questions are "is the native kernel as fast
as the Triton one" and "is exact within reach of the peer". The PDL figures are a labelled special
mode and are not compared; the same-size copy is a reference, not an arm.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from rltbench.arms import NOT_EXERCISED
from rltbench.results.stats import NO_AA, base_arm, is_aa, noise_label, paired_ratio_interval, rep_medians

MODES = ("graph", "hot", "eager")
REFERENCE = "torch"
TRITON = "exact"
AA = "A/A"
CASE_KEYS = ("op", "dtype", "width", "tokens")


def round_medians(samples: Sequence[float], rounds: int) -> list[float]:
    """One median per round: the samples are stored round after round, the same count in each."""
    if rounds < 1 or len(samples) % rounds:
        raise ValueError(f"{len(samples)} samples do not split into {rounds} rounds")
    per = len(samples) // rounds
    return rep_medians([samples[i * per:(i + 1) * per] for i in range(rounds)])


def compared_pairs(arms: Iterable[str]) -> list[tuple[str, str]]:
    """(reference, arm) pairs: each arm against torch, each other kernel arm against exact, and each
    A/A copy against the arm it repeats (exact#2 against exact, not against torch)."""
    names = list(arms)
    pairs = []
    for a in names:
        if base_arm(a) != a and base_arm(a) in names:
            pairs.append((base_arm(a), a))
        elif a != REFERENCE and REFERENCE in names:
            pairs.append((REFERENCE, a))
    if TRITON in names:
        pairs += [(TRITON, a) for a in names if base_arm(a) not in (REFERENCE, TRITON)]
    return pairs


def aa_intervals(per_round: Mapping[str, Sequence[float]]) -> list[Any]:
    """The ratio interval of every A/A pair (an arm and its repeat) with enough rounds."""
    out = []
    for arm, times in per_round.items():
        base = base_arm(arm)
        if arm != base and base in per_round:
            iv = paired_ratio_interval(per_round[base], times)
            if iv is not None:
                out.append(iv)
    return out


def case_verdicts(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The comparisons of one case and mode from its sample records (one record per arm)."""
    per_round = {r["arm"]: round_medians(r["samples_us"], int(r["rounds"])) for r in records}
    medians = {r["arm"]: statistics.median(r["samples_us"]) for r in records}
    aas = aa_intervals(per_round)
    widest = max(aas, key=lambda iv: iv.spread) if aas else None
    out = []
    for ref, arm in compared_pairs(per_round):
        iv = paired_ratio_interval(per_round[ref], per_round[arm])
        out.append({"ref": ref, "arm": arm, "ref_us": medians[ref], "arm_us": medians[arm],
                    "ratio": None if iv is None else iv.estimate, "lo": None if iv is None else iv.lo,
                    "hi": None if iv is None else iv.hi, "coverage": None if iv is None else iv.coverage,
                    "rounds": None if iv is None else iv.n,
                    "aa_spread": None if widest is None else widest.spread,
                    "verdict": AA if is_aa(arm, ref) else noise_label(iv, widest)})
    return out


def verdicts(samples: Iterable[Mapping[str, Any]], skip: Collection[str] = ()) -> list[dict[str, Any]]:
    """Every comparison of a run, one dict per (case, mode, reference, arm), from samples.jsonl;
    `skip`: runners that are references, not arms (the same-size copy). Records without `rounds`
    (runs older than this file) give none."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = defaultdict(list)
    for rec in samples:
        timed = rec.get("mode") in MODES and rec.get("rounds") and rec.get("samples_us")
        if timed and rec["arm"] not in skip:
            groups[(*(rec[k] for k in CASE_KEYS), rec["mode"])].append(rec)
    out = []
    for key, records in groups.items():
        for row in case_verdicts(records):
            out.append({**dict(zip((*CASE_KEYS, "mode"), key, strict=True)), **row})
    return out


def mark_unexercised(rows: list[dict[str, Any]], arms: Collection[str]) -> list[dict[str, Any]]:
    """`rows` with every eager comparison that involves one of `arms` (scope graph: eagerly they run
    torch's ops) labelled NOT_EXERCISED instead of faster / slower / within noise: it timed torch."""
    for r in rows:
        if r["mode"] == "eager" and (r["arm"] in arms or r["ref"] in arms):
            r["verdict"] = NOT_EXERCISED
    return rows


def vs_torch(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, ...], str]:
    """(op, dtype, width, tokens, mode, arm) -> the verdict of the arm against torch (A/A copies of
    torch included), for the main table's column."""
    return {(*(r[k] for k in CASE_KEYS), r["mode"], r["arm"]): r["verdict"]
            for r in rows if r["ref"] == REFERENCE}


__all__ = ["AA", "MODES", "NOT_EXERCISED", "NO_AA", "aa_intervals", "base_arm", "case_verdicts",
           "compared_pairs", "mark_unexercised", "round_medians", "verdicts", "vs_torch"]
