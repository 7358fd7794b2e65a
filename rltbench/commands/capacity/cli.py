"""`rltbench capacity`: flags -> predicted rows (checked before any run directory) -> run."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rltbench import arms as armspec
from rltbench import runtime
from rltbench.commands.capacity.plan import capacity_rows, check_admits, request_lengths
from rltbench.commands.capacity.run import CapacitySpec, run
from rltbench.engine.kv_capacity import GIB
from rltbench.engine.types import EngineConfig
from rltbench.errors import UsageError
from rltbench.models.configs import KV_LAYOUTS


def _names(text: str, flag: str) -> list[str]:
    out = list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    if not out:
        raise UsageError(f"{flag} is empty")
    return out


def capacity_command(
    models: Annotated[str, typer.Option(help="Model presets, comma list (random weights).")] = (
        "ouro-1.4b,huginn-0125"),
    kv_layouts: Annotated[str, typer.Option(help="Huginn KV layouts, comma list (full, compress).")] = (
        "full,compress"),
    input_len: runtime.BurstInputLenOption = None,
    output_len: runtime.BurstOutputLenOption = None,
    memory_gib: Annotated[float | None, typer.Option(
        help="KV budget in GiB (default: on a GPU the free memory after each model's weights minus the "
             "engine's headroom; on the CPU a fixed 16 GiB).")] = None,
    burst: Annotated[bool | None, typer.Option(
        help="Measure a burst at the largest C of each engine row (default: on a GPU yes, on the CPU "
             "no).")] = None,
    arms: armspec.ArmsOption = "torch",
    repeats: Annotated[int, typer.Option(help="Timed bursts per engine row.")] = 1,
    block_size: runtime.BlockSizeOption = 16,
    max_num_batched_tokens: runtime.MaxNumBatchedTokensOption = 2048,
    enforce_eager: runtime.EnforceEagerOption = False,
    seed: runtime.SeedOption = 0,
    dtype: runtime.DtypeOption = None,
    device: runtime.DeviceOption = None,
    result_dir: runtime.ResultDirOption = None,
) -> None:
    """KV capacity per model and layout (bytes per token, requests and tokens a budget admits), and a
    measured burst at the largest C each layout admits."""
    if (input_len is not None and input_len < 1) or (output_len is not None and output_len < 1):
        raise UsageError("--input-len and --output-len must be >= 1")
    if repeats < 1:
        raise UsageError("--repeats must be >= 1")
    if memory_gib is not None and memory_gib <= 0:
        raise UsageError("--memory-gib must be > 0")
    layouts = _names(kv_layouts, "--kv-layouts")
    bad = [x for x in layouts if x not in KV_LAYOUTS]
    if bad:
        raise UsageError(f"--kv-layouts: unknown {bad}; use {', '.join(KV_LAYOUTS)}")
    runtime.check_engine_flags(EngineConfig(block_size=block_size,
                                            max_num_batched_tokens=max_num_batched_tokens))
    arm_specs = armspec.parse_arms(arms)
    if len(arm_specs) != 1:
        raise UsageError("--arms: capacity bursts run one arm (e.g. --arms torch)")
    dev = runtime.resolve_device(device)
    dt = runtime.resolve_dtype(dtype, dev)
    names = _names(models, "--models")
    input_len, output_len, note = request_lengths(names, input_len, output_len)
    rows = capacity_rows(names, layouts, seed, dt, dev, memory_gib, block_size, input_len, output_len)
    check_admits(rows)
    do_burst = dev.startswith("cuda") if burst is None else burst
    if do_burst and not dev.startswith("cuda"):
        for r in rows:
            if r["kind"] == "engine":
                runtime.check_cpu_kv_bytes(int(r["budget_gib"] * GIB), f"{r['model']} ({r['layout']})")
    arm, spec = next(iter(arm_specs.items()))
    path = run(CapacitySpec(rows=rows, arm=arm, arm_spec=spec, burst=do_burst, repeats=repeats, seed=seed,
                            device=dev, dtype=dt, block_size=block_size,
                            max_num_batched_tokens=max_num_batched_tokens, enforce_eager=enforce_eager,
                            result_dir=result_dir, argv=list(sys.argv), notes=[note] if note else []))
    typer.echo((path / "table.md").read_text())
    typer.echo(f"results: {path}")
