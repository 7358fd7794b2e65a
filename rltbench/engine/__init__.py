"""Serving engine for looped models: paged KV, continuous batching, prefix cache, CUDA graphs.

Public API (docs/DESIGN.md section 3, docs/engine.md)::

    from rltbench.engine import Engine, EngineConfig, SamplingParams

Imports are lazy so that `rltbench.engine.attention` (a pure-function module) can be imported and
tested on its own without pulling in the models or kernels packages.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Engine": "rltbench.engine.engine",
    "EngineConfig": "rltbench.engine.types",
    "SamplingParams": "rltbench.engine.types",
    "TokenEvent": "rltbench.engine.types",
    "RequestOutput": "rltbench.engine.types",
    "EngineRequestError": "rltbench.engine.types",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rltbench.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
