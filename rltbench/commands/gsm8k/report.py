"""Gate analysis and rendering from the stored raw files only.

The verdict rule (results/gsm8k_stats.py says why): an arm whose kernels never ran is "inconclusive: not
exercised" (exit 3); else an arm whose generated sequences all equal the reference's is "identical"
(exit 0); otherwise, with random weights, "inconclusive: random weights" (exit 3); else pass iff
the exact one-sided 95% upper bound of the drop is <= the gate, fail iff the exact 95% lower bound
is > the gate, inconclusive otherwise. `GATE_CAPTION` states it under every table.md.

Raw files (written by the command): `questions.jsonl` (one row per question: doc id, target and,
per arm, the answer text, strict/flexible extractions and correctness, generated token count and
ids) and `arms.json` (per-arm timing and counters). `analyze` turns them into the summary
(accuracies, paired statistics, verdicts); `render(run_dir)` (for `rltbench report DIR`) rewrites
summary.json, table.md and accuracy.png from those files and the manifest's config.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from pathlib import Path
from typing import Any, NamedTuple

from rltbench.arms import NOT_EXERCISED, unexercised_arms
from rltbench.bench.warmth import is_cold
from rltbench.commands.gsm8k.interleave import CHUNKS_FILE, REPLAY_FILE
from rltbench.errors import UsageError
from rltbench.results import RunDir
from rltbench.results import report_sections as rs
from rltbench.results.gsm8k_stats import (
    check_gate,
    cp_lower,
    cp_upper,
    exit_code,
    gate_verdict,
    needed_n,
    overall_verdict,
    paired_stats,
    verdict_label,
)
from rltbench.results.plotting import figure
from rltbench.results.stats import aa_name, compare_to_reference, format_interval, format_spread
from rltbench.results.tables import table

REFERENCE_ARM = "torch"
QUESTIONS_FILE = "questions.jsonl"
ARMS_FILE = "arms.json"
GATE_RULE = "exact 95% bounds"
GATE_CAPTION = (
    "Verdicts: **inconclusive: not exercised** for an arm whose kernels never ran (scope graph without "
    "CUDA graphs runs torch's ops); else **identical** when every generated sequence equals the "
    "reference's (token ids, or text where the backend has no ids); otherwise, with random weights, "
    "**inconclusive: random weights** whatever the numbers; else **pass** when UCB95 <= gate, **fail** "
    "when LCB95 > gate, **inconclusive** in between. LCB95 / UCB95 are exact one-sided 95% bounds of the "
    "drop (Clopper-Pearson bounds on the discordance rate (n10 + n01) / n and on the share n10 / (n10 + "
    "n01), 2.5% each); they stay valid with no discordant question, where the standard error is 0. SE is "
    "the normal-approximation standard error, for comparison only: it decides nothing. n needed: the "
    "questions at which the same bounds would decide the gate if the observed rates n10 / n and n01 / n "
    "held (unknown: no size decides it, e.g. drop = gate)."
)
RANDOM_WEIGHTS_BANNER = (
    "RANDOM WEIGHTS: accuracies are meaningless (near zero); this run only checks "
    "that the gate pipeline works and whether arms generate identical sequences."
)


def _seq_differs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Token ids when both arms have them (engine), else the answer text (OpenAI backend)."""
    if a.get("token_ids") is not None and b.get("token_ids") is not None:
        return list(a["token_ids"]) != list(b["token_ids"])
    return a.get("response") != b.get("response")


