"""torch.profiler differences across torch 2.5-2.13, in one place.

- Event times: torch renamed `cuda_time*` to `device_time*` (2.4+, old names deprecated with a
  FutureWarning, maybe removed later); device-side events expose their own span through
  `time_range` in every version, which is what we use first.
- `prof.events()` lists device events (device_type CUDA) next to CPU ops in 2.x; older builds
  only attached kernels to CPU ops. We count device events from the chrome trace instead (see
  trace.py) and use `FunctionEvent`s only for CPU-op counts in CPU mode (`--device cpu`).
- `_ExperimentalConfig`/`acc_events` and other knobs changed between versions: we use none.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

_TIME_ATTRS = (
    "self_device_time_total",
    "self_cuda_time_total",
    "device_time_total",
    "cuda_time_total",
    "device_time",
    "cuda_time",
)


def event_time_us(evt: Any) -> float:
    """Duration of one profiler event in microseconds, whatever this torch calls it.

    Device events: their own time range. CPU ops: self CPU time (`self_cpu_time_total`) when asked
    for CPU mode, else the first device-time attribute this version has.
    """
    tr = getattr(evt, "time_range", None)
    if tr is not None and hasattr(tr, "start") and hasattr(tr, "end"):
        return float(tr.end - tr.start)
    return device_time_us(evt)


def device_time_us(evt: Any) -> float:
    """The device time of an event or an averaged row, trying the new then the old attribute names."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for attr in _TIME_ATTRS:
            try:
                val = getattr(evt, attr)
            except (AttributeError, AssertionError):
                continue
            if val is not None:
                return float(val)
    return 0.0


def is_cpu_event(evt: Any) -> bool:
    dt = getattr(evt, "device_type", None)
    return dt is None or str(dt).rsplit(".", 1)[-1].upper() == "CPU"


# aten ops that only make views, allocate, or read metadata: no kernel would run for them on a GPU.
NON_COMPUTE = frozenset(
    "as_strided view _reshape_alias reshape empty empty_strided empty_like resolve_conj resolve_neg "
    "result_type alias detach t transpose permute expand expand_as unsqueeze squeeze slice select split "
    "split_with_sizes chunk narrow _unsafe_view unbind flatten view_as type_as to _to_copy resize_ "
    "lift_fresh _local_scalar_dense item size stride numel is_nonzero contiguous clone linear matmul "
    "dropout _has_compatible_shallow_copy_type set_ unflatten movedim".split()
)


def _is_compute(e: Any) -> bool:
    name = str(getattr(e, "name", ""))
    return name.startswith("aten::") and name[6:] not in NON_COMPUTE


def _has_compute_below(e: Any, depth: int = 0) -> bool:
    for c in getattr(e, "cpu_children", None) or []:
        if _is_compute(c) or (depth < 32 and _has_compute_below(c, depth + 1)):
            return True
    return False


def cpu_leaf_ops(events: Iterable[Any]) -> list[Any]:
    """CPU `aten::` ops that do work, each counted once: the CPU analogue of kernels.

    An op counts when it computes (not a view/alloc/metadata op, see NON_COMPUTE) and no op below
    it computes (aten::linear -> aten::t + aten::addmm: only addmm counts). Sorted by start time.
    """
    ops = [e for e in events if is_cpu_event(e) and _is_compute(e) and not _has_compute_below(e)]
    ops.sort(key=lambda e: float(getattr(getattr(e, "time_range", None), "start", 0.0)))
    return ops


# aten op -> a representative CUDA kernel name, so CPU op sequences go through the same classifier.
_ATEN_ALIAS = {
    "mm": "gemm",
    "addmm": "gemm",
    "bmm": "gemm",
    "matmul": "gemm",
    "linear": "gemm",
    "baddbmm": "gemm",
    "rsqrt": "at::native rsqrt_kernel_cuda",
    "pow": "at::native pow_tensor_scalar_kernel_impl",
    "mean": "at::native reduce_kernel MeanOps",
    "silu": "at::native silu_kernel",
    "neg": "at::native neg_kernel",
    "cat": "at::native CatArrayBatchedCopy",
    "mul": "at::native MulFunctor",
    "add": "at::native CUDAFunctor_add",
    "add_": "at::native CUDAFunctor_add",
    "copy_": "at::native direct_copy_kernel_cuda",
    "_to_copy": "at::native direct_copy_kernel_cuda",
    "scaled_dot_product_attention": "attention",
    "_scaled_dot_product_flash_attention_for_cpu": "attention",
    "_softmax": "attention",
    "softmax": "attention",
    "index_copy_": "index_copy",
    "index_copy": "index_copy",
    "index_put_": "index_put",
    "embedding": "at::native embedding",
    "index_select": "at::native indexSelect",
}


def cpu_op_alias(name: str) -> str:
    """Map `aten::rsqrt` etc. to a kernel-like name understood by classify_name."""
    base = name.split("::", 1)[-1]
    return _ATEN_ALIAS.get(base, f"at::native cpu_{base}")
