"""Every numeric option of every command, walked from the CLI tree: nan, inf, -inf, -1, 0, 1e308 and ''
each end in exit 0 or 2 (never a traceback), a value the option cannot mean is refused in one line
that names the option before any work, and no refused value ever starts a run.

Before rltbench.options, `e2e --trace-time-scale nan` ran until killed, `pd --transfer-budget-gib nan`
and `capacity --memory-gib inf` were tracebacks, and `--kv-cache-gib inf` failed inside the engine.
Work is stopped where it would start (a run directory, a model), so an accepted value costs a
configuration check, not a run.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

import pytest

from rltbench import cli, options

VALUES = ("nan", "inf", "-inf", "-1", "0", "1e308", "")
# small, valid settings beside the option under test, so that an accepted value is checked cheaply
BASE_ARGS = {
    "kernels": ["--ops", "rmsnorm", "--widths", "8", "--dtypes", "fp32", "--arms", "torch"],
    "pd": ["--model", "ouro-tiny"],
    "tune": ["kernels"],
}


class WorkStarted(Exception):
    """Raised where a command's work begins: the values given were accepted."""


def _started(*args: Any, **kwargs: Any) -> None:
    raise WorkStarted


@pytest.fixture
def work_stops_where_it_starts(monkeypatch: pytest.MonkeyPatch):
    """A run directory or a model about to be made raises WorkStarted; what a command sets for its
    process (environment, the GIL switch interval) is put back afterwards."""
    from rltbench import runtime
    from rltbench.results.rundir import RunDir

    monkeypatch.setattr(RunDir, "create", classmethod(_started))
    monkeypatch.setattr(runtime, "load", _started)
    env, switch = dict(os.environ), sys.getswitchinterval()
    yield
    os.environ.clear()
    os.environ.update(env)
    sys.setswitchinterval(switch)


def number_type(param: Any) -> type | None:
    """int or float for a numeric option (typer's own record of the annotation, or click's type)."""
    desc = getattr(param, "type_descriptor", None)
    if desc is not None:
        return desc.annotation if desc.annotation in (int, float) else None
    return {"integer": int, "float": float}.get(getattr(getattr(param, "type", None), "name", ""))


def declared_bounds(param: Any) -> options.Bounds | None:
    """The bounds `options.number` gave the option (its click callback, as typer wraps it)."""
    check = getattr(getattr(param, "callback", None), "__wrapped__", None)
    owner = getattr(check, "__self__", None)
    return owner if isinstance(owner, options.Bounds) else None


def must_refuse(kind: type, bounds: options.Bounds, text: str) -> bool:
    """nan and the infinities mean nothing to any option; text that is not a number of the option's
    type is refused by parsing; the rest by the declared bounds."""
    try:
        value = kind(text)
    except ValueError:
        return True
    return not (isinstance(value, int) or math.isfinite(value)) or not bounds.admits(value)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int | None, str]:
    """(exit code, stderr); exit code None when the command got as far as starting its work."""
    try:
        rc = cli.main(argv)
    except WorkStarted:
        rc = None
    return rc, capsys.readouterr().err.strip()


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_numeric_option_refuses_what_it_cannot_mean(command: str, work_stops_where_it_starts,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    params = [p for p in cli._command(command).params if number_type(p) is not None]
    assert params, f"{command} has no numeric option"
    problems: list[str] = []
    for param in params:
        flag, kind, bounds = max(param.opts, key=len), number_type(param), declared_bounds(param)
        if bounds is None:
            problems.append(f"{command} {flag}: not declared through rltbench.options.number")
            continue
        for text in VALUES:
            argv = [command, *BASE_ARGS.get(command, []), f"{flag}={text}"]
            try:
                rc, err = _run(argv, capsys)
            except Exception as exc:  # noqa: BLE001 - every escape is a finding, named with its argv
                problems.append(f"{' '.join(argv)}: {type(exc).__name__}: {exc}")
                continue
            if rc not in (None, 0, 2):
                problems.append(f"{' '.join(argv)}: exit {rc}: {err}")
            elif rc == 2 and (len(err.splitlines()) != 1 or "Traceback" in err):
                problems.append(f"{' '.join(argv)}: not one line: {err}")
            elif must_refuse(kind, bounds, text):
                if rc != 2 or flag not in err:
                    outcome = "started" if rc is None else f"exit {rc}"
                    problems.append(f"{' '.join(argv)}: not refused by {flag} ({outcome})")
            elif f"{flag} must be" in err:
                problems.append(f"{' '.join(argv)}: refused a value its bounds admit: {err}")
    assert not problems, "\n".join(problems)


def test_a_refusal_names_the_option_and_its_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["e2e", "--trace-time-scale", "nan"]) == 2
    said = capsys.readouterr().err.strip()
    assert said == "error: --trace-time-scale must be a finite number in [0, 1000], got nan"
    assert cli.main(["serve", "--port", "70000"]) == 2
    assert capsys.readouterr().err.strip() == "error: --port must be an integer in [0, 65535], got 70000"


