"""`rltbench kernels`: correctness, then speed, of every kernel arm op by op.

`kernels_command` is a plain function with typer annotations; rltbench/cli.py registers it with
`app.command("kernels")(kernels_command)`. Exit codes: 0 all good, 1 an exact-arm mismatch or a
failed case, 2 bad input (UsageError), 130 Ctrl-C (finished cases stay on disk).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rltbench import arms as armspec
from rltbench import native, options
from rltbench.arms import ARMS, REFERENCE, ArmSpec
from rltbench.bench import kernel_defaults as defaults
from rltbench.errors import UsageError
from rltbench.kernels.names import OPS

if TYPE_CHECKING:
    from rltbench.bench import kernel_sweep as bench
    from rltbench.results import RunDir

# torch, Triton and the kernels load when the command runs (inside the functions), not for its --help.
# Triton decides interpreter vs GPU when a kernel is *defined* (import time): rltbench.cli decides
# TRITON_INTERPRET before the command runs. Without a GPU and without the interpreter the fused arms
# fall back to torch and their rows say so (status "fallback").

DEFAULT_TOKENS = ",".join(str(t) for t in defaults.DEFAULT_TOKENS)
MODE_CHOICES = {"graph": ["graph"], "eager": ["eager"], "hot": ["hot"], "both": ["graph", "eager"],
                "all": ["graph", "eager", "hot"]}


FLAG_EXAMPLES = {"--tokens": "1,8,128", "--widths": "2048,5632", "--ops": "rmsnorm,silu_mul",
                 "--dtypes": "bf16,fp32"}


def _split(text: str, flag: str) -> list[str]:
    return list(dict.fromkeys(options.comma_list(text, flag, FLAG_EXAMPLES.get(flag, "a,b"))))


def parse_tokens(text: str) -> list[int]:
    return list(dict.fromkeys(options.int_list(text, "--tokens", FLAG_EXAMPLES["--tokens"])))


def parse_widths(text: str) -> list[int] | None:
    """None for 'model' (each op's model widths)."""
    if str(text).strip().lower() == "model":
        return None
    return list(dict.fromkeys(options.int_list(text, "--widths", FLAG_EXAMPLES["--widths"])))


def parse_choice(text: str, flag: str, known: list[str], aliases: dict[str, str] | None = None) -> list[str]:
    if str(text).strip().lower() == "all":
        return list(known)
    out = []
    for item in _split(text, flag):
        name = (aliases or {}).get(item.lower(), item.lower())
        if name not in known:
            raise UsageError(f"{flag}: unknown value {item!r} (known: {', '.join(known)})")
        out.append(name)
    return list(dict.fromkeys(out))


def parse_kernel_arms(arms: str, overrides: dict[str, str | None]) -> tuple[dict[str, ArmSpec], list[str]]:
    """The arms of `--arms` (rltbench.arms grammar, or 'all': every named arm and the A/A arm
    torch#2) and notes. torch is always there: it is the reference. The native arm is built here,
    before any case runs: named and unavailable, a UsageError with the reason; included by 'all'
    and unavailable, dropped with a note. Without an A/A arm the verdicts give no direction, so
    that is noted too."""
    from rltbench.results.stats import base_arm

    notes: list[str] = []
    text = str(arms).strip()
    if text.lower() == "all":
        names = list(ARMS)
        try:
            native.load()
        except native.NativeUnavailable as exc:
            names.remove(native.NATIVE_IMPL)
            notes.append(f"native arm unavailable: {exc}")
        text = ",".join([*names, REFERENCE])   # the repeat is the A/A arm, the run's noise floor
    specs = armspec.parse_arms(text, overrides)
    if REFERENCE not in specs:
        specs = {REFERENCE: ARMS[REFERENCE], **specs}
        notes.append("torch arm added: it is the reference for correctness and speedup")
    if not any(base_arm(name) != name for name in specs):
        notes.append("no A/A arm (an arm named twice, e.g. --arms torch,exact,torch): timings are "
                     "reported without a verdict on which arm is faster")
    return specs, notes


def build_config(tokens: str, ops: str, dtypes: str, widths: str, arms: str, repeats: int, mode: str,
                 scope: str, seed: int, peer: bool,
                 overrides: dict[str, str | None] | None = None,
                 placements: int = 1) -> tuple[bench.BenchConfig, list[str]]:
    """Parse and validate every flag (UsageError on bad input); returns the config and notes. `scope`
    is the scope of the fused arms while timing (correctness always runs them with scope all); the
    numbers were checked against their bounds when the command line was parsed (rltbench.options)."""
    from rltbench.bench import kernel_sweep as bench

    mode_key = str(mode).strip().lower()
    if mode_key not in MODE_CHOICES:
        raise UsageError(f"--mode: unknown value {mode!r} (known: {', '.join(MODE_CHOICES)})")
    scope_key = str(scope).strip().lower()
    if scope_key not in bench.SCOPES:
        raise UsageError(f"--scope: unknown value {scope!r} (known: {', '.join(bench.SCOPES)})")
    if placements > 1 and "graph" not in MODE_CHOICES[mode_key]:
        raise UsageError(f"--placements applies to graph mode; --mode {mode_key} has none "
                         "(use --mode graph, both or all)")
    specs, notes = parse_kernel_arms(arms, {**(overrides or {}), "scope": scope_key})
    cfg = bench.BenchConfig(
        ops=parse_choice(ops, "--ops", list(OPS)),
        tokens=parse_tokens(tokens),
        dtypes=parse_choice(dtypes, "--dtypes", list(bench.DTYPES), bench.DTYPE_ALIASES),
        widths=parse_widths(widths),
        arms=list(specs),
        modes=MODE_CHOICES[mode_key],
        repeats=int(repeats),
        scope=scope_key,
        seed=int(seed),
        peer=bool(peer),
        placements=int(placements),
        specs=specs,
    )
    return cfg, notes


def validate_shapes(cfg: bench.BenchConfig, cases: list[bench.Case]) -> None:
    """Each (op, width) must be buildable (e.g. RoPE widths are multiples of the head dim)."""
    import torch

    from rltbench.bench import kernel_sweep as bench
    from rltbench.kernels import op_case

    seen = set()
    for case in cases:
        if (case.op, case.width) in seen:
            continue
        seen.add((case.op, case.width))
        mult = bench.WIDTH_MULTIPLE.get(case.op, 1)
        if case.width % mult:
            hint = " (leave it out with --ops, or use --widths model)" if len(cfg.ops) > 1 else ""
            raise UsageError(f"--widths: {case.op} needs a multiple of its head dim {mult}, got "
                             f"{case.width}{hint}")
        try:
            op_case(case.op).make_inputs(1, case.width, torch.float32, torch.device("cpu"),
                                         torch.Generator().manual_seed(0))
        except (ValueError, AssertionError) as exc:
            raise UsageError(f"--widths: {case.width} does not fit op {case.op}: {exc}") from None


def kernels_command(
    tokens: Annotated[str, typer.Option(help="Comma-separated token counts (rows); capped at "
                                        f"{defaults.CPU_MAX_TOKENS} without a GPU.")] = DEFAULT_TOKENS,
    ops: Annotated[str, typer.Option(help=f"Comma-separated op cases ({', '.join(OPS)}), or 'all'.")
                   ] = "all",
    dtypes: Annotated[str, typer.Option(help="Comma-separated dtypes: bf16, fp16, fp32, or 'all'.")] = "bf16",
    widths: Annotated[str, typer.Option(help="Comma-separated feature widths for every op, or 'model' "
                                        "(each op's Ouro-1.4B / Huginn-0125 widths). RoPE widths are "
                                        "heads x head dim: multiples of 128 (rope_neox) / 96 "
                                        f"(rope_interleaved). Capped at {defaults.CPU_MAX_WIDTH} without "
                                        "a GPU.")] = "model",
    arms: Annotated[str, typer.Option(help="Arms: torch, exact, approx, cuda (native CUDA C++) or "
                                      "NAME=norm:exact/rope:off/act:approx, comma-separated, or 'all' "
                                      "(torch is always added: it is the reference; 'all' leaves cuda out, "
                                      "with a note, where it cannot be built, and adds torch#2). An arm "
                                      "named twice is the A/A arm (torch,exact,exact -> exact#2): its "
                                      "spread decides which differences are noise.")
                    ] = "all",
    norm: armspec.NormOption = None,
    rope: armspec.RopeOption = None,
    act: armspec.ActOption = None,
    repeats: Annotated[int, options.number("Timed samples per arm and mode (after warm-up; GPU only).",
                                           ge=1)] = 100,
    placements: Annotated[int, options.number("Graph mode (GPU): time each case this many times, each on "
                                              "newly allocated inputs, outputs and graphs, and pool the "
                                              "rounds. A streaming kernel's level moves with where its "
                                              "buffers lie; the table lists each placement's figure "
                                              "beside the pooled one.", ge=1)] = 1,
    mode: Annotated[str, typer.Option(help="Timing (GPU only): graph (CUDA-graph replay, inputs rotated "
                                      "past the L2: cold), eager, hot (graph replay of one input set: "
                                      "L2-hot, as a decode step's activations), both (graph + eager) "
                                      "or all.")] = "graph",
    scope: Annotated[str, typer.Option(help="Scope of the fused arms while timing: 'all' (fused in eager "
                                       "too) or 'graph' (fused only under graph capture, as models "
                                       "run by default).")] = "all",
    result_dir: options.ResultDirOption = None,
    seed: Annotated[int, options.number("Base seed of the random inputs.", ge=0, le=options.SEED_MAX)] = 0,
    peer: Annotated[bool, typer.Option(help="Add Liger-Kernel as a peer column if importable.")] = True,
    diagnose: Annotated[str | None, typer.Option(help="Instead of the sweep, one diagnosis (GPU) of one "
                                                 "row count and width (defaults 4096, 2048): "
                                                 "'carryover' (what a slot leaves in L2 for the next "
                                                 "one; one op and dtype, defaults rmsnorm, bf16) or "
                                                 "'ncu' (Nsight Compute counters and kernel timestamps "
                                                 "of the norms beside streaming copies).")] = None,
    positions: Annotated[int, options.number("--diagnose carryover: replays timed after each "
                                             "predecessor.", ge=3)] = 8,
    trials: Annotated[int, options.number("--diagnose carryover: trials per subject and predecessor.",
                                          ge=2)] = 16,
    launches: Annotated[int, options.number("--diagnose ncu: launches of each case per view.", ge=1)] = 8,
    views: Annotated[str, typer.Option(help="--diagnose ncu: comma-separated kernel (each launch alone), "
                                       "graph (back to back, Nsight Compute), trace (back to back, "
                                       "kernel timestamps).")] = "kernel,graph,trace",
    large_copy_mib: Annotated[int, options.number("--diagnose ncu: MiB moved by the large copy, read + "
                                                  "write.", ge=1)] = 1024,
    keep_reports: Annotated[bool, typer.Option(help="--diagnose ncu: keep each Nsight Compute report, "
                                               "gzipped (about 1 MB each).")] = False,
    ncu: Annotated[str, typer.Option(help="--diagnose ncu: the Nsight Compute command line tool (default: "
                                     "ncu on PATH, else $CUDA_HOME/bin or /usr/local/cuda/bin).")] = "ncu",
) -> None:
    """Check each kernel arm against torch (bitwise for exact) and the fp64 oracle, then time it."""
    if diagnose is not None:
        extra = {"positions": positions, "trials": trials, "reps": launches, "views": views,
                 "large_copy_mib": large_copy_mib, "keep_reports": keep_reports, "ncu": ncu}
        print(run_diagnosis(diagnose, tokens, ops, dtypes, widths, seed, result_dir, extra))
        return
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rltbench.bench import kernel_sweep as bench
    from rltbench.commands.kernels import report
    from rltbench.results.console import fitted, wide_console

    console = wide_console()  # a log or pipe gets room for the table; a terminal's tables fold to it
    cfg, notes = build_config(tokens, ops, dtypes, widths, arms, repeats, mode, scope, seed, peer,
                              {"norm": norm, "rope": rope, "act": act}, placements)
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    plan = bench.plan_cases(cfg, on_gpu)
    validate_shapes(cfg, plan.cases)
    notes += plan.notes
    if not on_gpu and not bench.interpreter_active():
        notes.append("no GPU and TRITON_INTERPRET is not 1: the fused arms fall back to torch (set "
                     "TRITON_INTERPRET=1 to check the kernels through the Triton interpreter)")
    peer_on = False
    if cfg.peer:
        if not on_gpu:
            notes.append("Liger peer column skipped: needs a GPU")
        elif bench.liger_available():
            peer_on = True
            notes.append(f"Liger-Kernel peer column for {', '.join(bench.PEER_OPS)} (not a dependency)")
        else:
            notes.append("liger_kernel not importable: no peer column")
    run = bench_run_dir(cfg, result_dir, notes)
    if on_gpu:
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = "cpu (Triton interpreter)" if bench.interpreter_active() else "cpu (no interpreter)"
    summary: dict[str, Any] = {"device": device.type, "device_name": device_name, "notes": notes,
                               "peer": peer_on, "l2_bytes": None, "copy": None}
    for n in notes:
        console.print(f"[yellow]note:[/] {n}", highlight=False)
    run.write_json(report.SUMMARY, summary)
    failed = 0
    try:
        ctx = None
        if on_gpu:
            ctx = bench.TimingContext.create(device)
            summary.update(l2_bytes=ctx.l2_bytes, copy=ctx.copy)
            run.write_json(report.SUMMARY, summary)
            console.print(f"device copy: {ctx.copy['gbps']:.0f} GB/s, L2 {ctx.l2_bytes / 2**20:.0f} MiB")
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True) as progress:
            task = progress.add_task("kernels", total=len(plan.cases))
            for case in plan.cases:
                progress.update(task, description=f"{case.op} {case.dtype} w={case.width} T={case.tokens}")
                arms_here = cfg.arms + ([bench.PEER_ARM] if peer_on and case.op in bench.PEER_OPS else [])
                ops_factory = functools.partial(bench.make_arm_ops, specs=cfg.specs)
                rows, samples = bench.case_rows(case, arms_here, device, cfg, ctx, ops_factory)
                run.extend_jsonl(report.SAMPLES, samples)
                run.extend_jsonl(report.ROWS, rows)  # one write: a case's arms are stored together
                failed += sum(int(bench.failing(r)) for r in rows)
                progress.advance(task)
    except KeyboardInterrupt:  # the CLI says in one line what was kept (rltbench/cli.py)
        df = report.load_rows(run)
        if df.empty:  # before the first case: nothing to keep
            run.discard()
            raise
        run.update_manifest(status="interrupted", result=_result(df, failed, len(plan.cases)))
        report.write_outputs(run, df, summary)
        run.finished = f"{_cases_done(df)} of {len(plan.cases)} cases finished, table.md rendered"
        raise
    except Exception:
        run.update_manifest(status="failed")
        raise
    df, verdict_rows = report.load_run(run)
    run.update_manifest(status="complete", result=_result(df, failed, len(plan.cases)))
    report.write_outputs(run, df, summary, verdict_rows)
    console.print(fitted(report.rich_table(df), keys=report.KEY_COLUMNS))
    against_exact = report.rich_verdicts(verdict_rows)
    if against_exact is not None:
        console.print(fitted(against_exact, keys=report.KEY_COLUMNS))
    if not on_gpu:
        console.print("[yellow]timings need a CUDA GPU: timing columns are empty on this machine[/]")
    console.print(f"results: {run.path}")
    if failed:
        console.print(f"[bold red]{failed} row(s) failed: exact mismatch or error (see table)[/]")
        raise typer.Exit(code=1)


