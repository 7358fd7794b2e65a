"""Reference lines that no elementwise fusion can remove: the GEMM floor, the weight-bytes floor and
the KV-bytes floor.

- GEMM floor (per step): the summed kernel time of the GEMM and attention classes in the profile
  of the same decode step (projections, LM head, attention; see counting.floor_time_us). It is a
  sum of kernel durations measured under the profiler, so it excludes launch gaps; a step can
  only approach it if every norm/RoPE/activation/residual kernel disappeared.
- Weight-bytes floor (per step): bytes of weights read by one decode step divided by this run's
  measured device-to-device copy bandwidth. The bytes are counted, not assumed: one eager forward
  of one token runs under a TorchDispatchMode that adds the size of every model parameter an op
  reads (a looped model reads its shared weights once per loop; the embedding contributes one row
  per token). View ops read nothing and are skipped.
- KV-bytes floor (per step): bytes of cached K and V the step's attention must read, divided by the
  same copy bandwidth. Every row of the batch attends over its `context` cached tokens in every KV
  plane the engine allocates (`engine.kv_capacity.engine_layout`: Ouro one plane per layer
  application; Huginn per its KV layout). Planes that several applications share are counted once, so
  this is a lower bound: attention kernels reach it only if they stream each byte once at copy speed.
  Why it matters: at large batches attention, not the weights, dominates a decode step, and the
  weight-bytes floor alone says nothing about how close attention runs to its own limit.

Each floor is set beside the class it bounds: `share_of_floor` = floor time / the class's measured
kernel time (GEMM class against the weight-bytes floor, attention against the KV-bytes floor); 100%
would be a class running at the copy rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rltbench.engine.kv_capacity import engine_layout
from rltbench.models.dense_kv import DenseKVCache

_ROW_OPS = {"embedding", "index_select", "embedding_dense"}


def _storage_key(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return 0


class _WeightReadCounter(TorchDispatchMode):
    def __init__(self, params: dict[int, int]):
        super().__init__()
        self.params = params  # storage ptr -> bytes
        self.bytes = 0
        self.reads: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        schema = getattr(func, "_schema", None)
        if schema is not None and any(r.alias_info is not None for r in schema.returns):
            return out  # views and in-place ops move no weight bytes
        name = func.__name__.split(".")[0] if hasattr(func, "__name__") else str(func)
        flat = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        seen: set[int] = set()
        for t in flat:
            key = _storage_key(t)
            if key in self.params and key not in seen:
                seen.add(key)
                if name in _ROW_OPS and len(flat) >= 2:
                    idx = [x for x in flat if x is not t and not x.is_floating_point()]
                    rows = idx[0].numel() if idx else 1
                    row_bytes = t.element_size() * (t.shape[-1] if t.dim() > 1 else 1)
                    nbytes = rows * row_bytes
                else:
                    nbytes = self.params[key]
                self.bytes += nbytes
                self.reads[name] = self.reads.get(name, 0) + nbytes
        return out


def count_weight_bytes(model: torch.nn.Module, run: Callable[[], Any]) -> dict[str, Any]:
    """Bytes of model parameters read while `run()` executes (eager; not inside a graph capture)."""
    params: dict[int, int] = {}
    for p in model.parameters():
        key = _storage_key(p)
        params[key] = max(params.get(key, 0), p.numel() * p.element_size())
    counter = _WeightReadCounter(params)
    with torch.no_grad(), counter:
        run()
    total_params = sum(params.values())
    return {
        "bytes": counter.bytes,
        "param_bytes": total_params,
        "reuse": counter.bytes / total_params if total_params else float("nan"),
        "by_op": dict(sorted(counter.reads.items(), key=lambda kv: -kv[1])),
    }


def one_token_forward(model: Any, ops: Any) -> Callable[[], Any]:
    """A closure running one decode-like forward (1 token at position 0) + the LM head, eagerly."""
    cfg = model.config
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype

    def run() -> Any:
        cache = DenseKVCache(cfg.num_kv_planes, 1, 1, cfg.num_kv_heads, cfg.head_dim, dtype, device)
        cache.begin([0], [0])
        ids = torch.zeros(1, dtype=torch.long, device=device)
        pos = torch.zeros(1, dtype=torch.long, device=device)
        hidden = model.forward(ids, pos, cache, ops)
        return model.compute_logits(hidden)

    return run


def weight_floor_ms(weight_bytes: float, copy_gbps: float) -> float:
    """Time to read `weight_bytes` at the measured copy rate (GB/s, read+write bytes per second)."""
    return floor_ms(weight_bytes, copy_gbps)


def kv_bytes_per_step(config: Any, dtype: torch.dtype, batch: int, context: int) -> dict[str, Any]:
    """Bytes of cached K/V one decode step's attention reads at least: `batch` rows, each attending over
    `context` cached tokens in every KV plane of the engine's layout for `config`."""
    layout = engine_layout(config, dtype)
    per_token = layout.bytes_per_token  # K and V of one token in every plane
    return {
        "bytes": batch * context * per_token,
        "batch": batch,
        "context": context,
        "planes": layout.planes,
        "bytes_per_token": per_token,
        "layout": layout.name,
    }


def floor_ms(nbytes: float, copy_gbps: float) -> float:
    """Time to move `nbytes` at the measured copy rate (GB/s, read+write bytes per second)."""
    if not (math.isfinite(copy_gbps) and copy_gbps > 0):
        return float("nan")
    return nbytes / (copy_gbps * 1e9) * 1e3


def share_of_floor(floor_ms_value: float | None, class_time_us: float | None) -> float:
    """Floor time over the class's measured kernel time per step (1.0 = the class runs at its floor)."""
    if floor_ms_value is None or class_time_us is None or not class_time_us > 0:
        return float("nan")
    if not math.isfinite(floor_ms_value):
        return float("nan")
    return floor_ms_value * 1e3 / class_time_us
