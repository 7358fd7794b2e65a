"""Helpers shared by the engine tests (a uniquely named module: several test folders have a
conftest.py, so importing helpers `from conftest` depends on collection order)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rltbench.engine import Engine, EngineConfig
from rltbench.engine.schedule import Schedule
from rltbench.kernels import ARMS, make_ops
from rltbench.models import build_model


def tiny_model(preset: str, seed: int = 0) -> torch.nn.Module:
    """A tiny fp32 model on CPU with random weights."""
    return build_model(preset, device="cpu", dtype=torch.float32, seed=seed).eval()


def torch_ops():
    """The reference (torch arm) Ops."""
    return make_ops(ARMS["torch"])


def prompts(seed: int, lengths: list[int], vocab: int = 256) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def small_engine(model, **kw) -> Engine:  # noqa: ANN001
    """A CPU engine whose pool and step budget are small enough that short prompts chunk, share
    prefix blocks and wait for a slot; `kw` overrides any EngineConfig field."""
    cfg = dict(num_blocks=96, block_size=4, max_num_seqs=4, max_num_batched_tokens=16, use_cuda_graph=False)
    cfg.update(kw)
    return Engine(model, config=EngineConfig(**cfg))


def record_run(eng: Engine, on_step: Callable[[int, dict[str, list[int]]], None],
               min_steps: int) -> tuple[Schedule, dict[str, list[int]]]:
    """Record one run from an empty prefix cache: `on_step(0, out)` adds the first requests, and
    `on_step(n, out)` after step n may add late arrivals or abort one (`out`: each request's tokens
    so far). Steps until no request is left and at least `min_steps` steps ran, so that arrivals
    planned after an idle moment still come. Returns the schedule and every request's tokens."""
    eng.reset_prefix_cache()
    eng.start_recording()
    out: dict[str, list[int]] = {}
    on_step(0, out)
    steps = 0
    while eng.has_unfinished() or steps < min_steps:
        for ev in eng.step():
            out.setdefault(ev.request_id, []).extend(ev.token_ids)
        steps += 1
        on_step(steps, out)
    return eng.stop_recording(), out
