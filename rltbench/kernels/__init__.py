"""The op library: the torch reference, exact (bitwise) and approx Triton kernels, and the native
CUDA C++ arm `cuda` (bitwise; its sources and build live in rltbench.native), per op family.

    reference.py  the torch expressions the models use (what "exact" means)
    ops.py        Ops: routes each call to torch or a family's kernels, fallbacks counted by reason
    norm/ rope/ act/   one package per op family: kernels, launch configs, the dispatch table
    cases.py oracle.py rounding.py layout.py pdl.py   benchmark cases, fp64 oracle, shared helpers

Public API::

    from rltbench.kernels import OpSelection, make_ops, Ops, ARMS, OPS, op_case
"""

from rltbench.arms import ARMS
from rltbench.arms import ArmSpec as OpSelection
from rltbench.kernels.cases import OPS, OpCase, op_case
from rltbench.kernels.ops import Ops, OpStats, make_ops

__all__ = ["ARMS", "OPS", "OpCase", "OpSelection", "OpStats", "Ops", "make_ops", "op_case"]
