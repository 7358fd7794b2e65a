"""Fixtures for the model tests (helpers live in models_testutil.py)."""

from __future__ import annotations

import pytest

from rltbench.kernels import ARMS, make_ops


@pytest.fixture
def ref_ops():
    """The torch reference arm."""
    return make_ops(ARMS["torch"])
