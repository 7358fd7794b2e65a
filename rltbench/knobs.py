"""Every user-facing ``RLTBENCH_*`` environment variable: its name, type, default and meaning.

Why one table: a variable read deep inside the code is invisible to the user and to the results.
Each one is declared here once, read through `get` (code never reads ``os.environ`` for them),
documented from this table (`markdown_table`) and recorded in every manifest (`snapshot`).

Kernel launch parameters are not variables: they are typed configs in the per-GPU tuned file
(rltbench/tuned.py), replaced as a whole by one file named in ``RLTBENCH_TUNED``. The kernel arm
of a run is chosen by command flags (``--arms``, ``--norm``/``--rope``/``--act``, ``--scope``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rltbench.errors import UsageError


@dataclass(frozen=True)
class Knob:
    """One environment variable: ``type`` parses its text, ``default`` says what applies unset."""

    name: str
    type: type
    default: str
    doc: str


KNOBS: tuple[Knob, ...] = (
    Knob("RLTBENCH_TUNED", Path, "the GPU's own file, rltbench/tuned_configs/<GPU>.json",
         "A tuned-config JSON file (same schema as rltbench/tuned_configs/<GPU>.json) used instead of "
         "the GPU's file; `none`: no file, every kernel runs its code default. Recorded in manifests."),
    Knob("RLTBENCH_NATIVE_CACHE", Path, "$XDG_CACHE_HOME/rltbench/native (~/.cache/rltbench/native)",
         "Directory of the cuda arm's compiled extension, one sub-directory per build key."),
    Knob("RLTBENCH_GIT_SHA", str, "`git rev-parse HEAD` of the checkout",
         "The commit recorded in manifests, for a copy of the tree that has no .git."),
)
_BY_NAME = {k.name: k for k in KNOBS}
# set by the test suite's conftest for its own processes; the package never reads them
TEST_HARNESS = ("RLTBENCH_PYTEST_RUN_GPU", "RLTBENCH_EXPECT_INTERPRET")
_TUNED_HINT = "launch configs come from the tuned file: RLTBENCH_TUNED=path/to/file.json"
# variables earlier versions read, and what replaced them
REMOVED: dict[str, str] = {
    **{f"RLTBENCH_{n}": f"the arm is chosen by flags: unset it and pass --{n.lower()} instead"
       for n in ("NORM", "ROPE", "ACT", "SCOPE")},
    **{f"RLTBENCH_{n}": _TUNED_HINT for n in (
        "NORM_FAST", "NORM_FAST_WARPS", "NORM_TREE_SUM", "NORM_LOWWARP", "NORM_LOWWARP_TLSUM",
        "NORM_LOWWARP_WARPS", "NORM_LOWWARP_FLAT", "NORM_ONELAUNCH", "NORM_WIDE_MIN_ROWS", "PDL",
        "ACT_BLOCK", "FUSE_KV_WRITE", "APPROX_NORM_ROWS", "APPROX_NORM_WARPS", "APPROX_NORM_PERSIST",
        "APPROX_NORM_STAGES", "APPROX_NORM_STREAM", "APPROX_NORM_WLOAD", "APPROX_NORM_PDL",
        "APPROX_NORM_PDL_MIN_ROWS")},
}


def knob(name: str) -> Knob:
    """The declaration of `name`; KeyError names the declared ones (a typo is a bug, not unset)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not an rltbench knob (declared: {', '.join(_BY_NAME)})") from None


def raw(name: str) -> str | None:
    """The variable's text as set, or None when unset or empty (the default applies)."""
    value = os.environ.get(knob(name).name, "").strip()
    return value or None


def get(name: str) -> object | None:
    """The variable parsed with its type, or None when unset (the default applies)."""
    value = raw(name)
    return None if value is None else knob(name).type(value)


def snapshot() -> dict[str, str | None]:
    """For manifests: every knob's text as set in this process (None: unset, the default applied)."""
    return {k.name: raw(k.name) for k in KNOBS}


def check_environment() -> None:
    """UsageError (one line) when the environment sets an RLTBENCH_* variable nothing reads, naming
    what replaced it: a setting that silently does nothing would make a run mean something else
    than its manifest says. Commands call it while checking their arguments."""
    for name in sorted(os.environ):
        if name.startswith("RLTBENCH_") and name not in _BY_NAME and name not in TEST_HARNESS:
            hint = REMOVED.get(name, f"known: {', '.join(_BY_NAME)}")
            raise UsageError(f"{name} is set but rltbench does not read it ({hint})")


def markdown_table() -> str:
    """The knob table for the documentation (docs/configuration.md is checked against it)."""
    lines = ["| variable | type | default | what it does |", "|---|---|---|---|"]
    lines += [f"| `{k.name}` | {k.type.__name__.lower()} | {k.default} | {k.doc} |" for k in KNOBS]
    return "\n".join(lines) + "\n"
