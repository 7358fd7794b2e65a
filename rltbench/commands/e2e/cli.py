"""`rltbench e2e`: serving loads (burst / session / rate) across kernel arms, on the engine or OpenAI
servers.

Flag names follow vLLM where the meaning is the same (--input-len, --output-len, --max-num-seqs,
--max-num-batched-tokens, --block-size, --enforce-eager, --result-dir, --seed, --dtype,
--served-model-name, --request-rate, --burstiness, --max-concurrency, --num-prompts,
--random-range-ratio). The metric definitions are docs/contracts/e2e.md's (printed in table.md).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Annotated

import typer

from rltbench import arms as armspec
from rltbench import options
from rltbench.backends.base import Timeouts, parse_servers
from rltbench.bench.workload_defaults import DEFAULT_TRACE, SMALL_MODEL_TRACE
from rltbench.commands.e2e.defaults import (
    BURST,
    CPU_CONCURRENCY,
    DEFAULT_CELL_LATENCIES,
    DEFAULT_DURATION_S,
    DEFAULT_SWEEP_RATES,
    GPU_CONCURRENCY,
    MAX_BURSTINESS,
    MAX_CELL_REQUESTS,
    MAX_DURATION_S,
    MIN_CELL_REQUESTS,
    RATE,
    SESSION,
)
from rltbench.engine.types import EngineConfig
from rltbench.errors import UsageError


def e2e_command(
    model: options.ModelOption = "ouro-1.4b",
    weights: options.WeightsOption = "random",
    arms: armspec.ArmsOption = "torch,exact,approx",
    norm: armspec.NormOption = None,
    rope: armspec.RopeOption = None,
    act: armspec.ActOption = None,
    scope: armspec.ScopeOption = None,
    workload: Annotated[
        str, typer.Option(help="burst (C requests at once), session (trace replay) or rate (open-loop "
                          "arrivals at --request-rate).")
    ] = BURST,
    concurrency: Annotated[
        str | None, typer.Option(help=f"Burst sizes C, comma list (default {GPU_CONCURRENCY}; on CPU "
                                 f"{CPU_CONCURRENCY}).")
    ] = None,
    input_len: options.BurstInputLenOption = None,
    output_len: options.BurstOutputLenOption = None,
    repeats: Annotated[
        int | None,
        options.number("Repetitions, arm order reversed each time (default: burst 2, session 3).", ge=1),
    ] = None,
    seed: options.SeedOption = 0,
    trace: Annotated[
        str | None, typer.Option(help=f"Session trace: JSONL path or preset of workloads/presets.json "
                                 f"(default {DEFAULT_TRACE}; {SMALL_MODEL_TRACE} for a model too short "
                                 "for its records).")
    ] = None,
    trace_time_scale: Annotated[
        float | None, options.number("Multiply trace arrival times (0.1 = 10x faster, 0 = all at once).",
                                     ge=0, le=options.MAX_TRACE_SCALE)
    ] = None,
    trace_length_scale: Annotated[
        float | None, options.number("Multiply trace lengths and the 512-token hash block.",
                                     gt=0, le=options.MAX_TRACE_SCALE)
    ] = None,
    max_requests: Annotated[
        int | None, options.number("Replay only the first N trace records.", ge=1)
    ] = None,
    kv_cache_gib: options.KvCacheGibOption = None,
    max_num_seqs: Annotated[
        int | None, options.number("Engine batch limit (default: max C; session 128).", ge=1)
    ] = None,
    max_num_batched_tokens: options.MaxNumBatchedTokensOption = 2048,
    block_size: options.BlockSizeOption = 16,
    enforce_eager: options.EnforceEagerOption = False,
    prefill_graphs: options.PrefillGraphsOption = True,
    dtype: options.DtypeOption = None,
    device: options.DeviceOption = None,
    result_dir: options.ResultDirOption = None,
    backend: options.BackendOption = "engine",
    arm: options.ServersOption = None,
    served_model_name: Annotated[
        str | None, typer.Option(help="openai backend: model field (default: first of /v1/models).")
    ] = None,
    warmup_requests: Annotated[int, options.number("Warm-up burst size per arm (not measured).", ge=0)] = 4,
    ttft_timeout: options.TtftTimeoutOption = 300.0,
    stall_timeout: options.StallTimeoutOption = 120.0,
    deadline: Annotated[
        float, options.number("Global deadline for the whole run (s, 0 = none).", ge=0)
    ] = 0.0,
    live: Annotated[bool, typer.Option(help="Rich live table (off when not a terminal).")] = True,
    prefix_cache: Annotated[
        str | None,
        typer.Option(help="on, off, or both (off,on): every arm runs with the cache off (its own name, "
                          "the reference) and on (NAME+cache), interleaved like arms (default: sessions on, "
                          "bursts off)."),
    ] = None,
    exit_threshold: Annotated[
        float | None,
        options.number("Ouro exit gate threshold in (0, 1]: each token exits at the first loop whose exit "
                       "CDF, in the model dtype, reaches it (the reference rule; default: a checkpoint's "
                       "own, 1.0 included); exit depths are recorded and compared like tokens.", gt=0, le=1),
    ] = None,
    never_exit: Annotated[
        bool,
        typer.Option(help="Ouro: ignore the exit gate, every token takes the last loop (how vLLM reads a "
                          "checkpoint's threshold 1.0)."),
    ] = False,
    exit_mode: Annotated[
        str,
        typer.Option(help="With an exit threshold: all (every loop runs, the reference semantics), stop "
                          "(compute-saving, labelled: a decode step stops its loops once every row has "
                          "exited; a token's later-loop K/V are its exit loop's, so tokens can differ "
                          "from 'all'), or both (all,stop): every arm runs both ways, interleaved, the "
                          "compute-saving run named NAME+stop and compared with torch+stop."),
    ] = "all",
    request_rate: Annotated[str | None, typer.Option(
        help="rate: requests/s, a comma list, or sweep (default): the synchronous rate, the saturated "
             "throughput and --sweep-rates rates between, stopping when every arm saturates.")] = None,
    sweep_rates: Annotated[int | None, options.number(
        f"rate: rates of a sweep between the synchronous and saturated ones (default {DEFAULT_SWEEP_RATES}).",
        ge=1)] = None,
    arrivals: Annotated[str | None, typer.Option(
        help="rate: poisson (default), gamma (shape --burstiness) or constant gaps.")] = None,
    burstiness: Annotated[float | None, options.number(
        "rate: gamma shape of the gaps (1 = Poisson, < 1 burstier), mean rate kept.",
        gt=0, le=MAX_BURSTINESS)] = None,
    max_concurrency: Annotated[int | None, options.number(
        "rate: requests in flight at most; later arrivals wait client-side (queue delay).", ge=1)] = None,
    num_prompts: Annotated[int | None, options.number("rate: requests per rate cell.", ge=1,
                                                      le=MAX_CELL_REQUESTS)] = None,
    duration: Annotated[float | None, options.number(
        f"rate: seconds of arrivals per rate cell, exactly (default: a sweep sizes cells by "
        f"--cell-latencies, listed rates take {DEFAULT_DURATION_S:g}).", gt=0, le=MAX_DURATION_S)] = None,
    cell_latencies: Annotated[float | None, options.number(
        f"rate sweep: each cell's arrivals last K x the synchronous request latency of the probe "
        f"(default {DEFAULT_CELL_LATENCIES:g}; at least {MIN_CELL_REQUESTS} requests).", ge=1, le=1000)
    ] = None,
    lengths: Annotated[str | None, typer.Option(
        help="rate: request lengths drawn from a distribution of workloads/lengths/, a session preset's "
             "trace or a JSONL file (input_length, output_length); default --input-len/--output-len.")
    ] = None,
    random_range_ratio: Annotated[float | None, options.number(
        "rate: each length uniform within +-ratio of --input-len/--output-len (default 0).", ge=0, lt=1)
    ] = None,
    exclude_head: Annotated[float | None, options.number(
        "rate: share of each cell's first requests left out of its figures (warm-up; 0.1).", ge=0, lt=1)
    ] = None,
    exclude_tail: Annotated[float | None, options.number(
        "rate: share of each cell's last requests left out of its figures (cool-down; 0.1).", ge=0, lt=1)
    ] = None,
    slo: Annotated[str | None, typer.Option(
        help="rate: SLO terms METRIC:MS or METRIC:pNN:MS (ttft, tpot, e2el), e.g. ttft:500,tpot:50: "
             "per cell its share and goodput, per arm the SLO capacity.")] = None,
    slo_attainment: Annotated[float | None, options.number(
        "rate: share of requests that must meet a term without its own pNN (default 0.9).", gt=0, lt=1)
    ] = None,
    saturation_margin: Annotated[float | None, options.number(
        "rate: a cell saturates when its achieved rate falls short of the offered one by more than this "
        "share (default 0.1), or its later half's median TTFT is twice the earlier half's.", gt=0, lt=1)
    ] = None,
    ignore_eos: Annotated[bool | None, typer.Option(
        help="rate: exactly --output-len tokens per request, EOS ignored (default on).")] = None,
    think_time: Annotated[float | None, options.number(
        "session: ms between a turn's last token and the conversation's next turn, sent then instead "
        "of at its trace arrival (default off: trace arrivals).", ge=0, le=3_600_000)] = None,
    think_time_stddev: Annotated[float | None, options.number(
        "session: think times drawn from a normal of this standard deviation (ms), clipped at 0.",
        ge=0, le=3_600_000)] = None,
    cache_bust: Annotated[str | None, typer.Option(
        help="session: off (default), session (unique first tokens per conversation and repetition: only "
             "a conversation's own turns can hit a prefix cache) or request (no hit possible).")] = None,
) -> None:
    """Serving benchmark: burst, session or open-loop rate loads, arms interleaved, TTFT/TPOT/ITL/E2E,
    tok/s, SLO capacity, identity."""
    t_start = time.perf_counter()
    # torch and the engine: loaded when the command runs, not for `rltbench e2e --help`
    from rltbench import runtime
    from rltbench.backends.engine import parse_exit_modes, parse_prefix_cache
    from rltbench.commands.e2e.job import E2ESpec, run
    from rltbench.commands.e2e.rate import rate_spec_of
    from rltbench.commands.e2e.session import SessionSpec, session_spec_of

    if workload not in (BURST, SESSION, RATE):
        raise UsageError(f"--workload must be burst, session or rate, not {workload!r}")
    rate = rate_spec_of(workload, dict(
        request_rate=request_rate, sweep_rates=sweep_rates, arrivals=arrivals, burstiness=burstiness,
        max_concurrency=max_concurrency, num_prompts=num_prompts, duration=duration,
        cell_latencies=cell_latencies, lengths=lengths,
        random_range_ratio=random_range_ratio, exclude_head=exclude_head, exclude_tail=exclude_tail, slo=slo,
        slo_attainment=slo_attainment, saturation_margin=saturation_margin, ignore_eos=ignore_eos,
    ), {"--concurrency": concurrency, "--trace": trace, "--trace-time-scale": trace_time_scale,
        "--max-requests": max_requests, "--trace-length-scale": trace_length_scale})
    session_opts = session_spec_of(workload, think_time, think_time_stddev, cache_bust)
    if backend not in ("engine", "openai"):
        raise UsageError(f"--backend must be engine or openai, not {backend!r}")
    if repeats is None:
        repeats = 2 if workload == BURST else 3
    engine = EngineConfig(kv_cache_gib=kv_cache_gib, block_size=block_size,
                          max_num_batched_tokens=max_num_batched_tokens, use_cuda_graph=not enforce_eager,
                          prefill_graphs=prefill_graphs)
    seqs = 1 if max_num_seqs is None else max_num_seqs  # None: sized to the load later
    runtime.check_engine_flags(dataclasses.replace(engine, max_num_seqs=seqs))
    if backend == "engine" and arm:
        raise UsageError("--arm NAME=URL is for --backend openai; the engine backend takes --arms")
    if backend == "openai" and not arm:
        raise UsageError("--backend openai needs --arm NAME=URL (one per server)")
    cache = parse_prefix_cache(prefix_cache) if prefix_cache is not None else ()
    modes = parse_exit_modes(exit_mode)
    if backend == "openai" and (cache or exit_threshold is not None or never_exit or any(modes)):
        raise UsageError("--prefix-cache, --exit-threshold, --never-exit and --exit-mode are engine options "
                         "(a server sets its own)")
    if len(modes) > 1 and len(set(cache)) > 1:
        raise UsageError("--exit-mode all,stop and --prefix-cache off,on: vary one of them per run")
    spec = E2ESpec(
        source=runtime.ModelSource(model, weights, seed, exit_threshold=exit_threshold,
                                   stop_at_exit=any(modes), never_exit=never_exit),
        arms=(armspec.parse_arms(arms, armspec.override_flags(norm, rope, act, scope),
                                 graphs=not enforce_eager and runtime.resolve_device(device) == "cuda")
              if backend == "engine" else {}),
        servers=parse_servers(arm or []),
        workload=workload,
        concurrency=None if concurrency is None else options.parse_concurrency(concurrency),
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
        rate=rate,
        session_spec=session_opts or SessionSpec(),
    )
    _path, code = run(spec)
    if code:  # 1: an exact arm changed tokens on the reference's own batches; 3: an arm not exercised
        raise typer.Exit(code=code)
