"""Programmatic dependent launch (PDL, Hopper and later), used by the approx norm's large launches.

Why: a norm kernel follows a cuBLAS GEMM or the attention kernel. A normal launch starts only after
the previous kernel has completed and flushed; a PDL launch lets the driver start our grid as soon
as the previous grid's blocks have exited (or triggered), so our launch and the loads that do not
depend on the previous kernel (weights) overlap its tail. The data the previous kernel wrote is read
only after ``griddepcontrol.wait``, which returns when every prerequisite grid has completed and its
memory is visible: the arithmetic is unchanged (tested on the GPU with a producer kernel writing
the input inside the same graph).

Rules every PDL kernel here follows (``wait`` below):
- before ``wait``: read only tensors no kernel of the step writes (weights), write nothing;
- every program calls ``wait`` (so a grid's completion implies its predecessors' completion);
- mode 2 also triggers its own dependents right after ``wait`` (``griddepcontrol.launch_dependents``):
  a following PDL kernel may then start while this one runs (it still waits for this one's
  completion before it reads anything).

Modes: 0 off, 1 wait, 2 wait + early trigger; a kernel's launch config asks for one (the approx
norm's ApproxNormLaunch.pdl, from a row count). It runs only on a CUDA device of compute capability
>= 9.0 with a Triton that has ``launch_pdl`` and ``gdc_wait``, never under the interpreter. The
exact arm's kernels do not use it: in Ouro's decode step, where each follows a GEMM, both modes
made the step slower (5.570 ms with either against 5.527, results/gpu/profile-pdl1, -pdl2).

Benchmarks: ``plain_launches()`` turns PDL off for every launch inside it (a kernel's headline figure
must not depend on overlapping with an identical predecessor, which a model never launches), and
``launch_modes()`` records the modes the launches inside it chose (where a tuned mode applies).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.4
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    _HAVE_GDC = True
except ImportError:  # pragma: no cover - older Triton: PDL stays off
    _HAVE_GDC = False

    @triton.jit
    def gdc_wait():  # type: ignore[no-redef]
        pass

    @triton.jit
    def gdc_launch_dependents():  # type: ignore[no-redef]
        pass


MODES = (0, 1, 2)


@triton.jit
def wait(PDL: tl.constexpr):
    """The point after which a PDL kernel may read what earlier kernels wrote (no-op when off)."""
    if PDL >= 1:
        gdc_wait()
    if PDL >= 2:
        gdc_launch_dependents()


@functools.lru_cache(maxsize=1)
def triton_supports() -> bool:
    """Triton can compile the wait and launch with the programmatic-serialization attribute."""
    if not _HAVE_GDC:
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:  # pragma: no cover
        return False
    return "launch_pdl" in {f.name for f in dataclasses.fields(CUDAOptions)}


@functools.lru_cache(maxsize=8)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def usable(t: torch.Tensor, interpret: bool) -> bool:
    """PDL can run for a launch on t's device: CUDA, compute capability >= 9.0, a capable Triton."""
    if interpret or not t.is_cuda or not triton_supports():
        return False
    idx = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return _capability(idx) >= (9, 0)


_plain_depth = 0
_recorders: list[Counter[int]] = []


@contextlib.contextmanager
def plain_launches() -> Iterator[None]:
    """Every launch inside uses mode 0 (a plain launch), whatever its launch config asks.
    A captured graph keeps the modes it was captured with: replays need no context."""
    global _plain_depth
    _plain_depth += 1
    try:
        yield
    finally:
        _plain_depth -= 1


@contextlib.contextmanager
def launch_modes() -> Iterator[Counter[int]]:
    """Counts the modes the launches inside chose (mode -> launches): `counts[1] + counts[2]` > 0
    means a PDL mode applies to what ran."""
    counts: Counter[int] = Counter()
    _recorders.append(counts)
    try:
        yield counts
    finally:
        _recorders.remove(counts)


def mode_for(t: torch.Tensor, interpret: bool, requested: int) -> int:
    """The PDL mode a launch on t's device uses: `requested` (a validated mode from the kernel's
    launch config), 0 where PDL cannot run and inside `plain_launches`."""
    mode = requested if requested and not _plain_depth and usable(t, interpret) else 0
    for counts in _recorders:
        counts[mode] += 1
    return mode


def launch_kwargs(mode: int) -> dict[str, Any]:
    """Extra launch arguments: the kernel's PDL constexpr, and Triton's launch option when on."""
    return {"PDL": mode, "launch_pdl": True} if mode else {"PDL": 0}


__all__ = [
    "MODES", "launch_kwargs", "launch_modes", "mode_for", "plain_launches", "triton_supports", "usable",
    "wait",
]
