"""`rltbench tune`: measure launch configurations on this GPU and write its tuned-config file.

Targets: ``kernels`` (the exact one-launch norm's layout, the approx norm's launch per width, the
exact SiLU*up's tiles: every candidate bitwise-checked before it is timed; kernels.py, chosen by
select.py) and ``attention`` (the decode-attention table per batch and context length;
attention.py). Each run writes its timings to a run directory; ``--write-tuned`` merges the chosen
sections into rltbench/tuned_configs/<GPU>.json with their provenance. ``--from-results DIR``
chooses again from an earlier run's files under the current rules, without a GPU.

Exit codes: 0 done, 1 a kernel configuration failed its bitwise check (reported, never chosen),
2 bad input (UsageError, before any run directory exists).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rltbench import knobs, options, tuned
from rltbench.errors import UsageError

if TYPE_CHECKING:
    from rltbench.results import RunDir

# torch, Triton and the timing code load when the command runs (inside the functions), not for its --help

TARGETS = ("kernels", "attention")
REPO = Path(__file__).resolve().parents[3]
# the files each target's run writes and --from-results reads back
KERNEL_FILES = {"exact": "exact_timing.json", "approx": "approx_timing.json", "act": "act_timing.json"}
ATTENTION_FILE = "sweep.json"


def _parts(text: str) -> list[str]:
    from rltbench.commands.tune import kernels

    parts = options.comma_list(text, "--parts", ",".join(kernels.PARTS))
    unknown = sorted(set(parts) - set(kernels.PARTS))
    if not parts or unknown:
        raise UsageError(f"--parts: unknown {unknown or text!r} (known: {', '.join(kernels.PARTS)})")
    return parts


def _portable(path: Path | str | None) -> str | None:
    """A path as the shipped tuned file may record it: relative to the repository when inside it,
    else its last component (no machine paths in shipped files)."""
    if path is None:
        return None
    p = Path(path).resolve()
    try:
        return str(p.relative_to(REPO))
    except ValueError:
        return p.name


def _write(device: str, sections: dict[str, Any], source: dict[str, Any], log: Any) -> None:
    path = None
    for name, value in sections.items():
        path = tuned.write_section(device, name, value, source)
    if path is not None:
        log(f"wrote {', '.join(sections)} to {_portable(path)}")


def _portable_words(words: list[str]) -> str:
    return " ".join(str(_portable(w)) if w.startswith("/") else w for w in words)


def _command_line(target: str) -> str:
    """This command as the shipped tuned file records it: `rltbench tune ...`, paths portable."""
    args = sys.argv[1:]
    if args[:1] != ["tune"]:   # not started from the command line (tests, a wrapper)
        return f"rltbench tune {target}"
    return _portable_words(["rltbench", *args])


def _reselect(target: str, src: Path, write: bool) -> dict[str, Any]:
    """--from-results: the sections an earlier run's files support under the current rules; with
    `write`, merged into the tuned file with that run's provenance."""
    from rltbench.commands.tune import attention, select
    from rltbench.results import RunDir
    from rltbench.results.provenance import git_info

    try:
        run = RunDir.open(src)
        prov = run.manifest.get("provenance", {})
        if target == "kernels":
            rows = {part: run.read_json(f) if run.file(f).is_file() else []
                    for part, f in KERNEL_FILES.items()}
            approx = rows["approx"]["rows"] if isinstance(rows["approx"], dict) else rows["approx"]
            incumbent = (prov.get("tuned") or {}).get("sections", {}).get("norm_approx")
            sections = select.best_sections(rows["exact"], approx, rows["act"], incumbent)
        else:
            sections = {"decode_attention": attention.tuned_rows(run.read_json(ATTENTION_FILE))}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--from-results {src}: not a `rltbench tune {target}` run directory "
                         f"({exc})") from None
    device = prov.get("gpu")
    if write and (not isinstance(device, str) or not device):
        raise UsageError(f"--from-results {src}: its manifest names no GPU")
    if write and sections:
        ran = str(prov.get("command_line") or "").split()
        source = {"command": _portable_words(ran), "result_dir": _portable(src), "date": prov.get("date_utc"),
                  "git_sha": prov.get("git_sha"),
                  "selected_offline": {"command": _command_line(target),
                                       "git_sha": git_info().get("git_sha")}}
        _write(device, sections, source, typer.echo)
    return sections


def _run_kernels(run: RunDir, widths: list[int], tokens: list[int], parts: list[str], calls: int,
                 rounds: int, reps: int) -> tuple[dict[str, Any], bool]:
    """Measure, write the run's files; returns the chosen sections and whether every exact
    configuration passed its bitwise check."""
    import torch

    from rltbench.bench.timing import measure_copy_bandwidth
    from rltbench.commands.tune import kernels, select

    dev = torch.device("cuda", torch.cuda.current_device())
    incumbent = tuned.section("norm_approx")   # before this run writes the tuned file
    exact: list[dict[str, Any]] = []
    approx_rows: list[dict[str, Any]] = []
    act: list[dict[str, Any]] = []
    all_passed = True
    if "exact" in parts:
        checks = kernels.check_exact(dev, widths, tokens)
        run.write_json("exact_checks.json", checks)
        passed = {n for n, per in checks.items() if all(p["mismatches"] == 0 for p in per.values())}
        all_passed = passed == set(checks)
        exact = kernels.time_exact(dev, widths, tokens, passed, calls, rounds, reps)
        run.write_json(KERNEL_FILES["exact"], exact)
    copy = measure_copy_bandwidth(dev)
    if "approx" in parts:
        approx_rows = kernels.time_approx(dev, copy["gbps"], 20, rounds, reps)
        run.write_json(KERNEL_FILES["approx"], {"copy": copy, "rows": approx_rows})
    if "act" in parts:
        act = kernels.time_act(dev, copy["gbps"], 20, rounds, reps)
        run.write_json(KERNEL_FILES["act"], act)
    text = kernels.table(exact, approx_rows, act, copy)
    run.write_markdown("table.md", text)
    typer.echo(text)
    sections = select.best_sections(exact, approx_rows, act, incumbent)
    run.write_json("best_sections.json", sections)
    return sections, all_passed


