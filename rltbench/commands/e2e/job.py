"""Glue of `rltbench e2e`: validated options -> model/engine or servers -> plan -> run dir -> report.

Kept apart from cli.py so tests and scripts can call `build_and_run(opts)` or `make_plan(...)`
directly, with a fake or real backend.
"""

from __future__ import annotations

import math
import os
from typing import Any

from rich.console import Console

from rltbench.arms import (
    eager_kernel_arms,
    eager_reference_arms,
    is_exact,
    parse_arms,
    reference_arm,
    selection_dict,
)
from rltbench.commands.e2e import report
from rltbench.commands.e2e.display import RunDisplay
from rltbench.commands.e2e.engine_backend import EngineBackend, Timeouts
from rltbench.commands.e2e.runner import SCHEDULE_NOTE, Cell, Plan, run_plan
from rltbench.commands.e2e.workload import (
    SessionTrace,
    burst_prompts,
    load_trace,
    materialize_session,
    resolve_trace,
    theoretical_prefix_hit_rate,
    warmup_prompts,
)
from rltbench.errors import UsageError


def load_session(config: Any, opts: dict[str, Any], max_model_len: int | None) -> tuple[SessionTrace, dict]:
    """Resolve --trace (path or preset), apply scales (flags override the preset) and materialize."""
    path, preset = resolve_trace(opts["trace"])
    ts = opts.get("trace_time_scale")
    ls = opts.get("trace_length_scale")
    mr = opts.get("max_requests")
    ts = preset.get("time_scale", 1.0) if ts is None else ts
    ls = preset.get("length_scale", 1.0) if ls is None else ls
    mr = preset.get("max_requests") if mr is None else mr
    recs = load_trace(path, mr)
    sess = materialize_session(
        config, recs, opts["seed"], time_scale=ts, length_scale=ls, max_model_len=max_model_len
    )
    info = {
        "trace": str(path),
        "time_scale": ts,
        "length_scale": ls,
        "max_requests": mr,
        "records": len(recs),
        "requests": len(sess.requests),
        "dropped_too_long": sess.dropped_too_long,
        "block_size": sess.block_size,
        "theoretical_prefix_hit_rate": theoretical_prefix_hit_rate(sess.requests, sess.block_size),
        "mean_input": sum(len(r.prompt) for r in sess.requests) / len(sess.requests),
        "mean_output": sum(r.output_len for r in sess.requests) / len(sess.requests),
        "span_s": sess.requests[-1].arrival,
    }
    sess.info = info
    return sess, info


def make_plan(
    config: Any,
    opts: dict[str, Any],
    arm_names: list[str],
    exact_arms: set[str],
    session: SessionTrace | None,
    eager_kernel_arms: set[str] | None = None,
) -> Plan:
    """The cells and prompts of the run (pure: same options, same prompts). `eager_kernel_arms`: arms
    whose eager steps run their own kernels (scope all), each of which gets a session warm-up pass."""
    timeouts = Timeouts(opts["ttft_timeout"], opts["stall_timeout"], opts.get("deadline"))
    ref = reference_arm(arm_names)
    if session is None:
        cells = [Cell(f"C={c}", c) for c in opts["concurrency"]]
        cache: dict[tuple[int, int], list] = {}

        def prompts(cell: Cell, rep: int) -> list:
            key = (cell.C, rep)
            if key not in cache:
                cache.clear()  # one cell-repetition at a time: keep memory flat at C=128
                cache[key] = burst_prompts(
                    config, cell.C, opts["input_len"], opts["output_len"], opts["seed"], rep, cell.C
                )
            return cache[key]

        n_warm = min(opts["warmup_requests"], max(opts["concurrency"]))
        warm = warmup_prompts(config, n_warm, opts["input_len"], min(opts["output_len"], 4), opts["seed"])
        return Plan("burst", arm_names, ref, opts["repeats"], cells, prompts, warm, timeouts, exact_arms)
    reqs = session.requests
    warm = [
        type(r)(index=i, prompt=r.prompt, output_len=min(r.output_len, 4))
        for i, r in enumerate(reqs[: opts["warmup_requests"]])
    ]
    return Plan(
        "session",
        arm_names,
        ref,
        opts["repeats"],
        [Cell("session", 0)],
        lambda cell, rep: reqs,
        warm,
        timeouts,
        exact_arms,
        session,
        warmup_pass_arms={arm_names[0], *(eager_kernel_arms or ())},
    )


