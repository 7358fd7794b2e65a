"""CPU runs say what they measured. Without CUDA graphs an arm of scope `graph` runs torch's ops: its
identity compared torch with torch, yet e2e printed 16/16 identical and gsm8k "identical (exit 0)".
Now a run without graphs defaults to scope all (the kernels run, through the Triton interpreter),
an explicit `--scope graph` there gives a "not exercised" verdict and a non-zero exit, every CPU
speed figure carries the no-verdict caption, and profile's table and plot show the same quantity."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rltbench.arms import NOT_EXERCISED, parse_arms, scope_notes, unexercised_arms
from rltbench.cli import main
from rltbench.results import RunDir

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # --run-gpu: CPU tensors fall back to torch


# ---- the scope an arm gets -----------------------------------------------------------------------
def test_without_graphs_an_arm_that_states_no_scope_runs_its_kernels() -> None:
    eager = parse_arms("torch,exact,c=norm:approx,g=norm:exact/scope:graph", graphs=False)
    assert [s.scope for s in eager.values()] == ["graph", "all", "all", "graph"]
    assert parse_arms("torch,exact", {"scope": "graph"}, graphs=False)["exact"].scope == "graph"
    assert parse_arms("torch,exact,c=norm:approx")["exact"].scope == "graph"  # with graphs: unchanged
    assert parse_arms("torch,exact,c=norm:approx")["c"].scope == "graph"
    notes = " ".join(scope_notes(eager, graphs=False))
    assert "scope all, the default without graphs: the arm(s) exact, c run their kernels" in notes
    assert f"the scope=graph arm(s) g run the torch reference ops: {NOT_EXERCISED}" in notes
    assert scope_notes(eager, graphs=True) == []
    stored = {n: s.settings() for n, s in eager.items()} | {"server": "http://x"}
    assert unexercised_arms(stored, graphs=False) == ["g"] and unexercised_arms(stored, graphs=True) == []


def test_the_cpu_burst_shrinks_where_the_kernels_are_interpreted() -> None:
    from rltbench import runtime
    from rltbench.commands.e2e.job import E2ESpec, resolve_defaults

    source = runtime.ModelSource("ouro-tiny")
    eager = parse_arms("torch,exact", graphs=False)
    spec = resolve_defaults(E2ESpec(source=source, device="cpu", arms=eager))
    assert (spec.concurrency, spec.input_len, spec.output_len) == ([1, 2], 32, 8)
    assert any("through the Triton interpreter" in n for n in spec.notes)
    given = resolve_defaults(E2ESpec(source=source, device="cpu", input_len=16, arms=eager))
    assert (given.input_len, given.output_len) == (16, 8)
    stated = parse_arms("torch,exact", {"scope": "graph"})
    torch_only = resolve_defaults(E2ESpec(source=source, device="cpu", arms=stated))
    assert torch_only.concurrency == [1, 8] and torch_only.input_len > 32


# ---- e2e ---------------------------------------------------------------------------------------------
def _e2e(tmp_path: Path, name: str, *extra: str) -> tuple[int, Path]:
    out = tmp_path / name
    argv = ["e2e", "--model", "ouro-tiny", "--device", "cpu", "--no-live", "--arms", "torch,exact",
            "--concurrency", "1", "--input-len", "6", "--output-len", "2", "--repeats", "1",
            "--warmup-requests", "1", "--result-dir", str(out), *extra]
    return main(argv), out


def test_e2e_scope_graph_on_cpu_is_not_exercised_and_exits_3(tmp_path, capsys) -> None:
    rc, out = _e2e(tmp_path, "graph", "--scope", "graph")
    printed = " ".join(capsys.readouterr().out.split())
    assert rc == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["not_exercised"] == ["exact"] and summary["exit_code"] == 3
    (row,) = summary["replay_identity"]
    assert row["not_exercised"] and row["identical"] == row["compared"]  # torch against torch
    assert NOT_EXERCISED in printed and "no identity verdict (exit 3)" in printed
    assert NOT_EXERCISED in (out / "table.md").read_text()
    assert all(r["verdict"] == NOT_EXERCISED for r in summary.get("comparison", []) if r["arm"] == "exact")


@pytest.mark.slow  # about 20 s: the exact kernels in the Triton interpreter
def test_e2e_default_scope_on_cpu_runs_the_kernels(tmp_path, capsys) -> None:
    rc, out = _e2e(tmp_path, "default")
    printed = " ".join(capsys.readouterr().out.split())
    assert rc == 0
    run = RunDir.open(out)
    assert run.manifest["config"]["arm_specs"]["exact"]["scope"] == "all"
    if INTERPRETED:
        assert sum(run.manifest["engine_stats"]["exact"]["ops"]["fused"].values()) > 0
    assert "scope all, the default without graphs" in printed
    assert "no speed verdict: CPU timings" in printed.split("cell 1/")[0]  # before the first timing
    summary = json.loads((out / "summary.json").read_text())
    assert summary["not_exercised"] == [] and summary["exit_code"] == 0


# ---- gsm8k -------------------------------------------------------------------------------------------
def _tokenizer(tmp_path: Path) -> Path:
    from rltbench.textcodec import train_fallback_tokenizer

    tok = tmp_path / "tokenizer.json"
    train_fallback_tokenizer(["Q: Tom has 3 apples and buys 4. How many?\nA: 7.\n\n"] * 20,
                             model_vocab=256).save(str(tok))
    return tok


def test_gsm8k_scope_graph_on_cpu_is_inconclusive_not_exercised(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    argv = ["gsm8k", "--model", "ouro-tiny", "--arms", "torch,exact", "--scope", "graph", "--limit", "2",
            "--num-fewshot", "0", "--max-gen-toks", "3", "--batch-size", "2", "--device", "cpu",
            "--tokenizer", str(_tokenizer(tmp_path)), "--result-dir", str(out)]
    assert main(argv) == 3
    printed = " ".join(capsys.readouterr().out.split())
    summary = json.loads((out / "summary.json").read_text())
    (cmp,) = summary["comparisons"]
    assert cmp["sequences_differ"] == 0  # torch's ops twice: identical, and no evidence of anything
    assert (cmp["verdict"], cmp["verdict_reason"]) == ("inconclusive", NOT_EXERCISED)
    assert summary["not_exercised"] == ["exact"] and summary["exit_code"] == 3
    assert f"overall: inconclusive: {NOT_EXERCISED} (exit 3)" in printed
    assert "exact: inconclusive: its kernels never ran" in printed
    assert "inconclusive: not exercised" in (out / "table.md").read_text()


def test_gsm8k_cpu_default_generates_less_where_kernels_run_interpreted(tmp_path, monkeypatch, capsys):
    import rltbench.commands.gsm8k.evaluate as ev

    class Stop(Exception):
        """Not an interrupt: a run interrupted before its first result is removed, manifest and all."""

    def stop(*args, **kwargs):  # the configuration is written by now; generating is not this test
        raise Stop

    monkeypatch.setattr(ev, "run_arm", stop)
    out = tmp_path / "run"
    argv = ["gsm8k", "--model", "ouro-tiny", "--arms", "torch,exact", "--device", "cpu",
            "--tokenizer", str(_tokenizer(tmp_path)), "--result-dir", str(out)]
    with pytest.raises(Stop):
        main(argv)
    printed = " ".join(capsys.readouterr().out.split())
    config = json.loads((out / "manifest.json").read_text())["config"]
    assert config["max_gen_toks"] == 16 and "--max-gen-toks 16 on CPU" in printed
    assert config["arm_specs"]["exact"]["scope"] == "all" and config["cuda_graphs"] is False


def test_gsm8k_verdict_of_an_unexercised_arm() -> None:
    from rltbench.commands.gsm8k.report import analyze

    rows = [{"arms": {a: {"strict_correct": False, "token_ids": [1, 2]} for a in ("torch", "exact")}}] * 3
    s = analyze(rows, ["torch", "exact"], {}, 1.0, "strict-match", True, unexercised=["exact"])
    assert (s["overall"], s["overall_reason"], s["exit_code"]) == ("inconclusive", NOT_EXERCISED, 3)
    s = analyze(rows, ["torch", "exact"], {}, 1.0, "strict-match", True)
    assert (s["overall"], s["exit_code"]) == ("identical", 0)


# ---- kernels -----------------------------------------------------------------------------------------
def test_kernels_eager_comparisons_of_scope_graph_arms_are_not_exercised() -> None:
    from rltbench.results.kernel_verdicts import mark_unexercised

    pairs = (("torch", "exact"), ("exact", "approx"), ("torch", "torch#2"))
    rows = [{"mode": m, "ref": ref, "arm": arm, "verdict": "faster"}
            for m in ("graph", "eager") for ref, arm in pairs]
    marked = mark_unexercised(rows, ["exact"])
    assert [r["verdict"] for r in marked] == ["faster"] * 3 + [NOT_EXERCISED, NOT_EXERCISED, "faster"]


# ---- captions on every CPU speed figure ----------------------------------------------------------------
def _figure_text(fig) -> str:
    texts = [t.get_text() for t in fig.texts]
    texts += [t.get_text() for ax in fig.axes for t in (ax.title, ax.yaxis.label, *ax.texts)]
    return " ".join(texts)


def test_prefill_plot_says_cpu_timings_carry_no_verdict() -> None:
    from rltbench.commands.prefill.report import ONE, PACKED, ttft_figure

    cells = [{"cell": "in=64", "arm": a, "ttft_p50": 0.1} for a in (PACKED, ONE)]
    assert "no speed verdict: CPU timings" in _figure_text(ttft_figure(cells, {"device": "cpu"}))
    assert "no speed verdict" not in _figure_text(ttft_figure(cells, {"device": "cuda:0"}))


def _pd_analysis(device: str) -> dict:
    from rltbench.results.serving_stats import no_verdict_reason

    lat = [{"cell": "C=1", "C": 1, "mode": m, "ttft_p50": 0.03, "tpot_p50": 0.01}
           for m in ("colocated", "pd")]
    transfer = [{"cell": "C=1", "C": 1, "bytes_per_request": 2.0**20, "bytes_per_prompt_token": 4096.0,
                 "transfer_p50": 0.0096, "transfer_share_of_ttft_p50": 0.263}]
    summary = {"exact_arm_mismatch": False, "random_weights": True, "cells_total": 2, "cells_invalid": 0,
               "failed_requests": 0, "status": "complete",
               "no_verdict": no_verdict_reason({"device": device})}
    return {"config": {"device": device, "model": "ouro-tiny"}, "modes": ["colocated", "pd"],
            "latency": lat, "transfer": transfer, "replay_identity": [], "summary": summary}


def test_pd_stdout_and_plot_say_cpu_timings_carry_no_verdict(tmp_path) -> None:
    from rich.console import Console

    from rltbench.commands.pd.report import latency_figure, print_summary

    con = Console(width=200, record=True, force_terminal=False)
    print_summary(con, _pd_analysis("cpu"), tmp_path)
    line = next(line for line in con.export_text().splitlines() if "transfer p50" in line)
    assert "transfer p50 9.60 ms = 26.3% of TTFT (no speed verdict: CPU timings" in line
    assert "no speed verdict: CPU timings" in _figure_text(latency_figure(_pd_analysis("cpu")))
    gpu = Console(width=200, record=True, force_terminal=False)
    print_summary(gpu, _pd_analysis("cuda"), tmp_path)
    assert "no speed verdict" not in gpu.export_text()


# ---- profile: the table and the plot show one quantity -------------------------------------------------
def test_profile_cpu_plot_bars_are_the_table_figures() -> None:
    """The table said host ms/step 37.2 / 32.4 / 26.7 while the plot's bars (the profiled steps' aten op
    times) read about 20 / 46 / 31. Each bar now stacks up to the table's figure."""
    from rltbench.commands.profile.report import OUTSIDE, breakdown_figure, step_segments, table_markdown

    arms = {}
    figures = (("torch", 37.2, 40.0, 20.0), ("exact", 32.4, 60.0, 46.0), ("approx", 26.7, 50.0, 31.0))
    for name, wall, prof, ops in figures:  # host ms/step, profiled step ms, aten op ms
        arms[name] = {"kernels_per_step": 10.0, "agree": None, "wall_us": [wall * 1e3] * 3,
                      "profiled_wall_us": [prof * 1e3] * 3,
                      "classes": [{"class": "gemm", "count": 2.0, "time_us": ops * 600},
                                  {"class": "norm", "count": 4.0, "time_us": ops * 400}], "top_kernels": []}
    s = {"mode": "cpu", "model": "ouro-tiny", "batch": 1, "context": 4, "arms": arms}
    md = table_markdown(s)
    fig = breakdown_figure(s)
    labels = [t.get_text() for t in fig.axes[0].texts]
    for name, a in arms.items():
        seg = step_segments(a, "cpu")
        total = sum(seg.values())
        assert total == pytest.approx(a["wall_us"][0] / 1e3)
        assert seg[OUTSIDE] > 0
        assert f"| {name} | 10 | 10.0 | {total:.3f} (" in md  # the table's host ms/step
        assert f"{total:.2f}" in labels
    assert "table: host ms/step" in _figure_text(fig)
