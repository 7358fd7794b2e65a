"""Run only by test_conftest_switch.py (explicitly named, never collected on its own): checks in
whatever process pytest runs it (an xdist worker too) whether the Triton interpreter is on."""

from __future__ import annotations

import os


def test_interpreter_state_is_as_expected() -> None:
    want = os.environ["RLTBENCH_EXPECT_INTERPRET"] == "1"
    assert (os.environ.get("TRITON_INTERPRET") == "1") == want, os.environ.get("TRITON_INTERPRET")
