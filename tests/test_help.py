"""Every command's --help: built without torch (it took 3.5-5 s when each command module imported torch,
the engine and pandas), wrapped at spaces only at 80 columns (click cut `exact/ro pe:off` and
`--max-num- seqs`), and a usage line that names arguments as click does (tune showed `{target}`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rltbench import cli

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "triton", "pandas", "matplotlib")


def test_no_command_help_imports_torch() -> None:
    """Each command module imported and its help built in one fresh process: after each, none of the
    heavy modules is loaded. A structural check, not a timing: torch alone takes seconds to import."""
    code = (
        "import contextlib, importlib, io, sys\n"
        "from rltbench import cli\n"
        f"heavy = {HEAVY!r}\n"
        "for name, (module, _) in cli.COMMANDS.items():\n"
        "    importlib.import_module(module)\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        rc = cli.main([name, '--help'])\n"
        "    print(name, rc, *[m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    lines = out.stdout.strip().splitlines()
    assert lines == [f"{name} 0" for name in cli.COMMANDS], out.stdout + out.stderr


def _help(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main([*argv, "--help"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_help_wraps_at_spaces_only(command: str, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Every word of the command's description and of each option's help appears whole."""
    out = _help([command], monkeypatch, capsys)
    printed = set(out.split())
    click_command = cli._command(command)
    texts = [click_command.help or ""] + [p.help or "" for p in click_command.params
                                          if not getattr(p, "hidden", False)]
    cut = sorted({word for text in texts for word in text.split() if word not in printed})
    assert not cut, f"{command}: words split or missing at 80 columns: {cut}"
    assert max(len(line) for line in out.splitlines()) <= 80


def test_the_command_list_wraps_at_spaces_only(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    printed = set(_help([], monkeypatch, capsys).split())
    for name, where in cli.COMMANDS.items():
        assert set(cli.command_summary(*where).split()) <= printed, name


@pytest.mark.parametrize("command, usage", [
    ("tune", "tune [OPTIONS] TARGET"),
    ("report", "report [OPTIONS] RUN_DIR"),
    ("e2e", "e2e [OPTIONS]"),
])
def test_usage_names_arguments_as_click_does(command: str, usage: str, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    first = _help([command], monkeypatch, capsys).splitlines()[0]
    assert first.startswith("Usage: ") and first.endswith(usage), first
