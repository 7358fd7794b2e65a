"""`rltbench pd`: prefill on one device and decode on another, in two processes, against the colocated
engine on one device: what moving a looped model's KV costs (docs/pd.md).

A command of its own rather than an e2e preset: it starts and supervises two processes joined by
torch.distributed, moves KV between two engines, and reports transfer figures (bytes per request and
per token, transfer time against prefill time) that e2e has no place for. What the two share comes
from the library: the burst workload and cell order (bench.workload), the engine backend
(backends.engine), the metrics (results.serving) and the paired statistics (results.serving_stats).
"""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer

from rltbench import options


def pd_command(
    model: options.ModelOption = "ouro-1.4b",
    weights: options.WeightsOption = "random",
    kv_layout: Annotated[
        str | None, typer.Option(help="Huginn KV layout: full (one plane per layer application) or compress.")
    ] = None,
    arm: Annotated[
        str,
        typer.Option(
            help="The kernel arm both engines run: torch, exact, approx, cuda or NAME=norm:exact/..."
        ),
    ] = "exact",
    devices: Annotated[
        str | None,
        typer.Option(
            help="Prefill,decode devices: cuda:0,cuda:1 | cuda:0,cuda:0 | cpu,cpu "
            "(default: two GPUs if present, else one GPU twice, else cpu,cpu)."
        ),
    ] = None,
    backend: Annotated[
        str, typer.Option(help="Payload transport: auto (NCCL between two GPUs, else gloo), nccl or gloo.")
    ] = "auto",
    concurrency: Annotated[str, typer.Option(help="Burst sizes C, comma list.")] = "1,8,32",
    input_len: options.BurstInputLenOption = None,
    output_len: options.BurstOutputLenOption = None,
    repeats: Annotated[int, options.number("Repetitions; mode order reversed each time.", ge=1)] = 2,
    aa: Annotated[
        bool, typer.Option(help="Run the colocated engine twice per cell (A/A noise floor).")
    ] = True,
    seed: options.SeedOption = 0,
    transfer_budget_gib: Annotated[
        float, options.number("Packed KV in flight at most (GiB; one request always goes).",
                              gt=0, le=options.MAX_GIB)
    ] = 2.0,
    transfer_timeout: Annotated[
        float, options.number("Deadline of each transfer message (s).", gt=0)
    ] = 60.0,
    ttft_timeout: options.TtftTimeoutOption = 300.0,
    stall_timeout: options.StallTimeoutOption = 120.0,
    deadline: Annotated[
        float, options.number("No new cell after this many seconds (0 = none).", ge=0)
    ] = 0.0,
    max_num_batched_tokens: options.MaxNumBatchedTokensOption = 2048,
    block_size: options.BlockSizeOption = 16,
    enforce_eager: options.EnforceEagerOption = False,
    prefill_graphs: options.PrefillGraphsOption = True,
    dtype: options.DtypeOption = None,
    warmup_requests: Annotated[
        int, options.number("Colocated warm-up burst size (not measured).", ge=0)
    ] = 4,
    probe_reps: Annotated[
        int, options.number("Idle-link transfers of one request's KV (timed).", ge=1)
    ] = 5,
    result_dir: options.ResultDirOption = None,
) -> None:
    """Prefill/decode disaggregation: KV bytes moved, transfer vs prefill time, TTFT/TPOT vs colocated."""
    t_start = time.perf_counter()
    from rltbench.commands.pd.launch import run  # torch: loaded when the command runs, not for its --help

    opts: dict[str, Any] = dict(
        model=model,
        weights=weights,
        kv_layout=kv_layout,
        arm=arm,
        devices=devices,
        backend=backend,
        concurrency=concurrency,
        input_len=input_len,
        output_len=output_len,
        repeats=repeats,
        aa=aa,
        seed=seed,
        transfer_budget_gib=transfer_budget_gib,
        transfer_timeout=transfer_timeout,
        ttft_timeout=ttft_timeout,
        stall_timeout=stall_timeout,
        deadline=(t_start + deadline) if deadline > 0 else None,
        deadline_s=deadline,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        enforce_eager=enforce_eager,
        prefill_graphs=prefill_graphs,
        dtype=dtype,
        warmup_requests=warmup_requests,
        probe_reps=probe_reps,
        result_dir=result_dir,
        argv=list(sys.argv),
    )
    rc = run(opts)
    if rc:
        raise typer.Exit(code=rc)
