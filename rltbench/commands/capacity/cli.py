"""`rltbench capacity`: flags -> predicted rows (checked before any run directory) -> run."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rltbench import arms as armspec
from rltbench import options
from rltbench.engine.types import EngineConfig
from rltbench.errors import UsageError


def _names(text: str, flag: str, example: str) -> list[str]:
    return list(dict.fromkeys(options.comma_list(text, flag, example)))


def capacity_command(
    models: Annotated[str, typer.Option(help="Model presets, comma list (random weights).")] = (
        "ouro-1.4b,huginn-0125"),
    kv_layouts: Annotated[str, typer.Option(help="Huginn KV layouts, comma list (full, compress).")] = (
        "full,compress"),
    input_len: options.BurstInputLenOption = None,
    output_len: options.BurstOutputLenOption = None,
    memory_gib: Annotated[float | None, options.number(
        "KV budget in GiB (default: on a GPU the free memory after each model's weights minus the "
        "engine's headroom; on the CPU a fixed 16 GiB).", gt=0, le=options.MAX_GIB)] = None,
    burst: Annotated[bool | None, typer.Option(
        help="Measure a burst at the largest C of each engine row (default: on a GPU yes, on the CPU "
             "no).")] = None,
    arms: armspec.ArmsOption = "torch",
    repeats: Annotated[int, options.number("Timed bursts per engine row.", ge=1)] = 1,
    block_size: options.BlockSizeOption = 16,
    max_num_batched_tokens: options.MaxNumBatchedTokensOption = 2048,
    enforce_eager: options.EnforceEagerOption = False,
    seed: options.SeedOption = 0,
    dtype: options.DtypeOption = None,
    device: options.DeviceOption = None,
    result_dir: options.ResultDirOption = None,
) -> None:
    """KV capacity per model and layout (bytes per token, requests and tokens a budget admits), and a
    measured burst at the largest C each layout admits."""
    # torch and the engine: loaded when the command runs, not for `rltbench capacity --help`
    from rltbench import runtime
    from rltbench.commands.capacity.plan import capacity_rows, check_admits, request_lengths
    from rltbench.commands.capacity.run import CapacitySpec, run
    from rltbench.engine.kv_capacity import GIB
    from rltbench.models.configs import KV_LAYOUTS

    layouts = _names(kv_layouts, "--kv-layouts", "full,compress")
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
    names = _names(models, "--models", "ouro-tiny,huginn-tiny")
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
    from rltbench.results.console import print_table_md  # rich tables: loaded when a run prints one

    print_table_md(path / "table.md")
    typer.echo(f"results: {path}")