def analyze(
    rows: list[dict[str, Any]],
    arms: list[str],
    arm_info: dict[str, dict[str, Any]],
    gate: float,
    gate_filter: str,
    random_weights: bool,
    unexercised: Collection[str] = (),
) -> dict[str, Any]:
    """The summary: per-arm accuracy/throughput, per-variant paired stats and verdicts, the overall.
    `unexercised`: arms whose kernels never ran (`not_exercised`): inconclusive whatever they output."""
    check_gate(gate)
    key = "strict_correct" if gate_filter == "strict-match" else "flexible_correct"
    n = len(rows)
    per_arm: dict[str, Any] = {}
    for arm in arms:
        info = dict(arm_info.get(arm, {}))
        cells = [r["arms"][arm] for r in rows]
        secs = info.get("seconds") or 0.0
        toks = sum(int(c.get("gen_tokens") or 0) for c in cells)
        per_arm[arm] = {
            "n": n,
            "strict_acc": 100.0 * sum(bool(c.get("strict_correct")) for c in cells) / n if n else math.nan,
            "flexible_acc": 100.0 * sum(bool(c.get("flexible_correct")) for c in cells) / n
            if n
            else math.nan,
            "gate_acc": 100.0 * sum(bool(c.get(key)) for c in cells) / n if n else math.nan,
            "generated_tokens": toks,
            "seconds": secs,
            "questions_per_s": n / secs if secs > 0 else None,
            "tokens_per_s": toks / secs if secs > 0 else None,
            **{k: v for k, v in info.items() if k not in ("seconds",)},
        }
    comparisons = []
    for arm in arms:
        if arm == REFERENCE_ARM or REFERENCE_ARM not in arms:
            continue
        ref = [bool(r["arms"][REFERENCE_ARM].get(key)) for r in rows]
        var = [bool(r["arms"][arm].get(key)) for r in rows]
        st = paired_stats(ref, var)
        differ = sum(1 for r in rows if _seq_differs(r["arms"][REFERENCE_ARM], r["arms"][arm]))
        v, reason = gate_verdict(st, gate, differ, random_weights,
                                 NOT_EXERCISED if arm in unexercised else None)
        comparisons.append(
            {
                "arm": arm,
                "reference": REFERENCE_ARM,
                **st.to_dict(),
                "verdict": v,
                "verdict_reason": reason,
                # more questions cannot cure random weights: no size is quoted for them
                "needed_n": needed_n(st, gate) if v == "inconclusive" and reason is None else None,
                "sequences_differ": differ,
            }
        )
    overall, overall_reason = overall_verdict([(c["verdict"], c["verdict_reason"]) for c in comparisons])
    return {
        "n": n,
        "gate": gate,
        "gate_rule": GATE_RULE,
        "gate_filter": gate_filter,
        "reference": REFERENCE_ARM,
        "random_weights": random_weights,
        "arms": per_arm,
        "comparisons": comparisons,
        "overall": overall if comparisons else "n/a",
        "overall_reason": overall_reason if comparisons else None,
        "exit_code": exit_code(overall),
    }


def _fmt(x: Any, nd: int = 2) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _p(x: float) -> str:
    return "-" if x is None else (f"{x:.3g}" if x >= 1e-3 else f"{x:.1e}")


def interleaved_throughput(chunks: list[dict[str, Any]], arms: list[str], ref: str) -> dict[str, Any]:
    """Questions/s per arm over the chunks every arm finished, and each arm's speedup over `ref`:
    one paired ratio per chunk (arms ran ABBA within it), its interval, the A/A spread, the label."""
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for c in chunks:
        by.setdefault(c["arm"], {})[int(c["chunk"])] = c
    common = sorted(set.intersection(*(set(by.get(a, {})) for a in arms))) if arms else []
    per_arm = {}
    for a in arms:
        rows = [by[a][c] for c in common]
        secs = sum(float(r["seconds"]) for r in rows)
        q = sum(int(r["questions"]) for r in rows)
        per_arm[a] = {
            "chunks": len(rows),
            "questions": q,
            "seconds": secs,
            "questions_per_s": q / secs if secs > 0 else None,
            "cold_chunks": [r["chunk"] for r in rows if is_cold(r.get("cold_work"))],
        }
    per_rep = {a: [float(by[a][c]["seconds"]) for c in common] for a in arms}
    aa = aa_name(ref) if aa_name(ref) in arms else None
    speed = compare_to_reference(per_rep, ref, aa) if ref in arms and common else []
    return {"chunks": len(common), "arms": per_arm, "speedups": speed, "aa": aa}


