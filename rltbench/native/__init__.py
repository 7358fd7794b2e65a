"""The native arm's CUDA C++ operators: whether they can exist on this machine, and loading them.

The arm is called ``cuda`` (rltbench.arms: ``--arms torch,cuda``, ``--norm cuda``).
Its kernels are compiled from csrc/ on first use (build.py: a cached JIT build for the visible GPU)
and loaded into the process once. Where there is no CUDA build of torch, no visible GPU, no nvcc
or no ninja, or where the compile fails, the arm is *unavailable* with that reason: selecting it
is then a usage error (UsageError: one line, exit 2), never a silent run of torch's ops.

Entry points: ``unavailable_reason()`` (cheap, builds nothing), ``load()`` (builds or loads,
raises NativeUnavailable), ``require(selections)`` (what the commands call while checking their
arguments, so the build happens before any run directory or timed cell), ``provenance()`` (for
manifests). This package imports nothing from rltbench.kernels, which imports it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from rltbench.errors import UsageError

NATIVE_IMPL = "cuda"          # the per-family implementation value and the arm's name
FAMILIES = ("norm", "rope", "act")


class NativeUnavailable(RuntimeError):
    """The native arm cannot run here; str() is the reason (one line)."""


_LOCK = threading.Lock()
_STATE: dict[str, Any] = {"module": None, "info": None, "reason": None}


def unavailable_reason() -> str | None:
    """Why the native arm cannot run here, from cheap checks only (no compile); None if it may.
    A build failure is only known after load()."""
    with _LOCK:
        if _STATE["module"] is not None:
            return None
        if _STATE["reason"] is not None:
            return _STATE["reason"]
    return _environment_reason()


def _environment_reason() -> str | None:
    import torch  # here, not at import: rltbench.arms (and every command's --help) imports this package

    from rltbench.native import build

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build (the native kernels need CUDA torch)"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    if build.find_nvcc() is None:
        return "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
    if build.find_ninja() is None:
        return "ninja not found (pip install ninja): torch.utils.cpp_extension builds with it"
    return None


def load(verbose: bool = False) -> ModuleType:
    """The extension module (built at the first call in this process, from the cache after that).
    Raises NativeUnavailable with the reason; a failure is remembered for the process."""
    with _LOCK:
        if _STATE["module"] is not None:
            return _STATE["module"]
        if _STATE["reason"] is not None:
            raise NativeUnavailable(_STATE["reason"])
        reason = _environment_reason()
        if reason is None:
            from rltbench.native import build

            try:
                module, info = build.build(verbose=verbose)
            except Exception as exc:  # noqa: BLE001 - any compiler/loader failure makes the arm unavailable
                reason = "build failed: " + _first_error_line(str(exc))
            else:
                _STATE.update(module=module, info=info)
                return module
        _STATE["reason"] = reason
        raise NativeUnavailable(reason)


def _first_error_line(text: str) -> str:
    """The compiler's first error line of a failed build (the whole text is in the build directory's
    ninja log); else the exception's first line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower() and not ln.lower().startswith("error building extension"):
            return ln[:300]
    return (lines[0] if lines else "unknown error")[:300]


def uses_native(selection: Any) -> bool:
    """Whether an arm (rltbench.arms.ArmSpec) runs any family natively."""
    return any(getattr(selection, f, None) == NATIVE_IMPL for f in FAMILIES)


def require(selections: Iterable[Any] = (), what: str = "the cuda arm") -> ModuleType | None:
    """Build/load the extension if any selection uses it (none given: unconditionally); UsageError
    with the reason when it is unavailable. Commands call it while checking their arguments."""
    sels = list(selections)
    if sels and not any(uses_native(s) for s in sels):
        return None
    try:
        return load()
    except NativeUnavailable as exc:
        raise UsageError(f"{what} is unavailable: {exc}") from None


def build_info() -> dict[str, Any] | None:
    """The build this process loaded (BuildInfo as a dict), or None."""
    with _LOCK:
        info = _STATE["info"]
    return info.to_dict() if info is not None else None


def provenance() -> dict[str, Any]:
    """For manifests: whether this process loaded the native kernels, their build, or why not
    (only what already happened: this never builds)."""
    with _LOCK:
        loaded, reason = _STATE["module"] is not None, _STATE["reason"]
    return {"loaded": loaded, "build": build_info(), "unavailable": reason}


def reset() -> None:
    """Forget the loaded module and any failure (tests)."""
    with _LOCK:
        _STATE.update(module=None, info=None, reason=None)