@pytest.mark.parametrize("bounds, integer, says", [
    (options.Bounds(ge=1), True, "an integer >= 1"),
    (options.Bounds(gt=0), False, "a finite number > 0"),
    (options.Bounds(gt=0, lt=1), False, "a finite number in (0, 1)"),
    (options.Bounds(ge=0, le=100.5), False, "a finite number in [0, 100.5]"),
    (options.Bounds(), False, "a finite number"),
])
def test_bounds_describe_themselves(bounds: options.Bounds, integer: bool, says: str) -> None:
    assert bounds.describe(integer) == says


# every comma-list option, an empty item in it: one line naming the option, no run
@pytest.mark.parametrize("argv, flag", [
    (["prefill", "--models", "ouro-tiny,,"], "--models"),
    (["prefill", "--models", "ouro-tiny", "--input-lens", "64,,max"], "--input-lens"),
    (["capacity", "--models", "ouro-tiny,"], "--models"),
    (["capacity", "--models", "ouro-tiny", "--kv-layouts", "full,,compress"], "--kv-layouts"),
    (["e2e", "--model", "ouro-tiny", "--arms", "torch,,exact"], "--arms"),
    (["e2e", "--model", "ouro-tiny", "--concurrency", "1,,8"], "--concurrency"),
    (["e2e", "--model", "ouro-tiny", "--prefix-cache", "off,,on"], "--prefix-cache"),
    (["e2e", "--model", "ouro-tiny", "--exit-threshold", "0.5", "--exit-mode", "all,"], "--exit-mode"),
    (["pd", "--model", "ouro-tiny", "--concurrency", "1,,8"], "--concurrency"),
    (["pd", "--model", "ouro-tiny", "--devices", "cpu,,cpu"], "--devices"),
    (["kernels", "--tokens", "1,,8"], "--tokens"),
    (["kernels", "--widths", "8,"], "--widths"),
    (["kernels", "--dtypes", "fp32,,bf16"], "--dtypes"),
    (["serve", "--model", "ouro-tiny", "--warmup-prefill-len", "8,,16"], "--warmup-prefill-len"),
    (["tune", "kernels", "--tokens", "1,,8"], "--tokens"),
    (["tune", "attention", "--variants", ","], "--variants"),
    (["gsm8k", "--model", "ouro-tiny", "--arms", "torch,exact,"], "--arms"),
])
def test_an_empty_item_is_refused_in_every_comma_list(argv: list[str], flag: str, work_stops_where_it_starts,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = _run(argv, capsys)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"error: {flag}" in err and ("empty item" in err or "is empty" in err), err


@pytest.mark.parametrize("extra, says", [
    (["--request-rate", "1e308"], "--request-rate '1e308': '1e308' is not a rate in (0, 10000]"),
    (["--request-rate", "nan"], "--request-rate 'nan': 'nan' is not a rate"),
    (["--request-rate", "100", "--duration", "86400"], "more than 1,000,000 requests in one cell"),
])
def test_a_rate_cell_beyond_any_server_is_refused(extra: list[str], says: str, work_stops_where_it_starts,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`--request-rate 1e308` was an OverflowError after the model was built."""
    rc, err = _run(["e2e", "--model", "ouro-tiny", "--workload", "rate", *extra], capsys)
    assert rc == 2 and says in err and len(err.splitlines()) == 1, err
