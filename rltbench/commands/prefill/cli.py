"""`rltbench prefill`: flags -> per model the prompt lengths that fit its context (plan.py) -> run."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rltbench import arms as armspec
from rltbench import runtime
from rltbench.commands.prefill.plan import prompt_lengths
from rltbench.commands.prefill.run import PrefillSpec, run
from rltbench.engine.types import EngineConfig
from rltbench.errors import UsageError
from rltbench.models.configs import KV_LAYOUTS


def prefill_command(
    models: Annotated[str, typer.Option(help="Model presets, comma list (random weights).")] = (
        "ouro-1.4b,huginn-0125"),
    input_lens: Annotated[str | None, typer.Option(
        help="Prompt lengths, comma list; 'max' = the longest the model's context allows (default 2048, "
             "less where the model's context is shorter).")] = None,
    concurrency: Annotated[int, typer.Option(help="Prompts per burst (all sent at once).")] = 8,
    output_len: Annotated[int, typer.Option(help="Generated tokens per request (EOS ignored).")] = 4,
    repeats: Annotated[int, typer.Option(help="Repetitions (policy order reversed each time).")] = 2,
    arms: armspec.ArmsOption = "torch",
    kv_layout: Annotated[str, typer.Option(help="Huginn KV layout (full, compress).")] = "full",
    max_num_batched_tokens: Annotated[int, typer.Option(
        help="Prefill token budget per step, the same for both policies (packing needs >= 2 prompts' "
             "worth).")] = 8192,
    block_size: runtime.BlockSizeOption = 16,
    enforce_eager: runtime.EnforceEagerOption = False,
    prefill_graphs: runtime.PrefillGraphsOption = True,
    seed: runtime.SeedOption = 0,
    dtype: runtime.DtypeOption = None,
    device: runtime.DeviceOption = None,
    result_dir: runtime.ResultDirOption = None,
) -> None:
    """Long-prompt bursts: packed, chunked prefill against one request per prefill step (TTFT, prefill
    step time, their ratio beside the A/A spread, token identity)."""
    if concurrency < 2:
        raise UsageError("--concurrency must be >= 2 (one prompt cannot be packed)")
    if output_len < 1 or repeats < 1:
        raise UsageError("--output-len and --repeats must be >= 1")
    if kv_layout not in KV_LAYOUTS:
        raise UsageError(f"--kv-layout: use one of {', '.join(KV_LAYOUTS)}")
    runtime.check_engine_flags(EngineConfig(block_size=block_size,
                                            max_num_batched_tokens=max_num_batched_tokens))
    names = list(dict.fromkeys(s.strip() for s in models.split(",") if s.strip()))
    if not names:
        raise UsageError("--models is empty")
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
    typer.echo((path / "table.md").read_text())
    typer.echo(f"results: {path}")
