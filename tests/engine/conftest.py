"""Fixtures for the engine tests: tiny fp32 models on CPU and a torch-reference Ops object."""

from __future__ import annotations

import pytest
import torch

from tests.engine.engine_testutil import tiny_model, torch_ops


@pytest.fixture(scope="session")
def ouro_tiny() -> torch.nn.Module:
    return tiny_model("ouro-tiny")


@pytest.fixture(scope="session")
def huginn_tiny() -> torch.nn.Module:
    return tiny_model("huginn-tiny")


@pytest.fixture()
def ops():
    return torch_ops()
