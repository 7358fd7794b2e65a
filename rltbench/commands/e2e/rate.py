"""The open-loop rate workload of `rltbench e2e --workload rate`: its flags as a RateSpec, the requests
of each rate cell, and the sweep that places the rates and stops at saturation.

Cells run rate by rate (rising), each rate as `repeats` blocks of every arm still running it, the
arm order alternating A B C, C B A from one block to the next. After a rate's blocks, an arm whose
cells saturated the server in more than half of its repetitions (rltbench.results.rate.saturation)
runs no higher rate; the run stops when every arm has saturated, and says so.

`--request-rate sweep` places the rates first, as GuideLLM's sweep does: the reference arm serves a
few requests one at a time (the synchronous rate, and the synchronous request latency), and every
arm that is not an A/A copy serves a burst of twice the concurrency limit all at once (its saturated
throughput); those probe cells measure nothing of their own. The sweep then runs `--sweep-rates` N
rates in even ratios above the synchronous rate up to SWEEP_TOP x the saturated throughput of the
fastest arm (a burst understates what an open loop sustains, and the faster arm saturates later), and,
while an arm is still unsaturated there, up to N more at the same ratio. Even ratios, not even steps:
an SLO's capacity can sit far below saturation, and ratios resolve both ends alike.

How long a cell is: `--duration` seconds of arrivals or `--num-prompts` requests where given; in a
sweep otherwise `--cell-latencies` K x the synchronous request latency (at least MIN_CELL_REQUESTS
requests), so that a cell outlasts the life of a request K times over and a queue, if the rate
exceeds what the server holds, has time to build (a cell shorter than one request's life never
fills the server and every rate looks served).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rltbench.backends.base import Request, Timeouts
from rltbench.bench.arrivals import CONSTANT, GAMMA, POISSON, ArrivalProcess, arrival_times
from rltbench.bench.lengths import LengthSource, recorded_lengths
from rltbench.bench.workload import Cell, fit_burst_lengths, open_loop_prompts, warmup_prompts
from rltbench.commands.e2e.defaults import (
    DEFAULT_CELL_LATENCIES,
    DEFAULT_DURATION_S,
    DEFAULT_SWEEP_RATES,
    MAX_CELL_REQUESTS,
    MAX_RATE,
    MIN_CELL_REQUESTS,
    RATE,
)
from rltbench.commands.e2e.runner import Plan
from rltbench.errors import UsageError
from rltbench.options import comma_list
from rltbench.results.rate import (
    DEFAULT_EXCLUDE,
    DEFAULT_SATURATION_MARGIN,
    completed_rate,
    measured_records,
    rate_figures,
    saturation,
)
from rltbench.results.slo import DEFAULT_ATTAINMENT, SloTerm, cell_slo, parse_slo
from rltbench.results.stats import is_aa

SWEEP = "sweep"
SWEEP_TOP = 1.5  # the sweep's top rate over the fastest arm's saturated (burst) throughput
SYNC_PROBE_REQUESTS = 4
SYNC, SATURATED = "sync", "saturated"  # the probe cells of a sweep
WARMUP_CELL = Cell("warm-up", 0)


@dataclass(frozen=True)
class RateSpec:
    """The rate workload's flags, validated (`rate_spec`). `rates` None: a sweep."""

    rates: tuple[float, ...] | None = None
    sweep_rates: int = DEFAULT_SWEEP_RATES
    process: ArrivalProcess = ArrivalProcess()
    max_concurrency: int | None = None
    num_prompts: int | None = None
    duration_s: float | None = None  # None: a sweep sizes cells by cell_latencies, listed rates by default
    cell_latencies: float = DEFAULT_CELL_LATENCIES
    lengths: str | None = None  # --lengths NAME|PATH; None: --input-len / --output-len
    range_ratio: float = 0.0
    exclude_head: float = DEFAULT_EXCLUDE
    exclude_tail: float = DEFAULT_EXCLUDE
    slo: tuple[SloTerm, ...] = ()
    attainment: float = DEFAULT_ATTAINMENT
    saturation_margin: float = DEFAULT_SATURATION_MARGIN
    ignore_eos: bool = True

    def cell_seconds(self, sync_latency_s: float | None) -> tuple[float, str]:
        """(seconds of arrivals per cell, why): --duration, or K x the probe's synchronous request
        latency in a sweep, or the default for listed rates."""
        if self.duration_s is not None:
            return self.duration_s, "--duration"
        if sync_latency_s:
            return (self.cell_latencies * sync_latency_s,
                    f"{self.cell_latencies:g} x the synchronous request latency ({sync_latency_s:.3g} s)")
        return DEFAULT_DURATION_S, "the default for listed rates"

    def requests_at(self, rate: float, seconds: float) -> int:
        """Requests of one cell at `rate`: --num-prompts, or `seconds` of arrivals (at least
        MIN_CELL_REQUESTS; with --duration exactly its arrivals)."""
        if self.num_prompts is not None:
            return self.num_prompts
        floor = 2 if self.duration_s is not None else MIN_CELL_REQUESTS
        return max(floor, math.ceil(rate * seconds) + 1)

    def config(self) -> dict[str, Any]:
        """The spec as the manifest keeps it (what the report reads back)."""
        out = asdict(self)
        out.update(process=self.process.kind, burstiness=self.process.burstiness,
                   arrivals=self.process.label, slo=",".join(t.spec for t in self.slo) or None,
                   rates=list(self.rates) if self.rates else SWEEP)
        return out


