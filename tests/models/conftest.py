"""Fixtures for the model tests (helpers live in models_testutil.py)."""

from __future__ import annotations

import pytest

from rltbench.models._ref_ops import default_ops


@pytest.fixture
def ref_ops():
    """The torch reference arm (rltbench.kernels' when importable)."""
    return default_ops()
