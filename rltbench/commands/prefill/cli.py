"""`rltbench prefill`: flags -> per model the prompt lengths that fit its context (plan.py) -> run."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rltbench import arms as armspec
from rltbench import options
from rltbench.engine.types import EngineConfig
from rltbench.errors import UsageError


def prefill_command(
    models: Annotated[str, typer.Option(help="Model presets, comma list (random weights).")] = (
        "ouro-1.4b,huginn-0125"),
    input_lens: Annotated[str | None, typer.Option(
        help="Prompt lengths, comma list; 'max' = the longest the model's context allows (default 2048, "
             "less where the model's context is shorter).")] = None,
    concurrency: Annotated[int, options.number(
        "Prompts per burst (all sent at once; at least 2: one prompt cannot be packed).", ge=2)] = 8,
    output_len: Annotated[int, options.number("Generated tokens per request (EOS ignored).", ge=1)] = 4,
    repeats: Annotated[int, options.number("Repetitions (policy order reversed each time).", ge=1)] = 2,
    arms: armspec.ArmsOption = "torch",
    kv_layout: Annotated[str, typer.Option(help="Huginn KV layout (full, compress).")] = "full",
    max_num_batched_tokens: Annotated[int, options.number(
        "Prefill token budget per step, the same for both policies (packing needs >= 2 prompts' worth).",
        ge=1)] = 8192,
    block_size: options.BlockSizeOption = 16,
    enforce_eager: options.EnforceEagerOption = False,
    prefill_graphs: options.PrefillGraphsOption = True,
    seed: options.SeedOption = 0,
    dtype: options.DtypeOption = None,
    device: options.DeviceOption = None,
    result_dir: options.ResultDirOption = None,
) -> None:
    """Long-prompt bursts: packed, chunked prefill against one request per prefill step (TTFT, prefill
    step time, their ratio beside the A/A spread, token identity)."""
    # torch and the engine: loaded when the command runs, not for `rltbench prefill --help`
    from rltbench import runtime
    from rltbench.commands.prefill.plan import prompt_lengths
    from rltbench.commands.prefill.run import PrefillSpec, run
    from rltbench.models.configs import KV_LAYOUTS

    if kv_layout not in KV_LAYOUTS:
        raise UsageError(f"--kv-layout: use one of {', '.join(KV_LAYOUTS)}")
    runtime.check_engine_flags(EngineConfig(block_size=block_size,
                                            max_num_batched_tokens=max_num_batched_tokens))
    names = list(dict.fromkeys(options.comma_list(models, "--models", "ouro-tiny,huginn-tiny")))
    lengths, note = prompt_lengths(input_lens, names, output_len)
    arm_specs = armspec.parse_arms(arms)
    if len(arm_specs) != 1:
        raise UsageError("--arms: the policies are compared under one arm (e.g. --arms torch)")
    dev = runtime.resolve_device(device)
    dt = runtime.resolve_dtype(dtype, dev)
    arm, spec = next(iter(arm_specs.items()))
    path = run(PrefillSpec(lengths=lengths, concurrency=concurrency, output_len=output_len, repeats=repeats,
                           arm=arm, arm_spec=spec, kv_layout=kv_layout,
                           max_num_batched_tokens=max_num_batched_tokens, block_size=block_size,
                           enforce_eager=enforce_eager, prefill_graphs=prefill_graphs, seed=seed,
                           device=dev, dtype=dt,
                           result_dir=result_dir, argv=list(sys.argv), notes=[note] if note else []))
    from rltbench.results.console import print_table_md  # rich tables: loaded when a run prints one

    print_table_md(path / "table.md")
    typer.echo(f"results: {path}")
