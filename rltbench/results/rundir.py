"""A run directory: the one results schema shared by every rltbench command.

Layout of `results/<command>-<UTC time>/` (or `--result-dir`):
  manifest.json   provenance + the command's configuration + status (running/complete/interrupted/failed)
  *.json/*.jsonl  raw results (the source of truth; `rltbench report` re-renders from these only)
  *.csv           the same tables for spreadsheets / pandas
  table.md        the human summary; *.png plots

All writes are atomic (temp file + rename), so an interrupted run never leaves a half-written file,
and raw rows can be appended as work finishes so a Ctrl-C keeps everything measured so far.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import gzip
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from rltbench.errors import UsageError
from rltbench.results.plotting import png_bytes
from rltbench.results.provenance import collect as collect_provenance

SCHEMA_VERSION = 1
DEFAULT_ROOT = Path("results")


def _json_default(obj: Any) -> Any:
    """Make numpy/torch scalars, paths and dataclasses JSON-serialisable."""
    if hasattr(obj, "item") and callable(obj.item):
        try:
            return obj.item()
        except (TypeError, ValueError):
            pass
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "__dataclass_fields__"):
        return dataclasses.asdict(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    return str(obj)


def _clean(obj: Any) -> Any:
    """NaN/inf are not JSON: store them as null so every reader can load the file."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def dumps(obj: Any, indent: int | None = 2) -> str:
    return json.dumps(_clean(json.loads(json.dumps(obj, default=_json_default))), indent=indent,
                      allow_nan=False)


