"""`render(run_dir)`: table.md and breakdown.png of a profile run, from its raw summary.json only.

The table follows the study's: arm, kernels per step and per token, GPU ms per step and per token
with spread (p10-p90), ratio vs torch; then the floors and, per arm, the class breakdown, the
count cross-check and the top kernels. Kernels per step at batch 1 is the study's figure.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rltbench.commands.profile.classify import ATTN, CLASSES, GEMM
from rltbench.errors import UsageError
from rltbench.results import RunDir
from rltbench.results import report_sections as rs
from rltbench.results.plotting import caveat, colormap, figure
from rltbench.results.quantiles import summarize
from rltbench.results.tables import table

SUMMARY = "summary.json"
CPU_NO_VERDICT = "host timings of eager CPU steps say nothing about GPU kernels"
GAP = "launch gaps/idle"
OUTSIDE = "outside aten ops"   # CPU: Python, the Triton interpreter, the engine's own host work


def _f(x: Any, fmt: str = ".3f") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return format(x, fmt)


def _step_ms(arm: dict[str, Any], mode: str) -> tuple[float, float, float]:
    """(median, p10, p90) of one step in ms (GPU replay time, or host wall time on CPU)."""
    if mode == "gpu":
        s = arm.get("replay_stats_us") or {}
        return tuple(
            (s.get(k) if s.get(k) is not None else float("nan")) / 1e3 for k in ("median", "p10", "p90")
        )
    st = summarize(arm.get("wall_us") or [])
    return st.median / 1e3, st.p10 / 1e3, st.p90 / 1e3


def _decode_step_facts(facts: dict[str, Any] | None) -> list[str]:
    """What the timed graph was (context class, bucket, pool) and whether every timed cell was warm;
    nothing for runs recorded before these facts were (their table re-renders unchanged)."""
    if not facts:
        return []
    cold = [w for w in facts.get("warm", []) if w.get("warm") is False]
    warm = (f"**{len(cold)} of {len(facts.get('warm', []))} timed cells were not warm** (a capture, "
            "compile or pool growth inside them)" if cold else
            f"all {len(facts.get('warm', []))} timed cells warm (no capture, compile or pool growth)")
    return [
        f"Timed graph: context class {facts.get('len_class')} (attention covers that many positions), "
        f"batch bucket {facts.get('bucket')}, KV pool {facts.get('num_blocks')} blocks; arms ABBA "
        f"({' '.join(facts.get('order', []))}); {warm}. Same routine and engine sizing as the engine's "
        "decode table (docs/measurement.md).",
        "",
    ]


def _is_cpu(s: dict[str, Any]) -> bool:
    return s.get("mode", "gpu") == "cpu"


def _batch(s: dict[str, Any]) -> int:
    return int(s.get("batch", 1))


def _arms(s: dict[str, Any]) -> dict[str, Any]:
    return s.get("arms", {})


def _header(s: dict[str, Any]) -> list[str]:
    """Title, the arms that did not finish, and the manifest's notes."""
    lines = rs.title(f"rltbench profile: {s.get('model', '?')} batch {_batch(s)} "
                     f"context {s.get('context', '?')}")
    missing = [a for a in s.get("arms_planned", []) if a not in _arms(s)]
    if missing:
        lines += rs.bold(f"interrupted: no results for arm(s) {', '.join(missing)}; the table covers the "
                         "arms that finished")
    return lines + rs.notes(s.get("notes") or [])


def _mode(s: dict[str, Any]) -> list[str]:
    """What a count and a time are in this run: CPU ops and host time, or GPU kernels and replay time."""
    if _is_cpu(s):
        return [
            "**CPU mode**: counts are CPU `aten::` leaf ops per decode step (not GPU kernels) and times "
            "are host wall-clock of eager steps; arms with scope `graph` run torch's reference here "
            f"and the others the Triton interpreter or torch. **No speed verdict: {CPU_NO_VERDICT}**; "
            "no GPU claim is made.",
            "",
        ]
    batch = _batch(s)
    return [
        f"Device: {s.get('device_name', '?')}. A step = one decode-graph replay generating {batch} "
        f"token(s); per token = per step / {batch}. The study's figure is kernels per step at batch 1.",
        "",
        *_decode_step_facts(s.get("decode_step")),
    ]