def round_rate(rate: float) -> float:
    """A rate to 3 significant digits: the cell's name shows it exactly."""
    return float(f"{rate:.3g}")


def parse_request_rate(text: str) -> tuple[float, ...] | None:
    """`--request-rate 2,4.5,8` -> rising distinct rates (requests/s); `sweep` -> None."""
    if text.strip() == SWEEP:
        return None
    rates = []
    for part in comma_list(text, "--request-rate", "2,4.5,8"):
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 < value <= MAX_RATE):
            raise UsageError(f"--request-rate {text!r}: {part!r} is not a rate in (0, {MAX_RATE:g}] "
                             "(requests/s) nor 'sweep'")
        rates.append(round_rate(value))
    return tuple(sorted(set(rates)))


def _process(arrivals: str | None, burstiness: float | None) -> ArrivalProcess:
    """--arrivals and --burstiness -> the arrival process (vLLM: a burstiness other than 1 is gamma)."""
    b = burstiness
    kind = arrivals or (GAMMA if b is not None and b != 1 else POISSON)
    if kind not in (POISSON, GAMMA, CONSTANT):
        raise UsageError(f"--arrivals must be poisson, gamma or constant, not {kind!r}")
    if b is not None and b != 1 and kind != GAMMA:
        raise UsageError(f"--burstiness {b:g} shapes gamma arrivals; --arrivals {kind} has none")
    return ArrivalProcess(kind, 1.0 if b is None else b)


