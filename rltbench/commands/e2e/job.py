"""Glue of `rltbench e2e`: a validated E2ESpec -> model/engine or servers -> plan -> run dir -> report.

Kept apart from cli.py (flags -> spec) so tests and scripts can call `run(spec)` or `make_plan(...)`
directly, with a fake or real backend.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rltbench import runtime
from rltbench.arms import NOT_EXERCISED, ArmSpec, eager_kernel_arms, is_exact, reference_arm, scope_notes
from rltbench.backends.base import Request, Timeouts
from rltbench.backends.engine import EngineBackend, EngineVariant, exit_mode_variants, prefix_cache_variants
from rltbench.backends.openai import OpenAIBackend
from rltbench.bench.lengths import LengthSource
from rltbench.bench.workload import (
    BURST_INPUT_LEN,
    BURST_OUTPUT_LEN,
    Cell,
    SessionTrace,
    burst_prompts,
    default_trace,
    fit_burst_lengths,
    load_trace,
    materialize_session,
    resolve_trace,
    theoretical_prefix_hit_rate,
    warmup_prompts,
)
from rltbench.commands.e2e import report
from rltbench.commands.e2e.defaults import (
    BURST,
    CPU_CONCURRENCY,
    DEFAULT_DURATION_S,
    GPU_CONCURRENCY,
    INTERPRETER_CONCURRENCY,
    INTERPRETER_LENGTHS,
    SESSION,
)
from rltbench.commands.e2e.display import RunDisplay
from rltbench.commands.e2e.rate import RATE, RateSpec, make_rate_plan, rate_lengths
from rltbench.commands.e2e.runner import SCHEDULE_NOTE, Plan, run_plan
from rltbench.commands.e2e.session import (
    SessionSpec,
    session_prompts,
    session_requests,
    turn_facts,
    warmup_burst,
    warmup_pass,
)
from rltbench.engine.row_invariant import check_model
from rltbench.engine.types import EngineConfig
from rltbench.errors import UsageError
from rltbench.models.configs import OuroConfig, exit_rule
from rltbench.options import parse_concurrency
from rltbench.results import RunDir
from rltbench.results.serving_stats import no_verdict_caption


@dataclass
class E2ESpec:
    """Everything one e2e run needs, validated by the command (`cli.e2e_command`)."""

    source: runtime.ModelSource = field(default_factory=runtime.ModelSource)
    arms: dict[str, ArmSpec] = field(default_factory=dict)  # engine backend
    servers: dict[str, str] = field(default_factory=dict)  # openai backend: arm -> server root
    workload: str = BURST
    # None: chosen by resolve_defaults from the device and the model's context (noted in `notes`)
    concurrency: list[int] | None = None
    input_len: int | None = None
    output_len: int | None = None
    repeats: int = 2
    trace: str | None = None
    trace_time_scale: float | None = None
    trace_length_scale: float | None = None
    max_requests: int | None = None
    # the engine flags (pool size, block size, token budget, graphs); the load sets the rest
    engine: EngineConfig = field(default_factory=EngineConfig)
    max_num_seqs: int | None = None  # None: the largest burst (C), or 128 for a session
    dtype: str | None = None
    device: str | None = None
    result_dir: Path | None = None
    served_model_name: str | None = None
    warmup_requests: int = 4
    timeouts: Timeouts = field(default_factory=Timeouts)
    live: bool = True
    argv: list[str] = field(default_factory=lambda: list(sys.argv))
    notes: list[str] = field(default_factory=list)  # the defaults resolve_defaults chose, said aloud
    # engine backend: the prefix-cache settings every arm runs under, in schedule order (empty: the
    # workload's own, on for sessions, off for bursts); two settings make each arm two variants
    prefix_cache: tuple[bool, ...] = ()
    # engine backend, Ouro with an exit threshold: both exit modes in schedule order (True: the
    # compute-saving exit), each arm then run both ways; empty: the source's one mode
    exit_modes: tuple[bool, ...] = ()
    rate: RateSpec | None = None  # the rate workload's flags (--workload rate)
    session_spec: SessionSpec = field(default_factory=SessionSpec)  # think time, cache busting (sessions)
    lengths: LengthSource | None = None  # the rate workload's request lengths (set by resolve_defaults)

    @property
    def backend(self) -> str:
        return "openai" if self.servers else "engine"

    @property
    def arm_names(self) -> list[str]:
        return list(self.servers or self.variants)

    @property
    def cache_settings(self) -> tuple[bool, ...]:
        return self.prefix_cache or ((self.workload == SESSION),)

    @property
    def exit_varied(self) -> bool:
        return len(set(self.exit_modes)) > 1

    @property
    def exit_mode_text(self) -> str:
        """How the manifest names the exit modes: all, stop, or both in schedule order."""
        modes = self.exit_modes or (self.source.stop_at_exit,)
        return ",".join("stop" if m else "all" for m in modes)

    @property
    def variants(self) -> dict[str, EngineVariant]:
        """The scheduled arms of the engine backend: each kernel arm under each prefix-cache setting,
        or under each exit mode."""
        if self.exit_varied:
            return exit_mode_variants(list(self.arms), self.exit_modes, self.cache_settings[0])
        return prefix_cache_variants(list(self.arms), self.cache_settings)

    @property
    def identity_refs(self) -> dict[str, str]:
        """With the exit mode varied, each compute-saving arm's reference: the reference arm's own
        compute-saving run (which maps to itself). Its tokens are not meant to match every loop."""
        if not self.exit_varied:
            return {}
        variants = self.variants
        ref_arm = variants[reference_arm(list(variants))].engine_arm
        stop_ref = next(n for n, v in variants.items() if v.engine_arm == ref_arm and v.stop_at_exit)
        return {n: stop_ref for n, v in variants.items() if v.stop_at_exit}

    @property
    def cache_varied(self) -> bool:
        return len(set(self.cache_settings)) > 1

    @property
    def seed(self) -> int:
        """Seed of the prompts, the trace blocks and the random weights."""
        return self.source.seed

    @property
    def rate_limit(self) -> int:
        """The rate workload's concurrency limit: the client's --max-concurrency, else the engine's
        batch limit (--max-num-seqs, default 128)."""
        assert self.rate is not None
        return self.rate.max_concurrency or self.max_num_seqs or 128


def load_session(config: Any, spec: E2ESpec, max_model_len: int | None) -> tuple[SessionTrace, dict]:
    """Resolve --trace (path or preset), apply scales (flags override the preset) and materialize."""
    path, preset = resolve_trace(spec.trace)
    ts = preset.get("time_scale", 1.0) if spec.trace_time_scale is None else spec.trace_time_scale
    ls = preset.get("length_scale", 1.0) if spec.trace_length_scale is None else spec.trace_length_scale
    mr = preset.get("max_requests") if spec.max_requests is None else spec.max_requests
    recs = load_trace(path, mr)
    sess = materialize_session(
        config, recs, spec.seed, time_scale=ts, length_scale=ls, max_model_len=max_model_len
    )
    first_rep = session_requests(config, sess.requests, spec.session_spec, spec.seed, 0)
    info = {
        "trace": str(path),
        "time_scale": ts,
        "length_scale": ls,
        "max_requests": mr,
        "records": len(recs),
        "requests": len(sess.requests),
        "dropped_too_long": sess.dropped_too_long,
        "block_size": sess.block_size,
        "theoretical_prefix_hit_rate": theoretical_prefix_hit_rate(first_rep, sess.block_size),
        "mean_input": sum(len(r.prompt) for r in sess.requests) / len(sess.requests),
        "mean_output": sum(r.output_len for r in sess.requests) / len(sess.requests),
        "span_s": sess.requests[-1].arrival,
        **turn_facts(sess.requests),
        **spec.session_spec.config(),
    }
    sess.info = info
    return sess, info


def make_plan(
    config: Any,
    spec: E2ESpec,
    exact_arms: set[str],
    session: SessionTrace | None,
    eager_kernel_arms: set[str] | None = None,
) -> Plan:
    """The cells and prompts of the run (pure: same spec, same prompts). `eager_kernel_arms`: arms
    whose eager steps run their own kernels (scope all), each of which gets a session warm-up pass."""
    arm_names = spec.arm_names
    ref = reference_arm(arm_names)
    if spec.workload == RATE:
        assert spec.rate is not None and spec.lengths is not None
        return make_rate_plan(config, spec.rate, spec.lengths, arms=arm_names, ref=ref, repeats=spec.repeats,
                              seed=spec.seed, warmup_requests=spec.warmup_requests, timeouts=spec.timeouts,
                              exact_arms=exact_arms, limit=spec.rate_limit,
                              eager_arms=eager_kernel_arms or set())
    if session is None:
        cells = [Cell(f"C={c}", c) for c in spec.concurrency]
        cache: dict[tuple[int, int], list[Request]] = {}

        def prompts(cell: Cell, rep: int) -> list[Request]:
            key = (cell.C, rep)
            if key not in cache:
                cache.clear()  # one cell-repetition at a time: keep memory flat at C=128
                cache[key] = burst_prompts(
                    config, cell.C, spec.input_len, spec.output_len, spec.seed, rep, cell.C
                )
            return cache[key]

        n_warm = min(spec.warmup_requests, max(spec.concurrency))
        warm = warmup_prompts(config, n_warm, spec.input_len, min(spec.output_len, 4), spec.seed)
        return Plan(BURST, arm_names, ref, spec.repeats, cells, prompts, warm, spec.timeouts, exact_arms)
    reqs, opts = session.requests, spec.session_spec
    warm = warmup_burst(config, reqs, opts, spec.seed, spec.warmup_requests)
    prompts = session_prompts(config, reqs, opts, spec.seed)
    return Plan(
        SESSION,
        arm_names,
        ref,
        spec.repeats,
        [Cell(SESSION, 0)],
        prompts,
        warm,
        spec.timeouts,
        exact_arms,
        dataclasses.replace(session, requests=prompts(Cell(SESSION, 0), 0)),
        warmup_pass_arms={arm_names[0], *(eager_kernel_arms or ())},
        pass_prompts=warmup_pass(config, reqs, opts, spec.seed),
    )


def interpreter_burst(spec: E2ESpec) -> tuple[list[int] | None, tuple[int | None, int | None], str | None]:
    """(concurrency, (input_len, output_len), note) of a CPU burst whose arms run their kernels through
    the Triton interpreter: each value the user left out becomes the small INTERPRETER_* one, and the
    note says which and why."""
    chosen = {"concurrency": spec.concurrency is None, "input-len": spec.input_len is None,
              "output-len": spec.output_len is None}
    values = {"concurrency": INTERPRETER_CONCURRENCY, "input-len": INTERPRETER_LENGTHS[0],
              "output-len": INTERPRETER_LENGTHS[1]}
    concurrency = (parse_concurrency(INTERPRETER_CONCURRENCY) if chosen["concurrency"]
                   else spec.concurrency)
    lengths = (INTERPRETER_LENGTHS[0] if chosen["input-len"] else spec.input_len,
               INTERPRETER_LENGTHS[1] if chosen["output-len"] else spec.output_len)
    flags = " ".join(f"--{k} {values[k]}" for k, v in chosen.items() if v)
    note = flags and (f"{flags} on CPU: the arm(s) {', '.join(sorted(eager_kernel_arms(spec.arms)))} run "
                      "their kernels through the Triton interpreter, tens of times slower than torch's ops "
                      "(give these flags to run a larger burst)")
    return concurrency, lengths, note or None


def resolve_defaults(spec: E2ESpec) -> E2ESpec:
    """The spec with the defaults that depend on the device and the model filled in, each choice that
    differs from the GPU default noted, so `e2e --model ouro-tiny` works as given: burst lengths that
    fit the model's context (a burst the user sized must fit: UsageError naming the flag), fewer
    burst sizes on CPU (a small burst where arms run the Triton interpreter: `interpreter_burst`),
    and the small-model session trace for a model too short for the default one (sessions drop
    their too-long records, counted). Nothing is built: a bad preset fails here."""
    if spec.backend == "engine":
        dev, _dt, config = runtime.check(spec.source, spec.device, spec.dtype)
    else:
        dev, config = "remote", spec.source.config()
    context = int(config.max_position_embeddings)
    notes = list(spec.notes)
    concurrency = spec.concurrency
    burst_lengths = (spec.input_len, spec.output_len)
    if dev == "cpu" and spec.workload == BURST and eager_kernel_arms(spec.arms):
        concurrency, burst_lengths, note = interpreter_burst(spec)
        notes += [note] if note else []
    if concurrency is None:
        text = CPU_CONCURRENCY if dev == "cpu" else GPU_CONCURRENCY
        concurrency = parse_concurrency(text)
        if dev == "cpu" and spec.workload == BURST:
            notes.append(f"--concurrency {text} on CPU (the GPU default is {GPU_CONCURRENCY})")
    trace = spec.trace
    if spec.workload == SESSION and trace is None:
        trace, note = default_trace(context)
        notes += [note] if note else []
    lengths = None
    if spec.workload == RATE:
        assert spec.rate is not None
        concurrency = None
        lengths, note = rate_lengths(spec.rate, spec.input_len, spec.output_len, spec.trace_length_scale,
                                     context, spec.source.label)
        notes += [note] if note else []
        input_len, output_len = lengths.input_len, lengths.output_len
    elif spec.workload == BURST:
        input_len, output_len, note = fit_burst_lengths(*burst_lengths, context, spec.source.label)
        notes += [note] if note else []
    else:  # a session's lengths come from the trace; these only name the unused burst defaults
        input_len, output_len = spec.input_len or BURST_INPUT_LEN, spec.output_len or BURST_OUTPUT_LEN
    return dataclasses.replace(spec, concurrency=concurrency, input_len=input_len, output_len=output_len,
                               trace=trace, notes=notes, lengths=lengths)


def engine_config(spec: E2ESpec, model_len: int, session: SessionTrace | None) -> tuple[EngineConfig, int]:
    """The engine for the load and the KV blocks it needs at once: max_num_seqs >= max C and a pool
    that holds every burst (C is never shrunk); a session needs its longest request."""
    bs = spec.engine.block_size
    if spec.workload == RATE:  # one request must fit; the pool's size sets how many run at once
        assert spec.lengths is not None
        seqs = spec.max_num_seqs or spec.rate_limit
        per_req = spec.lengths.longest()
        need_blocks = math.ceil(per_req / bs)
    elif session is None:
        cmax = max(spec.concurrency)
        seqs = spec.max_num_seqs or cmax
        if seqs < cmax:
            raise UsageError(f"--max-num-seqs {seqs} < max concurrency {cmax}: C would be shrunk silently")
        per_req = spec.input_len + spec.output_len
        need_blocks = cmax * math.ceil(per_req / bs)
    else:
        seqs = spec.max_num_seqs or 128
        per_req = max(len(r.prompt) + r.output_len for r in session.requests)
        need_blocks = math.ceil(per_req / bs)
    cfg = dataclasses.replace(spec.engine, max_num_seqs=seqs, enable_prefix_caching=any(spec.cache_settings),
                              max_model_len=min(per_req, model_len))
    return cfg, need_blocks


def _engine_side(spec: E2ESpec) -> tuple[Any, Any, dict[str, Any], SessionTrace | None, dict | None]:
    """(backend, model config, facts for the manifest, session, session info) of the engine backend.
    Everything that can fail without weights (device, dtype, preset or checkpoint, trace, lengths)
    fails before a 1.4B model is built."""
    dev, dt, config = runtime.check(spec.source, spec.device, spec.dtype)
    max_len = int(config.max_position_embeddings)
    if spec.workload == SESSION:
        load_session(config, spec, max_len)
    model, _tok = runtime.load(spec.source, dev, dt)
    config = model.config
    session, sess_info = load_session(config, spec, max_len) if spec.workload == SESSION else (None, None)
    ecfg, need_blocks = engine_config(spec, max_len, session)
    engine = runtime.build_engine(model, spec.arms, ecfg, need_blocks)
    facts = {
        "device": dev,
        "dtype": runtime.dtype_name(dt),
        "random_weights": bool(getattr(model, "random_weights", spec.source.random)),
        "exit_threshold": getattr(model, "exit_threshold", None),  # the gate's, None: not evaluated
    }
    backend = EngineBackend(engine, spec.arm_names, variants=spec.variants)
    return backend, config, facts, session, sess_info


def _server_side(spec: E2ESpec) -> tuple[Any, Any, dict[str, Any], SessionTrace | None, dict | None]:
    """The same for the openai backend: the model config (for prompt ids) comes from the preset or
    the checkpoint's config.json; the servers hold the weights."""
    config = spec.source.config()
    max_len = int(config.max_position_embeddings)
    session, sess_info = load_session(config, spec, max_len) if spec.workload == SESSION else (None, None)
    facts = {"device": "remote", "dtype": "server", "random_weights": spec.source.random}
    return OpenAIBackend(spec.servers, spec.served_model_name), config, facts, session, sess_info


