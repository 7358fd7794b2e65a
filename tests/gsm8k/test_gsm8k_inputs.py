"""Bad gsm8k input is one line and exit 2 with no run directory left behind; `report` re-renders a
stored gsm8k run under the evidence rule without touching its manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rltbench.cli import main


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# ---- inputs rejected before a run directory exists -------------------------------------------------
@pytest.mark.parametrize("gate", ["nan", "inf", "-inf", "-1", "100.5"])
def test_meaningless_gate_is_rejected_up_front(gate: str, tmp_path: Path, capsys) -> None:
    """`--gate nan` ran the whole evaluation and then crashed in needed_n; `--gate inf` passed
    everything. (`--model nope` makes the old code stop early, after it made the run directory.)"""
    out = tmp_path / "run"
    assert main(["gsm8k", f"--gate={gate}", "--model", "nope", "--result-dir", str(out)]) == 2
    assert "--gate must be a finite number in [0, 100]" in _one_error_line(capsys)
    assert not out.exists()


def _checkpoint_dir(tmp_path: Path, *, config: bool, tokenizer: bool) -> Path:
    """A checkpoint directory as the tiny preset saves it, less the files a test leaves out."""
    from rltbench.models import build_model, save_hf_checkpoint

    ckpt = tmp_path / "ckpt"
    save_hf_checkpoint(build_model("ouro-tiny", device="cpu", seed=1), ckpt)
    if tokenizer:
        from rltbench.textcodec import train_fallback_tokenizer

        texts = ["Q: 3 + 4?\nA: 7. The answer is 7.\n\n"] * 20
        train_fallback_tokenizer(texts, model_vocab=256).save(str(ckpt / "tokenizer.json"))
    if not config:
        (ckpt / "config.json").unlink()
    return ckpt


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("unknown model", "unknown model preset 'nope'"),
        ("missing --tokenizer file", "tokenizer file not found"),
        ("checkpoint without config.json", "no config.json there"),
        ("checkpoint without tokenizer.json", "no tokenizer.json in"),
        ("tokenizer larger than the model vocab", "exceeds the model's vocab"),
        ("no cuda", "CUDA is not available"),
    ],
)
def test_bad_model_inputs_leave_no_run_directory(case: str, needle: str, tmp_path: Path, capsys) -> None:
    """These failed inside the run and left a 'failed' run directory behind."""
    import torch

    out = tmp_path / "run"
    args = ["gsm8k", "--arms", "torch", "--limit", "1", "--result-dir", str(out)]
    if case == "unknown model":
        args += ["--model", "nope"]
    elif case == "missing --tokenizer file":
        args += ["--model", "ouro-tiny", "--tokenizer", str(tmp_path / "missing" / "tokenizer.json")]
    elif case == "checkpoint without config.json":
        args += ["--weights", str(_checkpoint_dir(tmp_path, config=False, tokenizer=True))]
    elif case == "checkpoint without tokenizer.json":
        args += ["--weights", str(_checkpoint_dir(tmp_path, config=True, tokenizer=False))]
    elif case == "tokenizer larger than the model vocab":
        from tokenizers import Tokenizer, models

        big = tmp_path / "big.json"
        Tokenizer(models.WordLevel({f"w{i}": i for i in range(300)}, unk_token="w0")).save(str(big))
        args += ["--model", "ouro-tiny", "--tokenizer", str(big)]  # ouro-tiny's vocab is 256
    else:
        if torch.cuda.is_available():
            pytest.skip("a CUDA device is present")
        args += ["--model", "ouro-tiny", "--device", "cuda"]
    assert main(args) == 2
    assert needle in _one_error_line(capsys)
    assert not out.exists()


def test_removed_gate_mode_names_the_rule_that_replaced_it(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["gsm8k", "--gate-mode", "point", "--model", "nope", "--result-dir", str(out)]) == 2
    err = _one_error_line(capsys)
    assert "--gate-mode point was removed" in err and "exact 95% bounds" in err
    assert not out.exists()


# ---- report on a stored run ----------------------------------------------------------------------
def _stored_run(path: Path, *, n: int, differ: int, random_weights: bool, gate: object = 1.0) -> Path:
    """A gsm8k run directory as the command leaves it, written by hand: manifest.json in a compact
    layout of its own and without table.md in its file list (so any rewrite shows)."""
    path.mkdir()
    cell = {"strict_correct": False, "flexible_correct": False, "response": " 7", "gen_tokens": 2}
    rows = []
    for i in range(n):
        torch_cell = {**cell, "token_ids": [5, 7]}
        approx_cell = {**cell, "token_ids": [5, 8] if i < differ else [5, 7]}
        rows.append({"doc_id": i, "arms": {"torch": torch_cell, "exact": torch_cell, "approx": approx_cell}})
    (path / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "arms.json").write_text(json.dumps({a: {"seconds": 1.0} for a in ("torch", "exact", "approx")}))
    config = {
        "arms": ["torch", "exact", "approx"],
        "gate": gate,
        "gate_mode": "ucb",  # older runs stored it; today's rule ignores it
        "gate_filter": "strict-match",
        "task": "gsm8k_cot",
        "random_weights": random_weights,
    }
    manifest = {"command": "gsm8k", "status": "complete", "config": config, "files": ["questions.jsonl"]}
    (path / "manifest.json").write_text(json.dumps(manifest, separators=(",", ":")))
    return path


def test_report_applies_the_rule_and_never_rewrites_the_manifest(tmp_path: Path, capsys) -> None:
    """The committed random-weights run said 'pass' for approx with 81/87 sequences different; and
    `report` rewrote its manifest.json."""
    run = _stored_run(tmp_path / "rw", n=87, differ=81, random_weights=True)
    before = (run / "manifest.json").read_bytes()
    assert main(["report", str(run)]) == 0
    assert (run / "manifest.json").read_bytes() == before
    summary = json.loads((run / "summary.json").read_text())
    verdicts = {c["arm"]: (c["verdict"], c["verdict_reason"]) for c in summary["comparisons"]}
    assert verdicts == {"exact": ("identical", None), "approx": ("inconclusive", "random weights")}
    assert (summary["overall"], summary["overall_reason"], summary["exit_code"]) == (
        "inconclusive",
        "random weights",
        3,
    )
    table = (run / "table.md").read_text()
    assert "| 81/87 | **inconclusive: random weights** | - |" in table
    assert "| 0/87 | **identical** | - |" in table
    assert "**Overall: inconclusive: random weights** (exit code 3" in table
    assert "stay valid with no discordant question, where the standard error is 0" in table


def test_report_zero_discordance_with_differing_sequences_is_not_a_pass(tmp_path: Path) -> None:
    run = _stored_run(tmp_path / "real", n=87, differ=3, random_weights=False)
    assert main(["report", str(run)]) == 0
    comparisons = json.loads((run / "summary.json").read_text())["comparisons"]
    (approx,) = [c for c in comparisons if c["arm"] == "approx"]
    assert (approx["n10"], approx["n01"], approx["verdict"]) == (0, 0, "inconclusive")
    assert approx["needed_n"] == 368  # the old rule passed it: SE = 0
    assert "| 3/87 | **inconclusive** | 368 |" in (run / "table.md").read_text()


def test_report_of_a_run_with_a_nan_gate_is_one_line(tmp_path: Path, capsys) -> None:
    """A `--gate nan` run stored the gate as null; `report` crashed on it with a traceback."""
    run = _stored_run(tmp_path / "nan", n=5, differ=1, random_weights=False, gate=None)
    assert main(["report", str(run)]) == 2
    assert "config.gate None is not a gate" in _one_error_line(capsys)
