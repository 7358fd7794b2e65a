"""Op cases for the `rltbench kernels` benchmark: realistic inputs, how to call each op through an
Ops object, bytes moved and the fp64 oracle. One entry per name in OPS.

Shapes: norms and silu_mul take [tokens, width] (width = hidden size, resp. intermediate size);
RoPE takes width = num_heads * head_dim with head_dim 128 (NeoX, Ouro) or 96 (interleaved, Huginn)
and rotates q and k with that many heads each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rltbench.errors import UsageError
from rltbench.kernels import oracle as orc
from rltbench.kernels.names import OPS
from rltbench.kernels.ops import Ops

Tensor = torch.Tensor
Inputs = dict[str, Tensor]
EPS = 1e-6

ROPE_HEAD_DIM = {"rope_neox": 128, "rope_interleaved": 96}
ROPE_THETA = {"rope_neox": 1_000_000.0, "rope_interleaved": 50_000.0}


@dataclass(frozen=True)
class OpCase:
    """make_inputs(tokens, width, dtype, device, generator) -> dict; run(ops, inputs) -> tuple of
    outputs; bytes_moved(inputs) = inputs read once + outputs written once; oracle(inputs) ->
    tuple of fp64 outputs (same order as run); terms(inputs) -> the magnitude of the terms of each
    output's last sum (fp64, same order: the scale of the approx bound's fp32 slack, oracle.py)."""

    name: str
    family: str  # "norm" | "rope" | "act": the OpSelection field that selects it
    make_inputs: Callable[[int, int, torch.dtype, torch.device | str, torch.Generator | None], Inputs]
    run: Callable[[Ops, Inputs], tuple[Tensor, ...]]
    oracle: Callable[[Inputs], tuple[Tensor, ...]]
    output_keys: tuple[str, ...]  # the inputs whose shape/dtype each output has
    terms: Callable[[Inputs], tuple[Tensor, ...]]

    def bytes_moved(self, inputs: Inputs) -> int:
        read = sum(t.numel() * t.element_size() for t in inputs.values())
        written = sum(inputs[k].numel() * inputs[k].element_size() for k in self.output_keys)
        return read + written


def _randn(
    shape: tuple[int, ...], dtype: torch.dtype, device, gen, scale: float = 1.0, shift: float = 0.0
) -> Tensor:
    g_dev = gen.device if gen is not None else torch.device("cpu")
    t = torch.randn(shape, generator=gen, device=g_dev, dtype=torch.float32) * scale + shift
    return t.to(device=device, dtype=dtype)


def _norm_inputs(extra: tuple[str, ...]) -> Callable:
    def make(tokens: int, width: int, dtype, device, gen) -> Inputs:
        d = {
            "x": _randn((tokens, width), dtype, device, gen),
            "w": _randn((width,), dtype, device, gen, 0.1, 1.0),
        }
        for name in extra:
            d[name] = _randn((tokens, width), dtype, device, gen)
        return d

    return make


def _rope_inputs(name: str) -> Callable:
    head_dim = ROPE_HEAD_DIM[name]

    def make(tokens: int, width: int, dtype, device, gen) -> Inputs:
        if width % head_dim:
            raise UsageError(f"{name}: width {width} is not a multiple of head_dim {head_dim}")
        heads = width // head_dim
        g_dev = gen.device if gen is not None else torch.device("cpu")
        pos = torch.randint(0, 4096, (tokens,), generator=gen, device=g_dev).float()
        inv = 1.0 / (
            ROPE_THETA[name] ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=g_dev) / head_dim)
        )
        freqs = torch.outer(pos, inv)
        if name == "rope_neox":
            emb = torch.cat((freqs, freqs), -1)
            cos, sin = emb.cos().to(device, dtype), emb.sin().to(device, dtype)
        else:
            cos, sin = freqs.cos().to(device), freqs.sin().to(device)
        return {
            "q": _randn((tokens, heads, head_dim), dtype, device, gen),
            "k": _randn((tokens, heads, head_dim), dtype, device, gen),
            "cos": cos,
            "sin": sin,
        }

    return make


def _silu_inputs(tokens: int, width: int, dtype, device, gen) -> Inputs:
    return {
        "gate": _randn((tokens, width), dtype, device, gen, 2.0),
        "up": _randn((tokens, width), dtype, device, gen),
    }


def _norm_case(name: str, run: Callable[[Ops, Inputs], tuple[Tensor, ...]],
               extra: str | None = None) -> OpCase:
    """An RMSNorm case: x and w, plus the `extra` input (a residual or branch added before the norm)
    that the oracle and its terms take by the same name."""
    def added(d: Inputs) -> Inputs:
        return {} if extra is None else {extra: d[extra]}

    return OpCase(
        name,
        "norm",
        _norm_inputs(() if extra is None else (extra,)),
        run,
        lambda d: (orc.rms_norm(d["x"], d["w"], EPS, **added(d)),),
        ("x",),
        lambda d: (orc.rms_norm_terms(d["x"], d["w"], EPS, **added(d)),),
    )


def _rope_case(name: str) -> OpCase:
    """A RoPE case: the Ops method, the oracle and its terms all carry the case's name."""
    return OpCase(
        name,
        "rope",
        _rope_inputs(name),
        lambda ops, d: getattr(ops, name)(d["q"], d["k"], d["cos"], d["sin"]),
        lambda d: getattr(orc, name)(d["q"], d["k"], d["cos"], d["sin"]),
        ("q", "k"),
        lambda d: getattr(orc, f"{name}_terms")(d["q"], d["k"], d["cos"], d["sin"]),
    )


_CASES: dict[str, OpCase] = {case.name: case for case in (
    _norm_case("rmsnorm", lambda ops, d: (ops.rms_norm(d["x"], d["w"], EPS),)),
    _norm_case("rmsnorm_huginn", lambda ops, d: (ops.rms_norm_huginn(d["x"], d["w"], EPS),)),
    _norm_case("rmsnorm_residual",
               lambda ops, d: (ops.residual_rms_norm(d["residual"], d["x"], d["w"], EPS),), "residual"),
    _norm_case("add_rmsnorm_huginn",
               lambda ops, d: (ops.add_rms_norm_huginn(d["x"], d["branch"], d["w"], EPS),), "branch"),
    _rope_case("rope_neox"),
    _rope_case("rope_interleaved"),
    OpCase(
        "silu_mul",
        "act",
        _silu_inputs,
        lambda ops, d: (ops.silu_mul(d["gate"], d["up"]),),
        lambda d: (orc.silu_mul(d["gate"], d["up"]),),
        ("gate",),
        lambda d: (orc.silu_mul_terms(d["gate"], d["up"]),),
    ),
)}


def op_case(name: str) -> OpCase:
    """The benchmark case `name` (one of OPS); UsageError for unknown names."""
    try:
        return _CASES[name]
    except KeyError:
        raise UsageError(f"unknown op {name!r}: expected one of {', '.join(OPS)}") from None