def run(spec: E2ESpec) -> tuple[Path, int]:
    """Everything after flag parsing: returns the run directory and the exit code (report.exit_code:
    1 an exact arm mismatched under schedule replay, 3 an arm's kernels were not exercised, else 0)."""
    spec = resolve_defaults(spec)
    engine_side = spec.backend == "engine"
    backend, config, facts, session, sess_info = (_engine_side if engine_side else _server_side)(spec)
    arm_names = spec.arm_names
    if engine_side:
        arm_specs, exact_arms, own_eager = _variant_facts(spec)
    else:
        arm_specs = dict(spec.servers)
        exact_arms = {a for a in arm_names if a.split("#")[0] == "exact"}
    if not engine_side:
        own_eager = set()
    plan = make_plan(config, spec, exact_arms, session, own_eager)
    if engine_side and spec.cache_varied:
        plan.replay_ref = _cache_on_reference(spec, plan.ref)
        plan.row_invariant_pairs = _row_invariant_pairs(spec, backend.engine.model)
    if engine_side:
        plan.identity_refs = spec.identity_refs
    cfg = _manifest_config(spec, backend, plan, arm_specs, exact_arms, sess_info, facts)
    notes: list[str] = list(spec.notes)
    if engine_side:
        eng = backend.engine
        why = "not on a GPU" if spec.engine.use_cuda_graph else "--enforce-eager"
        notes += scope_notes(spec.arms, bool(eng.use_graphs), why)
        if isinstance(eng.model.config, OuroConfig):  # which reading of the exit gate ran here
            notes.append(exit_rule(eng.model.config, facts["dtype"]))
        cfg["engine"] = {
            "num_blocks": eng.num_blocks,
            "block_size": eng.config.block_size,
            "max_num_seqs": eng.config.max_num_seqs,
            "max_model_len": eng.max_model_len,
            "max_num_batched_tokens": eng.config.max_num_batched_tokens,
            "prefix_caching": eng.config.enable_prefix_caching,
            "cuda_graphs": eng.use_graphs,
        }
    cfg["notes"] = notes
    run_dir = RunDir.create("e2e", result_dir=spec.result_dir, argv=spec.argv, config=cfg)
    status = "failed"
    with RunDisplay(live=spec.live) as display:
        display.note(f"results: {run_dir.path}  ({backend.hosting})")
        for note in notes:
            display.console.print(f"[yellow]note: {note}[/]", highlight=False, soft_wrap=True)
        caption = no_verdict_caption(cfg)
        if caption:  # the cells print timings as they finish: say first what they are worth
            display.console.print(f"[yellow]note: {caption}; the timings below say nothing of a GPU[/]",
                                  highlight=False)
        try:
            status = run_plan(plan, backend, run_dir, display)
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            extra: dict[str, Any] = {}
            if engine_side:
                extra["engine_stats"] = _arm_stats(backend, arm_names)
            else:
                extra["servers"] = backend.notes
            if status == "deadline":  # the results schema knows running/complete/interrupted/failed
                status, extra["interrupted_by"] = "interrupted", "global deadline (--deadline)"
            a = None
            if status == "interrupted" and "interrupted_by" not in extra and run_dir.stored_nothing():
                run_dir.discard()  # Ctrl-C before the first result: nothing to keep (the CLI says so)
            else:
                run_dir.update_manifest(status=status, **extra)
                try:
                    a = report.render(run_dir.path)
                except Exception as exc:  # a report failure must not hide the measured data
                    display.note(f"[red]report failed: {exc}[/]")
                if status == "interrupted" and a is not None:  # said in the CLI's one line
                    done = sum(1 for c in a.get("cells", []) if not c.get("interrupted"))
                    run_dir.finished = f"{done} finished cells, table.md rendered"
    if a is not None:
        _print_summary(display, a, run_dir.path)
    return run_dir.path, a["summary"]["exit_code"] if a else 0


