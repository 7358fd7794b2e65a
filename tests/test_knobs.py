"""The RLTBENCH_* table (rltbench/knobs.py): at most 8 user-facing variables, each declared once with
a type, default and doc, recorded by snapshot(); no package module names a variable the table does
not declare; the documentation table lists them all."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from rltbench import knobs
from rltbench.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rltbench"
# the arm selection's variables: the arm contract (rltbench/arms.py) removes them with this module
BEING_REMOVED = {PACKAGE / "kernels" / "selection.py"}


def test_table_is_small_and_complete() -> None:
    assert 1 <= len(knobs.KNOBS) <= 8
    names = [k.name for k in knobs.KNOBS]
    assert len(set(names)) == len(names)
    for k in knobs.KNOBS:
        assert k.name.startswith("RLTBENCH_") and k.doc and k.default and k.type in (str, Path)
    table = knobs.markdown_table()
    assert all(f"`{n}`" in table for n in names)


def test_get_snapshot_and_unknown_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLTBENCH_TUNED", " /x/y.json ")
    monkeypatch.setenv("RLTBENCH_GIT_SHA", "")
    assert knobs.get("RLTBENCH_TUNED") == Path("/x/y.json")
    assert knobs.get("RLTBENCH_GIT_SHA") is None                 # empty: unset, the default applies
    snap = knobs.snapshot()
    assert set(snap) == {k.name for k in knobs.KNOBS} and snap["RLTBENCH_TUNED"] == "/x/y.json"
    with pytest.raises(KeyError, match="not an rltbench knob"):
        knobs.get("RLTBENCH_NORM_FAST")


def test_variables_nothing_reads_are_usage_errors_naming_the_replacement(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("RLTBENCH_") and n not in knobs.TEST_HARNESS]:
        monkeypatch.delenv(name)
    knobs.check_environment()
    monkeypatch.setenv("RLTBENCH_TUNED", "x.json")
    knobs.check_environment()
    monkeypatch.setenv("RLTBENCH_NORM_FAST", "1")
    with pytest.raises(UsageError, match="RLTBENCH_NORM_FAST .*RLTBENCH_TUNED=path"):
        knobs.check_environment()
    monkeypatch.delenv("RLTBENCH_NORM_FAST")
    monkeypatch.setenv("RLTBENCH_SCOPE", "all")
    with pytest.raises(UsageError, match="--scope"):
        knobs.check_environment()
    monkeypatch.delenv("RLTBENCH_SCOPE")
    monkeypatch.setenv("RLTBENCH_TYPO", "1")
    with pytest.raises(UsageError, match="known: RLTBENCH_TUNED"):
        knobs.check_environment()


def test_the_package_names_only_declared_variables() -> None:
    declared = {k.name for k in knobs.KNOBS}
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path in BEING_REMOVED or path.name == "knobs.py":   # knobs.py also lists removed names
            continue
        for name in re.findall(r"RLTBENCH_[A-Z][A-Z_]*[A-Z]", path.read_text()):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    undeclared = {n: sorted(p) for n, p in found.items() if n not in declared}
    assert not undeclared, undeclared


def test_documentation_lists_every_variable() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    assert knobs.markdown_table() in text