def _steps(s: dict[str, Any]) -> list[str]:
    """One row per arm: kernels (CPU ops) and time per step and per token, and the ratio vs torch."""
    mode, batch, arms = s.get("mode", "gpu"), _batch(s), _arms(s)
    unit, tunit = ("CPU ops", "host ms") if mode == "cpu" else ("kernels", "GPU ms")
    ref = _step_ms(arms["torch"], mode)[0] if "torch" in arms else float("nan")
    gpu = mode != "cpu"  # on CPU there are no graph nodes to compare and no speed ratio to show
    rows = []
    for name, a in arms.items():
        k = a.get("kernels_per_step")
        med, p10, p90 = _step_ms(a, mode)
        ratio = ref / med if med and math.isfinite(med) and math.isfinite(ref) else float("nan")
        agree = {True: "yes", False: "**NO**", None: "n/a"}[a.get("agree")]
        rows.append([name, _f(k, ".0f"), _f(k / batch if k is not None else None, ".1f"),
                     *([agree] if gpu else []), f"{_f(med)} ({_f(p10)}-{_f(p90)})", _f(med / batch),
                     *([f"{_f(ratio, '.2f')}x"] if gpu else [])])
    header = ["arm", f"{unit}/step", f"{unit}/token", *(["graph nodes = profiler"] if gpu else []),
              f"{tunit}/step (p10-p90)", f"{tunit}/token", *(["vs torch"] if gpu else [])]
    return [*table(header, rows), ""]


def _cpu_weights(s: dict[str, Any]) -> list[str]:
    if s.get("mode", "gpu") == "gpu":
        return []
    wb = s.get("weight_bytes") or {}
    return ["Weights read per step (counted over one eager token): "
            f"{_f(wb.get('bytes', float('nan')) / 1e6)} MB.", ""]


def _floors(s: dict[str, Any]) -> list[str]:
    """GPU: the weight-bytes, KV-bytes and GEMM floors, and each class against its floor."""
    if s.get("mode", "gpu") != "gpu":
        return []
    arms, wb = _arms(s), s.get("weight_bytes") or {}
    bw = (s.get("copy_bandwidth") or {}).get("gbps")
    lines = [
        "## Floors (what no elementwise fusion can remove)",
        "",
        f"- weight-bytes floor: {_f(wb.get('bytes', float('nan')) / 1e9)} GB of weights read per step "
        f"(counted over one eager token; {_f(wb.get('reuse'), '.2f')}x the parameter bytes) / measured "
        f"copy {_f(bw, '.0f')} GB/s = **{_f(s.get('weight_floor_ms'))} ms/step**",
    ]
    kv = s.get("kv_bytes") or {}
    if kv:
        per_plane = kv.get("bytes_per_token", 0) // max(1, kv.get("planes") or 1)
        lines.append(
            f"- KV-bytes floor: {_f(kv.get('bytes', float('nan')) / 1e9, '.3f')} GB of cached K/V "
            f"read per step ({kv.get('batch')} rows x {kv.get('context')} tokens x "
            f"{kv.get('planes')} planes x {per_plane} B) / measured copy = "
            f"**{_f(s.get('kv_floor_ms'), '.3f')} ms/step**")
    lines += [
        "- GEMM floor: summed profiler kernel time of the GEMM + attention classes of the same step "
        "(projections, LM head, attention; excludes launch gaps):",
    ]
    for name, a in arms.items():
        lines.append(
            f"  - {name}: {_f(a.get('gemm_floor_us', float('nan')) / 1e3)} ms/step "
            f"(all kernels busy {_f(a.get('busy_us', float('nan')) / 1e3)} ms)"
        )
    return [*lines, "", *_floor_shares(arms)]


