"""tests/interpreter_speed.py: a nested @triton.jit call in the interpreter skips the language
re-patch walk and computes the same bits."""

from __future__ import annotations

import inspect
import os

import pytest
import torch
import triton
import triton.language as tl

from tests.interpreter_speed import install

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="interpreter only")


@triton.jit
def _affine(x):
    return x * 3.0 + 0.5


@triton.jit
def _nested(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(X + offs)
    x = _affine(x)
    x = _affine(x)
    x = _affine(x)
    tl.store(Y + offs, x)


@triton.jit
def _flat(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(X + offs)
    tl.store(Y + offs, x * 3.0 + 0.5)


def _walks(monkeypatch: pytest.MonkeyPatch, kernel, x: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(inspect.getmembers calls of one launch, its output)."""
    from triton.runtime import interpreter

    calls = [0]
    real = inspect.getmembers

    def counting(obj, *args):
        calls[0] += 1
        return real(obj, *args)

    monkeypatch.setattr(interpreter.inspect, "getmembers", counting)
    y = torch.empty_like(x)
    kernel[(1,)](x, y, N=x.numel())
    monkeypatch.setattr(interpreter.inspect, "getmembers", real)
    return calls[0], y


def test_nested_calls_skip_the_walk_and_keep_the_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    assert install()  # the conftest installed it already: a second install changes nothing
    x = torch.randn(16, generator=torch.Generator().manual_seed(3)) * 1e3
    flat_walks, _ = _walks(monkeypatch, _flat, x)
    nested_walks, y = _walks(monkeypatch, _nested, x)
    assert nested_walks == flat_walks  # the three nested calls walked nothing
    expected = x.clone()
    for _ in range(3):
        expected = expected * 3.0 + 0.5
    assert torch.equal(y, expected)
    assert tl.static_range.__module__.startswith("triton.language")  # the launch restored tl


@triton.jit
def _times(X, Y, S, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, tl.load(X + offs) * tl.load(S + offs))


def test_special_values_in_a_launch_warn_nothing_and_stay_ieee() -> None:
    """inf * 0 and max * 2 in a kernel are values (nan, inf), as on a GPU, not numpy warnings."""
    import warnings

    from tests.interpreter_ieee import install as install_ieee

    assert install_ieee()
    x = torch.tensor([float("inf"), torch.finfo(torch.float32).max, 1.5, -2.0])
    s = torch.tensor([0.0, 2.0, 2.0, float("nan")])
    y = torch.empty_like(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _times[(1,)](x, y, s, N=4)
    assert torch.equal(y.isnan(), (x * s).isnan()) and torch.equal(y.nan_to_num(), (x * s).nan_to_num())
