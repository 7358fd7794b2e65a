"""The files git tracks under a folder of this repository: what a test of committed files reads.

Why: a test that walks results/ (or any folder a user writes into) also sees the user's own runs
(`./scripts/run.sh` writes results/kernels-<UTC time>/, which git ignores and CI never has), so the
suite failed on a machine where the README's commands had run before it. Without git history (a
copy of the tree) what is committed cannot be told, and the calling test is skipped.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def tracked_files(folder: str, root: Path = ROOT) -> list[Path]:
    """The files under `folder` (relative to `root`) that git tracks and the working tree holds,
    sorted; skips the calling test where `root` has no git history."""
    try:
        done = subprocess.run(["git", "ls-files", "-z", "--", folder], cwd=root, capture_output=True)
    except OSError:
        done = None
    if done is None or done.returncode != 0:
        pytest.skip("no git history here (a copy of the tree): which files are committed is unknown")
    names = [n for n in done.stdout.decode("utf-8", "surrogateescape").split("\0") if n]
    return sorted(p for p in (root / n for n in names) if p.is_file())


def tracked_dirs(folder: str, root: Path = ROOT) -> list[Path]:
    """The directories directly under `folder` that hold tracked files, sorted."""
    base = root / folder
    return sorted({base / p.relative_to(base).parts[0] for p in tracked_files(folder, root)
                   if len(p.relative_to(base).parts) > 1})
