"""RoPE of q and k for every kernel arm: the fused Triton kernels (exact or approx numerics,
fused.py), the cuda arm's CUDA C++ kernel (native.py) and the KV-write fusion switch (config.py).

`KERNELS` is the dispatch table: arm -> ``kernel(kind, q, k, cos, sin, qo, ko)``; `STORE` the
arms whose NeoX RoPE can also write the paged KV cache (Ops.rope_neox_store)."""

from __future__ import annotations

import functools
from collections.abc import Callable

from rltbench.kernels.rope import fused
from rltbench.kernels.rope.native import rope_native
from rltbench.native import NATIVE_IMPL

KERNELS: dict[str, Callable[..., None]] = {
    "exact": functools.partial(fused.rope, exact=True),
    "approx": functools.partial(fused.rope, exact=False),
    NATIVE_IMPL: rope_native,
}
STORE: dict[str, Callable[..., None]] = {
    "exact": functools.partial(fused.rope_neox_store, exact=True),
    "approx": functools.partial(fused.rope_neox_store, exact=False),
}
