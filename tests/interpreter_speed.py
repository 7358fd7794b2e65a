"""Make nested @triton.jit calls cheap in Triton's CPU interpreter, for the test suite only.

Why: the interpreter (triton 3.x, ``triton.runtime.interpreter``) re-patches ``triton.language``
on every call of a nested jit function (``InterpretedFunction.__call__`` -> ``_patch_lang``), and
each patch walks ``inspect.getmembers`` of tl, tl.core, tl.tensor and tl.math: about 1 ms per
call. The exact kernels call small jit helpers (rounding, tiles) thousands of times per launch,
so this walk was about half of the CPU suite's interpreter time.

While a launch runs, the modules its kernel sees are already patched (the launch restores them
when it ends), so a nested call whose function sees no other language module has nothing to patch:
it gets an empty scope instead. Every other call goes to Triton's own ``_patch_lang`` unchanged,
so what a kernel computes is the same bit for bit; only the redundant walk is skipped. Launches
are tracked per thread, so a launch in another thread is patched as Triton does it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import triton.language as tl

_MARK = "_rltbench_skips_nested_repatch"


def _language_modules(fn: Callable[..., Any]) -> frozenset[int]:
    """Ids of the language modules `fn` sees (the ones ``_patch_lang`` patches for it)."""
    return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)


def install() -> bool:
    """Wrap the interpreter's ``_patch_lang`` (once per process); False where Triton's layout
    differs from the one this was written for, and nothing is changed."""
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - Triton without the interpreter
        return False
    original = getattr(interpreter, "_patch_lang", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    if original is None or scope_type is None or not hasattr(scope_type, "restore"):
        return False
    if getattr(original, _MARK, False):
        return True
    launches = threading.local()  # .patched: language modules patched by the running launch

    def patch_lang(fn: Callable[..., Any]) -> Any:
        patched: frozenset[int] | None = getattr(launches, "patched", None)
        langs = _language_modules(fn)
        if patched is not None and langs <= patched:
            return scope_type()  # nested call: everything it sees is patched already
        scope = original(fn)
        if patched is None:  # a launch (GridExecutor): it restores this scope when it ends
            launches.patched = langs
            restore = scope.restore

            def restore_and_end_launch() -> None:
                launches.patched = None
                restore()

            scope.restore = restore_and_end_launch
        return scope

    setattr(patch_lang, _MARK, True)
    interpreter._patch_lang = patch_lang
    return True
