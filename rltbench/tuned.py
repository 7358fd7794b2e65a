"""Per-GPU tuned launch configurations: one JSON file per device model, read into typed configs.

Why files, not constants: the best tile, warp count or partition of a kernel depends on the GPU.
``rltbench tune`` measures them on the device (every candidate bitwise-checked before it is timed)
and writes ``rltbench/tuned_configs/<device>.json``; each kernel family reads its section as a
frozen dataclass (`config`). A GPU without a file, and the CPU, get each dataclass's code default,
which is the configuration measured best where one was measured. The file records where its
numbers came from (``sources``).

One override: ``RLTBENCH_TUNED=path/to/file.json`` (same schema) is used instead of the GPU's file,
``RLTBENCH_TUNED=none`` means no file. Whatever applies is recorded in every manifest (`in_use`).
The file and the configs are read once per process; `use` swaps the file for a block (tests, the
tuner) and `write_section` updates a GPU's file; both drop what was cached.

Kernels and engine both read this module; it imports neither.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from rltbench import knobs
from rltbench.errors import UsageError

TUNED_DIR = Path(__file__).resolve().parent / "tuned_configs"
NO_FILE = "none"   # RLTBENCH_TUNED=none: code defaults everywhere
SOURCES = "sources"


class LaunchConfig(Protocol):
    """A typed config read from one section of the tuned file (frozen dataclass)."""

    SECTION: ClassVar[str]

    @classmethod
    def from_section(cls, value: Any) -> Any:
        """The config for a section's JSON value (None: no section, the code default). ValueError
        for values the kernels cannot take."""
        ...


C = TypeVar("C", bound=LaunchConfig)


@dataclass(frozen=True)
class TunedFile:
    """The tuned data in force: where it came from ("gpu", "override", "none") and its sections."""

    origin: str
    path: Path | None
    data: Mapping[str, Any] = field(default_factory=dict)


def device_slug(name: str) -> str:
    """File name for a device name: 'NVIDIA H200' -> 'NVIDIA_H200'."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", name.strip()) or "unknown"


def path_for(device_name: str) -> Path:
    return TUNED_DIR / f"{device_slug(device_name)}.json"


@lru_cache(maxsize=1)
def _current_device_name() -> str | None:
    try:
        import torch  # here, not at module level: tuned is read by code that must not pull in torch

        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name(torch.cuda.current_device()))
    except Exception:  # no driver, no device: the code defaults apply
        return None
    return None


def _read(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def _resolve() -> TunedFile:
    override = knobs.raw("RLTBENCH_TUNED")
    if override is not None and override.lower() == NO_FILE:
        return TunedFile("none", None)
    if override == "0":
        raise UsageError("RLTBENCH_TUNED names a file now; RLTBENCH_TUNED=none runs without a tuned file")
    if override is not None:
        path = Path(override)
        try:
            return TunedFile("override", path, _read(path))
        except (OSError, ValueError) as exc:
            raise UsageError(f"RLTBENCH_TUNED={override}: not a readable tuned-config file ({exc})") from None
    dev = _current_device_name()
    path = path_for(dev) if dev is not None else None
    if path is None or not path.is_file():
        return TunedFile("none", None)
    try:
        return TunedFile("gpu", path, _read(path))
    except (OSError, ValueError):  # a damaged shipped file must not stop a run: code defaults
        return TunedFile("none", path)


_LOCK = threading.RLock()
_STACK: list[TunedFile] = []              # use() blocks, innermost last
_CACHE: dict[Any, Any] = {}               # "file" -> TunedFile, config class -> its instance


def active() -> TunedFile:
    """The tuned data in force (read once; UsageError for an unreadable RLTBENCH_TUNED file)."""
    with _LOCK:
        if _STACK:
            return _STACK[-1]
        if "file" not in _CACHE:
            _CACHE["file"] = _resolve()
        return _CACHE["file"]


def check() -> None:
    """Raise UsageError now when RLTBENCH_TUNED names a bad file or holds a bad value (commands call
    it while checking their arguments, before any run directory exists)."""
    data = active().data
    for name, value in data.items():
        if name != SOURCES and not isinstance(value, (dict, list, str)):
            raise UsageError(f"tuned-config section {name!r} must be a JSON object or list")
    for cls in _REGISTERED:
        config(cls)


def section(name: str) -> Any:
    """One section's raw JSON value in force, or None."""
    return active().data.get(name)


_REGISTERED: list[type] = []


def register(cls: type[C]) -> type[C]:
    """Class decorator: `cls` is a launch config, checked by `check` with every other one."""
    _REGISTERED.append(cls)
    return cls


def config(cls: type[C]) -> C:
    """The typed config of `cls` (its SECTION of the data in force), built once and cached (kernels
    read it at every launch: a dict lookup). A value the kernels cannot take is a UsageError naming
    the file and the section."""
    if not _STACK:
        cached = _CACHE.get(cls)
        if cached is not None:
            return cached
    with _LOCK:
        src = active()
        try:
            cfg = cls.from_section(src.data.get(cls.SECTION))
        except (TypeError, ValueError) as exc:
            where = src.path if src.path is not None else "tuned data"
            raise UsageError(f"{where}: section {cls.SECTION!r}: {exc}") from None
        if not _STACK:
            _CACHE[cls] = cfg
        return cfg


def fields_of(cls: type, value: Any) -> dict[str, Any]:
    """The entries of a section's JSON object that are fields of the dataclass `cls` (other keys are
    the tuner's record: measured figures, names); None gives {}. TypeError for a non-object."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"expected a JSON object, got {type(value).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in value.items() if k in names}


def reload() -> None:
    """Forget the cached file and configs (the next read resolves RLTBENCH_TUNED and the file again)."""
    with _LOCK:
        _CACHE.clear()


@contextlib.contextmanager
def use(data: Mapping[str, Any] | Path | None) -> Iterator[TunedFile]:
    """Within the block the tuned data is `data` (sections as in a file), the file at that path, or
    None (no file: code defaults). For tests and the tuner; configs read inside are not cached."""
    if isinstance(data, Path):
        src = TunedFile("override", data, _read(data))
    else:
        src = TunedFile("override" if data is not None else "none", None, dict(data or {}))
    with _LOCK:
        _STACK.append(src)
    try:
        yield src
    finally:
        with _LOCK:
            _STACK.remove(src)


def write_section(device_name: str, name: str, value: Any, source: dict[str, Any]) -> Path:
    """Merge one section, with its provenance (command, date, git sha, result directory), into the
    device's file; what was cached is dropped, so this process reads the new values."""
    p = path_for(device_name)
    try:
        data = _read(p) if p.is_file() else {}
    except (OSError, ValueError):
        data = {}
    data["device"] = device_name
    data[name] = value
    data.setdefault(SOURCES, {})[name] = source
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, p)
    reload()
    return p


def in_use() -> dict[str, Any] | None:
    """For manifests: the tuned data in force (origin, file, sections without provenance), or None
    when no file applies."""
    src = active()
    if src.origin == "none":
        return None
    if src.origin == "gpu" and src.path is not None:
        shown = f"rltbench/tuned_configs/{src.path.name}"
    else:
        shown = str(src.path) if src.path is not None else None
    sections = {k: v for k, v in src.data.items() if k != SOURCES}
    return {"origin": src.origin, "file": shown, "sections": sections}
