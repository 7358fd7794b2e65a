"""Gzip the bulky files of stored run directories, so committed GPU results stay small: the JSONL
raw files (per-request records, timing samples) and a table's JSON records (`<stem>.json` beside
its `<stem>.csv`: the same rows, which `report` re-renders from the raw files). Every reader goes
through rltbench.results.rundir (read_jsonl, RunDir.read_json), which reads `<name>.gz` where
`<name>` is gone.

    python -m rltbench.results.compact results/gpu [--min-kib 150]

Only files of at least --min-kib are packed (gzip level 9, mtime 0: the same bytes on every run);
manifests, summaries, markdown tables, CSVs and plots are left alone.
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path


def packable(root: Path) -> list[Path]:
    """The JSONL files under `root` and the JSON records of its CSV tables."""
    tables = [p for p in root.rglob("*.json") if p.with_suffix(".csv").is_file()]
    return sorted([*root.rglob("*.jsonl"), *tables])


def compact(root: Path, min_bytes: int) -> list[tuple[Path, int, int]]:
    """Pack every large packable file under `root`; (path, bytes before, bytes after) per file."""
    done = []
    for path in packable(root):
        size = path.stat().st_size
        if size < min_bytes:
            continue
        packed = path.with_name(path.name + ".gz")
        packed.write_bytes(gzip.compress(path.read_bytes(), compresslevel=9, mtime=0))
        path.unlink()
        done.append((path, size, packed.stat().st_size))
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("roots", nargs="+", type=Path, help="run directories or folders of them")
    ap.add_argument("--min-kib", type=int, default=150, help="pack files of at least this size")
    args = ap.parse_args()
    for root in args.roots:
        for path, before, after in compact(root, args.min_kib * 1024):
            print(f"{path}: {before / 1024:.0f} KiB -> {after / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
