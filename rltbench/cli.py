"""The `rltbench` command line: one typer app, one sub-command per measurement.

Each command lives in its own package under `rltbench.commands` (kernels, e2e, profile, gsm8k, serve)
as a plain function with typer annotations; this module only registers them (name -> module and
function) and turns user errors into one clear line with exit code 2 (never a traceback).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from pathlib import Path
from typing import Annotated

import torch
import typer
from rich.console import Console

from rltbench import knobs, tuned
from rltbench.errors import UsageError
from rltbench.results import RunDir

app = typer.Typer(
    name="rltbench",
    help="Benchmark and profile looped language models (Ouro, Huginn) across kernel arms: "
    "torch (reference), exact (fused, bitwise equal) and approx (fused, faster, may differ).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = Console(stderr=True)



def _use_triton_interpreter_without_gpu() -> None:
    """Triton picks interpreter or GPU when a kernel is defined (at import), so decide first."""
    if "TRITON_INTERPRET" in os.environ:
        return
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


_use_triton_interpreter_without_gpu()

# command name -> (module, function) for the commands and for `report` re-rendering.
COMMANDS = {
    "kernels": ("rltbench.commands.kernels.cli", "kernels_command"),
    "e2e": ("rltbench.commands.e2e.cli", "e2e_command"),
    "profile": ("rltbench.commands.profile.cli", "profile_command"),
    "gsm8k": ("rltbench.commands.gsm8k.cli", "gsm8k_command"),
    "serve": ("rltbench.commands.serve.cli", "serve_command"),
    "tune": ("rltbench.commands.tune.cli", "tune_command"),
    "pd": ("rltbench.commands.pd.cli", "pd_command"),
    "capacity": ("rltbench.commands.capacity.cli", "capacity_command"),
    "prefill": ("rltbench.commands.prefill.cli", "prefill_command"),
}
RENDERERS = {
    "kernels": ("rltbench.commands.kernels.report", "render"),
    "e2e": ("rltbench.commands.e2e.report", "render"),
    "profile": ("rltbench.commands.profile.report", "render"),
    "gsm8k": ("rltbench.commands.gsm8k.report", "render"),
    "pd": ("rltbench.commands.pd.report", "render"),
    "capacity": ("rltbench.commands.capacity.report", "render"),
    "prefill": ("rltbench.commands.prefill.report", "render"),
}


def _load(module: str, attr: str):
    return getattr(importlib.import_module(module), attr)


def _user_errors_exit_2(func, takes_arms: bool = False):
    """Wrap a command so a UsageError prints one red line and exits 2, also under CliRunner. A command
    that runs kernels first refuses RLTBENCH_* variables nothing reads (an older release's arm or
    launch knobs would silently do nothing) and a bad RLTBENCH_TUNED file, before any work."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            if takes_arms:
                knobs.check_environment()
                tuned.check()
            return func(*args, **kwargs)
        except UsageError as exc:
            err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=exc.exit_code) from None
        except KeyboardInterrupt:  # typer would exit 130 silently
            err_console.print("[yellow]interrupted: finished results were kept on disk[/]")
            raise typer.Exit(code=130) from None

    return wrapper


for _name, (_module, _attr) in COMMANDS.items():
    app.command(_name)(_user_errors_exit_2(_load(_module, _attr), takes_arms=True))


@app.command("report")
@_user_errors_exit_2
def report_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by any rltbench command.")],
) -> None:
    """Re-render table.md and the plots of a stored run from its raw result files."""
    run = RunDir.open(run_dir)
    if run.command not in RENDERERS:
        raise UsageError(f"{run_dir}: unknown command {run.command!r} in manifest.json")
    render = _load(*RENDERERS[run.command])
    render(run.path)
    err_console.print(f"re-rendered {run.path} from its raw files", highlight=False)


def _click_kind(exc: Exception) -> str | None:
    """Classify click's exceptions, whether typer uses the click package or (typer >= 0.20) its own
    vendored copy, so a bad option value is one usage line and exit 2 with either."""
    exits = [getattr(typer, "Exit", None)]
    aborts = [getattr(typer, "Abort", None)]
    usages = []
    for mod_name in ("typer._click.exceptions", "click.exceptions"):
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        usages.append(getattr(mod, "ClickException", None))
        exits.append(getattr(mod, "Exit", None))
        aborts.append(getattr(mod, "Abort", None))
    for kind, classes in (("usage", usages), ("exit", exits), ("abort", aborts)):
        if any(c is not None and isinstance(exc, c) for c in classes):
            return kind
    return None


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run the app, map UsageError to one line + exit 2."""
    try:
        rv = app(args=argv, standalone_mode=False)
    except UsageError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted: finished results were kept on disk[/]")
        return 130
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except Exception as exc:  # click usage errors and typer exits
        kind = _click_kind(exc)
        if kind == "usage":
            ctx = getattr(exc, "ctx", None)
            hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            err_console.print(f"[bold red]error:[/] {exc.format_message()}{hint}", highlight=False,
                              soft_wrap=True)
            return exc.exit_code
        if kind == "exit":
            return exc.exit_code
        if kind == "abort":
            err_console.print("[yellow]aborted[/]")
            return 130
        raise
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