def rate_spec(request_rate: str | None, *, burstiness: float | None = None, arrivals: str | None = None,
              max_concurrency: int | None = None, num_prompts: int | None = None,
              duration: float | None = None, cell_latencies: float | None = None,
              sweep_rates: int | None = None, lengths: str | None = None,
              random_range_ratio: float | None = None, exclude_head: float | None = None,
              exclude_tail: float | None = None, slo: str | None = None, slo_attainment: float | None = None,
              saturation_margin: float | None = None, ignore_eos: bool | None = None) -> RateSpec:
    """The rate workload's flags -> RateSpec, every value checked (one line naming the flag); each
    number was checked against its bounds when the command line was parsed (rltbench.options)."""
    sizes = [f for f, v in (("--num-prompts", num_prompts), ("--duration", duration),
                            ("--cell-latencies", cell_latencies)) if v is not None]
    if len(sizes) > 1:
        raise UsageError(f"{sizes[0]} and {sizes[1]} both size a rate cell: give one")
    if lengths is not None and random_range_ratio is not None:
        raise UsageError("--random-range-ratio varies --input-len/--output-len; --lengths draws recorded "
                         "lengths: give one")
    head = DEFAULT_EXCLUDE if exclude_head is None else exclude_head
    tail = DEFAULT_EXCLUDE if exclude_tail is None else exclude_tail
    if head + tail >= 1:
        raise UsageError("--exclude-head + --exclude-tail must leave some requests (sum < 1)")
    attainment = DEFAULT_ATTAINMENT if slo_attainment is None else slo_attainment
    rates = parse_request_rate(request_rate or SWEEP)
    if rates is not None and sweep_rates is not None:
        raise UsageError("--sweep-rates is for --request-rate sweep")
    if rates is not None and cell_latencies is not None:
        raise UsageError("--cell-latencies sizes cells from a sweep's probe: give --request-rate sweep "
                         "(listed rates: --duration or --num-prompts)")
    seconds = duration or DEFAULT_DURATION_S
    if rates is not None and num_prompts is None and max(rates) * seconds > MAX_CELL_REQUESTS:
        raise UsageError(f"--request-rate {max(rates):g} x --duration {seconds:g} s: more than "
                         f"{MAX_CELL_REQUESTS:,} requests in one cell; shorten --duration or give "
                         "--num-prompts")
    return RateSpec(
        rates=rates,
        sweep_rates=sweep_rates or DEFAULT_SWEEP_RATES,
        process=_process(arrivals, burstiness),
        max_concurrency=max_concurrency,
        num_prompts=num_prompts,
        duration_s=duration,
        cell_latencies=cell_latencies or DEFAULT_CELL_LATENCIES,
        lengths=lengths,
        range_ratio=random_range_ratio or 0.0,
        exclude_head=head,
        exclude_tail=tail,
        slo=parse_slo(slo, attainment) if slo is not None else (),
        attainment=attainment,
        saturation_margin=saturation_margin or DEFAULT_SATURATION_MARGIN,
        ignore_eos=True if ignore_eos is None else ignore_eos,
    )


def rate_spec_of(workload: str, flags: dict[str, Any], others: dict[str, Any]) -> RateSpec | None:
    """The RateSpec of `--workload rate` (None for the other workloads, which take none of its
    `flags`); `others`: the trace and burst flags the rate workload has no use for (flag -> value;
    --trace-length-scale scales --lengths only)."""
    given = [k for k, v in flags.items() if v is not None]
    if workload != RATE:
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} is for --workload rate")
        return None
    for flag, value in others.items():
        if value is not None and not (flag == "--trace-length-scale" and flags.get("lengths")):
            why = "scales --lengths only" if flag == "--trace-length-scale" else "is not for --workload rate"
            raise UsageError(f"{flag} {why} (rate cells: --request-rate, --max-concurrency, --lengths)")
    return rate_spec(**flags)


def rate_lengths(spec: RateSpec, input_len: int | None, output_len: int | None, length_scale: float | None,
                 context: int, model: str) -> tuple[LengthSource, str | None]:
    """(request lengths, a note or None) on a model of `context` tokens: recorded pairs (--lengths,
    scaled by `length_scale`), or --input-len / --output-len (shrunk to fit where left at their
    defaults, as for bursts) varied by --random-range-ratio, whose longest request must fit."""
    if spec.lengths is not None:
        source = recorded_lengths(spec.lengths, length_scale, context)
        dropped = source.info["dropped_too_long"]
        return source, (f"--lengths {spec.lengths}: {dropped} pairs longer than the context of {context} "
                        "tokens left out") if dropped else None
    inp, out, note = fit_burst_lengths(input_len, output_len, context, model)
    source = LengthSource(inp, out, spec.range_ratio)
    if source.longest() > context:
        raise UsageError(f"--random-range-ratio {spec.range_ratio:g}: the longest request "
                         f"({source.longest()} tokens) exceeds the context of {context}; lower the ratio or "
                         "the lengths")
    return source, note


def rate_cell(rate: float, max_concurrency: int | None) -> Cell:
    return Cell(f"{rate:g}/s", max_concurrency or 0, rate=rate, max_concurrency=max_concurrency)


def sweep_rates(sync: float, top: float, n: int) -> tuple[list[float], float]:
    """(N rates in even ratios above `sync` up to `top`, that ratio); a top no higher than twice the
    synchronous rate spans up to twice it (the probes only place the rates)."""
    ratio = (max(top, 2 * sync) / sync) ** (1 / n)
    return list(dict.fromkeys(round_rate(sync * ratio ** k) for k in range(1, n + 1))), ratio