def replay_identity(replays: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per arm: questions identical to the reference when replayed on its exact batches."""
    out: dict[str, dict[str, Any]] = {}
    for r in replays:
        a = out.setdefault(r["arm"], {"compared": 0, "identical": 0, "first": None, "kernels_in_eager": True})
        a["compared"] += r["compared"]
        a["identical"] += r["identical"]
        a["kernels_in_eager"] = a["kernels_in_eager"] and bool(r.get("kernels_in_eager_steps"))
        for d in r.get("divergences", []):
            first = a["first"]
            if first is None or (d["question"], d["token_index"]) < (first["question"], first["token_index"]):
                a["first"] = d
    return out


def _throughput_lines(summary: dict[str, Any]) -> list[str]:
    tp = summary.get("throughput")
    if not tp or not tp["chunks"]:
        return []
    ref = summary["reference"]
    lines = [
        "",
        f"## Throughput, arms interleaved (ABBA over {tp['chunks']} chunks of one batch each)",
        "",
    ]
    sp = {r["arm"]: r for r in tp["speedups"]}
    rows = []
    for arm, a in tp["arms"].items():
        r = sp.get(arm)
        speedup = "(ref)" if arm == ref else format_interval(r and r["speedup"])
        spread = format_spread(r and r["aa_spread"]) if r else "-"
        rows.append([arm, _fmt(a["questions_per_s"], 3), speedup, spread, r["label"] if r else "-",
                     ", ".join(map(str, a["cold_chunks"])) or "none"])
    header = ["arm", "questions/s", f"speedup vs {ref} (interval)", "A/A spread", "label", "cold chunks"]
    lines += table(header, rows, ["", "r", "", "", "", ""])
    lines += [
        "",
        "Speedup: median over chunks of (reference seconds / arm seconds), order-statistic interval; "
        "'within noise' when it reaches into the A/A spread (run `--arms torch,exact,torch` for an A/A "
        "arm). Cold chunks: a graph capture, compile or device malloc happened inside the timed chunk.",
    ]
    if summary.get("no_speed_verdict"):
        lines.append(f"No speed verdict: {summary['no_speed_verdict']}.")
    return lines


def _replay_lines(summary: dict[str, Any]) -> list[str]:
    rp = summary.get("replay")
    if not rp:
        return []
    lines = [
        "",
        f"## Identity under schedule replay (each arm on {summary['reference']}'s batches, kernels on "
        "in every step, prefill included)",
        "",
    ]
    rows = []
    for arm, r in rp.items():
        fd = r["first"]
        fdt = "-" if fd is None else f"{fd['question']}, {fd['token_index']}, {fd['step']}"
        bad = " **MISMATCH: must match (kernel bug)**" if arm in summary.get("exact_mismatch", []) else ""
        rows.append([arm, f"{r['identical']} / {r['compared']}{bad}", fdt])
    return lines + table(["arm", "identical / compared", "first divergence (question, token, step)"], rows)


class GateReport(NamedTuple):
    """What table.md is rendered from: the gate summary and the run's configuration."""

    summary: dict[str, Any]
    config: dict[str, Any]


def _header(r: GateReport) -> list[str]:
    summary, config = r
    lines = rs.title(
        f"GSM8K gate: {config.get('task', '?')} ({config.get('num_fewshot_used', '?')}-shot), "
        f"{summary['n']} questions, gate {summary['gate']:g} points ({summary['gate_rule']}, "
        f"{summary['gate_filter']})"
    )
    if summary.get("random_weights"):
        lines += [f"> **{RANDOM_WEIGHTS_BANNER}**", ""]
    return lines + [
        f"model `{config.get('model')}`"
        + (f" (family {config['model_family']})" if config.get("model_family") else "")
        + f" weights `{config.get('weights')}` backend `{config.get('backend')}` "
        f"tokenizer: {config.get('tokenizer_source', '-')}",
        "",
    ]


def _notes(r: GateReport) -> list[str]:
    summary, config = r
    lines = rs.notes(config.get("notes") or [])
    if summary.get("missing_arms"):
        lines += rs.bold(f"run {summary.get('status') or 'incomplete'}: no results for arm(s) "
                         f"{', '.join(summary['missing_arms'])}; the verdict covers only the arms below")
    return lines


def _arms(r: GateReport) -> list[str]:
    header = ["arm", "strict acc %", "flexible acc %", "gen tokens", "seconds", "questions/s", "tokens/s"]
    return ["## Arms", "", *table(header, [
        [arm, _fmt(a["strict_acc"]), _fmt(a["flexible_acc"]), a["generated_tokens"], _fmt(a["seconds"], 1),
         _fmt(a["questions_per_s"], 3), _fmt(a["tokens_per_s"], 1)] for arm, a in r.summary["arms"].items()
    ], ["", *"rrrrrr"])]


def _comparisons(r: GateReport) -> list[str]:
    summary = r.summary
    header = ["arm", "ref acc", "arm acc", "drop", "LCB95", "UCB95", "SE", "n10", "n01", "McNemar p",
              "seqs differ", "verdict", "n needed"]
    rows = [
        [c["arm"], _fmt(c["ref_acc"]), _fmt(c["var_acc"]), _fmt(c["drop"]), _fmt(c["lcb95"]),
         _fmt(c["ucb95"]), _fmt(c["se"]), c["n10"], c["n01"], _p(c["mcnemar_p"]),
         f"{c['sequences_differ']}/{c['n']}",
         f"**{verdict_label(c['verdict'], c['verdict_reason'])}**", needed_cell(c)]
        for c in summary["comparisons"]
    ] or [["(no variant arm)", *[""] * 12]]
    return [*rs.heading(f"Paired comparison vs {summary['reference']} (points; drop = ref - variant)"),
            *table(header, rows, ["", *"r" * 10, "", "r"])]


def _throughput(r: GateReport) -> list[str]:
    return _throughput_lines(r.summary)


def _replay(r: GateReport) -> list[str]:
    return _replay_lines(r.summary)


def _overall(r: GateReport) -> list[str]:
    summary = r.summary
    overall = (
        f"**Overall: {verdict_label(summary['overall'], summary['overall_reason'])}** (exit code "
        f"{summary['exit_code']}: 0 identical or pass, 1 fail, 3 inconclusive, 2 usage error)"
        if summary["comparisons"]
        else "**Overall: n/a** (no variant arm has results: nothing was gated)"
    )
    return ["", overall, "", GATE_CAPTION, ""]


SECTIONS: list[rs.Section] = [
    _header, _notes, _arms, _comparisons,
    _throughput, _replay, _overall,
]
"""The gate report, top to bottom."""


def table_markdown(summary: dict[str, Any], config: dict[str, Any]) -> str:
    return rs.render_sections(SECTIONS, GateReport(summary, config))


def needed_cell(c: dict[str, Any]) -> str:
    """The 'n needed' of a comparison: a size, 'unknown' (no size decides it) or '-' (not asked)."""
    if c["verdict"] != "inconclusive" or c.get("verdict_reason"):
        return "-"
    return "unknown" if c.get("needed_n") is None else str(c["needed_n"])


def accuracy_figure(summary: dict[str, Any]) -> Any:
    """Left: per-arm gate accuracy with exact (Clopper-Pearson) 95% intervals, which stay open at 0%
    and 100% where a normal interval has width 0. Right: discordant pairs per variant."""
    fig, (ax1, ax2) = figure(10, 4, 1, 2)
    arms = list(summary["arms"])
    n = max(summary["n"], 1)
    accs = [summary["arms"][a]["gate_acc"] for a in arms]
    correct = [round(p / 100.0 * n) if math.isfinite(p) else 0 for p in accs]
    errs = [
        [p - 100.0 * cp_lower(k, n, 0.025) for p, k in zip(accs, correct, strict=True)],
        [100.0 * cp_upper(k, n, 0.025) - p for p, k in zip(accs, correct, strict=True)],
    ]
    ax1.bar(arms, accs, yerr=errs, capsize=6, color=["#555555"] + ["#1f77b4"] * (len(arms) - 1))
    ax1.set_ylabel(f"accuracy % ({summary['gate_filter']})")
    ax1.set_title(f"GSM8K accuracy, n={summary['n']} (exact 95% CI)")
    ax1.set_ylim(0, 100)
    if summary.get("random_weights"):
        ax1.text(
            0.5,
            0.5,
            "RANDOM WEIGHTS",
            transform=ax1.transAxes,
            ha="center",
            va="center",
            fontsize=16,
            color="red",
            alpha=0.5,
            rotation=20,
        )
    comps = summary["comparisons"]
    if comps:
        names = [c["arm"] for c in comps]
        x = range(len(names))
        ax2.bar(
            [i - 0.2 for i in x],
            [c["n10"] for c in comps],
            width=0.4,
            label="n10 (ref right, arm wrong)",
            color="#d62728",
        )
        ax2.bar(
            [i + 0.2 for i in x],
            [c["n01"] for c in comps],
            width=0.4,
            label="n01 (ref wrong, arm right)",
            color="#2ca02c",
        )
        ax2.set_xticks(list(x))
        ax2.set_xticklabels(
            [
                f"{c['arm']}\n{verdict_label(c['verdict'], c['verdict_reason'])}\n"
                f"drop {_fmt(c['drop'])} [{_fmt(c['lcb95'])}, {_fmt(c['ucb95'])}]"
                for c in comps
            ]
        )
        ax2.legend(fontsize=8)
    ax2.set_title(f"discordant pairs vs {summary['reference']}")
    ax2.set_ylabel("questions")
    ax2.set_ylim(0, max([1] + [max(c["n10"], c["n01"]) for c in comps]) * 1.2)
    fig.tight_layout()
    return fig


def write_outputs(run: RunDir, summary: dict[str, Any], config: dict[str, Any]) -> None:
    run.write_json("summary.json", summary)
    run.write_markdown("table.md", table_markdown(summary, config))
    run.save_plot("accuracy.png", accuracy_figure(summary))


def summarize_run(run: RunDir) -> dict[str, Any]:
    """Recompute the summary from questions.jsonl, arms.json and the manifest config."""
    cfg = run.manifest.get("config", {})
    rows = run.read_jsonl(QUESTIONS_FILE)
    arm_info = run.read_json(ARMS_FILE) if (run.path / ARMS_FILE).exists() else {}
    wanted = list(cfg.get("arms") or (rows[0]["arms"].keys() if rows else []))
    # An interrupted run stores the arms that finished: analyse those (every row has them).
    arms = [a for a in wanted if rows and all(a in r.get("arms", {}) for r in rows)]
    gate = cfg.get("gate", 1.0)
    try:
        check_gate(gate)
    except ValueError:  # a run stored before gates were checked (nan is stored as null)
        raise UsageError(
            f"{run.path}/manifest.json: config.gate {gate!r} is not a gate (a finite number of points "
            "in [0, 100]); this run cannot be gated"
        ) from None
    # the stored gate_mode of older runs is ignored: the verdict follows today's rule, stated in table.md
    summary = analyze(
        rows,
        arms,
        arm_info,
        float(gate),
        cfg.get("gate_filter", "strict-match"),
        bool(cfg.get("random_weights", False)),
        not_exercised(cfg),
    )
    summary["not_exercised"] = [a for a in not_exercised(cfg) if a in arms]
    summary["throughput"] = interleaved_throughput(run.read_jsonl(CHUNKS_FILE), arms, REFERENCE_ARM)
    summary["replay"] = replay_identity(run.read_jsonl(REPLAY_FILE))
    if cfg.get("engine_device", cfg.get("device")) == "cpu":
        summary["no_speed_verdict"] = "CPU timings (the fused arms run torch ops or the Triton interpreter)"
        for r in summary["throughput"]["speedups"]:  # a label would read as a verdict
            r["label"] = "A/A" if r["label"] == "A/A" else "no verdict"
    # an exact arm (or the A/A arm) that changes tokens on the reference's own batches is a bug
    summary["exact_mismatch"] = [
        a for a, r in summary["replay"].items()
        if a.split("#", 1)[0] in ("exact", REFERENCE_ARM) and r["identical"] < r["compared"]
    ]
    if summary["exact_mismatch"]:
        summary["overall"], summary["overall_reason"] = "fail", "exact arm mismatch under replay"
        summary["exit_code"] = exit_code("fail")
    summary["missing_arms"] = [a for a in wanted if a not in arms]
    if summary["missing_arms"]:  # only an interrupted or failed run lacks arms
        summary["status"] = run.manifest.get("status")
    return summary


def not_exercised(cfg: dict[str, Any]) -> list[str]:
    """The arms of a stored run whose kernels never ran: scope graph on an engine without CUDA graphs
    (they ran torch's ops). Runs stored before the manifest said whether graphs ran: none."""
    if cfg.get("backend", "engine") != "engine" or cfg.get("cuda_graphs") is None:
        return []
    return unexercised_arms(cfg.get("arm_specs") or {}, bool(cfg["cuda_graphs"]))


def render_run(run: RunDir) -> Path:
    """summary.json, table.md and accuracy.png of `run` from its raw files; the path of table.md."""
    if not any((run.path / name).exists() for name in (QUESTIONS_FILE, f"{QUESTIONS_FILE}.gz")):
        raise UsageError(f"{run.path} has no {QUESTIONS_FILE}: the gsm8k run stored no results")
    summary = summarize_run(run)
    if summary["n"] == 0:
        raise UsageError(f"{run.path}/{QUESTIONS_FILE} holds no question answered by every arm")
    write_outputs(run, summary, run.manifest.get("config", {}))
    return run.path / "table.md"


def render(run_dir: str | Path) -> Path:
    """`rltbench report DIR`: re-create summary.json, table.md and accuracy.png from the raw files.
    The stored run is opened read-only: its manifest.json (provenance) is never rewritten."""
    return render_run(RunDir.open(run_dir))
