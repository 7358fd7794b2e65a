"""The `rltbench` command line: one typer app, one sub-command per measurement.

Each command lives in its own package under `rltbench.commands` as a plain function with typer
annotations; this module names them (name -> module and function), loads a command's module only
when that command runs or shows its help, and a command module imports torch (the engine, pandas)
only inside its function, so `rltbench --help` and `rltbench <command> --help` answer at once. It turns
user errors into one clear line with exit code 2 and Ctrl-C (or SIGTERM) into one line with exit code
130, never a traceback. Help wraps on spaces only (`HelpFormatter`).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.util
import os
import signal
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

try:  # a Ctrl-C while the CLI itself loads is an interrupt like any other: exit 130, no traceback
    import typer
    from rich.console import Console
    from typer.core import TyperCommand, TyperGroup
except KeyboardInterrupt:
    sys.exit(130)

from rltbench import knobs, tuned
from rltbench.errors import UsageError
from rltbench.options import OptionValueError

err_console = Console(stderr=True)


# command name -> (module, function). Every command is a package rltbench.commands.<name> whose cli.py
# holds <name>_command and, for a command that stores runs, whose report.py holds the `render` that
# `rltbench report` uses (serve and tune store none). A module is imported only when its command
# runs or shows help.
COMMANDS = {name: (f"rltbench.commands.{name}.cli", f"{name}_command")
            for name in ("kernels", "e2e", "profile", "gsm8k", "serve", "tune", "pd", "capacity", "prefill")}
RENDERERS = {name: (f"rltbench.commands.{name}.report", "render") for name in COMMANDS
             if name not in ("serve", "tune")}


def _use_triton_interpreter_without_gpu() -> None:
    """Triton picks interpreter or GPU when a kernel is defined (at import), so decide before a
    command's body imports any kernel. torch (seconds to import) loads here, when a command or a
    report runs, not for `--help`."""
    if "TRITON_INTERPRET" in os.environ:
        return
    import torch  # heavy: only once a command or a report is about to run

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def _quiet_profiler_log() -> None:
    """torch's profiler (kineto) prints `USDT: ... profiler_start` / `profiler_stop` on stderr around
    every profiled region (profile, the kernel counts of kernels): noise between a command's own
    lines. Level 6 is above all of kineto's console levels; set KINETO_LOG_LEVEL yourself to see
    them (e.g. 4 for its errors)."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def _load(module: str, attr: str) -> Any:
    """A command's function (or a renderer) from its module; a command module imports no torch."""
    _quiet_profiler_log()
    return getattr(importlib.import_module(module), attr)


def _end_unfinished_runs(exc: BaseException) -> None:
    """A command ended by an exception: every run directory it left `running` says how it ended, and
    one that stored nothing but its manifest after a UsageError is removed (rltbench.results)."""
    rundir = sys.modules.get("rltbench.results.rundir")
    if rundir is not None:  # no command got as far as importing the results layer: no run exists
        rundir.end_unfinished_runs(exc)


def _forget_earlier_runs() -> None:
    """A command starts: the runs an earlier command of this process created are not its own."""
    rundir = sys.modules.get("rltbench.results.rundir")
    if rundir is not None:
        rundir.forget_created_runs()


def _say_interrupted(exc: BaseException) -> None:
    """After Ctrl-C: end the runs left `running` (one that stored nothing is removed), and one line
    saying where the finished results are: the only line an interrupt prints (commands say what
    finished through `RunDir.finished`, not a line of their own)."""
    _end_unfinished_runs(exc)
    rundir = sys.modules.get("rltbench.results.rundir")
    kept = rundir.kept_runs_described() if rundir is not None else []
    line = ("interrupted before any result was written" if not kept
            else f"interrupted: finished results were kept in {', '.join(kept)}")
    err_console.print(f"[yellow]{line}[/]", highlight=False, soft_wrap=True)