def _run_attention(run: RunDir, variants: str | None, reps: int, min_calls: int) -> dict[str, Any]:
    from rltbench.commands.tune import attention

    chosen = attention.SWEEP_VARIANTS
    if variants:
        chosen = {n: attention.SWEEP_VARIANTS[n] for n in _variants(variants)}
    res = attention.sweep_decode_attention(variants=chosen, reps=reps, min_calls=min_calls, log=typer.echo)
    run.write_json(ATTENTION_FILE, res)
    text = attention.format_table(res)
    run.write_markdown("table.md", "```\n" + text + "\n```\n")
    typer.echo(text)
    return {"decode_attention": attention.tuned_rows(res)}


def _variants(text: str) -> list[str]:
    """The attention sweep's variants named by --variants (UsageError for an unknown one)."""
    from rltbench.commands.tune import attention

    names = options.comma_list(text, "--variants", next(iter(attention.SWEEP_VARIANTS)))
    unknown = [v for v in names if v not in attention.SWEEP_VARIANTS]
    if unknown:
        raise UsageError(f"--variants: unknown {unknown} (known: {', '.join(attention.SWEEP_VARIANTS)})")
    return names


def _check_options(target: str, from_results: Path | None, variants: str | None) -> None:
    import torch

    knobs.check_environment()
    tuned.check()
    if target not in TARGETS:
        raise UsageError(f"unknown tune target {target!r} (known: {', '.join(TARGETS)})")
    if variants is not None and target != "attention":
        raise UsageError("--variants: only for `rltbench tune attention`")
    if variants is not None:
        _variants(variants)
    if from_results is not None and not (from_results / "manifest.json").is_file():
        raise UsageError(f"--from-results {from_results}: not a run directory (no manifest.json)")
    if from_results is None and not torch.cuda.is_available():
        raise UsageError(f"`rltbench tune {target}` measures on a CUDA GPU and none is visible "
                         "(--from-results DIR chooses again from an earlier run without one)")


def tune_command(
    target: Annotated[str, typer.Argument(help="kernels: the fused kernels' launch configs; attention: the "
                                          "decode-attention table.")],
    result_dir: Annotated[Path | None, typer.Option(help="Run directory, new or without an earlier run "
                                                     "(default results/tune-<UTC time>/).")] = None,
    write_tuned: Annotated[bool, typer.Option(help="Merge the chosen configs into "
                                              "rltbench/tuned_configs/<GPU>.json.")] = False,
    from_results: Annotated[Path | None, typer.Option(help="No GPU: choose again from an earlier tune run's "
                                                       "files under the current rules.")] = None,
    widths: Annotated[str, typer.Option(help="kernels: widths of the exact norm's cases.")] = "2048,5280",
    tokens: Annotated[str, typer.Option(help="kernels: token counts of the exact norm's cases (the "
                                        "choice weighs those <= 128).")] = "1,2,4,8,128,4096",
    parts: Annotated[str, typer.Option(help="kernels: exact (one-launch norm), approx (approx norm), act "
                                       "(exact SiLU*up).")] = "exact,approx,act",
    calls: Annotated[int, options.number("kernels: calls per captured graph.", ge=1)] = 40,
    rounds: Annotated[int, options.number("kernels: interleaving rounds.", ge=1)] = 4,
    reps: Annotated[int, options.number("Timed samples per round (kernels) or per variant (attention).",
                                        ge=1)] = 8,
    variants: Annotated[str | None, typer.Option(help="attention: a comma-separated subset of the "
                                                 "sweep's variants.")] = None,
    min_calls: Annotated[int, options.number("attention: calls per timing window.", ge=1)] = 200,
) -> None:
    """Measure launch configurations (bitwise-checked first) and write the GPU's tuned file."""
    import torch

    from rltbench.results import RunDir

    target = str(target).strip().lower()
    width_list = options.int_list(widths, "--widths", "2048,5280")
    token_list = options.int_list(tokens, "--tokens", "1,8,128")
    part_list = _parts(parts)
    _check_options(target, from_results, variants)
    if from_results is not None:
        sections = _reselect(target, from_results, write_tuned)
        typer.echo(f"chosen: {', '.join(sections) or 'nothing (no usable rows)'}")
        return
    run = RunDir.create("tune", result_dir, argv=list(sys.argv))
    all_passed = True
    if target == "kernels":
        sections, all_passed = _run_kernels(run, width_list, token_list, part_list, calls, rounds, reps)
    else:
        sections = _run_attention(run, variants, reps, min_calls)
    if write_tuned and sections:
        prov = run.manifest.get("provenance", {})
        source = {"command": _command_line(target), "result_dir": _portable(run.path),
                  "date": prov.get("date_utc"), "git_sha": prov.get("git_sha")}
        _write(torch.cuda.get_device_name(), sections, source, typer.echo)
    run.update_manifest(status="complete")
    if not all_passed:
        typer.echo("some exact configurations failed their bitwise check (exact_checks.json): not timed")
        raise typer.Exit(code=1)
