"""What the user reads: the console gate table on an 80-column log, and the model a run names."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

import rltbench.commands.gsm8k.cli as gcli


def _summary() -> dict:
    cmp = dict(n=1319, needed_n=None, verdict_reason=None)
    return {
        "reference": "torch",
        "n": 1319,
        "gate": 1.0,
        "gate_rule": "exact 95% bounds",
        "gate_filter": "flexible-extract",
        "arms": {a: {"gate_acc": 68.97} for a in ("torch", "exact", "approx", "approx_long")},
        "comparisons": [
            {
                **cmp,
                "arm": "exact",
                "drop": 0.0,
                "lcb95": -0.28,
                "ucb95": 0.28,
                "n10": 0,
                "n01": 0,
                "mcnemar_p": 1.0,
                "sequences_differ": 0,
                "verdict": "identical",
            },
            {
                **cmp,
                "arm": "approx",
                "drop": -10.5,
                "lcb95": -13.25,
                "ucb95": 3.2,
                "n10": 300,
                "n01": 1000,
                "mcnemar_p": 1.2e-5,
                "sequences_differ": 1319,
                "verdict": "inconclusive",
                "needed_n": 12345,
            },
            {
                **cmp,
                "arm": "approx_long",
                "drop": -28.74,
                "lcb95": -31.5,
                "ucb95": -25.0,
                "n10": 1000,
                "n01": 1000,
                "mcnemar_p": 0.45,
                "sequences_differ": 1319,
                "verdict": "fail",
            },
        ],
    }


def _console_text(monkeypatch, summary: dict) -> str:
    con = Console(width=80, force_terminal=False, record=True)
    monkeypatch.setattr(gcli, "console", con)
    gcli._print_summary(summary)
    return con.export_text()


def test_gate_table_is_never_cut_on_an_80_column_log(monkeypatch) -> None:
    """Old table: 10 padded columns on 80 columns printed 'appr…', 'verd…', 'refe…'."""
    text = _console_text(monkeypatch, _summary())
    assert "…" not in text
    for cell in ("approx_long", "inconclusive", "identical", "reference", "1000/1000", "1.2e-05", "-28.74"):
        assert cell in text, cell
    assert "approx: inconclusive: the 95% bounds [-13.25, 3.20] points contain the gate" in text
    assert "needs about 12345 questions (more than the 1319 GSM8K test questions)" in text


def test_gate_caption_is_whole_sentences(monkeypatch) -> None:
    """The old caption began mid-sentence: 'points; p: McNemar exact; differ: ...'."""
    text = _console_text(monkeypatch, _summary())
    assert "points; p:" not in text and gcli.CONSOLE_CAPTION.startswith("Drop = reference minus arm")
    flat = " ".join(text.split())
    assert "Drop = reference minus arm accuracy, in points." in flat
    assert "Identical arms pass; otherwise pass needs UCB95 <= gate, fail LCB95 > gate." in flat


def test_random_weights_verdict_is_printed_whole(monkeypatch) -> None:
    summary = _summary()
    approx = summary["comparisons"][1]
    approx.update(verdict_reason="random weights", needed_n=None)
    text = _console_text(monkeypatch, summary)
    assert "…" not in text
    assert "approx: inconclusive: random weights: 1319/1319 sequences differ" in text
    assert "about" not in text  # no question count is quoted: more questions cannot cure random weights
    assert "random" in text.split("approx:")[0]  # in the table itself, not only below it


def test_undecidable_arm_says_so(monkeypatch) -> None:
    summary = _summary()
    summary["comparisons"][1]["needed_n"] = None
    text = _console_text(monkeypatch, summary)
    assert "approx: inconclusive" in text and "no number of questions up to 1,000,000 decides it" in text


@pytest.mark.parametrize(
    ("model", "weights", "backend", "label"),
    [
        (None, "random", "engine", "ouro-1.4b"),
        ("ouro-tiny", "random", "engine", "ouro-tiny"),
        (None, "/x/my-ckpt/", "engine", "my-ckpt (checkpoint)"),
        ("mine", "/x/my-ckpt", "engine", "mine"),
        (None, "random", "openai", "served model (see --arm)"),
    ],
)
def test_model_label_never_names_the_default_preset_for_a_checkpoint(model, weights, backend, label) -> None:
    assert gcli.model_label(model, weights, backend) == label


def test_checkpoint_run_names_its_model_and_flags_cpu_arms(tmp_path) -> None:
    """A huginn checkpoint used to be labelled `ouro-1.4b` (the --model default) in table.md; on CPU
    there are no CUDA graphs, so the fused arms default to scope all and run their kernels, which the
    run must say (scope graph there would compare torch with itself: tests/test_cpu_honesty.py)."""
    from typer.testing import CliRunner

    from rltbench.cli import app
    from rltbench.models import build_model, save_hf_checkpoint
    from rltbench.textcodec import train_fallback_tokenizer

    ckpt = tmp_path / "hug-ckpt"
    save_hf_checkpoint(build_model("huginn-tiny", device="cpu", seed=3), ckpt)
    texts = ["Q: Tom has 3 apples and buys 4. How many?\nA: 3 + 4 = 7. The answer is 7.\n\n"] * 20
    train_fallback_tokenizer(texts, model_vocab=256).save(str(ckpt / "tokenizer.json"))
    out = tmp_path / "run"
    args = "gsm8k --weights {} --arms torch,exact --limit 2 --num-fewshot 0 --max-gen-toks 4 --batch-size 2 "
    args += "--device cpu --result-dir {}"
    res = CliRunner().invoke(app, args.format(ckpt, out).split())
    assert res.exit_code == 0, res.output
    table = (out / "table.md").read_text()
    assert "model `hug-ckpt (checkpoint)` (family huginn)" in table and "ouro-1.4b" not in table
    assert "scope all, the default without graphs: the arm(s) exact run their kernels" in table
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["model_family"] == "huginn" and manifest["random_weights"] is False
    assert "run their kernels in every step" in res.output


def test_ctrl_c_after_the_first_arm_keeps_a_readable_partial_report(tmp_path, monkeypatch) -> None:
    """Old code: the interrupted run had no table.md, and `rltbench report` then wrote 'Overall: n/a
    (exit code 0 ...)' with no word about the arms that never ran."""
    from typer.testing import CliRunner

    import rltbench.commands.gsm8k.evaluate as ev
    from rltbench.cli import app
    from rltbench.textcodec import train_fallback_tokenizer

    orig, calls = ev.run_arm, []

    def second_arm_interrupted(name, *a, **k):
        calls.append(name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return orig(name, *a, **k)

    monkeypatch.setattr(ev, "run_arm", second_arm_interrupted)
    tok = tmp_path / "tokenizer.json"
    texts = ["Q: Tom has 3 apples and buys 4. How many?\nA: 3 + 4 = 7. The answer is 7.\n\n"] * 20
    train_fallback_tokenizer(texts, model_vocab=256).save(str(tok))
    out = tmp_path / "run"
    args = "gsm8k --model ouro-tiny --arms torch,exact --limit 2 --num-fewshot 0 --max-gen-toks 4 "
    args += f"--batch-size 2 --device cpu --tokenizer {tok} --result-dir {out}"
    res = CliRunner().invoke(app, args.split())
    assert res.exit_code == 130 and calls == ["torch", "exact"]
    said = [ln for ln in res.output.splitlines() if "interrupted" in ln]
    assert said == [f"interrupted: finished results were kept in {out} (the finished arms, table.md "
                    "rendered)"]
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"
    table = (out / "table.md").read_text()
    assert "**run interrupted: no results for arm(s) exact; the verdict covers only the arms below**" in table
    assert "**Overall: n/a** (no variant arm has results: nothing was gated)" in table
    assert "| (no variant arm) |" + "  |" * 12 in table  # the table writer's empty cells
    assert "exit code 0" not in table
