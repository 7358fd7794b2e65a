"""`rltbench e2e`: serving loads (burst / session) across kernel arms, on the engine or OpenAI servers.

Flag names follow vLLM where the meaning is the same (--input-len, --output-len, --max-num-seqs,
--max-num-batched-tokens, --block-size, --enforce-eager, --result-dir, --seed, --dtype,
--served-model-name). The metric definitions are docs/contracts/e2e.md's (printed in table.md).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Annotated

import typer

from rltbench import arms as armspec
from rltbench import runtime
from rltbench.backends.base import Timeouts, parse_servers
from rltbench.backends.engine import parse_exit_modes, parse_prefix_cache
from rltbench.bench.workload import DEFAULT_TRACE, SMALL_MODEL_TRACE
from rltbench.commands.e2e.job import BURST, CPU_CONCURRENCY, GPU_CONCURRENCY, SESSION, E2ESpec, run
from rltbench.engine.types import EngineConfig
from rltbench.errors import UsageError


def e2e_command(
    model: runtime.ModelOption = "ouro-1.4b",
    weights: runtime.WeightsOption = "random",
    arms: armspec.ArmsOption = "torch,exact,approx",
    norm: armspec.NormOption = None,
    rope: armspec.RopeOption = None,
    act: armspec.ActOption = None,
    scope: armspec.ScopeOption = None,
    workload: Annotated[
        str, typer.Option(help="burst (C requests at once) or session (trace replay).")
    ] = BURST,
    concurrency: Annotated[
        str | None, typer.Option(help=f"Burst sizes C, comma list (default {GPU_CONCURRENCY}; on CPU "
                                 f"{CPU_CONCURRENCY}).")
    ] = None,
    input_len: runtime.BurstInputLenOption = None,
    output_len: runtime.BurstOutputLenOption = None,
    repeats: Annotated[
        int | None,
        typer.Option(help="Repetitions, arm order reversed each time (default: burst 2, session 3)."),
    ] = None,
    seed: runtime.SeedOption = 0,
    trace: Annotated[
        str | None, typer.Option(help=f"Session trace: JSONL path or preset of workloads/presets.json "
                                 f"(default {DEFAULT_TRACE}; {SMALL_MODEL_TRACE} for a model too short "
                                 "for its records).")
    ] = None,
    trace_time_scale: Annotated[
        float | None, typer.Option(help="Multiply trace arrival times (0.1 = 10x faster, 0 = all at once).")
    ] = None,
    trace_length_scale: Annotated[
        float | None, typer.Option(help="Multiply trace lengths and the 512-token hash block.")
    ] = None,
    max_requests: Annotated[int | None, typer.Option(help="Replay only the first N trace records.")] = None,
    kv_cache_gib: runtime.KvCacheGibOption = None,
    max_num_seqs: Annotated[
        int | None, typer.Option(help="Engine batch limit (default: max C; session 128).")
    ] = None,
    max_num_batched_tokens: runtime.MaxNumBatchedTokensOption = 2048,
    block_size: runtime.BlockSizeOption = 16,
    enforce_eager: runtime.EnforceEagerOption = False,
    prefill_graphs: runtime.PrefillGraphsOption = True,
    dtype: runtime.DtypeOption = None,
    device: runtime.DeviceOption = None,
    result_dir: runtime.ResultDirOption = None,
    backend: runtime.BackendOption = "engine",
    arm: runtime.ServersOption = None,
    served_model_name: Annotated[
        str | None, typer.Option(help="openai backend: model field (default: first of /v1/models).")
    ] = None,
    warmup_requests: Annotated[int, typer.Option(help="Warm-up burst size per arm (not measured).")] = 4,
    ttft_timeout: Annotated[float, typer.Option(help="Per-request first-token timeout (s).")] = 300.0,
    stall_timeout: Annotated[float, typer.Option(help="Per-request timeout between tokens (s).")] = 120.0,
    deadline: Annotated[float, typer.Option(help="Global deadline for the whole run (s, 0 = none).")] = 0.0,
    live: Annotated[bool, typer.Option(help="Rich live table (off when not a terminal).")] = True,
    prefix_cache: Annotated[
        str | None,
        typer.Option(help="on, off, or both (off,on): every arm runs with the cache off (its own name, "
                          "the reference) and on (NAME+cache), interleaved like arms (default: sessions on, "
                          "bursts off)."),
    ] = None,
    exit_threshold: Annotated[
        float | None,
        typer.Option(help="Ouro exit gate threshold in (0, 1): each token exits at the first loop whose "
                          "exit CDF reaches it; exit depths are recorded and compared like tokens."),
    ] = None,
    exit_mode: Annotated[
        str,
        typer.Option(help="With --exit-threshold: all (every loop runs, the reference semantics), stop "
                          "(compute-saving, labelled: a decode step stops its loops once every row has "
                          "exited; a token's later-loop K/V are its exit loop's, so tokens can differ "
                          "from 'all'), or both (all,stop): every arm runs both ways, interleaved, the "
                          "compute-saving run named NAME+stop and compared with torch+stop."),
    ] = "all",
) -> None:
    """Serving benchmark: burst or session loads, arms interleaved, TTFT/TPOT/ITL/E2E, tok/s, identity."""
    t_start = time.perf_counter()
    if workload not in (BURST, SESSION):
        raise UsageError(f"--workload must be burst or session, not {workload!r}")
    if backend not in ("engine", "openai"):
        raise UsageError(f"--backend must be engine or openai, not {backend!r}")
    if repeats is None:
        repeats = 3 if workload == SESSION else 2
    if repeats < 1:
        raise UsageError("--repeats must be >= 1")
    if (input_len is not None and input_len < 1) or (output_len is not None and output_len < 1):
        raise UsageError("--input-len and --output-len must be >= 1")
    if ttft_timeout <= 0 or stall_timeout <= 0 or deadline < 0:
        raise UsageError("--ttft-timeout/--stall-timeout must be > 0 and --deadline >= 0")
    if warmup_requests < 0:
        raise UsageError("--warmup-requests must be >= 0")
    engine = EngineConfig(kv_cache_gib=kv_cache_gib, block_size=block_size,
                          max_num_batched_tokens=max_num_batched_tokens, use_cuda_graph=not enforce_eager,
                          prefill_graphs=prefill_graphs)
    seqs = 1 if max_num_seqs is None else max_num_seqs  # None: sized to the load later
    runtime.check_engine_flags(dataclasses.replace(engine, max_num_seqs=seqs))
    if max_requests is not None and max_requests < 1:
        raise UsageError("--max-requests must be >= 1")
    if backend == "engine" and arm:
        raise UsageError("--arm NAME=URL is for --backend openai; the engine backend takes --arms")
    if backend == "openai" and not arm:
        raise UsageError("--backend openai needs --arm NAME=URL (one per server)")
    cache = parse_prefix_cache(prefix_cache) if prefix_cache is not None else ()
    modes = parse_exit_modes(exit_mode)
    if backend == "openai" and (cache or exit_threshold is not None or any(modes)):
        raise UsageError("--prefix-cache, --exit-threshold and --exit-mode are engine options (a server sets "
                         "its own)")
    if len(modes) > 1 and len(set(cache)) > 1:
        raise UsageError("--exit-mode all,stop and --prefix-cache off,on: vary one of them per run")
    spec = E2ESpec(
        source=runtime.ModelSource(model, weights, seed, exit_threshold=exit_threshold,
                                   stop_at_exit=any(modes)),
        arms=(armspec.parse_arms(arms, armspec.override_flags(norm, rope, act, scope),
                                 graphs=not enforce_eager and runtime.resolve_device(device) == "cuda")
              if backend == "engine" else {}),
        servers=parse_servers(arm or []),
        workload=workload,
        concurrency=None if concurrency is None else runtime.parse_concurrency(concurrency),
        input_len=input_len,
        output_len=output_len,
        repeats=repeats,
        trace=trace,
        trace_time_scale=trace_time_scale,
        trace_length_scale=trace_length_scale,
        max_requests=max_requests,
        engine=engine,
        max_num_seqs=max_num_seqs,
        dtype=dtype,
        device=device,
        result_dir=result_dir,
        served_model_name=served_model_name,
        warmup_requests=warmup_requests,
        timeouts=Timeouts(ttft_timeout, stall_timeout, (t_start + deadline) if deadline > 0 else None),
        live=live,
        argv=list(sys.argv),
        prefix_cache=cache,
        exit_modes=modes if len(modes) > 1 else (),
    )
    _path, code = run(spec)
    if code:  # 1: an exact arm changed tokens on the reference's own batches; 3: an arm not exercised
        raise typer.Exit(code=code)
