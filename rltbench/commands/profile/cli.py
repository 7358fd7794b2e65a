"""`rltbench profile`: kernels per token, GPU time per token and where it goes, per arm.

`render` (report.py) serves `rltbench report`.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.console import Console

from rltbench import arms as armspec
from rltbench import options
from rltbench.commands.profile.defaults import DEFAULT_CONTEXT
from rltbench.errors import UsageError


def _console() -> Console:
    """Rich console; in logs and pipes wide enough that the summary table is not folded."""
    from rltbench.results.console import wide_console

    return wide_console()


def profile_device(device: str, cpu: bool) -> tuple[str, str | None]:
    """(device, note): a GPU unless `--device cpu` (or the older `--cpu`) asks for the labelled CPU
    profile, which makes no GPU claim; `auto` is the GPU where there is one, else the CPU profile
    (with a note saying so), so `rltbench profile --model ouro-tiny` works on any machine."""
    import torch

    from rltbench import runtime

    if cpu:
        if device not in ("cuda", "cpu", options.AUTO):
            raise UsageError(f"--cpu is --device cpu; it cannot go with --device {device}")
        device = "cpu"
    if device == options.AUTO:
        if torch.cuda.is_available():
            return runtime.resolve_device("cuda"), None
        return "cpu", "no CUDA GPU here: a labelled CPU profile (CPU ops and host times, no GPU claims)"
    if device != "cpu" and not torch.cuda.is_available():
        raise UsageError(
            f"--device {device}: rltbench profile found no CUDA GPU; use --device cpu for a labelled CPU "
            "profile"
        )
    return runtime.resolve_device(device), None


def profile_command(
    model: options.ModelOption = "ouro-1.4b",
    weights: options.WeightsOption = "random",
    batch: Annotated[int | None, options.number("Sequences per decode step (default 1; --bench prefill: "
                                                "rows of the prefill step, default 4).", ge=1)] = None,
    context: Annotated[
        int | None, options.number(f"Cached tokens per sequence (default {DEFAULT_CONTEXT}, less where the "
                                   "model's context cannot also hold the profiled steps; --bench prefill: "
                                   "prompt length, default 512; --bench exit: default 128).", ge=1)
    ] = None,
    arms: armspec.ArmsOption = "torch,exact,approx",
    norm: armspec.NormOption = None,
    rope: armspec.RopeOption = None,
    act: armspec.ActOption = None,
    scope: armspec.ScopeOption = None,
    dtype: options.DtypeOption = None,
    device: Annotated[
        str, typer.Option(help="auto (cuda if a GPU is visible, else cpu), cuda, cuda:N or cpu (cpu: the "
                          "eager CPU path, CPU op counts and host times, no GPU claims).")
    ] = options.AUTO,
    seed: options.SeedOption = 0,
    iters: Annotated[int | None, options.number("Timed replays per arm (events, no profiler; default 200). "
                                                "--bench: samples per cell and round (decode 20, prefill "
                                                "3, exit 10).", ge=1)] = None,
    rounds: Annotated[
        int | None, options.number("Interleaving rounds (A B C C B A ...) the iters are split into (default "
                                   "4; --bench: ABBA repetitions, decode 6, prefill 8, exit 10).", ge=1)
    ] = None,
    replays: Annotated[
        int, options.number("Graph replays under the profiler (count cross-check).", ge=1)
    ] = 3,
    steps: Annotated[
        int, options.number("Real engine decode steps under the profiler (work outside the graph).", ge=1)
    ] = 3,
    cpu: Annotated[bool, typer.Option("--cpu", hidden=True, help="The same as --device cpu.")] = False,
    result_dir: options.ResultDirOption = None,
    bench: Annotated[str | None, typer.Option(help="Instead of the profile, one step benchmark (GPU, random "
                                              "bf16 weights, arms ABBA with an A/A arm): 'decode' (model "
                                              "and engine decode steps, a burst), 'prefill' (eager vs "
                                              "graph prefill step) or 'exit' (every-loop vs the "
                                              "compute-saving exit step).")] = None,
    attribute: Annotated[bool, typer.Option(help="--bench decode: also time the batch-1 step in four "
                                            "engines (context class x pool size).")] = False,
    skip_burst: Annotated[bool, typer.Option(help="--bench decode: leave out the burst.")] = False,
    no_aa: Annotated[bool, typer.Option(help="--bench prefill: leave out the A/A arm (torch#2).")] = False,
    warmup: Annotated[int, options.number("--bench prefill: untimed runs per arm.", ge=0)] = 2,
    threshold: Annotated[float, options.number("--bench exit: exit threshold Q.", gt=0, lt=1)] = 0.7,
    batches: Annotated[str, typer.Option(help="--bench exit: comma-separated batch sizes.")] = "1,8",
    lengths: Annotated[str | None, typer.Option(help="--bench prefill: prompt lengths, comma list, one "
                                                "step of --batch prompts each, measured one after "
                                                "another (default: --context).")] = None,
) -> None:
    """Kernels per token, GPU time per token and its breakdown per arm for one decode step."""
    from rltbench.commands.profile.benches import check_bench_only

    check_bench_only(bench, {"--lengths": lengths is not None, "--attribute": attribute,
                             "--skip-burst": skip_burst, "--no-aa": no_aa})
    if bench is not None:
        from rltbench.commands.profile.benches import StepBench, run_bench

        print(run_bench(StepBench(bench, model, arms, batch, context, iters, rounds, attribute, skip_burst,
                                  no_aa, warmup, threshold, batches, lengths), result_dir))
        return
    batch = 1 if batch is None else batch
    iters = 200 if iters is None else iters
    rounds = 4 if rounds is None else rounds
    # torch and the engine: loaded when the command runs, not for `rltbench profile --help`
    from rltbench import runtime
    from rltbench.commands.profile.collect import ProfileSpec, fit_context, run_profile
    from rltbench.commands.profile.report import SUMMARY, render, summary_markdown
    from rltbench.results import RunDir

    dev, device_note = profile_device(device, cpu)
    specs = armspec.parse_arms(arms, armspec.override_flags(norm, rope, act, scope))
    source = runtime.ModelSource(model, weights, seed)
    # preset or config.json, dtype and lengths checked before any run directory exists
    _dev, dt, model_config = runtime.check(source, dev, dtype)
    label = model if source.random else model_config.name
    context, context_note = fit_context(context, int(model_config.max_position_embeddings), steps, iters,
                                        dev == "cpu", label)
    spec = ProfileSpec(
        source=source,
        device=dev,
        dtype=dt,
        batch=batch,
        context=context,
        arms=specs,
        iters=iters,
        rounds=rounds,
        replays=replays,
        steps=steps,
    )
    console = _console()
    notes = [n for n in (device_note, context_note) if n]
    for note in notes:
        console.print(f"[yellow]note: {note}[/]", highlight=False, soft_wrap=True)
    loaded, _tok = runtime.load(source, dev, dt)  # a corrupt checkpoint fails here, before the run directory
    config = {
        "model": label,
        "weights": None if source.random else weights,
        "random_weights": source.random,
        "batch": batch,
        "context": context,
        "arms": list(specs),
        "dtype": runtime.dtype_name(spec.dtype),
        "iters": iters,
        "rounds": rounds,
        "replays": replays,
        "steps": steps,
        "mode": "cpu" if spec.cpu else "gpu",
        "selections": {a: s.to_dict() for a, s in specs.items()},
        "notes": notes,
    }
    run = RunDir.create("profile", result_dir=result_dir, argv=sys.argv, config=config)
    mode_note = "  [yellow](CPU mode: no GPU claims)[/]" if spec.cpu else ""
    console.print(f"[bold]rltbench profile[/] -> {run.path}{mode_note}")
    extra = {"model": label, "weights": config["weights"], "dtype": config["dtype"], "notes": notes,
             "arms_planned": list(specs)}

    def save(out: dict[str, Any]) -> None:
        """summary.json (and the traces) of every arm finished so far: what a Ctrl-C keeps."""
        for arm, tr in out.get("_traces", {}).items():
            if not run.file(f"trace-{arm}.json.gz").exists():
                run.write_json_gz(f"trace-{arm}.json.gz", tr)
        run.write_json(SUMMARY, {k: v for k, v in out.items() if k != "_traces"} | extra)

    try:
        out = run_profile(spec, log=lambda m: console.print(f"  {m}"), model=loaded, on_arm=save)
    except BaseException as exc:
        run.mark_ended(exc)  # removes the run when no arm finished
        if isinstance(exc, KeyboardInterrupt) and run.kept():
            render(run.path)  # the finished arms' table and plot; the CLI says where in one line
            arms_done = ", ".join(run.read_json(SUMMARY).get("arms", {}))
            run.finished = f"finished arm(s) {arms_done}, table.md rendered"
        raise
    save(out)
    render(run.path)
    run.update_manifest(status="complete")
    from rltbench.results.console import print_markdown

    print_markdown(console, summary_markdown(run.read_json(SUMMARY)))
    console.print(f"table: {run.file('table.md')}  plot: {run.file('breakdown.png')}")