def _counts(s: dict[str, Any]) -> list[str]:
    """GPU: the graph's kernel nodes against the profiler's count, per arm."""
    if s.get("mode", "gpu") != "gpu":
        return []
    lines = ["## Kernel counts: graph nodes vs profiler", ""]
    for name, a in _arms(s).items():
        c = a.get("graph_census") or {}
        p = a.get("profiler") or {}
        o = a.get("outside_graph") or {}
        lines.append(
            f"- {name}: graph kernel nodes {c.get('kernels', 'n/a')}, memcpy {c.get('memcpy', 'n/a')}, "
            f"memset {c.get('memset', 'n/a')}; profiler {_f(p.get('kernels_per_replay'), '.1f')} "
            f"kernels/replay over {p.get('replays', 0)} replays; outside the graph per engine step: "
            f"{_f(o.get('kernels_per_step'), '.1f')} kernels + {_f(o.get('copies_per_step'), '.1f')} "
            f"copies. Verdict: {a.get('agree_reason', '')}"
        )
    return [*lines, ""]


def _per_class(a: dict[str, Any], cls: str) -> str:
    row = next((r for r in a.get("classes", []) if r["class"] == cls), {"count": 0, "time_us": 0})
    return f"{_f(row['count'], '.0f')} / {_f(row['time_us'], '.0f')} us"


def _breakdown(s: dict[str, Any]) -> list[str]:
    arms = _arms(s)
    lines = ["## Breakdown per class (count / time per step)", ""]
    if _is_cpu(s):
        lines += ["Times are aten op times of the profiled steps, which the profiler slows; breakdown.png "
                  f"splits each arm's host ms/step (the table above) in their shares, the rest '{OUTSIDE}' "
                  "(Python, the Triton interpreter).", ""]
    lines += table(["class", *arms], [[cls, *(_per_class(a, cls) for a in arms.values())] for cls in CLASSES])
    return lines + [
        "",
        "Classes of generic elementwise kernels (mul/add/cast) are inferred from their neighbours "
        "(see rltbench/commands/profile/classify.py).",
        "",
    ]


def _top(s: dict[str, Any]) -> list[str]:
    """Per arm, its 15 most frequent kernels (CPU: aten ops)."""
    lines = []
    for name, a in _arms(s).items():
        top = []
        for r in a.get("top_kernels", [])[:15]:
            kname = (r["name"] if len(r["name"]) <= 90 else r["name"][:87] + "...").replace("|", "\\|")
            top.append([f"`{kname}`", r.get("class", ""), _f(r.get("count"), ".1f"),
                        _f(r.get("time_us"), ".1f")])
        title, head = (("Top CPU ops", ["op", "class", "count/step", "host us/step"]) if _is_cpu(s)
                       else ("Top kernels", ["kernel", "class", "count/step", "us/step"]))
        lines += [f"### {title}: {name}", "", *table(head, top), ""]
    return lines


SUMMARY_SECTIONS: list[rs.Section] = [_header, _mode, _steps, _cpu_weights]
"""The report's head: what the console prints at the end of a run."""
SECTIONS: list[rs.Section] = [*SUMMARY_SECTIONS, _floors, _counts, _breakdown, _top]
"""The profile report, top to bottom."""


def table_markdown(s: dict[str, Any]) -> str:
    return rs.render_sections(SECTIONS, s)


def summary_markdown(s: dict[str, Any]) -> str:
    """The head of table.md (title, notes, mode, the per-arm step table) for the console."""
    return rs.render_sections(SUMMARY_SECTIONS, s) + "\n"


def _floor_shares(arms: dict[str, Any]) -> list[str]:
    """Each bounded class against its floor, per arm: the floor's time as a % of the class's kernel
    time (100% = the class runs at the copy rate)."""
    if not any(a.get("floor_shares") for a in arms.values()):
        return []
    rows = []
    for name, a in arms.items():
        shares = a.get("floor_shares") or {}
        time_us = {r["class"]: r["time_us"] for r in a.get("classes", [])}
        cells = [f"{_f(time_us.get(c, float('nan')) / 1e3, '.3f')} ms = "
                 f"{_f(100 * shares.get(c, float('nan')), '.1f')}% of floor" for c in (GEMM, ATTN)]
        rows.append([name, *cells])
    return ["Each class against its floor (floor time / class kernel time; GEMM against the "
            "weight-bytes floor, attention against the KV-bytes floor):", "",
            *table(["arm", "GEMM class", "attention class"], rows), ""]


