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


def markdown_table() -> str:
    """The knob table for the documentation (docs/configuration.md is checked against it)."""
    lines = ["| variable | type | default | what it does |", "|---|---|---|---|"]
    lines += [f"| `{k.name}` | {k.type.__name__.lower()} | {k.default} | {k.doc} |" for k in KNOBS]
    return "\n".join(lines) + "\n"