def _file_mode() -> int:
    """The mode `open()` would give a new file (0o666 minus the umask).

    `tempfile.mkstemp` creates files 0600; renamed into place unchanged, results on a shared GPU box
    would be unreadable to everyone but their writer."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so readers see either the old or the new file, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically (see `atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def default_run_path(command: str, root: Path | None = None) -> Path:
    """A new `<root>/<command>-<UTC time>` (DEFAULT_ROOT, read at the call, where root is None: the
    test suite points it away from the checkout)."""
    root = DEFAULT_ROOT if root is None else root
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = root / f"{command}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = root / f"{command}-{stamp}-{n}"
    return path


# every run the current command created, in order: what the CLI reports after Ctrl-C, and what it
# closes when the command ends by an exception before saying how its run ended (end_unfinished_runs)
_CREATED: list[RunDir] = []


def forget_created_runs() -> None:
    """A new command starts (the CLI calls this): runs of earlier commands in this process are not
    its runs."""
    _CREATED.clear()


def kept_runs_described() -> list[str]:
    """Each run this process created and kept, as the one line after Ctrl-C names it: its path, and
    what finished where the command said (`RunDir.finished`)."""
    return [f"{r.path} ({r.finished})" if r.finished else str(r.path) for r in _CREATED if r.kept()]


def end_unfinished_runs(exc: BaseException) -> None:
    """A command ended by `exc`: each run it created whose manifest on disk still says `running` is
    ended by `RunDir.mark_ended` (interrupted / failed, or removed when a UsageError came before it
    stored anything). Runs that already recorded their end are left alone; the manifest is re-read
    from disk first, since another process (a pd rank) may have written it since."""
    for run in _CREATED:
        mf = run.path / "manifest.json"
        try:
            on_disk = json.loads(mf.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if on_disk.get("status") == "running":
            run.manifest = on_disk
            run.mark_ended(exc)


def stored_text(path: Path) -> str:
    """The text of a stored file, or of `path`.gz where a committed run keeps it packed
    (python -m rltbench.results.compact); FileNotFoundError when neither exists."""
    packed = path.with_name(path.name + ".gz")
    if not path.exists() and packed.exists():
        return gzip.decompress(packed.read_bytes()).decode()
    return path.read_text()


def read_jsonl(path: Path) -> list[Any]:
    """The records of a JSONL file, packed or not (stored_text); [] when neither exists. A line torn
    by a hard kill is skipped, the rest kept."""
    try:
        text = stored_text(path)
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


class RunDir:
    """One run's directory. Create with `RunDir.create(...)`, open a stored one with `RunDir.open(...)`.

    A stored run's manifest is its provenance (the commit, the status, the config it ran with): an
    opened run re-renders its tables and plots but never rewrites manifest.json.
    """

    def __init__(self, path: Path, manifest: dict[str, Any], read_only_manifest: bool = False):
        self.path = Path(path)
        self.manifest = manifest
        self.read_only_manifest = read_only_manifest
        self.made_dir = False  # create() made the directory itself (so discard() may remove it)
        self.finished = ""  # what finished, in a few words ("2 of 4 cases"): the line after Ctrl-C says it

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def create(cls, command: str, result_dir: str | Path | None = None, argv: list[str] | None = None,
               config: dict[str, Any] | None = None) -> RunDir:
        """Make the directory and write the manifest (status `running`).

        Raises UsageError when the directory cannot be created or written, before any work starts.
        """
        path = Path(result_dir) if result_dir else default_run_path(command)
        made = not path.exists()
        if (path / "manifest.json").exists():
            # appending to another run's rows.jsonl would mix two runs under one manifest
            raise UsageError(f"{path} already holds an rltbench run (manifest.json); choose a new "
                             "--result-dir or delete that one first")
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / ".write-probe"
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise UsageError(f"cannot write results to {path}: {exc.strerror or exc}") from None
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "command": command,
            "status": "running",
            "config": config or {},
            "provenance": collect_provenance(argv),
            "files": [],
        }
        run = cls(path, manifest)
        run.made_dir = made
        run._write_manifest()
        _CREATED.append(run)
        return run

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        """Open a stored run (for `rltbench report`): files can be (re)written, manifest.json cannot."""
        path = Path(path)
        mf = path / "manifest.json"
        if not mf.is_file():
            raise UsageError(f"{path} is not an rltbench run directory (no manifest.json)")
        try:
            manifest = json.loads(mf.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"cannot read {mf}: {exc}") from None
        return cls(path, manifest, read_only_manifest=True)

    # -- manifest -----------------------------------------------------------------------------
    @property
    def command(self) -> str:
        return str(self.manifest.get("command"))

    def _write_manifest(self) -> None:
        atomic_write_text(self.path / "manifest.json", dumps(self.manifest) + "\n")

    def _note_file(self, name: str) -> None:
        files = self.manifest.setdefault("files", [])
        if name not in files:
            files.append(name)
            if not self.read_only_manifest:
                self._write_manifest()

    def update_manifest(self, **fields: Any) -> None:
        """Merge top-level fields (e.g. status="complete", summary={...}) and rewrite atomically.
        Refused on an opened (stored) run: re-rendering must not change its provenance."""
        if self.read_only_manifest:
            raise RuntimeError(f"{self.path}: a stored run's manifest.json is not rewritten")
        self.manifest.update(fields)
        self._write_manifest()

    def stored_nothing(self) -> bool:
        """No file but the manifest yet: the run has no result to keep."""
        return not self.manifest.get("files")

    def mark_ended(self, exc: BaseException) -> None:
        """The run ended early: `interrupted` for Ctrl-C, else `failed`, with the error's first line
        stored (what is already on disk stays and `rltbench report` can render it). Bad input found
        only after the directory was made (a corrupt weights file), or a Ctrl-C before the first
        result, leaves no directory behind when nothing but the manifest was stored: there is
        nothing to keep, and it is not a run."""
        if isinstance(exc, (UsageError, KeyboardInterrupt)) and self.stored_nothing():
            self.discard()
            return
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        self.update_manifest(status=status, error=f"{type(exc).__name__}: {exc}"[:500])

    @contextmanager
    def recording(self, render: Callable[[Path], Any]) -> Iterator[RunDir]:
        """The body of a run: `complete` when it returns, `mark_ended` (interrupted / failed) and
        re-raised when it raises, and `render(path)` either way, so that an interrupted run still
        gets the tables of what it finished. One place for that order, which every command that
        renders its own run directory needs."""
        try:
            yield self
            self.update_manifest(status="complete")
        except BaseException as exc:
            self.mark_ended(exc)
            raise
        finally:
            if self.kept():  # not removed by mark_ended (nothing stored): something to render
                render(self.path)

    def kept(self) -> bool:
        """The run directory still holds its manifest (discard() was not called)."""
        return (self.path / "manifest.json").is_file()

    def discard(self) -> None:
        """Remove the files the run listed, its manifest, and the directory if create() made it and
        nothing else is in it: a run that ended before its first result leaves nothing behind."""
        for name in self.manifest.get("files") or []:
            (self.path / name).unlink(missing_ok=True)
        (self.path / "manifest.json").unlink(missing_ok=True)
        if self.made_dir:
            try:
                self.path.rmdir()
            except OSError:  # something else is in it: leave it
                pass
        if self in _CREATED:
            _CREATED.remove(self)

    def finish(self, table_md: str, **json_files: Any) -> str:
        """Write the raw JSON files (name without .json -> object) and table.md, then mark the run
        complete: the last step of every run that did all it planned. Returns the table."""
        for name, obj in json_files.items():
            self.write_json(f"{name}.json", obj)
        self.write_markdown("table.md", table_md)
        self.update_manifest(status="complete")
        return table_md

    # -- raw results ----------------------------------------------------------------------------
    def file(self, name: str) -> Path:
        return self.path / name

    def write_json(self, name: str, obj: Any) -> Path:
        atomic_write_text(self.path / name, dumps(obj) + "\n")
        self._note_file(name)
        return self.path / name

    def write_json_gz(self, name: str, obj: Any) -> Path:
        """gzip-compressed JSON for bulky raw files (profiler traces: ~10x smaller, so a run
        directory stays small enough to commit); `name` should end in .json.gz."""
        data = gzip.compress((json.dumps(obj, separators=(",", ":")) + "\n").encode(), mtime=0)
        atomic_write_bytes(self.path / name, data)
        self._note_file(name)
        return self.path / name

    def read_json(self, name: str) -> Any:
        """A stored JSON file, or `name`.gz where a committed run keeps a table's records packed
        (python -m rltbench.results.compact); a missing or corrupt one is a UsageError naming it."""
        path = self.path / name
        try:
            return json.loads(stored_text(path))
        except FileNotFoundError:
            raise UsageError(f"{path}: file missing from the run directory") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UsageError(f"cannot read {path}: {exc}") from None

    def write_jsonl(self, name: str, rows: list[Any]) -> Path:
        atomic_write_text(self.path / name, "".join(dumps(r, indent=None) + "\n" for r in rows))
        self._note_file(name)
        return self.path / name

    def append_jsonl(self, name: str, row: Any) -> None:
        """Append one record and flush: rows written before a crash or Ctrl-C stay readable."""
        with open(self.path / name, "a", encoding="utf-8") as fh:
            fh.write(dumps(row, indent=None) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self._note_file(name)

    def extend_jsonl(self, name: str, rows: list[Any]) -> None:
        """Append several records in one write (one unit of work: a Ctrl-C never splits it)."""
        if not rows:
            return
        with open(self.path / name, "a", encoding="utf-8") as fh:
            fh.write("".join(dumps(r, indent=None) + "\n" for r in rows))
            fh.flush()
            os.fsync(fh.fileno())
        self._note_file(name)

    def read_jsonl(self, name: str) -> list[Any]:
        return read_jsonl(self.path / name)

    def write_table(self, name: str, df: Any) -> Path:
        """A pandas DataFrame as `<name>.csv` and `<name>.json` (records)."""
        atomic_write_text(self.path / f"{name}.csv", df.to_csv(index=False))
        self.write_json(f"{name}.json", df.to_dict(orient="records"))
        self._note_file(f"{name}.csv")
        return self.path / f"{name}.csv"

    def read_table(self, name: str) -> pd.DataFrame:
        return pd.DataFrame(self.read_json(f"{name}.json"))

    def write_markdown(self, name: str, text: str) -> Path:
        return self.write_text(name, text if text.endswith("\n") else text + "\n")

    def write_text(self, name: str, text: str) -> Path:
        """A text file (CSV, a tool's output) written atomically and listed in the manifest."""
        atomic_write_text(self.path / name, text)
        self._note_file(name)
        return self.path / name

    def adopt(self, name: str, gzipped: bool = False) -> Path:
        """List `name`, a file another program wrote into the run, in the manifest; with `gzipped`
        replace it by `name`.gz first (a raw report kept small enough to commit)."""
        if gzipped:
            src = self.path / name
            atomic_write_bytes(self.path / f"{name}.gz", gzip.compress(src.read_bytes(), mtime=0))
            src.unlink()
            name = f"{name}.gz"
        self._note_file(name)
        return self.path / name

    def save_plot(self, name: str, fig: Any) -> Path:
        """Save a matplotlib figure as PNG (atomically) and close it."""
        atomic_write_bytes(self.path / name, png_bytes(fig))
        self._note_file(name)
        return self.path / name