def request_latency(recs: list[dict[str, Any]]) -> float | None:
    """Median send-to-last-token seconds of the requests that finished ok (the synchronous probe's
    request latency, which sizes a sweep's cells)."""
    done = [r["last"] - r["send"] for r in recs if r.get("status") == "ok" and r.get("last") is not None]
    return float(np.median(done)) if done else None


def probed_arms(arms: list[str], ref: str) -> list[str]:
    """The arms whose saturated throughput a sweep probes: the reference first, then every arm that
    is not an A/A copy of one already probed."""
    out: list[str] = []
    for arm in [ref, *arms]:
        if arm not in out and not any(arm == o or is_aa(arm, o) for o in out):
            out.append(arm)
    return out


class RateSweep:
    """The run order of the rate workload (a runner.CellOrder; module docstring)."""

    def __init__(self, arms: list[str], ref: str, repeats: int, spec: RateSpec, limit: int):
        self.arms, self.ref, self.repeats, self.spec, self.limit = arms, ref, repeats, spec, limit
        self.figures: dict[tuple[str, str, int], dict[str, Any]] = {}
        self.probes: dict[str, dict[str, Any]] = {}
        self.rates: list[float] = []
        self.saturated: dict[str, dict[str, Any]] = {}
        self.stopped: str | None = None
        self.cell_s, self.cell_why = spec.cell_seconds(None)
        self._blocks: dict[tuple[int, str], list[str]] = {}

    def probe_cells(self) -> list[tuple[Cell, list[str]]]:
        """(probe cell, the arms that serve it): the synchronous one by the reference, the saturated
        one by every probed arm."""
        return [(Cell(SYNC, 1, max_concurrency=1, probe=True), [self.ref]),
                (Cell(SATURATED, self.spec.max_concurrency or self.limit, probe=True,
                      max_concurrency=self.spec.max_concurrency), probed_arms(self.arms, self.ref))]

    def requests_at(self, rate: float) -> int:
        """Requests of one cell at `rate` (RateSpec.requests_at with this sweep's cell length)."""
        return self.spec.requests_at(rate, self.cell_s)

    def block_arms(self, rep: int, cell: Cell) -> list[str]:
        return self._blocks.get((rep, cell.name), [])

    def __iter__(self) -> Iterator[tuple[int, Cell, str]]:
        rates, step = (list(self.spec.rates), 0.0) if self.spec.rates else (None, 0.0)
        if rates is None:
            for cell, probe_arms in self.probe_cells():
                self._blocks[(0, cell.name)] = probe_arms
                for arm in probe_arms:
                    yield 0, cell, arm
            sync = self.probes.get(SYNC, {})
            sat = [p["rate"] for name, p in self.probes.items() if name.startswith(SATURATED) and p["rate"]]
            if not sync.get("rate") or not sat:
                self.stopped = "the probes finished no request: no rate to sweep"
                return
            self.cell_s, self.cell_why = self.spec.cell_seconds(sync.get("latency_s"))
            rates, step = sweep_rates(sync["rate"], SWEEP_TOP * max(sat), self.spec.sweep_rates)
        active, extra, i = list(self.arms), 0, 0
        while i < len(rates):
            cell = rate_cell(rates[i], self.spec.max_concurrency)
            self.rates.append(rates[i])
            for rep in range(self.repeats):
                order = active if (rep + i) % 2 == 0 else active[::-1]
                self._blocks[(rep, cell.name)] = list(order)
                for arm in order:
                    yield rep, cell, arm
            active = [a for a in active if not self._saturates(a, cell)]
            if not active:
                self.stopped = f"every arm saturated by {cell.name}: no higher rate"
                return
            if i == len(rates) - 1 and step and extra < self.spec.sweep_rates:
                rates.append(round_rate(rates[-1] * step))
                extra += 1
            i += 1
        self.stopped = (f"the last rate ({self.rates[-1]:g}/s) left {', '.join(active)} unsaturated"
                        + (f" ({extra} rates past the saturated probe)" if step else ""))

    def _saturates(self, arm: str, cell: Cell) -> bool:
        """Whether `arm` saturated at `cell` in more than half of its repetitions (then noted)."""
        reasons = [self.figures[k].get("saturated") for rep in range(self.repeats)
                   if (k := (arm, cell.name, rep)) in self.figures]
        hits = [r for r in reasons if r]
        if reasons and 2 * len(hits) > len(reasons):
            self.saturated[arm] = {"rate": cell.rate, "reason": hits[0],
                                   "reps": f"{len(hits)}/{len(reasons)}"}
            return True
        return False

    def record(self, arm: str, cell: Cell, rep: int, records: list[dict[str, Any]]) -> str | None:
        """Keep a finished cell's figures; the live view's line for it."""
        if cell.probe:
            rate = completed_rate(records)
            name = cell.name if arm == self.ref else f"{cell.name} {arm}"
            self.probes[name] = {"rate": rate, "requests": len(records), "arm": arm}
            if cell.name == SYNC:
                self.probes[name]["latency_s"] = request_latency(records)
            return f"probe {cell.name}: {rate or 0:.3g} req/s"
        s = self.spec
        fig = rate_figures(records, s.exclude_head, s.exclude_tail)
        fig["saturated"] = saturation(fig, s.saturation_margin)
        self.figures[(arm, cell.name, rep)] = fig
        achieved = "-" if fig["achieved_rate"] is None else f"{fig['achieved_rate']:.3g}"
        line = f"achieved {achieved} of {cell.rate:g} req/s"
        if s.slo:
            measured = measured_records(records, s.exclude_head, s.exclude_tail)
            line += f", SLO share {cell_slo(measured, s.slo).get('slo_share', 0):.0%}"
        return line + (f"  [yellow]saturated: {fig['saturated']}[/]" if fig["saturated"] else "")

    def summary(self) -> dict[str, Any]:
        return {"probes": self.probes, "rates": self.rates, "saturated": self.saturated,
                "stopped": self.stopped, "cell_s": self.cell_s, "cell_why": self.cell_why,
                "top_factor": SWEEP_TOP}


