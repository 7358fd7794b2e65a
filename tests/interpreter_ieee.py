"""Quiet numpy's floating-point warnings inside Triton's CPU interpreter launches, for the test suite.

Why: the interpreter evaluates a kernel's float ops with numpy, whose default error state warns on
overflow, invalid (inf - inf, 0 * inf) and divide by zero. A GPU kernel raises no such exceptions:
inf and nan are values, and the bitwise tests feed them on purpose (tests/kernels/_util.with_specials).
About 28 `RuntimeWarning: overflow/invalid value encountered` lines in a suite run came from there.
Only the launch (``GridExecutor.__call__``) runs under ``np.errstate(ignore)``: numpy on the host,
outside a kernel, keeps its warnings, and what the kernel computes is unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

_MARK = "_rltbench_ieee_quiet"


def install() -> bool:
    """Wrap the interpreter's launch (once per process); False where Triton has no such launch."""
    try:
        from triton.runtime.interpreter import GridExecutor
    except ImportError:  # pragma: no cover - Triton without the interpreter
        return False
    launch = GridExecutor.__call__
    if getattr(launch, _MARK, False):
        return True

    @functools.wraps(launch)
    def quiet_launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            return launch(self, *args, **kwargs)

    setattr(quiet_launch, _MARK, True)
    GridExecutor.__call__ = quiet_launch
    return True