def _variant_facts(spec: E2ESpec) -> tuple[dict[str, Any], set[str], set[str]]:
    """Per scheduled arm of the engine backend: its settings for the manifest; the arms that must
    reproduce the reference bit for bit (exact arms, and with the cache varied every bitwise arm: the
    prefix cache must not change a token); the arms that get a session warm-up pass of their own
    (eager kernels of their own, or the first arm of another prefix-cache setting, whose prefill
    shapes differ)."""
    variants = spec.variants
    specs = {n: spec.arms[v.engine_arm] for n, v in variants.items()}
    arm_specs = {n: {**s.settings(), "prefix_cache": "on" if variants[n].prefix_caching else "off"}
                 for n, s in specs.items()}
    for n, v in variants.items():
        if v.stop_at_exit is not None:
            arm_specs[n]["exit_mode"] = "stop" if v.stop_at_exit else "all"
    must_match = {n for n, s in specs.items() if is_exact(s) or (spec.cache_varied and s.bitwise)}
    if spec.cache_varied:  # the arm whose schedule the others replay is not compared with itself
        must_match.discard(_cache_on_reference(spec, reference_arm(list(variants))))
    must_match -= set(spec.identity_refs.values())  # nor is a mode's own reference
    own = eager_kernel_arms(spec.arms)
    eager = {n for n, v in variants.items() if v.engine_arm in own}
    firsts = {next(n for n, v in variants.items() if v.prefix_caching == on) for on in spec.cache_settings}
    # each exit mode's first arm too: the compute-saving decode runs other kernels
    firsts |= {next(n for n, v in variants.items() if v.stop_at_exit == m) for m in set(spec.exit_modes)}
    return arm_specs, must_match, eager | firsts


