"""The op library: the torch reference, exact (bitwise) and approx Triton kernels, and the native
CUDA C++ arm `cuda` (bitwise; its sources and build live in rltbench.native), per op family.

    reference.py  the torch expressions the models use (what "exact" means)
    ops.py        Ops: routes each call to torch or a family's kernels, fallbacks counted by reason
    norm/ rope/ act/   one package per op family: kernels, launch configs, the dispatch table
    names.py cases.py oracle.py rounding.py layout.py pdl.py   benchmark cases, fp64 oracle, helpers

Public API::

    from rltbench.kernels import OpSelection, make_ops, Ops, ARMS, OPS, op_case

Imports are lazy (torch and Triton load with the first of these names used), so that the torch-free
`rltbench.kernels.names` serves `rltbench kernels --help` on its own.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ARMS": ("rltbench.arms", "ARMS"),
    "OpSelection": ("rltbench.arms", "ArmSpec"),
    "OPS": ("rltbench.kernels.names", "OPS"),
    "OpCase": ("rltbench.kernels.cases", "OpCase"),
    "op_case": ("rltbench.kernels.cases", "op_case"),
    "Ops": ("rltbench.kernels.ops", "Ops"),
    "OpStats": ("rltbench.kernels.ops", "OpStats"),
    "make_ops": ("rltbench.kernels.ops", "make_ops"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'rltbench.kernels' has no attribute {name!r}")
    module, attr = where
    return getattr(importlib.import_module(module), attr)