def _build_model(opts: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The model for the engine backend and the facts for the manifest (device, dtype, random weights)."""
    from rltbench.commands.e2e.cli import _device_dtype
    from rltbench.models import build_model, cpu_size_note, load_model

    dev, dt = _device_dtype(opts["device"], opts["dtype"])
    if opts["weights"] == "random":
        model = build_model(opts["model"], device=dev, dtype=dt, seed=opts["seed"])
    else:
        model, _tok = load_model(opts["weights"], device=dev, dtype=dt, tokenizer=False)
    model.eval()
    note = cpu_size_note(model)
    if note:
        Console(stderr=True).print(f"[yellow]{note}[/]", highlight=False)
    return model, {
        "device": dev,
        "dtype": str(dt).replace("torch.", ""),
        "random_weights": bool(getattr(model, "random_weights", opts["weights"] == "random")),
    }


def _check_before_build(opts: dict[str, Any]) -> None:
    """Validate the trace and lengths against the preset's (or checkpoint's) config, without weights."""
    from pathlib import Path

    from rltbench.commands.e2e.cli import _device_dtype
    from rltbench.models import config_from_hf, get_config

    _device_dtype(opts["device"], opts["dtype"])
    if opts["weights"] == "random":
        config = get_config(opts["model"])
    else:
        cfg_file = Path(opts["weights"]) / "config.json"
        if not cfg_file.is_file():
            raise UsageError(f"--weights {opts['weights']}: no config.json there (or use --weights random)")
        config = config_from_hf(cfg_file)
    max_len = int(config.max_position_embeddings)
    if opts["workload"] == "session":
        load_session(config, opts, max_len)
    elif opts["input_len"] + opts["output_len"] > max_len:
        raise UsageError(
            f"--input-len + --output-len = {opts['input_len'] + opts['output_len']} exceeds the "
            f"model context {max_len}"
        )


def build_and_run(opts: dict[str, Any]) -> tuple[Any, bool]:
    """Everything after flag parsing: returns the RunDir path and whether an exact arm mismatched
    (under schedule replay; the command then exits 1)."""
    from rltbench.results import RunDir

    sessionwl = opts["workload"] == "session"
    if opts["backend"] == "openai":
        from rltbench.commands.e2e.openai_backend import OpenAIBackend, parse_arm_urls
        from rltbench.models import config_from_hf, get_config

        urls = parse_arm_urls(opts["arm_urls"])
        config = (
            get_config(opts["model"])
            if opts["weights"] == "random"
            else config_from_hf(f"{opts['weights']}/config.json")
        )
        backend: Any = OpenAIBackend(urls, opts.get("served_model_name"))
        arm_names = list(urls)
        arm_specs = dict(urls)
        exact_arms = {a for a in arm_names if a.split("#")[0] == "exact"}
        facts = {"device": "remote", "dtype": "server", "random_weights": opts["weights"] == "random"}
        session, sess_info = (
            load_session(config, opts, config.max_position_embeddings) if sessionwl else (None, None)
        )
    else:
        selections = parse_arms(opts["arms"], opts["overrides"])
        arm_names = list(selections)
        arm_specs = {n: selection_dict(s) for n, s in selections.items()}
        exact_arms = {n for n, s in selections.items() if is_exact(s)}
        _check_before_build(opts)  # bad flags fail before a 1.4B model is built
        model, facts = _build_model(opts)
        config = model.config
        session, sess_info = (
            load_session(config, opts, int(config.max_position_embeddings)) if sessionwl else (None, None)
        )
        engine = _make_engine(model, selections, opts, session)
        from rltbench.engine import SamplingParams

        backend = EngineBackend(engine, SamplingParams, arm_names)
    if opts["workload"] == "burst":
        max_len = int(getattr(config, "max_position_embeddings", 1 << 30))
        if opts["input_len"] + opts["output_len"] > max_len:
            raise UsageError(
                f"--input-len + --output-len = {opts['input_len'] + opts['output_len']} exceeds the "
                f"model context {max_len}"
            )
    own_eager = eager_kernel_arms(selections) if opts["backend"] == "engine" else set()
    plan = make_plan(config, opts, arm_names, exact_arms, session, own_eager)
    workload_note = (
        f"burst: C in {opts['concurrency']}, {opts['input_len']} in / {opts['output_len']} out, "
        "random ids (no special ids), fresh prompts per repetition, same for every arm"
        if not sessionwl
        else f"session replay of {sess_info['trace']}: {sess_info['requests']} requests "
        f"(dropped {sess_info['dropped_too_long']} too long), time x{sess_info['time_scale']}, "
        f"length x{sess_info['length_scale']} (block {sess_info['block_size']} tokens), prefix cache "
        f"on, reset per arm-repetition after warm-up, history fixed by the trace; theoretical "
        f"prefix-hit rate {sess_info['theoretical_prefix_hit_rate']:.1%}"
    )
    if sessionwl and opts["backend"] == "openai":
        workload_note += "; server prefix caches cannot be reset between arm-repetitions via the API"
    model_label = opts["model"] if opts["weights"] == "random" else f"{opts['weights']} (checkpoint)"
    cfg = {
        "model": model_label,
        "weights": opts["weights"],
        "backend": opts["backend"],
        "hosting": backend.hosting,
        "arm_names": arm_names,
        "arm_specs": arm_specs,
        "reference_arm": plan.ref,
        "exact_arms": sorted(exact_arms),
        "workload": opts["workload"],
        "concurrency": opts["concurrency"],
        "input_len": opts["input_len"],
        "output_len": opts["output_len"],
        "repeats": opts["repeats"],
        "seed": opts["seed"],
        "session": sess_info,
        "schedule_note": SCHEDULE_NOTE,
        "workload_note": workload_note,
        "timeouts": {
            "ttft_s": opts["ttft_timeout"],
            "stall_s": opts["stall_timeout"],
            "deadline": opts.get("deadline") is not None,
        },
        **facts,
    }
    notes: list[str] = []
    if opts["backend"] == "engine":
        eng = backend.engine
        same = eager_reference_arms(selections, bool(eng.use_graphs))
        if same:
            notes.append(
                f"no CUDA graphs ({'--enforce-eager' if opts['enforce_eager'] else 'not on a GPU'}): the "
                f"scope=graph arm(s) {', '.join(same)} run the torch reference ops and measure "
                "nothing of the fused kernels; use --scope all to run the kernels eagerly"
            )
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
    run = RunDir.create("e2e", result_dir=opts["result_dir"], argv=opts.get("argv"), config=cfg)
    status = "failed"
    with RunDisplay(live=opts.get("live", True)) as display:
        display.note(f"results: {run.path}  ({backend.hosting})")
        for note in notes:
            display.console.print(f"[yellow]note: {note}[/]", highlight=False, soft_wrap=True)
        try:
            status = run_plan(plan, backend, run, display)
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            extra: dict[str, Any] = {}
            if opts["backend"] == "openai":
                extra["servers"] = backend.notes
            else:
                extra["engine_stats"] = _arm_stats(backend.engine, arm_names)
            if status == "deadline":  # the results schema knows running/complete/interrupted/failed
                status, extra["interrupted_by"] = "interrupted", "global deadline (--deadline)"
            run.update_manifest(status=status, **extra)
            try:
                a = report.render(run.path)
            except Exception as exc:  # a report failure must not hide the measured data
                display.note(f"[red]report failed: {exc}[/]")
                a = None
            if status == "interrupted" and "interrupted_by" not in extra:
                done = sum(1 for c in (a or {}).get("cells", []) if not c.get("interrupted"))
                display.console.print(
                    f"[yellow]interrupted: {done} finished cells kept in {run.path} "
                    f"(table.md rendered; `rltbench report {run.path}` re-renders)[/]",
                    highlight=False,
                    soft_wrap=True,
                )
    if a is not None:
        _print_summary(display, a, run.path)
    return run.path, bool(a and a["summary"]["exact_arm_mismatch"])


def _make_engine(
    model: Any, selections: dict[str, Any], opts: dict[str, Any], session: SessionTrace | None
) -> Any:
    """Engine sized for the load: max_num_seqs >= max C and a pool that holds every burst (never shrink C)."""
    from rltbench.engine import Engine, EngineConfig

    bs = opts["block_size"]
    if session is None:
        cmax = max(opts["concurrency"])
        seqs = opts["max_num_seqs"] or cmax
        if seqs < cmax:
            raise UsageError(f"--max-num-seqs {seqs} < max concurrency {cmax}: C would be shrunk silently")
        per_req = opts["input_len"] + opts["output_len"]
        need_blocks = cmax * math.ceil(per_req / bs)
        max_len = per_req
    else:
        seqs = opts["max_num_seqs"] or 128
        per_req = max(len(r.prompt) + r.output_len for r in session.requests)
        need_blocks = math.ceil(per_req / bs)
        max_len = per_req
    model_len = int(model.config.max_position_embeddings)
    kw: dict[str, Any] = {}
    if opts["kv_cache_gib"] is None and next(model.parameters()).device.type == "cpu":
        kw["num_blocks"] = max(need_blocks, 64)  # CPU: exactly what the load needs (tests, dry runs)
        _check_cpu_memory(model, kw["num_blocks"], bs)
    ecfg = EngineConfig(
        kv_cache_gib=opts["kv_cache_gib"],
        block_size=bs,
        max_num_seqs=seqs,
        max_num_batched_tokens=opts["max_num_batched_tokens"],
        enable_prefix_caching=session is not None,
        use_cuda_graph=not opts["enforce_eager"],
        max_model_len=min(max_len, model_len),
        prefill_graphs=opts.get("prefill_graphs", True),
        **kw,
    )
    try:
        eng = Engine(model, arms=selections, config=ecfg)
    except (ValueError, RuntimeError) as exc:
        raise UsageError(f"engine: {exc}") from None
    if eng.num_blocks < need_blocks:
        raise UsageError(
            f"KV pool holds {eng.num_blocks} blocks of {bs} tokens but the load needs {need_blocks}: "
            "raise --kv-cache-gib or lower --concurrency (C is never shrunk silently)"
        )
    return eng


def _available_memory_bytes() -> int | None:
    """Memory the OS can give this process now (Linux), None where it cannot be read."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _check_cpu_memory(model: Any, num_blocks: int, block_size: int) -> None:
    """Refuse, in one line, a CPU KV pool that cannot fit in memory (instead of an allocator error)."""
    from rltbench.engine.paged_context import kv_bytes_per_block

    mc = model.config
    dtype = next(model.parameters()).dtype
    need = num_blocks * kv_bytes_per_block(
        int(mc.num_kv_planes), block_size, int(mc.num_kv_heads), int(mc.head_dim), dtype
    )
    avail = _available_memory_bytes()
    if avail is not None and need > 0.8 * avail:
        raise UsageError(
            f"the load needs {need / 2**30:.1f} GiB of KV cache ({num_blocks} blocks of {block_size} tokens, "
            f"{int(mc.num_kv_planes)} KV planes) but this machine has {avail / 2**30:.1f} GiB free: lower "
            "--concurrency / --input-len / --output-len, or use a tiny preset (--model ouro-tiny) on CPU"
        )


def _arm_stats(engine: Any, arms: list[str]) -> dict[str, Any]:
    out = {}
    for a in arms:
        try:
            if engine.has_unfinished():
                break
            engine.set_arm(a)
            out[a] = engine.stats()
        except Exception as exc:  # informative only
            out[a] = {"error": str(exc)}
    return out


def _print_summary(display: RunDisplay, a: dict[str, Any], path: Any) -> None:
    con = display.console
    s = a["summary"]
    method = s.get("identity_method", "free-running")
    for r in a["replay_identity"]:
        con.print(
            f"identity ({method}) {r['cell']:>8} {r['arm']:<10} {r['identical']}/{r['compared']} "
            "identical to " + a["ref"] + ("" if not r["skipped"] else f" ({'; '.join(r['skipped'])})"),
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
            f"[bold red]EXACT ARM MISMATCH ({method}): {report.mismatch_text(m)} identical to {a['ref']}[/]",
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
    if a["config"].get("random_weights"):
        con.print("[yellow]random weights: text is not meaningful[/]")
    con.print(
        f"{s['cells_total']} cells ({s['cells_invalid']} invalid), status {report.status_text(s)}: "
        f"{path}/table.md",
        highlight=False,
        soft_wrap=True,
    )
