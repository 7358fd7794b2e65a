"""Per-GPU tuned launch knobs, one JSON file per device model (as vLLM keeps its fused-MoE configs).

Why files, not constants: the best tile, warp count or partition of a kernel depends on the GPU;
the tuning scripts (scripts/kernel_tune.py, ``python -m rltbench.commands.tune.attention --sweep
--write-tuned``) measure them on the device and write ``rltbench/tuned_configs/<device>.json``;
kernels read their section at launch. A GPU without a file, and the CPU, get the built-in
defaults. Environment variables (``RLTBENCH_*``, recorded in every manifest) override both, so a
tuning run can try values without editing files. Every file records where its numbers came from.

Kernels and engine both read this module; it imports neither.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

TUNED_DIR = Path(__file__).resolve().parent / "tuned_configs"


def device_slug(name: str) -> str:
    """File name for a device name: 'NVIDIA H200' -> 'NVIDIA_H200'."""
    return re.sub(r"[^A-Za-z0-9.-]+", "_", name.strip()) or "unknown"


def path_for(device_name: str) -> Path:
    return TUNED_DIR / f"{device_slug(device_name)}.json"


@lru_cache(maxsize=8)
def _load(device_name: str) -> dict[str, Any]:
    p = path_for(device_name)
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@lru_cache(maxsize=1)
def _current_device_name() -> str | None:
    try:
        import torch

        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name(torch.cuda.current_device()))
    except Exception:  # no driver, no device: the built-in defaults apply
        return None
    return None


def section(name: str, device_name: str | None = None) -> Any:
    """The tuned values of one section for this (or the current) GPU, or None. Set
    ``RLTBENCH_TUNED=0`` to ignore every file (built-in defaults; for A/B runs)."""
    if os.environ.get("RLTBENCH_TUNED", "1") == "0":
        return None
    dev = device_name if device_name is not None else _current_device_name()
    if dev is None:
        return None
    return _load(dev).get(name)


def write_section(device_name: str, name: str, value: Any, source: dict[str, Any]) -> Path:
    """Merge one section (with its provenance: command, date, git sha, result file) into the
    device's file; the reader caches are cleared so the same process sees the new values."""
    p = path_for(device_name)
    data = dict(_load(device_name))
    data["device"] = device_name
    data[name] = value
    data.setdefault("sources", {})[name] = source
    TUNED_DIR.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, p)
    _load.cache_clear()
    return p


def in_use() -> dict[str, Any] | None:
    """For manifests: the current device's tuned file (path and launch sections, provenance left
    out) as the kernels read it, or None when none applies."""
    if os.environ.get("RLTBENCH_TUNED", "1") == "0":
        return None
    dev = _current_device_name()
    if dev is None or not path_for(dev).is_file():
        return None
    data = {k: v for k, v in _load(dev).items() if k != "sources"}
    return {"file": f"rltbench/tuned_configs/{path_for(dev).name}", "sections": data}


def knob(env: str, section_name: str, key: str, default: Any, sub: tuple[str, str] | None = None) -> Any:
    """One scalar knob: the environment variable, else the device's tuned value, else `default`.
    ``sub=(table, entry)``: a value in ``section[table][entry]`` (e.g. ``("by_width", "2048")``)
    wins over the section's own, so a section can hold per-shape values beside its default."""
    v = os.environ.get(env)
    if v not in (None, ""):
        return type(default)(v) if not isinstance(default, bool) else v not in ("0", "false", "False")
    tuned = section(section_name)
    if isinstance(tuned, dict):
        table = tuned.get(sub[0]) if sub is not None else None
        per = table.get(sub[1]) if isinstance(table, dict) and sub is not None else None
        if isinstance(per, dict) and key in per:
            return per[key]
        if key in tuned:
            return tuned[key]
    return default