def _row_invariant_pairs(spec: E2ESpec, model: Any) -> list[tuple[str, str]]:
    """(cache-on arm, cache-off arm) of every engine arm run both ways: the pairs whose row-invariant
    replays decide cache identity. None for a model the mode refuses (Huginn "compress"), whose
    identity then rests on the plain replay alone."""
    try:
        check_model(model)
    except UsageError:
        return []
    by_arm: dict[str, dict[bool, str]] = {}
    for name, v in spec.variants.items():
        by_arm.setdefault(v.engine_arm, {}).setdefault(v.prefix_caching, name)
    return [(d[True], d[False]) for d in by_arm.values() if len(d) == 2]


def _cache_on_reference(spec: E2ESpec, ref: str) -> str:
    """The cache-on run of the reference arm: its schedule is the one every other arm replays (a
    cache-on schedule replays with the cache off too, by recomputing each hit prefix)."""
    engine_arm = spec.variants[ref].engine_arm
    return next(n for n, v in spec.variants.items() if v.engine_arm == engine_arm and v.prefix_caching)


def _manifest_config(spec: E2ESpec, backend: Any, plan: Plan, arm_specs: dict[str, Any], exact_arms: set[str],
                     sess_info: dict | None, facts: dict[str, Any]) -> dict[str, Any]:
    """The run's configuration as manifest.json stores it (what the report reads back)."""
    if spec.workload == RATE:
        assert spec.rate is not None and spec.lengths is not None
        rs = spec.rate
        rates = "sweep" if rs.rates is None else ", ".join(f"{r:g}" for r in rs.rates)
        size = (f"{rs.num_prompts} requests" if rs.num_prompts else
                f"{rs.duration_s:g} s of arrivals" if rs.duration_s is not None else
                f"{rs.cell_latencies:g} synchronous request latencies of arrivals" if rs.rates is None else
                f"{DEFAULT_DURATION_S:g} s of arrivals")
        workload_note = (
            f"open-loop rate: {rs.process.label} arrivals at {rates} requests/s, {size} per cell, "
            f"{spec.lengths.label}, random ids (no special ids), fresh per rate and repetition, same for "
            f"every arm; {'EOS ignored (exact output lengths)' if rs.ignore_eos else 'stops at EOS'}; "
            f"concurrency limit {rs.max_concurrency or 'none (the engine queues)'}; first "
            f"{rs.exclude_head:.0%} and last {rs.exclude_tail:.0%} of each cell's requests left out of its "
            "figures (warm-up, cool-down)"
        )
    elif spec.workload == BURST:
        workload_note = (
            f"burst: C in {spec.concurrency}, {spec.input_len} in / {spec.output_len} out, "
            "random ids (no special ids), fresh prompts per repetition, same for every arm"
        )
    else:
        assert sess_info is not None
        workload_note = (
            f"session replay of {sess_info['trace']}: {sess_info['requests']} requests "
            f"(dropped {sess_info['dropped_too_long']} too long), time x{sess_info['time_scale']}, "
            f"length x{sess_info['length_scale']} (block {sess_info['block_size']} tokens), prefix cache "
            f"{' and '.join('on' if on else 'off' for on in spec.cache_settings)}, reset per "
            "arm-repetition after warm-up, history fixed by the trace; theoretical "
            f"prefix-hit rate {sess_info['theoretical_prefix_hit_rate']:.1%}"
        )
        opts = spec.session_spec
        if opts.think is not None:
            workload_note += (f"; think time {opts.think.label}: each of the {sess_info['later_turns']} "
                              "later turns sent that long after its previous turn's last token")
        if opts.cache_bust != "off":
            workload_note += (f"; cache busting per {opts.cache_bust} (unique first tokens per repetition "
                              f"and {opts.cache_bust})")
        if spec.backend == "openai":
            workload_note += "; server prefix caches cannot be reset between arm-repetitions via the API"
    return {
        "model": spec.source.label,
        "weights": spec.source.weights,
        "backend": spec.backend,
        "hosting": backend.hosting,
        "arm_names": spec.arm_names,
        "arm_specs": arm_specs,
        "reference_arm": plan.ref,
        "replay_reference_arm": plan.replay_ref or plan.ref,
        "prefix_cache": ["on" if on else "off" for on in spec.cache_settings],
        "row_invariant_pairs": [list(p) for p in plan.row_invariant_pairs],
        "row_invariant_tile": plan.row_invariant_tile if plan.row_invariant_pairs else None,
        "exit_threshold": facts.get("exit_threshold"),
        "exit_mode": spec.exit_mode_text,
        "identity_references": spec.identity_refs,
        "exact_arms": sorted(exact_arms),
        "workload": spec.workload,
        "concurrency": spec.concurrency,
        "input_len": spec.input_len,
        "output_len": spec.output_len,
        "repeats": spec.repeats,
        "seed": spec.seed,
        "session": sess_info,
        "rate": spec.rate.config() if spec.rate is not None else None,
        "lengths": ({"label": spec.lengths.label, **spec.lengths.info} if spec.lengths is not None else None),
        "schedule_note": SCHEDULE_NOTE,
        "workload_note": workload_note,
        "timeouts": {
            "ttft_s": spec.timeouts.first_token,
            "stall_s": spec.timeouts.stall,
            "deadline": spec.timeouts.deadline is not None,
        },
        **facts,
    }