def step_segments(a: dict[str, Any], mode: str) -> dict[str, float]:
    """One arm's bar in breakdown.png: ms per step per class, stacking up to the table's step time.

    GPU: each class's profiler kernel time, plus the launch gaps (step - busy). CPU: the table's host
    ms/step (median of the unprofiled steps) split in the shares the profiled steps give: each class's
    aten op time over the profiled step's wall time, the rest outside aten ops (Python, the Triton
    interpreter). The profiler slows every op, so its own times are not the table's quantity; its
    shares are. Runs stored before the profiled steps were timed split by the op times alone."""
    times = {cls: next((r["time_us"] for r in a.get("classes", []) if r["class"] == cls), 0.0) / 1e3
             for cls in CLASSES}
    step = _step_ms(a, mode)[0]
    if mode == "gpu":
        gap = max(0.0, step - a.get("busy_us", 0.0) / 1e3) if math.isfinite(step) else 0.0
        return {**times, GAP: gap}
    ops = sum(times.values())
    profiled = summarize(a.get("profiled_wall_us") or []).median / 1e3 if a.get("profiled_wall_us") else ops
    whole = max(profiled, ops)
    if not (math.isfinite(step) and whole > 0):
        return {**times, OUTSIDE: 0.0}
    return {**{c: step * t / whole for c, t in times.items()}, OUTSIDE: step * (whole - ops) / whole}


def breakdown_figure(s: dict[str, Any]) -> Any:
    """Stacked bars: time per class per arm (per step), plus launch gaps on GPU (the rest outside aten
    ops on CPU), each bar as tall as the table's step time (`step_segments`), with floor lines."""
    arms: dict[str, Any] = s.get("arms", {})
    mode = s.get("mode", "gpu")
    fig, ax = figure(7.5, 4.5)
    names = list(arms)
    bottoms = [0.0] * len(names)
    cmap = colormap("tab10")
    segments = [step_segments(a, mode) for a in arms.values()]
    series = list(CLASSES) + [GAP if mode == "gpu" else OUTSIDE]
    for i, cls in enumerate(series):
        vals = [seg.get(cls, 0.0) for seg in segments]
        if any(vals):
            grey = cls in (GAP, OUTSIDE)
            ax.bar(names, vals, bottom=bottoms, label=cls, color="#cccccc" if grey else cmap(i % 10))
            bottoms = [b + v for b, v in zip(bottoms, vals, strict=False)]
    for x, total in enumerate(bottoms):  # the bar's height is the table's figure: print it
        ax.annotate(f"{total:.2f}", (x, total), ha="center", va="bottom", fontsize=8)
    if mode == "gpu":
        wf = s.get("weight_floor_ms")
        if wf is not None and math.isfinite(wf):
            ax.axhline(wf, color="k", ls="--", lw=1, label="weight-bytes floor")
        gf = [a.get("gemm_floor_us") for a in arms.values() if a.get("gemm_floor_us") is not None]
        if gf:
            ax.axhline(min(gf) / 1e3, color="k", ls=":", lw=1, label="GEMM floor")
    ax.set_ylabel("host ms per step (table: host ms/step)" if mode == "cpu"
                  else "GPU ms per step (table: GPU ms/step)")
    ax.set_title(
        f"{s.get('model', '')} batch {s.get('batch')} context {s.get('context')}"
        + (" - CPU mode" if mode == "cpu" else "")
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    caveat(fig, [f"no speed verdict: {CPU_NO_VERDICT}" if mode == "cpu" else None])
    return fig


def render(run_dir: str | Path) -> None:
    """Re-create table.md and breakdown.png from summary.json (for `rltbench report DIR`)."""
    run = RunDir.open(run_dir)
    if not run.file(SUMMARY).is_file():
        raise UsageError(f"{run_dir}: no {SUMMARY} (the profile did not finish any arm)")
    s = run.read_json(SUMMARY)
    if not s.get("arms"):
        raise UsageError(f"{run_dir}: {SUMMARY} has no arm results")
    run.write_markdown("table.md", table_markdown(s))
    run.save_plot("breakdown.png", breakdown_figure(s))
