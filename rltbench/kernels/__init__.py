"""Kernel arms for looped LMs: the torch reference, exact (bitwise) and approx Triton kernels, and
the native CUDA C++ arm `cuda` (bitwise; its sources and build live in rltbench.native).

Public API (contract: docs/DESIGN.md section 1)::

    from rltbench.kernels import OpSelection, make_ops, Ops, ARMS, OPS, op_case
"""

from rltbench.arms import ARMS
from rltbench.arms import ArmSpec as OpSelection
from rltbench.kernels.cases import OPS, OpCase, op_case
from rltbench.kernels.ops import Ops, OpStats, make_ops

__all__ = ["ARMS", "OPS", "OpCase", "OpSelection", "OpStats", "Ops", "make_ops", "op_case"]
