"""SiLU·up for every kernel arm: the fused Triton kernel (exact or approx numerics, fused.py), the
cuda arm's CUDA C++ kernel (native.py) and the exact arm's launch config (config.py).

`KERNELS` is the dispatch table: arm -> ``kernel(gate_rows, up_rows, out_rows)``."""

from __future__ import annotations

import functools
from collections.abc import Callable

from rltbench.kernels.act import fused
from rltbench.kernels.act.native import silu_mul_native_rows
from rltbench.native import NATIVE_IMPL

KERNELS: dict[str, Callable[..., None]] = {
    "exact": functools.partial(fused.silu_mul_rows, exact=True),
    "approx": functools.partial(fused.silu_mul_rows, exact=False),
    NATIVE_IMPL: silu_mul_native_rows,
}