def _rng(seed: int, stream: int, *key: int) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, stream, *key])


def make_rate_plan(config: Any, spec: RateSpec, lengths: LengthSource, *, arms: list[str], ref: str,
                   repeats: int, seed: int, warmup_requests: int, timeouts: Timeouts, exact_arms: set[str],
                   limit: int, eager_arms: set[str]) -> Plan:
    """The plan of a rate run: prompts per (cell, repetition), the same for every arm; the sweep as
    its order; each cell replayed once. `limit`: the engine's (or the client's) concurrency limit."""
    cache: dict[tuple[str, int], list[Request]] = {}

    def prompts(cell: Cell, rep: int) -> list[Request]:
        key = (cell.name, rep)
        if key not in cache:
            cache.clear()  # one cell-repetition at a time
            if cell.rate is None:  # a probe or the warm-up pass: everything at once
                n = SYNC_PROBE_REQUESTS if cell.name == SYNC else 2 * max(cell.C, 1)
                times = np.zeros(n)
                ints = (rep, 1 + [SYNC, SATURATED, WARMUP_CELL.name].index(cell.name))
            else:
                n = sweep.requests_at(cell.rate)
                ints = (rep, 10 + round(cell.rate * 1000))
                times = arrival_times(n, cell.rate, spec.process, _rng(seed, 0xA441, *ints))
            lens = lengths.draw(n, _rng(seed, 0x1E9, *ints))
            cache[key] = open_loop_prompts(config, times, lens, seed, ints, spec.ignore_eos)
        return cache[key]

    warm = warmup_prompts(config, warmup_requests, lengths.input_len, min(lengths.output_len, 4), seed)
    sweep = RateSweep(arms, ref, repeats, spec, limit)
    # varied lengths: every prefill shape is new, so the first arm and every arm with eager kernels of
    # its own serve one untimed burst of twice the limit first (as sessions pass over their trace)
    pass_arms = set() if lengths.fixed else {arms[0], *eager_arms}
    return Plan(RATE, arms, ref, repeats, [Cell(WARMUP_CELL.name, limit)], prompts, warm, timeouts,
                exact_arms, warmup_pass_arms=pass_arms, order=sweep, replay_every_rep=False)