def _user_errors_exit_2(func, takes_arms: bool = False):
    """Wrap a command so a UsageError prints one red line and exits 2, also under CliRunner, and
    Ctrl-C is one line and exit 130. A command that runs kernels first refuses RLTBENCH_* variables
    nothing reads (an older release's arm or launch knobs would silently do nothing) and a bad
    RLTBENCH_TUNED file, before any work."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        _forget_earlier_runs()
        try:
            _use_triton_interpreter_without_gpu()
            if takes_arms:
                knobs.check_environment()
                tuned.check()
            return func(*args, **kwargs)
        except UsageError as exc:
            _end_unfinished_runs(exc)
            err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=exc.exit_code) from None
        except KeyboardInterrupt as exc:  # typer would exit 130 silently
            _say_interrupted(exc)
            raise typer.Exit(code=130) from None
        except typer.Exit:
            raise
        except Exception as exc:
            _end_unfinished_runs(exc)
            raise

    return wrapper


def command_summary(module: str, function: str) -> str:
    """The first paragraph of a command function's docstring (what its own --help starts with), read
    from the module's source with `ast` so that `rltbench --help` imports no command module."""
    spec = importlib.util.find_spec(module)  # imports the parent packages only (no torch there)
    origin = spec.origin if spec is not None else None
    if origin is None:
        return ""
    tree = ast.parse(Path(origin).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            doc = ast.get_docstring(node) or ""
            return " ".join(doc.split("\n\n")[0].split())
    return ""


# ---- help text ---------------------------------------------------------------------------------------
_BaseContext = TyperGroup.context_class  # click's, or typer's vendored copy of it (typer >= 0.20)
_CLICK_TEXTWRAP = importlib.import_module(_BaseContext.formatter_class.__module__.rpartition(".")[0]
                                          + "._textwrap")


class _SpacesOnlyWrapper(_CLICK_TEXTWRAP.TextWrapper):
    """Click's text wrapper, except that a line breaks only at a space: a word longer than the
    column stays whole (on a line of its own), and a hyphen is no break point."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.break_long_words = False
        self.break_on_hyphens = False

    _handle_long_word = textwrap.TextWrapper._handle_long_word  # click's cuts the word at the margin


@contextlib.contextmanager
def _wrapping_on_spaces() -> Iterator[None]:
    """Click's wrap_text builds its wrapper from this module attribute at each call."""
    original = _CLICK_TEXTWRAP.TextWrapper
    _CLICK_TEXTWRAP.TextWrapper = _SpacesOnlyWrapper
    try:
        yield
    finally:
        _CLICK_TEXTWRAP.TextWrapper = original


class HelpFormatter(_BaseContext.formatter_class):
    """Every command's help: click's layout, wrapped on spaces only. Click cut tokens at the margin
    (`exact/ro pe:off`) and broke option names at their hyphens (`--max-num- seqs`)."""

    def write_usage(self, *args: Any, **kwargs: Any) -> None:
        with _wrapping_on_spaces():
            super().write_usage(*args, **kwargs)

    def write_text(self, *args: Any, **kwargs: Any) -> None:
        with _wrapping_on_spaces():
            super().write_text(*args, **kwargs)

    def write_dl(self, *args: Any, **kwargs: Any) -> None:
        with _wrapping_on_spaces():
            super().write_dl(*args, **kwargs)


class HelpContext(_BaseContext):
    formatter_class = HelpFormatter


class Command(TyperCommand):
    """A command's click command: help through HelpFormatter, and a usage line that names each
    argument as click does (TARGET, [NAME] when optional), not typer's `{target}`."""

    context_class = HelpContext

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name != "argument":
                continue
            name = param.metavar or param.name.upper()
            name += "..." if param.nargs != 1 else ""
            pieces.append(name if param.required else f"[{name}]")
        return pieces


def _command(name: str) -> Any:
    """The click command of `name`, built from its module on first use (same options, same help)."""
    sub = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False)
    sub.command(name, cls=Command)(_user_errors_exit_2(_load(*COMMANDS[name]), takes_arms=True))
    return typer.main.get_command(sub)


class LazyCommands(TyperGroup):
    """The app's command group. Importing every command (torch, the engine, pandas, aiohttp) took
    seconds before `rltbench --help` could print a line; here a command's module is imported only
    when that command runs or shows its own help, and the list comes from COMMANDS."""

    context_class = HelpContext

    def list_commands(self, ctx: Any) -> list[str]:
        return [*COMMANDS, *super().list_commands(ctx)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            try:
                self.add_command(_command(cmd_name), cmd_name)
            except KeyboardInterrupt as exc:  # while torch imports; typer then exits 130 silently
                _say_interrupted(exc)
                raise
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(n, command_summary(*where)) for n, where in COMMANDS.items()]
        rows += [(n, c.get_short_help_str(limit=200)) for n, c in self.commands.items() if n not in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


# Plain (click) help, not rich panels: rich squeezes option names into a fixed column and cut them
# at 80 columns (--trace-length-sca...); click puts a long option on its own line instead.
app = typer.Typer(
    name="rltbench",
    cls=LazyCommands,
    help="Benchmark and profile looped language models (Ouro, Huginn) across kernel arms: "
    "torch (reference), exact (fused, bitwise equal) and approx (fused, faster, may differ).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _group() -> None:
    """The app is a group even though only `report` is registered up front (the rest load lazily)."""


@app.command("report", cls=Command)
@_user_errors_exit_2
def report_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by any rltbench command.")],
) -> None:
    """Re-render table.md and the plots of a stored run from its raw result files."""
    from rltbench.results import RunDir  # pandas: loaded when a report runs, not at `rltbench --help`

    run = RunDir.open(run_dir)
    if run.command in COMMANDS and run.command not in RENDERERS:
        raise UsageError(f"{run_dir}: a {run.command} run has nothing to re-render (its files are final)")
    if run.command not in RENDERERS:
        raise UsageError(f"{run_dir}: unknown command {run.command!r} in manifest.json")
    if run.stored_nothing() and [p.name for p in run.path.iterdir()] == ["manifest.json"]:
        # it ended (or was killed) before its first result
        err_console.print(f"nothing finished: {run.path} ({run.manifest.get('status')}) holds no result, "
                          "only its manifest", highlight=False, soft_wrap=True)
        return
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


def _terminate_as_interrupt(signum: int, frame: Any) -> None:
    """SIGTERM (a job scheduler, `timeout`, `kill`) ends a run the way Ctrl-C does: what finished is
    kept and the manifest says `interrupted`, instead of a run left `running` without its table."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: run the app, map UsageError to one line + exit 2, Ctrl-C (or
    SIGTERM) to one line + exit 130."""
    own_sigterm = (os.name == "posix" and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
                   and threading.current_thread() is threading.main_thread())
    if own_sigterm:
        signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    try:
        return _run_app(argv)
    finally:
        if own_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run_app(argv: list[str] | None) -> int:
    _forget_earlier_runs()
    try:
        rv = app(args=argv, standalone_mode=False)
    except UsageError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # before or after typer's own handler (which exits 130 silently)
        _say_interrupted(exc)
        return 130
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except Exception as exc:  # click usage errors and typer exits
        kind = _click_kind(exc)
        if kind == "usage" and type(exc).__name__ == "NoArgsIsHelpError":  # bare `rltbench`: the help
            print(exc.format_message())
            return 0
        if kind == "usage":
            ctx = getattr(exc, "ctx", None)
            # a value outside its option's bounds names the option and the bounds: no hint needed
            hint = (f" (see {ctx.command_path} --help)"
                    if ctx is not None and not isinstance(exc, OptionValueError) else "")
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
