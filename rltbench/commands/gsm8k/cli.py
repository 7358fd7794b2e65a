"""`rltbench gsm8k --gate 1.0`: does a kernel arm lose GSM8K accuracy against the torch arm?

The same model answers the same questions greedily once per arm (one process, one model, the
engine switches arms); lm-eval builds the prompts and scores them (see tasks.py); the paired
statistics and the verdict are ours (stats.py). Exit codes: 0 identical or pass, 1 fail, 3
inconclusive (2 = usage error, from the CLI). With random weights the run still works (pipeline check
and sequence identity) but accuracies mean nothing: an arm that is not identical to torch is
"inconclusive: random weights", and that is printed on the console, in table.md and in the manifest.

Every input is checked before the run directory is made (`validate_numbers`, `arm_names`,
`check_model_inputs`): a bad flag, model, tokenizer or checkpoint leaves no run directory behind.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from rltbench import arms as armspec
from rltbench import runtime, textcodec
from rltbench.arms import ArmSpec
from rltbench.backends.base import Timeouts, parse_servers
from rltbench.backends.engine import EngineBackend
from rltbench.backends.openai import OpenAIBackend
from rltbench.commands.gsm8k import report
from rltbench.commands.gsm8k.generation import QuestionCodec
from rltbench.commands.gsm8k.interleave import CachedArmBackend, InterleavedGenerator
from rltbench.commands.gsm8k.stats import NEEDED_N_CAP, verdict_label
from rltbench.commands.gsm8k.tasks import (
    DATA_DIR,
    FILTERS,
    TASKS,
    build_task,
    lm_eval_version,
    set_offline_env,
)
from rltbench.engine.types import EngineConfig
from rltbench.errors import UsageError
from rltbench.results import RunDir

console = Console()
GSM8K_TEST_SIZE = 1319
CPU_LIMIT = 8  # questions when --limit is not given and the engine runs on the CPU (the full set: hours)
DEFAULT_ARMS = "torch,exact,approx"
DEFAULT_MODEL = "ouro-1.4b"
ENGINE_CONTEXT_CAP = 4096  # GSM8K 8-shot prompts are ~1k tokens; caps the decode graphs' block tables
SERVER_TIMEOUT_S = 600.0  # per request, first token and between tokens: a server that says nothing
FALLBACK_TOKENIZER = "fallback_tokenizer.json"  # written into the run when no --tokenizer is given


def arm_names(arms: str | None, backend: str, servers: dict[str, str],
              overrides: dict[str, str | None] | None = None) -> dict[str, ArmSpec | None]:
    """The arms to run, the reference `torch` first: {name: ArmSpec} on the engine (`--arms`, the
    A/A arm `torch#2` allowed once), {name: None} for servers (the `--arm NAME=URL` names)."""
    ref = report.REFERENCE_ARM
    if backend == "openai":
        if not servers:
            raise UsageError("--backend openai needs --arm NAME=URL for each arm (torch included)")
        if arms is not None:
            raise UsageError("with --backend openai the arms are the --arm NAME=URL servers: drop --arms")
        specs: dict[str, ArmSpec | None] = dict.fromkeys(servers)
    else:
        if servers:
            raise UsageError("--arm NAME=URL is for --backend openai")
        specs = dict(armspec.parse_arms(arms or DEFAULT_ARMS, overrides))
        extra = [a for a in specs if "#" in a and a != f"{ref}#2"]
        if extra:
            raise UsageError(f"--arms lists an arm twice: {', '.join(extra)} (only {ref} may repeat, once: "
                             "the A/A arm)")
    if ref not in specs:
        raise UsageError(f"--arms must include the reference arm '{ref}'")
    return {ref: specs[ref], **{a: s for a, s in specs.items() if a != ref}}


def validate_numbers(
    gate: float,
    limit: int | None,
    batch_size: int,
    max_gen_toks: int,
    num_fewshot: int | None,
    task: str,
    backend: str,
    gate_filter: str,
) -> None:
    if not math.isfinite(gate) or not 0.0 <= gate <= 100.0:  # nan compares false: it decides nothing
        raise UsageError(f"--gate must be a finite number of points in [0, 100], got {gate}")
    if limit is not None and not 1 <= limit <= GSM8K_TEST_SIZE:
        raise UsageError(f"--limit must be in 1..{GSM8K_TEST_SIZE}, got {limit}")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {batch_size}")
    if max_gen_toks < 1:
        raise UsageError(f"--max-gen-toks must be >= 1, got {max_gen_toks}")
    if num_fewshot is not None and num_fewshot < 0:
        raise UsageError(f"--num-fewshot must be >= 0, got {num_fewshot}")
    if task not in TASKS:
        raise UsageError(f"--task must be one of {', '.join(TASKS)}, got {task!r}")
    if backend not in ("engine", "openai"):
        raise UsageError(f"--backend must be engine or openai, got {backend!r}")
    if gate_filter not in FILTERS:
        raise UsageError(f"--filter must be one of {', '.join(FILTERS)}, got {gate_filter!r}")


def model_label(model: str | None, weights: str, backend: str) -> str:
    """What the run is called in the manifest and table.md: the preset for random weights, else the
    given --model or what is known without loading (the checkpoint directory, or the servers').
    Never the default preset's name for a checkpoint or a server: that would name the wrong model."""
    if model:
        return model
    if backend == "openai":
        return "served model (see --arm)"
    if weights == "random":
        return DEFAULT_MODEL
    return f"{Path(weights).resolve().name} (checkpoint)"


def _check_vocab(vocab: int | None, model_vocab: int) -> None:
    if vocab is not None and vocab > model_vocab:
        raise UsageError(f"tokenizer vocab {vocab} exceeds the model's vocab {model_vocab}")


def check_model_inputs(source: runtime.ModelSource, tokenizer: str | None, device: str, dtype: str) -> None:
    """What `build_engine_side` would reject, found without building the model, so that a bad
    preset, checkpoint, tokenizer, device or dtype is one line before any run directory exists."""
    _dev, _dt, model_cfg = runtime.check(source, device, dtype)
    if not source.random and tokenizer is None and not (Path(source.weights) / "tokenizer.json").is_file():
        raise UsageError(f"no tokenizer.json in {source.weights}: add it or pass --tokenizer PATH")
    if tokenizer is not None:
        _check_vocab(textcodec.load_tokenizer_file(tokenizer).vocab_size(), model_cfg.vocab_size)


def build_engine_side(
    source: runtime.ModelSource, tokenizer: str | None, device: str, dtype: str, run_dir: Path
) -> tuple[Any, Any, bool]:
    """(model, codec, random_weights): a preset with random weights or a checkpoint, and its text codec."""
    dev = runtime.resolve_device(device)
    model, tok = runtime.load(source, dev, runtime.resolve_dtype(dtype, dev), tokenizer=tokenizer is None)
    if tokenizer is not None:
        codec = textcodec.load_tokenizer_file(tokenizer)
    elif tok is not None:
        codec = textcodec.wrap(tok, f"checkpoint:{Path(source.weights) / 'tokenizer.json'}")
    else:
        codec = textcodec.fallback_codec(model.config.vocab_size)
        codec.tok.save(str(run_dir / FALLBACK_TOKENIZER))
        console.print(
            f"[yellow]no tokenizer given: using a {codec.source} (saved as {FALLBACK_TOKENIZER})[/]"
        )
    _check_vocab(codec.vocab_size(), model.config.vocab_size)
    return model, codec, bool(getattr(model, "random_weights", source.random))


def make_engine(model: Any, arms: dict[str, ArmSpec], batch_size: int, max_context: int) -> Any:
    """The engine of the gate. Its KV pool is what this workload can use: batch_size sequences of
    max_context tokens, plus one sequence's worth so the shared few-shot prefix can stay cached (sized
    from free memory it took 129 GiB of an H200 for a 4 x 2k-token run, starving the processes that
    shared the GPU)."""
    on_cuda = next(model.parameters()).device.type == "cuda"
    prefix_ok = model.config.family != "huginn" or bool(getattr(model, "prefix_cache_safe", False))
    block = EngineConfig.block_size
    blocks_per_seq = -(-max_context // block)
    cfg = EngineConfig(
        block_size=block,
        max_num_seqs=batch_size,
        enable_prefix_caching=prefix_ok,
        use_cuda_graph=on_cuda,
        max_model_len=max_context,
        num_blocks=(batch_size + 1) * blocks_per_seq,
    )
    return runtime.build_engine(model, arms, cfg)


VERDICT_COLORS = {"identical": "green", "pass": "green", "fail": "red", "inconclusive": "yellow"}
CONSOLE_CAPTION = (
    "Drop = reference minus arm accuracy, in points. LCB95 / UCB95: exact one-sided 95% bounds of "
    "the drop. p: McNemar's exact p-value. differ: generated sequences not identical to the "
    "reference's. Identical arms pass; otherwise pass needs UCB95 <= gate, fail LCB95 > gate."
)


def _inconclusive_line(arm: str, c: dict[str, Any]) -> str:
    """Why an arm is inconclusive and what would decide it."""
    if c.get("verdict_reason"):
        return (
            f"{arm}: {verdict_label(c['verdict'], c['verdict_reason'])}: {c['sequences_differ']}/{c['n']} "
            "sequences differ from the reference, and random weights score near 0% in every arm; "
            "only identical sequences are evidence here (run real weights: --weights DIR)"
        )
    bounds = f"the 95% bounds [{report._fmt(c['lcb95'])}, {report._fmt(c['ucb95'])}] points contain the gate"
    if c["needed_n"] is None:
        return (
            f"{arm}: inconclusive: {bounds}; no number of questions up to {NEEDED_N_CAP:,} decides it "
            "at the observed rates"
        )
    beyond = ""
    if c["needed_n"] > GSM8K_TEST_SIZE:
        beyond = f" (more than the {GSM8K_TEST_SIZE} GSM8K test questions)"
    return (
        f"{arm}: inconclusive: {bounds}; deciding it needs about {c['needed_n']} questions{beyond} "
        "at the observed discordance and drop"
    )


def _print_summary(summary: dict[str, Any]) -> None:
    """The gate table, narrow enough for an 80-column log: arm names and verdicts are never cut."""
    t = Table(
        title=f"GSM8K gate vs {summary['reference']} ({summary['n']} questions, gate "
        f"{summary['gate']:g} points, {summary['gate_rule']}, {summary['gate_filter']})",
        caption=CONSOLE_CAPTION,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 0),
        show_edge=False,
    )
    t.add_column("arm", no_wrap=True)
    for col in ("acc %", "drop", "LCB95", "UCB95", "n10/n01", "p", "differ"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("verdict")  # 'inconclusive: random weights' wraps at its space, never cut
    lines = []
    for arm, a in summary["arms"].items():
        c = next((c for c in summary["comparisons"] if c["arm"] == arm), None)
        if c is None:
            t.add_row(arm, report._fmt(a["gate_acc"]), "", "", "", "", "", "", "reference")
        else:
            color = VERDICT_COLORS[c["verdict"]]
            if c["verdict"] == "inconclusive":
                lines.append(_inconclusive_line(arm, c))
            t.add_row(
                arm,
                report._fmt(a["gate_acc"]),
                report._fmt(c["drop"]),
                report._fmt(c["lcb95"]),
                report._fmt(c["ucb95"]),
                f"{c['n10']}/{c['n01']}",
                report._p(c["mcnemar_p"]),
                f"{c['sequences_differ']}/{c['n']}",
                f"[{color}]{verdict_label(c['verdict'], c['verdict_reason'])}[/]",
            )
    console.print(t)
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)


def _banner_random() -> None:
    console.print(Panel(report.RANDOM_WEIGHTS_BANNER, title="WARNING", style="bold red"))


def gsm8k_command(
    model: Annotated[
        str | None,
        typer.Option(
            help="Model preset (ouro-1.4b, huginn-0125, ouro-tiny, ...) for random weights (default "
            f"{DEFAULT_MODEL}); a label when --weights is a checkpoint (default: its directory name)."
        ),
    ] = None,
    weights: Annotated[
        str, typer.Option(help="Checkpoint directory (config.json, safetensors, tokenizer.json) or 'random'.")
    ] = "random",
    arms: Annotated[
        str | None,
        typer.Option(help="Engine arms (default torch,exact,approx); torch is the reference. "
                     "torch, exact, approx, cuda or NAME=norm:exact/rope:off/scope:all; torch named twice "
                     "is the A/A arm. With --backend openai the arms are the --arm servers."),
    ] = None,
    norm: armspec.NormOption = None,
    rope: armspec.RopeOption = None,
    act: armspec.ActOption = None,
    scope: armspec.ScopeOption = None,
    gate: Annotated[
        float,
        typer.Option(
            help="Largest tolerated accuracy drop, in points (0-100). Pass: identical sequences, or "
            "an exact 95% upper bound of the drop <= gate."
        ),
    ] = 1.0,
    task: Annotated[
        str, typer.Option(help="lm-eval task: gsm8k_cot (8-shot CoT) or gsm8k (5-shot).")
    ] = "gsm8k_cot",
    num_fewshot: Annotated[int | None, typer.Option(help="Exemplars (default: the task's).")] = None,
    limit: Annotated[
        int | None, typer.Option(help=f"First N test questions (default all {GSM8K_TEST_SIZE}; {CPU_LIMIT} "
                                 "when the engine runs on the CPU).")
    ] = None,
    batch_size: Annotated[
        int, typer.Option(help="Concurrent sequences (engine max_num_seqs / requests in flight).")
    ] = 32,
    max_gen_toks: Annotated[int, typer.Option(help="Most generated tokens per question.")] = 256,
    gate_mode: Annotated[
        str | None, typer.Option(hidden=True, help="Removed: the gate has one rule (exact bounds).")
    ] = None,
    gate_filter: Annotated[
        str, typer.Option("--filter", help="Which lm-eval extraction decides correctness.")
    ] = "strict-match",
    result_dir: runtime.ResultDirOption = None,
    backend: runtime.BackendOption = "engine",
    arm: runtime.ServersOption = None,
    dtype: runtime.DtypeOption = "auto",
    device: runtime.DeviceOption = "auto",
    tokenizer: Annotated[
        str | None,
        typer.Option(help="tokenizer.json (or its directory); needed for real text with random weights."),
    ] = None,
    seed: runtime.SeedOption = 0,
) -> None:
    """GSM8K quality gate: paired accuracy of each arm vs torch.
    Exit 0 identical or pass, 1 fail, 3 inconclusive."""
    set_offline_env()
    if gate_mode is not None:
        # the point rule passed without evidence and the normal bound passed at SE = 0
        raise UsageError(
            f"--gate-mode {gate_mode} was removed: the gate has one rule, exact 95% bounds (pass: "
            "identical sequences or an upper bound of the drop <= --gate); drop --gate-mode"
        )
    servers = parse_servers(arm or [])
    validate_numbers(gate, limit, batch_size, max_gen_toks, num_fewshot, task, backend, gate_filter)
    specs = arm_names(arms, backend, servers, armspec.override_flags(norm, rope, act, scope))
    label = model_label(model, weights, backend)
    source = runtime.ModelSource(label if weights == "random" else DEFAULT_MODEL, weights, seed)
    notes: list[str] = []
    if backend == "engine":
        check_model_inputs(source, tokenizer, device, dtype)
        if limit is None and runtime.resolve_device(device) == "cpu":
            limit = CPU_LIMIT
            notes.append(f"--limit {CPU_LIMIT} on CPU (all {GSM8K_TEST_SIZE} questions would take hours "
                         f"here; pass --limit {GSM8K_TEST_SIZE} for the full set)")
            console.print(f"[yellow]note: {notes[-1]}[/]", highlight=False, soft_wrap=True)
    build_task(task)  # fail fast (lm-eval missing, data missing) before any model work
    config: dict[str, Any] = {
        "model": label,
        "weights": weights,
        "arms": list(specs),
        "gate": gate,
        "gate_rule": report.GATE_RULE,
        "gate_filter": gate_filter,
        "task": task,
        "num_fewshot": num_fewshot,
        "limit": limit,
        "batch_size": batch_size,
        "max_gen_toks": max_gen_toks,
        "backend": backend,
        "arm_urls": servers,
        "dtype": dtype,
        "device": device,
        "tokenizer": tokenizer,
        "seed": seed,
        "random_weights": backend == "engine" and weights == "random",
        "lm_eval_version": lm_eval_version(),
        "data_dir": str(DATA_DIR),
        "notes": notes,
    }
    if backend == "engine":
        config["arm_specs"] = {n: s.settings() for n, s in specs.items() if s is not None}
    run = RunDir.create("gsm8k", result_dir=result_dir, argv=sys.argv, config=config)
    try:
        summary = _run(run, config, source, specs, servers)
    except KeyboardInterrupt as exc:  # the CLI says in one line what was kept
        if run.stored_nothing():  # before the first result: the tokenizer saved for it goes too
            run.file(FALLBACK_TOKENIZER).unlink(missing_ok=True)
        run.mark_ended(exc)  # interrupted; removed when nothing was stored yet
        if (run.path / report.QUESTIONS_FILE).exists():
            try:
                report.render_run(run)
                run.finished = "the finished arms, table.md rendered"
            except Exception as err:  # the raw files are what matters; say why the table is missing
                console.print(f"[red]table.md not written: {err}[/]", highlight=False, soft_wrap=True)
        raise
    except BaseException as exc:
        run.mark_ended(exc)  # failed; removed when bad input (a corrupt checkpoint) stored nothing
        raise
    raise typer.Exit(code=summary["exit_code"])


def _generator(run: Any, config: dict[str, Any], source: runtime.ModelSource, specs: dict[str, Any],
               servers: dict[str, str]) -> InterleavedGenerator:
    """The model (engine) or the servers behind every arm, as one interleaved generator."""
    arms = list(specs)
    common = dict(arms=arms, ref=report.REFERENCE_ARM, chunk=config["batch_size"], write=run.append_jsonl,
                  note=lambda text: console.print(text, highlight=False))
    if config["backend"] != "engine":
        config["tokenizer_source"] = "server"
        return InterleavedGenerator(OpenAIBackend(servers), questions=QuestionCodec(),
                                    timeouts=Timeouts(SERVER_TIMEOUT_S, SERVER_TIMEOUT_S), **common)
    model, codec, random_w = build_engine_side(source, config["tokenizer"], config["device"], config["dtype"],
                                               run.path)
    config["random_weights"] = random_w
    config["tokenizer_source"] = codec.source
    config["engine_device"] = next(model.parameters()).device.type
    if config["weights"] != "random":
        config["model_family"] = model.config.family
    max_context = min(int(model.config.max_position_embeddings), ENGINE_CONTEXT_CAP)
    config["max_context"] = max_context
    engine = make_engine(model, specs, config["batch_size"], max_context)
    same = armspec.eager_reference_arms(specs, bool(engine.use_graphs))
    if same:
        config["notes"].append(
            f"no CUDA graphs (not on a GPU): the scope=graph arm(s) {', '.join(same)} run the torch "
            "reference ops, so this gate compares torch with itself"
        )
        console.print(f"[yellow]note: {config['notes'][-1]}[/]", highlight=False, soft_wrap=True)
    questions = QuestionCodec(codec, tuple(model.config.eos_token_ids), max_context)
    return InterleavedGenerator(EngineBackend(engine, arms, codec), questions=questions, **common)


def _run(run: Any, config: dict[str, Any], source: runtime.ModelSource, specs: dict[str, Any],
         servers: dict[str, str]) -> dict[str, Any]:
    # lm-eval is an optional dependency: it loads when a gate runs, not at `rltbench --help`
    from rltbench.commands.gsm8k.evaluate import RltbenchLM, run_arm

    generator = _generator(run, config, source, specs, servers)
    run.update_manifest(config=config, random_weights=config["random_weights"])
    if config["random_weights"]:
        _banner_random()
    engine = getattr(generator.backend, "engine", None)
    rows: dict[int, dict[str, Any]] = {}
    arm_info: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="rltbench-gsm8k-ds-") as cache_dir:
        for name in generator.arms:
            lm = RltbenchLM(CachedArmBackend(generator, name), max_gen_toks=config["max_gen_toks"])
            if generator.key is None:
                console.print(f"generating: every arm, chunks of {config['batch_size']} questions, arms ABBA")
            res = run_arm(
                name, lm, config["task"], config["limit"], config["num_fewshot"], cache_dir=Path(cache_dir)
            )
            config["num_fewshot_used"] = res.extra.get("n_shot")
            stats = generator.stats[name]
            info: dict[str, Any] = {
                "seconds": stats.seconds,
                "truncated_prompts": stats.truncated_prompts,
                "prompt_tokens": stats.prompt_tokens,
                "lm_eval_metrics": res.metrics,
            }
            if engine is not None:
                try:
                    engine.set_arm(name)
                    info["engine_stats"] = engine.stats()
                except Exception as exc:  # stats are informative only
                    info["engine_stats"] = {"error": str(exc)}
            arm_info[name] = info
            for doc_id in sorted(res.rows):
                row = rows.setdefault(doc_id, {"doc_id": doc_id, **res.docs.get(doc_id, {}), "arms": {}})
                row["arms"][name] = res.rows[doc_id]
            # Store after every arm: an interrupted run keeps (and `report` renders) the finished arms.
            run.write_jsonl(report.QUESTIONS_FILE, [rows[k] for k in sorted(rows)])
            run.write_json(report.ARMS_FILE, arm_info)
            if res.extra.get("lm_eval_config") and not (run.path / "lm_eval_task.json").exists():
                run.write_json("lm_eval_task.json", res.extra["lm_eval_config"])
            n_q = len(res.rows)
            acc = 100.0 * sum(bool(r.get("strict_correct")) for r in res.rows.values()) / max(n_q, 1)
            console.print(
                f"arm {name}: {n_q} questions, strict acc {acc:.2f}%"
                + (
                    f", [yellow]{stats.truncated_prompts} prompts left-truncated[/]"
                    if stats.truncated_prompts
                    else ""
                )
            )
    run.update_manifest(config=config)
    summary = report.summarize_run(run)
    report.write_outputs(run, summary, config)
    _print_summary(summary)
    if config["random_weights"]:
        _banner_random()
    overall = verdict_label(summary["overall"], summary["overall_reason"])
    console.print(
        f"[bold]overall: {overall}[/] (exit {summary['exit_code']}); results in {run.path}",
        highlight=False,
        soft_wrap=True,
    )
    run.update_manifest(
        status="complete",
        verdict=summary["overall"],
        verdict_reason=summary["overall_reason"],
        exit_code=summary["exit_code"],
    )
    return summary
