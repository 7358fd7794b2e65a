"""pdl.plain_launches / pdl.launch_modes without a GPU: the mode a launch would choose is forced to 0
inside plain_launches (the kernels benchmark's headline) and recorded by launch_modes (where a tuned
PDL mode applies). `usable` is faked: no device here can launch with PDL."""

from __future__ import annotations

import torch

from rltbench.kernels import pdl


def test_plain_launches_force_mode_zero_and_launch_modes_record(monkeypatch) -> None:
    monkeypatch.setattr(pdl, "usable", lambda t, interpret: True)
    t = torch.zeros(1)
    with pdl.launch_modes() as outer:
        assert pdl.mode_for(t, False, requested=2) == 2
        with pdl.plain_launches():
            assert pdl.mode_for(t, False, requested=2) == 0
            with pdl.plain_launches():  # nested: still plain, and plain again only after both exit
                assert pdl.mode_for(t, False, requested=1) == 0
            assert pdl.mode_for(t, False, requested=1) == 0
        with pdl.launch_modes() as inner:
            assert pdl.mode_for(t, False, requested=1) == 1
        assert pdl.mode_for(t, False, requested=0) == 0
    assert dict(inner) == {1: 1}
    assert dict(outer) == {2: 1, 0: 4, 1: 1}
    assert pdl.mode_for(t, False, requested=2) == 2 and not pdl._recorders and pdl._plain_depth == 0


def test_unusable_device_records_plain(monkeypatch) -> None:
    monkeypatch.setattr(pdl, "usable", lambda t, interpret: False)
    with pdl.launch_modes() as counts:
        assert pdl.mode_for(torch.zeros(1), True, requested=2) == 0
    assert dict(counts) == {0: 1}
