#!/usr/bin/env python3
"""Shrink a Triton cache directory to what a later process on the same GPU kind needs to skip the
compile: each kernel's metadata (.json) and binary (.cubin). The IR dumps (.ttir, .ttgir, .llir,
.ptx, .source) are most of the bytes and are only read for inspection; each group file is rewritten
to list the kept files, so Triton still finds a complete group (a group missing a listed file is a
cache miss, never an error).

    python scripts/slim_triton_cache.py .tcache
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

KEEP = {".json", ".cubin"}


def slim(root: Path) -> tuple[int, int]:
    """Returns (bytes before, bytes after)."""
    before = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    for grp in root.rglob("__grp__*.json"):
        try:
            data = json.loads(grp.read_text())
            children = data["child_paths"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        kept = {name: path for name, path in children.items() if Path(name).suffix in KEEP}
        if not any(name.endswith(".cubin") for name in kept):
            continue   # not an NVIDIA kernel group: leave it whole
        for name, path in children.items():
            if name not in kept:
                Path(path).unlink(missing_ok=True)
                (grp.parent / name).unlink(missing_ok=True)
        grp.write_text(json.dumps({**data, "child_paths": kept}))
    after = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    return before, after


if __name__ == "__main__":
    b, a = slim(Path(sys.argv[1] if len(sys.argv) > 1 else ".tcache"))
    print(f"triton cache: {b / 1e6:.1f} MB -> {a / 1e6:.1f} MB")
