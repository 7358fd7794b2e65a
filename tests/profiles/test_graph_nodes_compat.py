"""Graph-node census logic (fake driver API) and profiler attribute compatibility."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

from rltbench.commands.profile.classify import classify_name
from rltbench.commands.profile.compat import cpu_leaf_ops, cpu_op_alias, device_time_us, event_time_us
from rltbench.commands.profile.graph_nodes import census, graph_census


class FakeApi:
    """Graph 1: 3 kernels, 1 memset, 1 empty, a child graph 2 (2 kernels, 1 memcpy)."""

    graphs = {1: [10, 11, 12, 13, 14, 15], 2: [20, 21, 22]}
    types = {10: 0, 11: 0, 12: 0, 13: 2, 14: 5, 15: 4, 20: 0, 21: 1, 22: 0}

    def nodes(self, graph: int) -> list[int]:
        return self.graphs[graph]

    def node_type(self, node: int) -> int:
        return self.types[node]

    def child_graph(self, node: int) -> int:
        return 2


def test_census_counts_types_and_children() -> None:
    c = census(1, FakeApi())
    assert (c.kernels, c.memcpy, c.memset, c.child_graphs) == (5, 1, 1, 1)
    assert c.other == {"empty": 1}


def test_graph_census_without_kept_graph() -> None:
    class NotKept:
        def raw_cuda_graph(self) -> int:
            raise RuntimeError("keep_graph must be True")

    c, why = graph_census(NotKept(), api=FakeApi())
    assert c is None and "keep_graph" in why
    c, why = graph_census(object(), api=FakeApi())
    assert c is None and "raw_cuda_graph" in why

    class Kept:
        def raw_cuda_graph(self) -> int:
            return 1

    c, _ = graph_census(Kept(), api=FakeApi())
    assert c is not None and c.kernels == 5


def test_device_time_new_and_old_names() -> None:
    new = SimpleNamespace(self_device_time_total=7.0)
    old = SimpleNamespace(self_cuda_time_total=5.0)
    assert device_time_us(new) == 7.0 and device_time_us(old) == 5.0
    assert device_time_us(SimpleNamespace()) == 0.0

    class Deprecated:
        @property
        def self_cuda_time_total(self) -> float:
            warnings.warn("deprecated", FutureWarning, stacklevel=2)
            return 3.0

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert device_time_us(Deprecated()) == 3.0
    ranged = SimpleNamespace(time_range=SimpleNamespace(start=10.0, end=14.5), self_device_time_total=99.0)
    assert event_time_us(ranged) == 4.5


def test_cpu_leaf_ops_and_aliases() -> None:
    def ev(name, start, children=()):
        return SimpleNamespace(
            name=name,
            device_type="DeviceType.CPU",
            cpu_children=list(children),
            time_range=SimpleNamespace(start=start, end=start + 1),
        )

    addmm, t = ev("aten::addmm", 2.0), ev("aten::t", 1.0)
    linear = ev("aten::linear", 0.5, [t, addmm])
    leaves = cpu_leaf_ops([linear, addmm, t, ev("rltbench.x", 0.0), ev("aten::rsqrt", 3.0)])
    assert [e.name for e in leaves] == ["aten::addmm", "aten::rsqrt"]  # aten::t is a view
    assert classify_name(cpu_op_alias("aten::addmm"))[0] == "gemm"
    assert classify_name(cpu_op_alias("aten::rsqrt"))[0] == "norm"
    assert classify_name(cpu_op_alias("aten::index_copy_"))[0] == "kv write"


@pytest.mark.gpu
def test_gpu_driver_census_matches_capture() -> None:
    import torch

    x = torch.randn(1024, device="cuda")
    g = torch.cuda.CUDAGraph(keep_graph=True)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        y = x * 2
        y = y + 1
        y.zero_()
    c, why = graph_census(g)
    assert c is not None, why
    assert c.kernels >= 2
