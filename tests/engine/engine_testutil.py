"""Helpers shared by the engine tests (a uniquely named module: several test folders have a
conftest.py, so importing helpers `from conftest` depends on collection order)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest
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


# Prepended to every sm90_compile_report script: the sm_90 target and `usage(kernel)` -> (registers,
# local bytes) from cuobjdump (-1 where it could not be read).
SM90_PRELUDE = """
import json, os, re, subprocess, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
target = GPUTarget("cuda", 90, 32)
cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
def usage(kernel):
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    res = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True)
    os.unlink(f.name)
    regs = re.search(r"REG:(\\d+)", res.stdout)
    spill = re.search(r"LOCAL:(\\d+)", res.stdout)
    return int(regs.group(1)) if regs else -1, int(spill.group(1)) if spill else -1
"""


def sm90_compile_report(script: str) -> list:
    """Run a Triton AOT compile script for sm_90 (after SM90_PRELUDE) in a fresh interpreter without
    TRITON_INTERPRET (the real compiler, no GPU needed) and return the JSON it prints after
    ``COMPILE_OK``; skips where Triton has no NVIDIA backend or no ptxas."""
    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        pytest.skip("Triton without the NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = [sys.executable, "-c", SM90_PRELUDE + script]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr:
        pytest.skip("ptxas unavailable")
    assert proc.returncode == 0 and "COMPILE_OK" in proc.stdout, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("COMPILE_OK", 1)[1])