DIAGNOSES = ("carryover", "ncu")


def _one(text: str, default_text: str, default: str, flag: str) -> str:
    """The single value a diagnosis takes from a list option (its own default where the sweep's
    default was left)."""
    if text == default_text:
        return default
    items = _split(text, flag)
    if len(items) != 1:
        raise UsageError(f"{flag}: --diagnose takes one value, got {text!r}")
    return items[0]


def run_diagnosis(name: str, tokens: str, ops: str, dtypes: str, widths: str, seed: int,
                  result_dir: Path | None, extra: dict[str, Any]) -> str:
    """`--diagnose NAME`: the diagnosis's run directory and table (UsageError for a bad value first).
    `extra` holds the options only the diagnoses read."""
    if name not in DIAGNOSES:
        raise UsageError(f"--diagnose: unknown value {name!r} (known: {', '.join(DIAGNOSES)})")
    try:
        rows = int(_one(tokens, DEFAULT_TOKENS, "4096", "--tokens"))
        width = int(_one(widths, "model", "2048", "--widths"))
    except ValueError:
        raise UsageError("--tokens and --widths: --diagnose takes one integer each") from None
    if name == "ncu":
        from rltbench.commands.kernels.ncu import NcuSpec, parse_views, run_ncu

        if rows < 1 or width < 1:
            raise UsageError("--tokens and --widths must be positive")
        spec = NcuSpec(tokens=rows, width=width, reps=extra["reps"], views=parse_views(extra["views"]),
                       large_copy_mib=extra["large_copy_mib"], keep_reports=extra["keep_reports"],
                       ncu=extra["ncu"])
        return run_ncu(spec, result_dir)
    from rltbench.commands.kernels.carryover import CarryoverSpec, run_carryover

    spec = CarryoverSpec(op=_one(ops, "all", "rmsnorm", "--ops"), tokens=rows, width=width,
                         dtype=_one(dtypes, "bf16", "bf16", "--dtypes"), positions=extra["positions"],
                         trials=extra["trials"], seed=seed)
    return run_carryover(spec, result_dir)


def _cases_done(df) -> int:
    """Cases with at least one stored row (a case's rows are written together when it finishes)."""
    keys = ["op", "dtype", "width", "tokens"]
    return 0 if df.empty else int(len(df[keys].drop_duplicates()))


def _result(df, failed: int, planned: int) -> dict[str, int]:
    """The manifest's `result`: how much of the plan finished and how many rows failed."""
    return {"rows": int(len(df)), "failing_rows": int(failed), "cases_done": _cases_done(df),
            "cases_planned": int(planned)}


def bench_run_dir(cfg: bench.BenchConfig, result_dir: Path | None, notes: list[str]) -> RunDir:
    """The run directory; its manifest records the config, the notes and each arm's selection."""
    from rltbench.results import RunDir

    selections = {a: s.replace(scope=cfg.scope).to_dict() for a, s in cfg.specs.items()}
    return RunDir.create("kernels", result_dir=result_dir, argv=list(sys.argv),
                         config={**cfg.to_dict(), "notes": notes, "arm_selections": selections,
                                 "correctness_scope": "all"})
