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
from rltbench import runtime
from rltbench.backends.base import Timeouts, parse_servers
from rltbench.backends.engine import parse_exit_modes, parse_prefix_cache
from rltbench.bench.workload import DEFAULT_TRACE, SMALL_MODEL_TRACE
from rltbench.commands.e2e.job import BURST, CPU_CONCURRENCY, GPU_CONCURRENCY, SESSION, E2ESpec, run
from rltbench.commands.e2e.rate import DEFAULT_DURATION_S, DEFAULT_SWEEP_RATES, RATE, rate_spec_of
from rltbench.commands.e2e.session import SessionSpec, session_spec_of
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
        str, typer.Option(help="burst (C requests at once), session (trace replay) or rate (open-loop "
                          "arrivals at --request-rate).")
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
        typer.Option(help="Ouro exit gate threshold in (0, 1]: each token exits at the first loop whose "
                          "exit CDF, in the model dtype, reaches it (the reference rule; default: a "
                          "checkpoint's own, 1.0 included); exit depths are recorded and compared like "
                          "tokens."),
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
    sweep_rates: Annotated[int | None, typer.Option(
        help=f"rate: rates of a sweep between the synchronous and saturated ones (default "
             f"{DEFAULT_SWEEP_RATES}).")] = None,
    arrivals: Annotated[str | None, typer.Option(
        help="rate: poisson (default), gamma (shape --burstiness) or constant gaps.")] = None,
    burstiness: Annotated[float | None, typer.Option(
        help="rate: gamma shape of the gaps (1 = Poisson, < 1 burstier), mean rate kept.")] = None,
    max_concurrency: Annotated[int | None, typer.Option(
        help="rate: requests in flight at most; later arrivals wait client-side (queue delay).")] = None,
    num_prompts: Annotated[int | None, typer.Option(help="rate: requests per rate cell.")] = None,
    duration: Annotated[float | None, typer.Option(
        help=f"rate: seconds of arrivals per rate cell (default {DEFAULT_DURATION_S:g}).")] = None,
    lengths: Annotated[str | None, typer.Option(
        help="rate: request lengths drawn from a distribution of workloads/lengths/, a session preset's "
             "trace or a JSONL file (input_length, output_length); default --input-len/--output-len.")
    ] = None,
    random_range_ratio: Annotated[float | None, typer.Option(
        help="rate: each length uniform within +-ratio of --input-len/--output-len (default 0).")] = None,
    exclude_head: Annotated[float | None, typer.Option(
        help="rate: share of each cell's first requests left out of its figures (warm-up; 0.1).")] = None,
    exclude_tail: Annotated[float | None, typer.Option(
        help="rate: share of each cell's last requests left out of its figures (cool-down; 0.1).")] = None,
    slo: Annotated[str | None, typer.Option(
        help="rate: SLO terms METRIC:MS or METRIC:pNN:MS (ttft, tpot, e2el), e.g. ttft:500,tpot:50: "
             "per cell its share and goodput, per arm the SLO capacity.")] = None,
    slo_attainment: Annotated[float | None, typer.Option(
        help="rate: share of requests that must meet a term without its own pNN (default 0.9).")] = None,
    saturation_margin: Annotated[float | None, typer.Option(
        help="rate: a cell saturates when its achieved rate falls short of the offered one by more "
             "than this share, or its TTFT grows by more than this many s per s (default 0.1).")] = None,
    ignore_eos: Annotated[bool | None, typer.Option(
        help="rate: exactly --output-len tokens per request, EOS ignored (default on).")] = None,
    think_time: Annotated[float | None, typer.Option(
        help="session: ms between a turn's last token and the conversation's next turn, sent then instead "
             "of at its trace arrival (default off: trace arrivals).")] = None,
    think_time_stddev: Annotated[float | None, typer.Option(
        help="session: think times drawn from a normal of this standard deviation (ms), clipped at 0.")
    ] = None,
    cache_bust: Annotated[str | None, typer.Option(
        help="session: off (default), session (unique first tokens per conversation and repetition: only "
             "a conversation's own turns can hit a prefix cache) or request (no hit possible).")] = None,
) -> None:
    """Serving benchmark: burst, session or open-loop rate loads, arms interleaved, TTFT/TPOT/ITL/E2E,
    tok/s, SLO capacity, identity."""
    t_start = time.perf_counter()
    if workload not in (BURST, SESSION, RATE):
        raise UsageError(f"--workload must be burst, session or rate, not {workload!r}")
    rate = rate_spec_of(workload, dict(
        request_rate=request_rate, sweep_rates=sweep_rates, arrivals=arrivals, burstiness=burstiness,
        max_concurrency=max_concurrency, num_prompts=num_prompts, duration=duration, lengths=lengths,
        random_range_ratio=random_range_ratio, exclude_head=exclude_head, exclude_tail=exclude_tail, slo=slo,
        slo_attainment=slo_attainment, saturation_margin=saturation_margin, ignore_eos=ignore_eos,
    ), {"--concurrency": concurrency, "--trace": trace, "--trace-time-scale": trace_time_scale,
        "--max-requests": max_requests, "--trace-length-scale": trace_length_scale})
    session_opts = session_spec_of(workload, think_time, think_time_stddev, cache_bust)
    if backend not in ("engine", "openai"):
        raise UsageError(f"--backend must be engine or openai, not {backend!r}")
    if repeats is None:
        repeats = 2 if workload == BURST else 3
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
    if backend == "openai" and (cache or exit_threshold is not None or never_exit or any(modes)):
        raise UsageError("--prefix-cache, --exit-threshold, --never-exit and --exit-mode are engine options "
                         "(a server sets its own)")
    if len(modes) > 1 and len(set(cache)) > 1:
        raise UsageError("--exit-mode all,stop and --prefix-cache off,on: vary one of them per run")
    spec = E2ESpec(
        source=runtime.ModelSource(model, weights, seed, exit_threshold=exit_threshold,
                                   stop_at_exit=any(modes), never_exit=never_exit),
        arms=(armspec.parse_arms(arms, armspec.override_flags(norm, rope, act, scope))
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
        rate=rate,
        session_spec=session_opts or SessionSpec(),
    )
    _path, mismatch = run(spec)
    if mismatch:
        raise typer.Exit(code=1)  # an exact arm changed tokens on the reference's own batches
