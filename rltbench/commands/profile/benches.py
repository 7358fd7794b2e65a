"""`rltbench profile --bench decode|prefill|exit`: the step benchmarks, each with its own defaults for
the profile options it shares (rows, context, samples, rounds) and the options only it reads.

Why here: they time whole engine steps as the profile does, with the same engine sizing and timing
routine (rltbench.bench.timing), and write run directories with manifests like every other run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rltbench import options
from rltbench.errors import UsageError

BENCHES = ("decode", "prefill", "exit")
# per benchmark: the defaults of the profile options it reads (left unset on the command line)
DEFAULTS: dict[str, dict[str, int]] = {
    "decode": {"iters": 20, "rounds": 6},
    "prefill": {"batch": 4, "context": 512, "iters": 3, "rounds": 8},
    "exit": {"context": 128, "iters": 10, "rounds": 10},
}


# the options only one benchmark reads: given with another (or with the profile) they would be ignored
BENCH_ONLY = {"--lengths": "prefill", "--no-aa": "prefill", "--attribute": "decode", "--skip-burst": "decode"}


def check_bench_only(bench: str | None, given: dict[str, bool]) -> None:
    """A UsageError (exit 2) for an option the run would silently ignore: one that only another
    `--bench` reads (an unknown `--bench` is reported by `run_bench`)."""
    if bench is not None and bench not in BENCHES:
        return
    for flag, is_given in given.items():
        if is_given and bench != BENCH_ONLY[flag]:
            where = f"--bench {bench}" if bench else "the profile (no --bench)"
            raise UsageError(f"{flag} is read by --bench {BENCH_ONLY[flag]} only, not by {where}")


@dataclass(frozen=True)
class StepBench:
    """The options of one `--bench` run as the command line gave them (None: the benchmark's default)."""

    name: str
    model: str
    arms: str
    batch: int | None
    context: int | None
    iters: int | None
    rounds: int | None
    attribute: bool
    skip_burst: bool
    no_aa: bool
    warmup: int
    threshold: float
    batches: str
    lengths: str | None = None

    def value(self, option: str) -> int:
        given = getattr(self, option)
        return int(given if given is not None else DEFAULTS[self.name][option])


def run_bench(b: StepBench, result_dir: Path | None) -> str:
    """Check `--bench` and run it; returns its table (UsageError, exit 2, before any work)."""
    if b.name not in BENCHES:
        raise UsageError(f"--bench: unknown value {b.name!r} (known: {', '.join(BENCHES)})")
    if b.name == "decode":
        from rltbench.commands.profile.decode_steps import run_decode_steps

        return run_decode_steps(b.model, b.value("rounds"), b.value("iters"), b.attribute, b.skip_burst,
                                result_dir)
    if b.name == "prefill":
        from rltbench.commands.profile.prefill_steps import run_prefill_steps

        lengths = (options.int_list(b.lengths, "--lengths", "512,2048,4096") if b.lengths is not None
                   else [b.value("context")])
        return run_prefill_steps(b.model, b.arms, b.no_aa, b.value("batch"), lengths,
                                 b.value("rounds"), b.value("iters"), b.warmup, result_dir)
    from rltbench.commands.profile.exit_steps import run_exit_steps

    batches = options.int_list(b.batches, "--batches", "1,8")
    return run_exit_steps(b.model, b.threshold, batches, b.value("context"), b.value("rounds"),
                          b.value("iters"), result_dir)
