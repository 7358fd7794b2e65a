"""A test marked slow, run explicitly by tests/test_conftest_switch.py (not collected by itself: the
name does not match test_*.py)."""

import pytest


@pytest.mark.slow
def test_marked_slow() -> None:
    assert True
