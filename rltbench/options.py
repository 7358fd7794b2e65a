"""How every command reads its options: numbers within bounds declared once with the option, comma
lists without empty items, and the declarations of the options several commands share.

Why one module: a value means the same, and is refused the same way, wherever it is given. Checks
written in each command's body drifted apart: `--trace-time-scale nan` ran until killed, `pd
--transfer-budget-gib nan` and `capacity --memory-gib inf` ended in tracebacks, `--kv-cache-gib inf`
failed inside the engine naming no option. Here a numeric option declares its bounds with `number`;
click checks them (callback `Bounds.check`) while the command line is parsed, before the command's
body runs: before any run directory, model or engine exists. A refusal is one line that names the
option, exit code 2: `--trace-time-scale must be a finite number in [0, 1000], got nan`. A float
option never takes nan or an infinity: none of ours gives either a meaning (a duration or a budget
without a limit is not what inf would say; `--deadline 0` is "none").

This module imports no torch (nor the engine, nor pandas): `rltbench <command> --help` builds the
command from these declarations and answers at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from rltbench.bench.workload_defaults import BURST_INPUT_LEN, BURST_OUTPUT_LEN
from rltbench.errors import UsageError

AUTO = "auto"  # --device / --dtype: chosen from the machine (rltbench.runtime)
SEED_MAX = 2**32 - 1  # numpy's legacy seeds end here; a seed is an identity, not a quantity
MAX_GIB = 1_000_000  # a memory budget beyond a petabyte is a typo (and GiB x 2**30 must stay finite)
MAX_TRACE_SCALE = 1000.0  # a trace replayed 1000x slower or longer is already no workload


class OptionValueError(typer.BadParameter):
    """A value outside its option's bounds: a usage error (exit 2) whose message names the option
    itself, so it is printed as it is (click would prefix "Invalid value for ...")."""

    def format_message(self) -> str:
        return self.message

    def show(self, file: Any = None) -> None:
        """One line, also where click itself reports the error (a typer app run on its own)."""
        typer.echo(f"error: {self.format_message()}", file=file, err=file is None)


def _shown(value: float) -> str:
    """1000 for 1000.0, 1e+308, nan, inf: a bound or a value as the user would write it."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Bounds:
    """The values a numeric option admits: at least `ge` (or above `gt`), at most `le` (or below
    `lt`), and always finite. `check` is the option's click callback."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def admits(self, value: float) -> bool:
        return (math.isfinite(value)
                and (self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))

    def describe(self, integer: bool) -> str:
        """'an integer >= 1', 'a finite number in (0, 1)', ... (what the refusal says it must be)."""
        what = "an integer" if integer else "a finite number"
        low = self.ge if self.ge is not None else self.gt
        high = self.le if self.le is not None else self.lt
        if low is not None and high is not None:
            return (f"{what} in {'[' if self.ge is not None else '('}{_shown(low)}, {_shown(high)}"
                    f"{']' if self.le is not None else ')'}")
        if low is not None:
            return f"{what} {'>=' if self.ge is not None else '>'} {_shown(low)}"
        if high is not None:
            return f"{what} {'<=' if self.le is not None else '<'} {_shown(high)}"
        return what

    def check(self, ctx: Any, param: Any, value: Any) -> Any:
        """The click callback: the value unchanged (None: not given), else OptionValueError."""
        if value is None or self.admits(value):
            return value
        name = max(param.opts, key=len)
        raise OptionValueError(f"{name} must be {self.describe(isinstance(value, int))}, got {_shown(value)}")


def number(help: str, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
           lt: float | None = None, **option: Any) -> Any:
    """`typer.Option(help=...)` for an int or float option whose values lie within the bounds (and
    are finite); every numeric option of every command is declared through this."""
    return typer.Option(help=help, callback=Bounds(ge=ge, gt=gt, le=le, lt=lt).check, **option)


def comma_list(text: str, flag: str, example: str) -> list[str]:
    """The items of a comma-separated flag value, stripped. An empty item (`1,,8`, a trailing comma)
    is a UsageError, not skipped: it is usually a typo for a value that was meant to be there."""
    items = [part.strip() for part in str(text).split(",")]
    if not any(items):
        raise UsageError(f"{flag} is empty (e.g. {flag} {example})")
    if not all(items):
        raise UsageError(f"{flag} {text!r}: an empty item between commas (e.g. {flag} {example})")
    return items


def int_list(text: str, flag: str, example: str, ge: int = 1) -> list[int]:
    """The integers of a comma list, in the given order, each >= `ge` (UsageError naming `flag`)."""
    out: list[int] = []
    for part in comma_list(text, flag, example):
        try:
            value = int(part)
        except ValueError:
            raise UsageError(f"{flag}: {part!r} is not an integer (e.g. {flag} {example})") from None
        if value < ge:
            raise UsageError(f"{flag}: {value} must be >= {ge}")
        out.append(value)
    return out


def parse_concurrency(text: str) -> list[int]:
    """`--concurrency 1,8,32,128` -> [1, 8, 32, 128] (positive, unique, in the given order)."""
    return list(dict.fromkeys(int_list(text, "--concurrency", "1,8,32,128")))


# ---- the options several commands share ------------------------------------------------------------
ModelOption = Annotated[str, typer.Option(help="Model preset (ouro-1.4b, ouro-2.6b, huginn-0125, ouro-tiny, "
                                               "huginn-tiny); its weights come from --weights.")]
WeightsOption = Annotated[str, typer.Option(help="'random' (weights drawn from --seed) or an HF checkpoint "
                                                 "DIR (config.json + safetensors).")]
DeviceOption = Annotated[str | None, typer.Option(help="auto (cuda if a GPU is visible, else cpu), cpu, cuda "
                                                       "or cuda:N.")]
DtypeOption = Annotated[str | None, typer.Option(help="auto (bf16 on CUDA, fp32 on CPU), bf16, fp16 or "
                                                      "fp32.")]
SeedOption = Annotated[int, number("Seed of random weights (and of the prompts a command draws).",
                                   ge=0, le=SEED_MAX)]
ResultDirOption = Annotated[Path | None, typer.Option(help="Run directory, new or without an earlier run "
                                                         "(default results/<command>-<UTC time>).")]
BackendOption = Annotated[str, typer.Option(help="engine (every arm in this process) or openai (one server "
                                                 "per arm, each given by --arm NAME=URL).")]
ServersOption = Annotated[list[str] | None, typer.Option("--arm", help="NAME=URL of an OpenAI-compatible "
                                                                       "server, one per arm (repeatable).")]
# a burst's lengths (e2e and pd): None = the default, shortened to fit the model's context (fit_burst_lengths)
BurstInputLenOption = Annotated[int | None, number(
    f"Burst prompt length in token ids (default {BURST_INPUT_LEN}, less where the model's context is "
    "shorter).", ge=1)]
BurstOutputLenOption = Annotated[int | None, number(
    f"Burst generated tokens per request, EOS ignored (default {BURST_OUTPUT_LEN}, less where the "
    "model's context is shorter).", ge=1)]
TtftTimeoutOption = Annotated[float, number("Per-request first-token timeout (s).", gt=0)]
StallTimeoutOption = Annotated[float, number("Per-request timeout between tokens (s).", gt=0)]
# the engine's flags (e2e, serve, pd, capacity, prefill); names follow vLLM where the meaning is the same
KvCacheGibOption = Annotated[float | None, number("KV pool size in GiB (default: the free GPU memory minus "
                                                  "headroom).", gt=0, le=MAX_GIB)]
MaxNumBatchedTokensOption = Annotated[int, number("Prefill token budget per step.", ge=1)]
BlockSizeOption = Annotated[int, number("KV block size (tokens).", ge=1)]
EnforceEagerOption = Annotated[bool, typer.Option(help="No CUDA graphs (scope-graph arms then equal torch).")]
PrefillGraphsOption = Annotated[bool, typer.Option(help="Capture prefill steps whose exact shape repeats in "
                                                        "CUDA graphs.")]
