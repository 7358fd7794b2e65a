"""Provenance of a run: what ran, where, on which software. Written into every manifest.json.

Every number rltbench reports is only as good as the record of how it was produced, so this
collects the versions and the hardware once per run, never failing: a field that cannot be read
is recorded as None rather than stopping the measurement.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from rltbench import __version__, native, tuned


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def git_info() -> dict[str, Any]:
    """The git sha of the rltbench checkout (and whether the tree had uncommitted changes)."""
    if os.environ.get("RLTBENCH_GIT_SHA"):
        # a copy of the tree shipped to another machine (its .git, if any, may be stale): the
        # launcher passes the sha of the commit it sent
        return {"git_sha": os.environ["RLTBENCH_GIT_SHA"], "git_dirty": None}
    here = str(Path(__file__).resolve().parent)
    sha = _run(["git", "rev-parse", "HEAD"], cwd=here)
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here)
    return {"git_sha": sha, "git_dirty": bool(dirty) if sha else None}


def gpu_info() -> dict[str, Any]:
    """GPU name, driver and CUDA version as torch and nvidia-smi see them (None on CPU machines)."""
    info: dict[str, Any] = {"gpu": None, "gpu_count": 0, "driver": None, "cuda": None,
                            "compute_capability": None}
    info["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        info["gpu_count"] = torch.cuda.device_count()
        info["gpu"] = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
        info["compute_capability"] = f"{major}.{minor}"
        smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        info["driver"] = smi.splitlines()[0].strip() if smi else None
    return info


def software_info() -> dict[str, Any]:
    """Versions of the packages whose behaviour decides the numbers (torch, triton, ...)."""
    versions: dict[str, Any] = {"python": platform.python_version()}
    for name in ("torch", "triton", "numpy", "pandas", "lm_eval", "liger_kernel"):
        try:
            mod = __import__(name)
        except Exception:  # noqa: BLE001 - optional packages may fail to import in many ways
            versions[name] = None
            continue
        versions[name] = getattr(mod, "__version__", None) or distribution_version(name)
    versions["rltbench"] = __version__
    return versions


def distribution_version(import_name: str) -> str:
    """The installed distribution's version for a module that has no `__version__` (Liger-Kernel has
    none, and a peer column is only comparable across runs with its version). importlib.metadata
    normalises the name, so `liger_kernel` finds the `liger-kernel` distribution."""
    try:
        return importlib.metadata.version(import_name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def collect(argv: list[str] | None = None) -> dict[str, Any]:
    """The full provenance block of a manifest."""
    argv = list(sys.argv if argv is None else argv)
    return {
        "command_line": shlex.join(argv),
        "argv": argv,
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        # the knobs that change what runs: rltbench's own, and which GPUs / Triton mode were visible
        "env": {k: v for k, v in os.environ.items()
                if k.startswith("RLTBENCH_") or k in ("CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET")},
        **git_info(),
        **gpu_info(),
        "versions": software_info(),
        # per-GPU launch knobs (rltbench/tuned_configs): fast norm, PDL, fused K/V write, attention
        "tuned": _tuned_in_use(),
        # the native arm's build (key, arch, compile seconds) when this process loaded it, or why not
        "native": _native_in_use(),
    }


def _native_in_use() -> dict[str, Any] | None:
    try:
        return native.provenance()
    except Exception:  # noqa: BLE001 - provenance must never stop a run
        return None


def _tuned_in_use() -> dict[str, Any] | None:
    try:
        return tuned.in_use()
    except Exception:  # noqa: BLE001 - provenance must never stop a run
        return None
