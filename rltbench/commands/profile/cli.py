"""`rltbench profile`: kernels per token, GPU time per token and where it goes, per arm.

Registered by the lead in rltbench/cli.py as `profile`; `render` (report.py) serves `rltbench report`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rltbench.errors import UsageError


def _console() -> Console:
    """Rich console; in logs and pipes wide enough that the summary table is not folded."""
    con = Console()
    return con if con.is_terminal else Console(width=max(con.width, 160))
_DTYPES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float32": "float32",
}


def parse_arms(text: str) -> list[str]:
    """Comma-separated arm names, validated against rltbench.kernels.ARMS, order kept, no duplicates."""
    from rltbench.kernels import ARMS

    arms = [a.strip() for a in text.split(",") if a.strip()]
    if not arms:
        raise UsageError("--arms is empty; give e.g. torch,exact,approx")
    bad = [a for a in arms if a not in ARMS]
    if bad:
        raise UsageError(f"unknown arm(s) {', '.join(bad)}; choose from {', '.join(ARMS)}")
    if len(set(arms)) != len(arms):
        raise UsageError(f"--arms lists an arm twice: {text}")
    from rltbench import native

    native.require([ARMS[a] for a in arms])   # builds the native kernels now, or says why they cannot run
    return arms


def parse_dtype(text: str):
    import torch

    key = text.strip().lower()
    if key not in _DTYPES:
        raise UsageError(f"unknown dtype {text!r}; choose from bf16, fp16, fp32")
    return getattr(torch, _DTYPES[key])


def profile_command(
    model: Annotated[
        str,
        typer.Option(
            help="Model preset (ouro-1.4b, ouro-2.6b, huginn-0125, ouro-tiny, "
            "huginn-tiny); random weights unless --weights."
        ),
    ] = "ouro-1.4b",
    weights: Annotated[
        Path | None, typer.Option(help="Checkpoint directory (config.json + safetensors).")
    ] = None,
    batch: Annotated[int, typer.Option(help="Sequences per decode step.")] = 1,
    context: Annotated[int, typer.Option(help="Cached tokens per sequence.")] = 512,
    arms: Annotated[
        str, typer.Option(help="Comma-separated arms: torch, exact, approx, cuda (native CUDA C++).")
    ] = "torch,exact,approx",
    dtype: Annotated[
        str | None, typer.Option(help="bf16 | fp16 | fp32 (default bf16 on GPU, fp32 on CPU).")
    ] = None,
    iters: Annotated[int, typer.Option(help="Timed replays per arm (events, no profiler).")] = 200,
    rounds: Annotated[
        int, typer.Option(help="Interleaving rounds (A B C C B A ...) the iters are split into.")
    ] = 4,
    replays: Annotated[int, typer.Option(help="Graph replays under the profiler (count cross-check).")] = 3,
    steps: Annotated[
        int, typer.Option(help="Real engine decode steps under the profiler (work outside the graph).")
    ] = 3,
    cpu: Annotated[
        bool,
        typer.Option("--cpu", help="Profile the eager CPU path (CPU op counts, host times; no GPU claims)."),
    ] = False,
    result_dir: Annotated[
        Path | None,
        typer.Option(help="Run directory, new or without an earlier run (default results/profile-<UTC>)."),
    ] = None,
) -> None:
    """Kernels per token, GPU time per token and its breakdown per arm for one decode step."""
    import torch

    from rltbench.commands.profile.collect import ProfileSpec, run_profile
    from rltbench.commands.profile.report import SUMMARY, render, table_markdown

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
    if not cpu and not torch.cuda.is_available():
        raise UsageError(
            "rltbench profile needs a CUDA GPU (none found); use --cpu for a labelled CPU profile"
        )
    if weights is not None and not weights.is_dir():
        raise UsageError(f"--weights {weights}: not a directory")
    arm_list = parse_arms(arms)
    if weights:
        from rltbench.models import config_from_hf

        # config.json checked before any run directory exists; the manifest names what was loaded
        model = config_from_hf(weights / "config.json").name
    else:
        from rltbench.models import get_config

        get_config(model)  # UsageError listing the presets for an unknown name
    dt = parse_dtype(dtype or ("fp32" if cpu else "bf16"))
    spec = ProfileSpec(
        model=model,
        weights=str(weights) if weights else None,
        dtype=dt,
        batch=batch,
        context=context,
        arms=arm_list,
        iters=iters,
        rounds=rounds,
        replays=replays,
        steps=steps,
        cpu=cpu,
    )
    from rltbench.results import RunDir

    console = _console()
    config = {
        "model": model,
        "weights": spec.weights,
        "random_weights": weights is None,
        "batch": batch,
        "context": context,
        "arms": arm_list,
        "dtype": str(dt).replace("torch.", ""),
        "iters": iters,
        "rounds": rounds,
        "replays": replays,
        "steps": steps,
        "mode": "cpu" if cpu else "gpu",
    }
    try:
        from rltbench.kernels import ARMS

        config["selections"] = {a: _sel_dict(ARMS[a]) for a in arm_list}
    except Exception:  # noqa: BLE001 - manifests must not fail on a selection without to_dict
        pass
    run = RunDir.create("profile", result_dir=result_dir, argv=sys.argv, config=config)
    console.print(
        f"[bold]rltbench profile[/] -> {run.path}" + ("  [yellow](CPU mode: no GPU claims)[/]" if cpu else "")
    )
    try:
        out = run_profile(spec, log=lambda m: console.print(f"  {m}"))
    except KeyboardInterrupt:
        run.update_manifest(status="interrupted")
        raise
    except BaseException as exc:
        run.update_manifest(status="failed", error=f"{type(exc).__name__}: {exc}"[:500])
        raise
    traces = out.pop("_traces", {})
    out.update(model=model, weights=spec.weights, dtype=config["dtype"])
    for arm, tr in traces.items():
        run.write_json_gz(f"trace-{arm}.json.gz", tr)
    run.write_json(SUMMARY, out)
    render(run.path)
    run.update_manifest(status="complete")
    console.print(table_markdown(out).split("## ")[0])
    console.print(f"table: {run.file('table.md')}  plot: {run.file('breakdown.png')}")


def _sel_dict(sel) -> dict:
    if hasattr(sel, "to_dict"):
        return sel.to_dict()
    from dataclasses import asdict, is_dataclass

    return asdict(sel) if is_dataclass(sel) else {"repr": repr(sel)}
