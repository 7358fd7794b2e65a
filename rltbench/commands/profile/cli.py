"""`rltbench profile`: kernels per token, GPU time per token and where it goes, per arm.

`render` (report.py) serves `rltbench report`.
"""

from __future__ import annotations

import sys
from typing import Annotated

import torch
import typer
from rich.console import Console

from rltbench import arms as armspec
from rltbench import runtime
from rltbench.commands.profile.collect import ProfileSpec, run_profile
from rltbench.commands.profile.report import SUMMARY, render, table_markdown
from rltbench.errors import UsageError
from rltbench.results import RunDir


def _console() -> Console:
    """Rich console; in logs and pipes wide enough that the summary table is not folded."""
    con = Console()
    return con if con.is_terminal else Console(width=max(con.width, 160))


def profile_device(device: str, cpu: bool) -> str:
    """The device of the profile: a GPU unless `--device cpu` (or the older `--cpu`) asks for the
    labelled CPU profile, which makes no GPU claim."""
    if cpu:
        if device not in ("cuda", "cpu"):
            raise UsageError(f"--cpu is --device cpu; it cannot go with --device {device}")
        device = "cpu"
    if device != "cpu" and not torch.cuda.is_available():
        raise UsageError(
            "rltbench profile needs a CUDA GPU (none found); use --device cpu for a labelled CPU profile"
        )
    return runtime.resolve_device(device)


def profile_command(
    model: runtime.ModelOption = "ouro-1.4b",
    weights: runtime.WeightsOption = "random",
    batch: Annotated[int, typer.Option(help="Sequences per decode step.")] = 1,
    context: Annotated[int, typer.Option(help="Cached tokens per sequence.")] = 512,
    arms: armspec.ArmsOption = "torch,exact,approx",
    norm: armspec.NormOption = None,
    rope: armspec.RopeOption = None,
    act: armspec.ActOption = None,
    scope: armspec.ScopeOption = None,
    dtype: runtime.DtypeOption = None,
    device: Annotated[
        str, typer.Option(help="cuda, cuda:N or cpu (cpu: the eager CPU path, CPU op counts and host "
                          "times, no GPU claims).")
    ] = "cuda",
    seed: runtime.SeedOption = 0,
    iters: Annotated[int, typer.Option(help="Timed replays per arm (events, no profiler).")] = 200,
    rounds: Annotated[
        int, typer.Option(help="Interleaving rounds (A B C C B A ...) the iters are split into.")
    ] = 4,
    replays: Annotated[int, typer.Option(help="Graph replays under the profiler (count cross-check).")] = 3,
    steps: Annotated[
        int, typer.Option(help="Real engine decode steps under the profiler (work outside the graph).")
    ] = 3,
    cpu: Annotated[bool, typer.Option("--cpu", hidden=True, help="The same as --device cpu.")] = False,
    result_dir: runtime.ResultDirOption = None,
) -> None:
    """Kernels per token, GPU time per token and its breakdown per arm for one decode step."""
    for flag, val in (
        ("--batch", batch),
        ("--context", context),
        ("--iters", iters),
        ("--rounds", rounds),
        ("--replays", replays),
        ("--steps", steps),
    ):
        if val < 1:
            raise UsageError(f"{flag} must be a positive integer (got {val})")
    dev = profile_device(device, cpu)
    specs = armspec.parse_arms(arms, armspec.override_flags(norm, rope, act, scope))
    source = runtime.ModelSource(model, weights, seed)
    # config.json checked before any run directory exists; the manifest names what was loaded
    label = source.config().name if not source.random else model
    spec = ProfileSpec(
        source=source,
        device=dev,
        dtype=runtime.resolve_dtype(dtype, dev),
        batch=batch,
        context=context,
        arms=specs,
        iters=iters,
        rounds=rounds,
        replays=replays,
        steps=steps,
    )
    console = _console()
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
    }
    run = RunDir.create("profile", result_dir=result_dir, argv=sys.argv, config=config)
    mode_note = "  [yellow](CPU mode: no GPU claims)[/]" if spec.cpu else ""
    console.print(f"[bold]rltbench profile[/] -> {run.path}{mode_note}")
    try:
        out = run_profile(spec, log=lambda m: console.print(f"  {m}"))
    except BaseException as exc:
        run.mark_ended(exc)
        raise
    traces = out.pop("_traces", {})
    out.update(model=label, weights=config["weights"], dtype=config["dtype"])
    for arm, tr in traces.items():
        run.write_json_gz(f"trace-{arm}.json.gz", tr)
    run.write_json(SUMMARY, out)
    render(run.path)
    run.update_manifest(status="complete")
    console.print(table_markdown(out).split("## ")[0])
    console.print(f"table: {run.file('table.md')}  plot: {run.file('breakdown.png')}")
