"""`rltbench gsm8k --gate 1.0`: does a kernel arm lose GSM8K accuracy against the torch arm?

The same model answers the same questions greedily once per arm (one process, one model, the
engine switches arms); lm-eval builds the prompts and scores them (see tasks.py); the paired
statistics and the verdict are ours (results/gsm8k_stats.py). Exit codes: 0 identical or pass, 1 fail, 3
inconclusive (2 = usage error, from the CLI). With random weights the run still works (pipeline check
and sequence identity) but accuracies mean nothing: an arm that is not identical to torch is
"inconclusive: random weights", and that is printed on the console, in table.md and in the manifest.

Every input is checked before the run directory is made (the numbers when the command line is
parsed: rltbench.options; then `check_choices`, `arm_names`, `check_model_inputs`): a bad flag, model,
tokenizer or checkpoint leaves no run directory behind. torch, the engine and pandas load when the
command runs (inside the functions), not for `rltbench gsm8k --help`.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from rltbench import arms as armspec
from rltbench import options, textcodec
from rltbench.arms import ArmSpec
from rltbench.backends.base import Timeouts, parse_servers
from rltbench.commands.gsm8k.generation import QuestionCodec
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

if TYPE_CHECKING:
    from rltbench import runtime
    from rltbench.commands.gsm8k.interleave import InterleavedGenerator

console = Console()
GSM8K_TEST_SIZE = 1319
CPU_LIMIT = 8  # questions when --limit is not given and the engine runs on the CPU (the full set: hours)
GEN_TOKS = 256  # most generated tokens per question when --max-gen-toks is not given
CPU_INTERPRETER_GEN_TOKS = 16  # ... on CPU where arms run their kernels in the Triton interpreter
DEFAULT_ARMS = "torch,exact,approx"
DEFAULT_MODEL = "ouro-1.4b"
ENGINE_CONTEXT_CAP = 4096  # GSM8K 8-shot prompts are ~1k tokens; caps the decode graphs' block tables
SERVER_TIMEOUT_S = 600.0  # per request, first token and between tokens: a server that says nothing
FALLBACK_TOKENIZER = "fallback_tokenizer.json"  # written into the run when no --tokenizer is given


def arm_names(arms: str | None, backend: str, servers: dict[str, str],
              overrides: dict[str, str | None] | None = None,
              graphs: bool = True) -> dict[str, ArmSpec | None]:
    """The arms to run, the reference `torch` first: {name: ArmSpec} on the engine (`--arms`, the
    A/A arm `torch#2` allowed once; `graphs`: whether the engine captures CUDA graphs, which sets the
    default scope), {name: None} for servers (the `--arm NAME=URL` names)."""
    from rltbench.commands.gsm8k import report

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
        specs = dict(armspec.parse_arms(arms or DEFAULT_ARMS, overrides, graphs=graphs))
        extra = [a for a in specs if "#" in a and a != f"{ref}#2"]
        if extra:
            raise UsageError(f"--arms lists an arm twice: {', '.join(extra)} (only {ref} may repeat, once: "
                             "the A/A arm)")
    if ref not in specs:
        raise UsageError(f"--arms must include the reference arm '{ref}'")
    return {ref: specs[ref], **{a: s for a, s in specs.items() if a != ref}}


def check_choices(task: str, backend: str, gate_filter: str) -> None:
    """The named choices (the numbers were checked against their bounds when the command line was
    parsed: rltbench.options)."""
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
    from rltbench import runtime

    _dev, _dt, model_cfg = runtime.check(source, device, dtype)
    if not source.random and tokenizer is None and not (Path(source.weights) / "tokenizer.json").is_file():
        raise UsageError(f"no tokenizer.json in {source.weights}: add it or pass --tokenizer PATH")
    if tokenizer is not None:
        _check_vocab(textcodec.load_tokenizer_file(tokenizer).vocab_size(), model_cfg.vocab_size)


def build_engine_side(
    source: runtime.ModelSource, tokenizer: str | None, device: str, dtype: str, run_dir: Path
) -> tuple[Any, Any, bool]:
    """(model, codec, random_weights): a preset with random weights or a checkpoint, and its text codec."""
    from rltbench import runtime

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
    from rltbench import runtime

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
    from rltbench.commands.gsm8k import report
    from rltbench.results.gsm8k_stats import NEEDED_N_CAP, verdict_label

    if c.get("verdict_reason") == armspec.NOT_EXERCISED:
        same = f"{c['n'] - c['sequences_differ']}/{c['n']}"
        return (f"{arm}: inconclusive: its kernels never ran ({armspec.NOT_EXERCISED}); its {same} "
                "sequences equal to the reference's are torch's own")
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
    from rltbench.commands.gsm8k import report
    from rltbench.results.console import fitted
    from rltbench.results.gsm8k_stats import verdict_label

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
    t.add_column("verdict")  # never cut: a table too wide for the console folds (results.console)
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
                # the reason's head ('not exercised'); the line under the table gives all of it
                f"[{color}]{verdict_label(c['verdict'], (c['verdict_reason'] or '').split(':')[0])}[/]",
            )
    console.print(fitted(t, keys=1))
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)


def _banner_random() -> None:
    from rltbench.commands.gsm8k import report

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
        options.number("Largest tolerated accuracy drop, in points (0-100). Pass: identical sequences, "
                       "or an exact 95% upper bound of the drop <= gate.", ge=0, le=100),
    ] = 1.0,
    task: Annotated[
        str, typer.Option(help="lm-eval task: gsm8k_cot (8-shot CoT) or gsm8k (5-shot).")
    ] = "gsm8k_cot",
    num_fewshot: Annotated[int | None, options.number("Exemplars (default: the task's).", ge=0)] = None,
    limit: Annotated[
        int | None, options.number(f"First N test questions (default all {GSM8K_TEST_SIZE}; {CPU_LIMIT} "
                                   "when the engine runs on the CPU).", ge=1, le=GSM8K_TEST_SIZE)
    ] = None,
    batch_size: Annotated[
        int, options.number("Concurrent sequences (engine max_num_seqs / requests in flight).", ge=1)
    ] = 32,
    max_gen_toks: Annotated[int | None, options.number(
        f"Most generated tokens per question (default {GEN_TOKS}; {CPU_INTERPRETER_GEN_TOKS} on CPU "
        "where arms run their kernels through the Triton interpreter).", ge=1)] = None,
    gate_mode: Annotated[
        str | None, typer.Option(hidden=True, help="Removed: the gate has one rule (exact bounds).")
    ] = None,
    gate_filter: Annotated[
        str, typer.Option("--filter", help="Which lm-eval extraction decides correctness.")
    ] = "strict-match",
    result_dir: options.ResultDirOption = None,
    backend: options.BackendOption = "engine",
    arm: options.ServersOption = None,
    dtype: options.DtypeOption = options.AUTO,
    device: options.DeviceOption = options.AUTO,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="tokenizer.json (or its directory); needed for real text with random weights."),
    ] = None,
    seed: options.SeedOption = 0,
) -> None:
    """GSM8K quality gate: paired accuracy of each arm vs torch.
    Exit 0 identical or pass, 1 fail, 3 inconclusive."""
    from rltbench import runtime
    from rltbench.commands.gsm8k import report
    from rltbench.results import RunDir

    set_offline_env()
    if gate_mode is not None:
        # the point rule passed without evidence and the normal bound passed at SE = 0
        raise UsageError(
            f"--gate-mode {gate_mode} was removed: the gate has one rule, exact 95% bounds (pass: "
            "identical sequences or an upper bound of the drop <= --gate); drop --gate-mode"
        )
    servers = parse_servers(arm or [])
    check_choices(task, backend, gate_filter)
    gen_toks_given = max_gen_toks is not None
    max_gen_toks = max_gen_toks if gen_toks_given else GEN_TOKS
    specs = arm_names(arms, backend, servers, armspec.override_flags(norm, rope, act, scope),
                      graphs=backend != "engine" or runtime.resolve_device(device) == "cuda")
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
        interpreted = sorted(armspec.eager_kernel_arms({a: s for a, s in specs.items() if s is not None}))
        if interpreted and runtime.resolve_device(device) == "cpu" and not gen_toks_given:
            max_gen_toks = CPU_INTERPRETER_GEN_TOKS
            notes.append(f"--max-gen-toks {max_gen_toks} on CPU: the arm(s) {', '.join(interpreted)} run "
                         "their kernels through the Triton interpreter, about a second per decode step "
                         "(give --max-gen-toks to generate more)")
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
    from rltbench.backends.engine import EngineBackend
    from rltbench.backends.openai import OpenAIBackend
    from rltbench.commands.gsm8k import report
    from rltbench.commands.gsm8k.interleave import InterleavedGenerator

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
    config["cuda_graphs"] = bool(engine.use_graphs)  # with arm_specs: which arms were exercised
    config["arm_specs"] = {name: spec.settings() for name, spec in specs.items()}
    for note in armspec.scope_notes(specs, bool(engine.use_graphs)):
        config["notes"].append(note)
        console.print(f"[yellow]note: {note}[/]", highlight=False, soft_wrap=True)
    questions = QuestionCodec(codec, tuple(model.config.eos_token_ids), max_context)
    return InterleavedGenerator(EngineBackend(engine, arms, codec), questions=questions, **common)


def _run(run: Any, config: dict[str, Any], source: runtime.ModelSource, specs: dict[str, Any],
         servers: dict[str, str]) -> dict[str, Any]:
    # lm-eval is an optional dependency: it loads when a gate runs, not at `rltbench --help`
    from rltbench.commands.gsm8k import report
    from rltbench.commands.gsm8k.evaluate import RltbenchLM, run_arm
    from rltbench.commands.gsm8k.interleave import CachedArmBackend
    from rltbench.results.gsm8k_stats import verdict_label

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
