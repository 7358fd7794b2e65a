"""Census of a captured CUDA graph's nodes: exact kernels per replay, with no profiler overhead.

torch (>= 2.7, so 2.11 on the GPU box) exposes the captured `cudaGraph_t` through
`CUDAGraph.raw_cuda_graph()` when the graph was created with `keep_graph=True`. The handle is
the same object as the driver's `CUgraph`, so the driver API in libcuda (always present where
CUDA runs; no cuda-python needed) lists its nodes: `cuGraphGetNodes`, `cuGraphNodeGetType`,
child graphs through `cuGraphChildGraphNodeGetGraph`. Kernel nodes are what a replay launches;
memcpy/memset nodes are counted separately; empty/event nodes launch nothing.

The traversal is written against a tiny `GraphApi` protocol so its logic is tested on CPU with a
fake; `DriverGraphApi` is the thin ctypes implementation used on the GPU.
"""

from __future__ import annotations

import ctypes
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

# CUgraphNodeType (cuda.h)
NODE_TYPES = {
    0: "kernel",
    1: "memcpy",
    2: "memset",
    3: "host",
    4: "graph",
    5: "empty",
    6: "wait_event",
    7: "event_record",
    8: "ext_semas_signal",
    9: "ext_semas_wait",
    10: "mem_alloc",
    11: "mem_free",
    12: "batch_mem_op",
    13: "conditional",
}


class GraphApi(Protocol):
    def nodes(self, graph: int) -> list[int]: ...
    def node_type(self, node: int) -> int: ...
    def child_graph(self, node: int) -> int: ...


@dataclass
class GraphCensus:
    """Node counts of one graph (child graphs flattened in)."""

    kernels: int
    memcpy: int
    memset: int
    other: dict[str, int] = field(default_factory=dict)
    child_graphs: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def census(graph: int, api: GraphApi, _depth: int = 0) -> GraphCensus:
    """Count the nodes of `graph` by type, descending into child-graph nodes."""
    if _depth > 16:
        raise RuntimeError("CUDA graph nesting deeper than 16 levels")
    counts: Counter[str] = Counter()
    children = 0
    nested: list[GraphCensus] = []
    for node in api.nodes(graph):
        kind = NODE_TYPES.get(api.node_type(node), "unknown")
        if kind == "graph":
            children += 1
            nested.append(census(api.child_graph(node), api, _depth + 1))
        else:
            counts[kind] += 1
    res = GraphCensus(
        counts.pop("kernel", 0), counts.pop("memcpy", 0), counts.pop("memset", 0), dict(counts), children
    )
    for sub in nested:
        res.kernels += sub.kernels
        res.memcpy += sub.memcpy
        res.memset += sub.memset
        res.child_graphs += sub.child_graphs
        for k, v in sub.other.items():
            res.other[k] = res.other.get(k, 0) + v
    return res


class DriverGraphApi:
    """GraphApi on libcuda through ctypes (CUDA driver API; CUgraph == cudaGraph_t)."""

    def __init__(self) -> None:
        lib = None
        for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if lib is None:
            raise OSError("CUDA driver library (libcuda) not found")
        self.lib = lib

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed with CUresult {rc}")

    def nodes(self, graph: int) -> list[int]:
        n = ctypes.c_size_t(0)
        self._check(
            self.lib.cuGraphGetNodes(ctypes.c_void_p(graph), None, ctypes.byref(n)), "cuGraphGetNodes"
        )
        arr = (ctypes.c_void_p * max(1, n.value))()
        self._check(self.lib.cuGraphGetNodes(ctypes.c_void_p(graph), arr, ctypes.byref(n)), "cuGraphGetNodes")
        return [int(arr[i] or 0) for i in range(n.value)]

    def node_type(self, node: int) -> int:
        kind = ctypes.c_int(-1)
        self._check(
            self.lib.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)), "cuGraphNodeGetType"
        )
        return int(kind.value)

    def child_graph(self, node: int) -> int:
        g = ctypes.c_void_p(0)
        self._check(
            self.lib.cuGraphChildGraphNodeGetGraph(ctypes.c_void_p(node), ctypes.byref(g)),
            "cuGraphChildGraphNodeGetGraph",
        )
        return int(g.value or 0)


def graph_census(cuda_graph: Any, api: GraphApi | None = None) -> tuple[GraphCensus | None, str]:
    """(census, note) of a torch.cuda.CUDAGraph; census None with the reason when it cannot be read."""
    getter = getattr(cuda_graph, "raw_cuda_graph", None)
    if getter is None:
        return None, "this torch has no CUDAGraph.raw_cuda_graph() (needs torch >= 2.7)"
    try:
        raw = int(getter())
    except Exception as exc:  # torch raises RuntimeError when keep_graph was False
        return (
            None,
            f"raw_cuda_graph() unavailable ({str(exc).splitlines()[0][:120]}); capture with keep_graph=True",
        )
    if raw == 0:
        return None, "raw_cuda_graph() returned a null graph"
    try:
        return census(raw, api or DriverGraphApi()), "cuGraphGetNodes on the captured cudaGraph_t"
    except (OSError, RuntimeError) as exc:
        return None, f"driver API: {exc}"
