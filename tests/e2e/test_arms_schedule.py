"""Arm specs and the interleaved schedule."""

from __future__ import annotations

import pytest

from rltbench.arms import is_exact, parse_arms, reference_arm
from rltbench.bench.workload import Cell, schedule
from rltbench.errors import UsageError


def test_parse_arms_names_duplicates_overrides_and_custom():
    arms = parse_arms("torch,exact,approx,torch")
    assert list(arms) == ["torch", "exact", "approx", "torch#2"]
    assert arms["exact"].norm == "exact" and arms["torch#2"].norm == "off"
    assert is_exact(arms["exact"]) and not is_exact(arms["approx"]) and not is_exact(arms["torch"])
    over = parse_arms("torch,exact", {"scope": "all", "rope": "off", "norm": None})
    assert over["exact"].scope == "all" and over["exact"].rope == "off" and over["torch"].scope == "graph"
    custom = parse_arms("torch,fused=norm:exact/scope:all")
    assert (
        custom["fused"].norm == "exact" and custom["fused"].rope == "off" and custom["fused"].scope == "all"
    )
    assert reference_arm(["exact", "torch"]) == "torch" and reference_arm(["a", "b"]) == "a"


@pytest.mark.parametrize("spec", ["", "nope", "x=norm:fast", "x=norm", "x=color:red", "to#rch"])
def test_bad_arm_specs_are_usage_errors(spec):
    with pytest.raises(UsageError):
        parse_arms(spec)
    with pytest.raises(UsageError):
        parse_arms("torch,exact", {"scope": "sometimes"})


def test_schedule_alternates_arms():
    cells = [Cell("C=1", 1), Cell("C=8", 8)]
    s = schedule(["A", "B", "C"], cells, 2)
    order = [
        "".join(a for r, c, a in s if r == rep and c.name == name)
        for rep in (0, 1)
        for name in ("C=1", "C=8")
    ]
    assert order == ["ABC", "CBA", "CBA", "ABC"]
    assert len(s) == 12