def _arm_stats(backend: EngineBackend, arms: list[str]) -> dict[str, Any]:
    """The engine's counters per scheduled arm (a variant's are its engine arm's in its exit mode)."""
    out = {}
    for a in arms:
        if backend.engine.has_unfinished():
            break
        out[a] = backend.stats(a) or {"error": "no stats (the engine could not switch to this arm)"}
    return out


def _print_summary(display: RunDisplay, a: dict[str, Any], path: Any) -> None:
    con = display.console
    s = a["summary"]
    method = s.get("identity_method", "free-running")
    replay_ref = a["config"].get("replay_reference_arm") or a["ref"]
    refs = a["config"].get("identity_references") or {}
    for r in a["replay_identity"]:
        con.print(
            f"identity ({method}) {r['cell']:>8} {r['arm']:<10} {r['identical']}/{r['compared']} "
            f"identical to {refs.get(r['arm'], replay_ref)}"
            + ("" if not r["skipped"] else f" ({'; '.join(r['skipped'])})")
            + (f" [yellow]({NOT_EXERCISED})[/]" if r.get("not_exercised") else ""),
            highlight=False,
            soft_wrap=True,
        )
    for m in s["exact_arm_unverified"]:
        con.print(
            f"[yellow]exact arm {m['arm']} {m['cell']}: identity unverified ({method}); see table.md[/]",
            highlight=False,
            soft_wrap=True,
        )
    for m in s["exact_arm_mismatches"]:
        con.print(
            f"[bold red]EXACT ARM MISMATCH ({method}): {report.mismatch_text(m)} identical to "
            f"{refs.get(m['arm'], replay_ref)}[/]",
            highlight=False,
            soft_wrap=True,
        )
    if s.get("cold_cells"):
        con.print(
            f"[yellow]{len(s['cold_cells'])} timed cell(s) did cold work (capture/compile/malloc): "
            "see 'Cold work' in table.md[/]",
            highlight=False,
        )
    for r in a["comparison"]:
        if r["metric"] == "output_tok_s" and r["delta"] is not None:
            ci = "" if r["ci_lo"] is None else f" [{1 + r['ci_lo']:.3f}, {1 + r['ci_hi']:.3f}]"
            aa = "" if r["aa_spread"] is None else f", A/A spread ±{r['aa_spread']:.1%}"
            con.print(
                f"{r['cell']:>8} {r['arm']:<10} output tok/s {1 + r['delta']:.3f}x{ci} of {a['ref']}"
                f"{aa}  ({r['verdict']})",
                highlight=False,
                soft_wrap=True,
            )
    sess = a["config"].get("session")
    if sess:
        measured = []
        for arm in a["arms"]:
            vals = [
                c.get("measured_prefix_hit_rate")
                for c in a["cells"]
                if c["arm"] == arm and c.get("measured_prefix_hit_rate") is not None
            ]
            if vals:
                measured.append(f"{arm} {sorted(vals)[len(vals) // 2]:.1%}")
        con.print(
            f"prefix-hit rate: theoretical {sess['theoretical_prefix_hit_rate']:.1%}, measured "
            + (", ".join(measured) or "-"),
            highlight=False,
            soft_wrap=True,
        )
    depths: dict[str, list[float]] = {}
    for c in a["cells"]:
        if c.get("mean_exit_depth"):
            depths.setdefault(c["arm"], []).append(c["mean_exit_depth"])
    if depths:
        means = ", ".join(f"{k} {sum(v) / len(v):.3f}" for k, v in depths.items())
        con.print(f"mean exit depth (loops): {means}", highlight=False, soft_wrap=True)
    loops = report.decode_loops_by_arm(a)
    if loops:
        run_ = ", ".join(f"{k} {v:.3f}" for k, v in loops.items())
        con.print(f"compute-saving exit, loops run per decode step: {run_}", highlight=False, soft_wrap=True)
    for r in a.get("mode_comparison") or []:
        if r["metric"] == "output_tok_s" and r["delta"] is not None:
            ci = "" if r["ci_lo"] is None else f" [{1 + r['ci_lo']:.3f}, {1 + r['ci_hi']:.3f}]"
            con.print(f"{r['cell']:>8} {r['arm']:<10} output tok/s {1 + r['delta']:.3f}x{ci} of "
                      f"{r['against']}  ({r['verdict']})", highlight=False, soft_wrap=True)
    stopped = (a.get("sweep") or {}).get("stopped")
    if stopped:
        con.print(f"rate sweep: {stopped}", highlight=False, soft_wrap=True)
    for line in a.get("slo_headlines") or []:
        con.print(f"[bold]{line}[/]", highlight=False, soft_wrap=True)
    if a["config"].get("random_weights"):
        con.print("[yellow]random weights: text is not meaningful[/]")
    if s.get("not_exercised"):
        con.print(f"[yellow]{', '.join(s['not_exercised'])}: {NOT_EXERCISED}; no identity verdict "
                  "(exit 3)[/]", highlight=False, soft_wrap=True)
    con.print(
        f"{s['cells_total']} cells ({s['cells_invalid']} invalid), status {report.status_text(s)}: "
        f"{path}/table.md",
        highlight=False,
        soft_wrap=True,
    )
