"""Tables and plots of a `rltbench kernels` run, rebuilt from its raw files only.

Raw files (the source of truth, written as cases finish): rows.jsonl (one row per case x arm),
samples.jsonl (every timing sample), summary.json (device facts and notes). `render(run_dir)`
re-creates table.md, cases.csv/json, verdicts.csv/json and the plots from them, for
`rltbench report DIR`. The verdicts (which differences are outside the A/A spread) are computed
from the samples here, not at run time, so a stored run can be re-read with the same rules.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
from rich.table import Table

from rltbench.arms import unexercised_arms
from rltbench.bench.kernel_sweep import SIZE_COPY
from rltbench.results import RunDir
from rltbench.results import kernel_verdicts as vd
from rltbench.results import report_sections as rs
from rltbench.results.plotting import arm_color, figure
from rltbench.results.stats import format_spread
from rltbench.results.tables import table

ROWS = "rows.jsonl"
SAMPLES = "samples.jsonl"
SUMMARY = "summary.json"
VERDICTS = "verdicts"   # verdicts.csv / verdicts.json
ARM_ORDER = ["torch", "exact", "cuda", "approx", "liger"]
BITWISE_ARMS = ("exact", "cuda")   # arms whose mismatches vs torch must be 0


def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return float("nan")
    return f


def _fmt(v: Any, digits: int = 2) -> str:
    f = _num(v)
    if not math.isfinite(f):
        return "-"
    return f"{f:.{digits}f}"


def _fmt_int(v: Any) -> str:
    f = _num(v)
    return "-" if not math.isfinite(f) else str(int(f))


def load_rows(run: RunDir) -> pd.DataFrame:
    """rows.jsonl as a DataFrame (empty frame with the key columns when nothing finished yet)."""
    rows = run.read_jsonl(ROWS)
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=["op", "dtype", "width", "tokens", "arm", "status"])
    return df


def load_verdicts(run: RunDir) -> list[dict[str, Any]]:
    """Every comparison of the run's timed arms (results/kernel_verdicts.py), from samples.jsonl; eager
    comparisons of scope-graph arms (torch's ops there) are marked not exercised."""
    rows = vd.verdicts(run.read_jsonl(SAMPLES), skip=(SIZE_COPY,))   # [] without samples
    selections = (run.manifest.get("config") or {}).get("arm_selections") or {}
    return vd.mark_unexercised(rows, unexercised_arms(selections, graphs=False))


def load_run(run: RunDir) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """The rows with their `verdict` column, and every comparison behind it."""
    rows = load_verdicts(run)
    return with_verdicts(load_rows(run), rows), rows


def has_values(df: pd.DataFrame, col: str) -> bool:
    """Whether some row has a number in column `col`."""
    return col in df and bool(pd.to_numeric(df[col], errors="coerce").notna().any())


def has_timings(df: pd.DataFrame, mode: str = "graph") -> bool:
    return has_values(df, f"{mode}_us_median")


def _sorted(df: pd.DataFrame) -> pd.DataFrame:
    rank = {a: i for i, a in enumerate(ARM_ORDER)}
    key = df["arm"].map(lambda a: rank.get(a, rank.get(vd.base_arm(a), len(rank)) + 0.5))
    return df.assign(_arm_rank=key).sort_values(["op", "dtype", "width", "tokens", "_arm_rank"]) \
        .drop(columns="_arm_rank")


def _mismatch_cell(row: pd.Series, markdown: bool) -> str:
    n = _fmt_int(row.get("mismatches"))
    share = _num(row.get("mismatch_share"))
    if n not in ("-", "0") and math.isfinite(share):
        n = f"{n} ({100 * share:.1f}%)"
    bad = vd.base_arm(str(row.get("arm"))) in BITWISE_ARMS and not n.startswith(("-", "0"))
    if not bad:
        return n
    return f"**{n} (must be 0)**" if markdown else f"[bold red]{n}[/]"


COLUMNS = ["op", "dtype", "width", "tokens", "arm", "status", "mismatches vs torch", "max ULP vs torch",
           "max ULP vs oracle", "err / bound", "share != oracle", "graph us (p10-p90)", "eager us (p10-p90)",
           "hot us (p10-p90)", "kernels/call", "GB/s", "% copy", "% same-size copy", "speedup",
           "vs torch", "PDL us (p10-p90)", "PDL % copy"]
HOT_COL = COLUMNS.index("hot us (p10-p90)")   # shown only when a row has an L2-hot timing
SIZE_COPY_COL = COLUMNS.index("% same-size copy")   # shown only when the run timed the same-size copy
VERDICT_COL = COLUMNS.index("vs torch")   # shown only when some arm has a verdict (timed rounds)
# shown only when an arm was also timed with its tuned programmatic-dependent-launch mode
PDL_COLS = (COLUMNS.index("PDL us (p10-p90)"), COLUMNS.index("PDL % copy"))
PDL_NOTE = ("The headline (% copy, speedup) is the plain launch. PDL us / PDL % copy: the same arm "
            "captured with the programmatic dependent launch mode the device's tuned file gives it for the "
            "case, timed in the same interleaving; consecutive calls of one op then overlap, which a model "
            "step (the op after a GEMM) does not offer.")


def _shown(df: pd.DataFrame, n: int) -> list[int]:
    """Column indices shown: the hot and PDL columns only where some row has those timings."""
    hidden = set()
    if not has_timings(df, "hot"):
        hidden.add(HOT_COL)
    if not has_values(df, "graph_pct_size_copy"):
        hidden.add(SIZE_COPY_COL)
    if "verdict" not in df or not df["verdict"].fillna("").astype(bool).any():
        hidden.add(VERDICT_COL)
    if not has_timings(df, "graph_pdl"):
        hidden.update(PDL_COLS)
    return [i for i in range(n) if i not in hidden]


def _bound_cell(row: pd.Series, markdown: bool) -> str:
    """The error over the approx arm's stated bound (oracle.bound_ratio); above 1 is flagged on the
    approx arm, the only arm the bound is a promise for (torch and exact round twice)."""
    v = _num(row.get("max_err_over_bound"))
    if not math.isfinite(v):
        return "-"
    cell = _fmt(v)
    if row.get("arm") == "approx" and v > 1:
        return f"**{cell} (> 1)**" if markdown else f"[bold red]{cell}[/]"
    return cell


def main_mode(row: pd.Series | dict[str, Any]) -> str:
    """The mode behind a row's headline columns (GB/s, % copy, speedup): graph, else eager, else hot."""
    return next((m for m in ("graph", "eager", "hot") if math.isfinite(_num(row.get(f"{m}_us_median")))),
                "graph")


def with_verdicts(df: pd.DataFrame, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """`df` with column `verdict`: the arm against torch in its headline mode ("A/A" for a repeated
    arm, empty for torch itself and where there are no rounds to compare)."""
    if df.empty:
        return df
    table = vd.vs_torch(rows)

    def cell(row: pd.Series) -> str:
        arm = str(row["arm"])
        if arm == vd.REFERENCE:
            return ""
        if arm != vd.base_arm(arm):
            return vd.AA
        key = (row["op"], row["dtype"], int(row["width"]), int(row["tokens"]), main_mode(row), arm)
        return table.get(key, "")
    return df.assign(verdict=[cell(r) for _, r in df.iterrows()])


def _cells(row: pd.Series, markdown: bool) -> list[str]:
    def span(mode: str) -> str:
        med = row.get(f"{mode}_us_median")
        if not math.isfinite(_num(med)):
            return "-"
        return f"{_fmt(med)} ({_fmt(row.get(f'{mode}_us_p10'))}-{_fmt(row.get(f'{mode}_us_p90'))})"

    main = main_mode(row)
    kpc = row.get(f"{main}_kernels_per_call")
    share = _num(row.get("share_differs_oracle"))
    status = str(row.get("status", ""))
    if not markdown and status not in ("ok", ""):
        status = f"[{'red' if status in ('MISMATCH', 'error') else 'yellow'}]{status}[/]"
    return [str(row["op"]), str(row["dtype"]), str(row["width"]), str(row["tokens"]), str(row["arm"]), status,
            _mismatch_cell(row, markdown), _fmt_int(row.get("max_ulp_vs_torch")),
            _fmt(row.get("max_ulp_vs_oracle")), _bound_cell(row, markdown),
            "-" if not math.isfinite(share) else f"{100 * share:.2f}%",
            span("graph"), span("eager"), span("hot"), _fmt(kpc, 1), _fmt(row.get(f"{main}_gbps"), 0),
            _fmt(row.get(f"{main}_pct_copy"), 1),
            _fmt(row.get("graph_pct_size_copy"), 1) if main == "graph" else "-",
            _fmt(row.get(f"{main}_speedup")), str(row.get("verdict") or "-"), span("graph_pdl"),
            _fmt(row.get("graph_pdl_pct_copy"), 1)]


def cold_rows(df: pd.DataFrame) -> int:
    """Rows whose timed samples saw cold work in some mode (runs older than this check: 0)."""
    cols = [c for c in df.columns if c.endswith("_warm")]
    return int((df[cols] == False).any(axis=1).sum()) if cols else 0  # noqa: E712 (NaN: not measured)


def _ratio_cell(r: dict[str, Any]) -> str:
    if r.get("ratio") is None:
        return "-"
    return f"{r['ratio']:.3f}x ({r['lo']:.3f}-{r['hi']:.3f}, {100 * r['coverage']:.0f}%)"


def verdict_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The comparisons section: every pair per case and mode, with its interval and A/A spread."""
    if not rows:
        return []
    order = {m: i for i, m in enumerate(vd.MODES)}
    rows = sorted(rows, key=lambda r: (r["op"], r["dtype"], r["width"], r["tokens"], order[r["mode"]],
                                       r["ref"] != vd.REFERENCE))
    body = [[str(r["op"]), str(r["dtype"]), str(r["width"]), str(r["tokens"]), r["mode"],
             f"{r['arm']} vs {r['ref']}", _fmt(r["arm_us"], 3), _fmt(r["ref_us"], 3), _ratio_cell(r),
             format_spread(r["aa_spread"]), r["verdict"]] for r in rows]
    return ["", "## Verdicts", "",
            "Each pair's ratio is reference time / arm time per round (above 1: the arm is faster), the "
            "median over the rounds of the interleaving with its order-statistic interval (its coverage in "
            "brackets). The A/A spread is how far the run's repeated arm landed from its original in the "
            "same case and mode; a ratio whose interval reaches into it is `within noise`. Without an A/A "
            f"arm no pair gets a direction (`{vd.NO_AA}`): add one with a repeated arm, e.g. `--arms "
            "torch,exact,cuda,torch`.", "",
            *table(["op", "dtype", "width", "tokens", "mode", "pair", "arm us", "ref us", "ref / arm",
                    "A/A spread", "verdict"], body)]


def placement_lines(df: pd.DataFrame) -> list[str]:
    """The placements section (`--placements N`): each arm's graph figure per placement beside the
    pooled one, so a threshold read off the pooled % copy shows how far one allocation moves it."""
    body = []
    for _, r in _sorted(df).iterrows():
        levels = r.get("graph_placement_us")
        if not isinstance(levels, list) or len(levels) < 2:
            continue
        pct = r.get("graph_placement_pct_copy")
        size = r.get("graph_placement_size_copy_us")
        body.append([str(r["op"]), str(r["dtype"]), str(r["width"]), str(r["tokens"]), str(r["arm"]),
                     " / ".join(_fmt(u, 3) for u in levels),
                     " / ".join(_fmt(v, 1) for v in pct) if isinstance(pct, list) else "-",
                     _fmt(r.get("graph_pct_copy"), 1),
                     " / ".join(_fmt(100 * c / u, 1) for c, u in zip(size, levels, strict=True))
                     if isinstance(size, list) else "-"])
    if not body:
        return []
    return ["", "## Placements", "",
            "Graph mode timed each case once per placement: inputs, outputs and graphs allocated anew "
            "(same values), the rounds of all placements pooled into the figures above and the verdicts. "
            "Per placement: the arm's median, its % of the device copy, and the same-size copy's time "
            "over the arm's in that placement.", "",
            *table(["op", "dtype", "width", "tokens", "arm", "graph us per placement",
                    "% copy per placement", "% copy pooled", "% same-size copy per placement"], body)]


CONTRACT = (
    "Contract: the `exact` and `cuda` (native CUDA C++) arms must differ from `torch` in 0 "
    "elements (bitwise); `approx` "
    "may differ. Max ULP vs torch counts representable steps between arm and torch; max ULP vs "
    "oracle is in ulps of the dtype at the fp64 oracle value (0.5 = correctly rounded); err / "
    "bound is the largest error over the approx arm's stated bound, 0.6 ulp (fp32: 8) + 2^-20 x "
    "the magnitude of the output's summed terms (fp32 slack, large only where an output cancels: "
    "rltbench/kernels/oracle.py), <= 1 within it; share != "
    "oracle = elements not equal to the oracle rounded to the dtype. Correctness inputs are fresh "
    "random values; the fused arms run with scope all. Times are us per call (median, p10-p90), "
    "CUDA-graph replay over rotated input sets (cold L2; each slot of the interleaving starts "
    "from a flushed L2, or, where the sets are too small to rotate past L2, each sample does), "
    "eager, and hot (graph replay of one input set: L2-hot, as a decode step); GB/s, % copy and "
    "speedup are of the graph (else eager) time; GB/s counts each input read once and each "
    "output written once; speedup is over the torch arm in the same mode; kernels/call is "
    "counted. % same-size copy: the case's bytes (half "
    "read, half written) streamed by torch's elementwise kernel (a bitwise not of int32), "
    "graph-captured over rotated buffers and timed in the same interleaving, over the arm's graph "
    "time; the device copy behind % copy is a memcpy of a buffer far larger than L2, where the "
    "launch and ramp costs that a kernel of a few MB pays vanish."
)
"""What the columns mean and what each arm must meet."""


class KernelsReport(NamedTuple):
    """What table.md is rendered from: the case rows, the run summary, the manifest, the verdicts."""

    df: pd.DataFrame
    summary: dict[str, Any]
    manifest: dict[str, Any]
    verdict_rows: list[dict[str, Any]]


def _header(r: KernelsReport) -> list[str]:
    summary = r.summary
    lines = [*rs.title("rltbench kernels"),
             f"Status: **{r.manifest.get('status', '?')}**. "
             f"Device: {summary.get('device_name') or summary.get('device', '?')}."]
    copy = summary.get("copy") or {}
    if math.isfinite(_num(copy.get("gbps"))):
        lines.append(f"Measured device-to-device copy: {_fmt(copy.get('gbps'), 0)} GB/s "
                     f"({_fmt_int(copy.get('bytes'))} bytes read+written); "
                     f"L2 {_fmt_int(summary.get('l2_bytes'))} B.")
    return lines


def _contract(r: KernelsReport) -> list[str]:
    return ["", CONTRACT, "", *([PDL_NOTE, ""] if has_timings(r.df, "graph_pdl") else [])]


def _notes(r: KernelsReport) -> list[str]:
    notes = list(r.summary.get("notes") or [])
    return ["Notes:", *rs.bullets(notes)] if notes else []


def _no_case(r: KernelsReport) -> list[str]:
    return ["No case finished."] if r.df.empty else []


def _warnings(r: KernelsReport) -> list[str]:
    """Bitwise arms that differ from torch and rows timed with cold work, in bold."""
    df, lines = r.df, []
    bad = df[df["arm"].isin(BITWISE_ARMS) & (df["status"] == "MISMATCH")] if "status" in df else df.iloc[:0]
    if len(bad):
        lines += rs.bold(f"FAIL: {len(bad)} bitwise-arm case(s) differ from torch.")
    cold = cold_rows(df)
    if cold:
        lines += rs.bold(f"{cold} row(s) timed with cold work among the timed samples (a Triton compile, "
                         "graph capture or device malloc: `cold_work` in samples.jsonl); their times "
                         "include it.")
    return lines


def _cases(r: KernelsReport) -> list[str]:
    """One line per case x arm (the rows the console's rich_table prints, with markdown cells)."""
    keep = _shown(r.df, len(COLUMNS))
    rows = [_cells(row, markdown=True) for _, row in _sorted(r.df).iterrows()]
    lines = table([COLUMNS[i] for i in keep], [[cells[i] for i in keep] for cells in rows])
    notes_rows = [(row["op"], row["dtype"], row["width"], row["tokens"], row["arm"], row.get("note"))
                  for _, row in _sorted(r.df).iterrows()
                  if isinstance(row.get("note"), str) and row.get("note")]
    if notes_rows:
        lines += ["", "Row notes:"]
        lines += [f"- {op} {dt} w={w} T={t} {arm}: {note}" for op, dt, w, t, arm, note in notes_rows]
    return lines


def _placements(r: KernelsReport) -> list[str]:
    return placement_lines(r.df)


def _verdicts(r: KernelsReport) -> list[str]:
    return verdict_lines(r.verdict_rows)


def _only_with_cases(section: rs.Section) -> rs.Section:
    """`section`, silent when no case finished."""
    def shown(r: KernelsReport) -> list[str]:
        return [] if r.df.empty else section(r)
    shown.__doc__ = section.__doc__
    return shown


def _end(r: KernelsReport) -> list[str]:
    return [""]


SECTIONS: list[rs.Section] = [
    _header, _contract, _notes, _no_case,
    *map(_only_with_cases, (_warnings, _cases, _placements, _verdicts)),
    _end,
]
"""The kernels report, top to bottom."""


def markdown_table(df: pd.DataFrame, summary: dict[str, Any], manifest: dict[str, Any],
                   verdict_rows: list[dict[str, Any]] | None = None) -> str:
    """The human summary: contract, device facts, notes, one line per case x arm, then the verdicts."""
    return rs.render_sections(SECTIONS, KernelsReport(df, summary, manifest, verdict_rows or []))


KEY_COLUMNS = 5   # op, dtype, w, T, arm: what names a row, repeated in every part of a folded table
SHORT = ["op", "dtype", "w", "T", "arm", "status", "diff", "ulp/t", "ulp/o", "e/b", "!=o", "graph us",
         "eager us", "hot us", "k/call", "GB/s", "%copy", "%size", "x torch", "verdict",
         "PDL us", "PDL %copy"]
TIMING_COLS = range(SHORT.index("graph us"), len(SHORT))


def rich_table(df: pd.DataFrame) -> Table:
    """The same table for the console, short headers (exact mismatches and errors in red).

    Timing columns are left out when no row has a timing (machines without a GPU).
    """
    timed = any(has_timings(df, m) for m in ("graph", "eager", "hot"))
    keep = [i for i in _shown(df, len(SHORT)) if timed or i not in TIMING_COLS]
    table = Table(title="rltbench kernels (diff = elements != torch, ulp/t = max ULP vs torch, ulp/o = max "
                  "ULP vs fp64 oracle, e/b = error / approx bound, !=o = share != oracle)", show_lines=False,
                  pad_edge=False)
    for i in keep:
        table.add_column(SHORT[i], justify="left" if i in (0, 1, 4, 5) else "right", overflow="fold",
                         no_wrap=i in (0, 5))
    if not df.empty:
        for _, row in _sorted(df).iterrows():
            cells = _cells(row, markdown=False)
            table.add_row(*[cells[i] for i in keep])
    return table


def rich_verdicts(rows: list[dict[str, Any]]) -> Table | None:
    """The pairs not against torch (those are the main table's `verdict`), for the console; None
    when there are none."""
    others = [r for r in rows if r["ref"] != vd.REFERENCE and r["verdict"] != vd.AA]
    if not others:
        return None
    out = Table(title="arms against exact (ref / arm per round: above 1 the arm is faster; table.md has "
                "every pair)", pad_edge=False)
    left = ("op", "dtype", "mode", "pair", "verdict")
    for name in ("op", "dtype", "w", "T", "mode", "pair", "ref / arm", "A/A spread", "verdict"):
        out.add_column(name, justify="left" if name in left else "right")
    key = ("op", "dtype", "width", "tokens", "mode", "arm")
    for r in sorted(others, key=lambda r: tuple(r[k] for k in key)):
        out.add_row(str(r["op"]), str(r["dtype"]), str(r["width"]), str(r["tokens"]), r["mode"],
                    f"{r['arm']} vs {r['ref']}", _ratio_cell(r), format_spread(r["aa_spread"]), r["verdict"])
    return out


# ----------------------------------------------------------------------------------------------
# plots
# ----------------------------------------------------------------------------------------------
def _panels(df: pd.DataFrame) -> list[tuple[str, int]]:
    return sorted({(str(o), int(w)) for o, w in zip(df["op"], df["width"], strict=True)})


def _grid(n: int):
    cols = min(3, max(1, n))
    rows = math.ceil(n / cols)
    fig, axes = figure(4.2 * cols, 3.4 * rows, rows, cols, squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def latency_figure(df: pd.DataFrame, mode: str, dtype: str):
    """Latency vs tokens, one panel per (op, width), one line per arm, log-log axes."""
    sub = df[df["dtype"] == dtype].copy()
    sub["t"] = pd.to_numeric(sub.get(f"{mode}_us_median"), errors="coerce")
    sub = sub[sub["t"].notna()]
    if sub.empty:
        return None
    panels = _panels(sub)
    fig, axes = _grid(len(panels))
    for ax, (op, width) in zip(axes, panels, strict=False):
        p = sub[(sub["op"] == op) & (sub["width"] == width)]
        for arm in [a for a in ARM_ORDER if a in set(p["arm"])] + sorted(set(p["arm"]) - set(ARM_ORDER)):
            a = p[p["arm"] == arm].sort_values("tokens")
            ax.plot(a["tokens"], a["t"], marker="o", label=arm, color=arm_color(arm))
            lo = pd.to_numeric(a.get(f"{mode}_us_p10"), errors="coerce")
            hi = pd.to_numeric(a.get(f"{mode}_us_p90"), errors="coerce")
            if lo is not None and hi is not None and lo.notna().all() and hi.notna().all():
                ax.fill_between(a["tokens"], lo, hi, alpha=0.2, color=arm_color(arm))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{op} (w={width})", fontsize=9)
        ax.set_xlabel("tokens")
        ax.set_ylabel("us per call")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{mode} latency, {dtype} (median, band p10-p90)")
    fig.tight_layout()
    return fig


def speedup_figure(df: pd.DataFrame, mode: str, dtype: str):
    """Speedup over torch, bars per (op, width, tokens), one bar per non-torch arm."""
    sub = df[(df["dtype"] == dtype) & (df["arm"] != "torch")].copy()
    sub["s"] = pd.to_numeric(sub.get(f"{mode}_speedup"), errors="coerce")
    sub = sub[sub["s"].notna()]
    if sub.empty:
        return None
    labels = sorted({(o, int(w), int(t))
                     for o, w, t in zip(sub["op"], sub["width"], sub["tokens"], strict=True)})
    arms = [a for a in ARM_ORDER if a in set(sub["arm"])]
    fig, ax = figure(max(7.0, 0.45 * len(labels) * max(1, len(arms))), 4.5)
    width = 0.8 / max(1, len(arms))
    for j, arm in enumerate(arms):
        a = sub[sub["arm"] == arm]
        vals = {(o, int(w), int(t)): s
                for o, w, t, s in zip(a["op"], a["width"], a["tokens"], a["s"], strict=True)}
        xs = [i + j * width for i in range(len(labels))]
        ax.bar(xs, [vals.get(lb, float("nan")) for lb in labels], width, label=arm, color=arm_color(arm))
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))])
    ax.set_xticklabels([f"{o}\nw={w} T={t}" for o, w, t in labels], rotation=90, fontsize=7)
    ax.set_ylabel("speedup over torch (x)")
    ax.set_title(f"{mode} speedup over torch, {dtype}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def accuracy_figure(df: pd.DataFrame, dtype: str):
    """Max ULP vs the fp64 oracle per op and arm (log scale; 0.5 = correctly rounded)."""
    sub = df[df["dtype"] == dtype].copy()
    sub["u"] = pd.to_numeric(sub.get("max_ulp_vs_oracle"), errors="coerce")
    sub = sub[sub["u"].notna()]
    if sub.empty:
        return None
    ops = sorted(set(sub["op"]))
    arms = [a for a in ARM_ORDER if a in set(sub["arm"])]
    fig, ax = figure(max(6.0, 1.1 * len(ops) * max(1, len(arms)) / 2), 4.0)
    width = 0.8 / max(1, len(arms))
    for j, arm in enumerate(arms):
        vals = [sub[(sub["op"] == op) & (sub["arm"] == arm)]["u"].max() for op in ops]
        heights = [max(v, 0.01) if math.isfinite(v) else float("nan") for v in vals]
        ax.bar([i + j * width for i in range(len(ops))], heights, width, label=arm, color=arm_color(arm))
    ax.set_yscale("log")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(ops))])
    ax.set_xticklabels(ops, rotation=30, fontsize=8)
    ax.set_ylabel("max ULP vs fp64 oracle (floor 0.01)")
    ax.set_title(f"error vs fp64 oracle, {dtype} (max over tokens/widths)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def write_outputs(run: RunDir, df: pd.DataFrame, summary: dict[str, Any],
                  verdict_rows: list[dict[str, Any]] | None = None) -> list[str]:
    """table.md, cases.csv/json, verdicts.csv/json and every plot the data supports; returns the file
    names written. `verdict_rows` None: computed from the run's samples."""
    written = []
    if verdict_rows is None:
        verdict_rows = load_verdicts(run)
    if "verdict" not in df:
        df = with_verdicts(df, verdict_rows)
    if not df.empty:
        run.write_table("cases", _sorted(df).drop(columns=["ops_stats"], errors="ignore"))
        written += ["cases.csv", "cases.json"]
    if verdict_rows:
        run.write_table(VERDICTS, pd.DataFrame(verdict_rows))
        written += [f"{VERDICTS}.csv", f"{VERDICTS}.json"]
    run.write_markdown("table.md", markdown_table(df, summary, run.manifest, verdict_rows))
    written.append("table.md")
    if df.empty:
        return written
    for dtype in sorted(set(df["dtype"])):
        fig = accuracy_figure(df, dtype)
        if fig is not None:
            run.save_plot(f"accuracy_{dtype}.png", fig)
            written.append(f"accuracy_{dtype}.png")
        for mode in ("graph", "eager", "hot"):
            for name, make in (("latency", latency_figure), ("speedup", speedup_figure)):
                fig = make(df, mode, dtype)
                if fig is not None:
                    run.save_plot(f"{name}_{mode}_{dtype}.png", fig)
                    written.append(f"{name}_{mode}_{dtype}.png")
    return written


def render(run_dir: str | Path) -> list[str]:
    """Re-create table.md, cases.csv/json and the plots of a stored kernels run from its raw files."""
    run = RunDir.open(run_dir)
    summary = run.read_json(SUMMARY) if run.file(SUMMARY).exists() else {}
    return write_outputs(run, load_rows(run), summary)
