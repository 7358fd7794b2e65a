"""End to end through the real engine: ouro-tiny (random weights), 5 questions, torch vs exact."""

from __future__ import annotations

import json

import lm_eval  # noqa: F401 - a test dependency (pyproject [test]): missing must fail, not skip
import pytest
import typer  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from rltbench.commands.gsm8k.cli import gsm8k_command  # noqa: E402
from rltbench.textcodec import train_fallback_tokenizer  # noqa: E402


def _run(tmp_path, arms: str, device: str, *extra: str):
    texts = [
        "Q: Janet has 16 eggs and eats 3. How many are left?\nA: 16 - 3 = 13. The answer is 13.\n\n"
    ] * 20
    tok_path = tmp_path / "tokenizer.json"
    train_fallback_tokenizer(texts, model_vocab=256).save(str(tok_path))
    out = tmp_path / "run"
    app = typer.Typer()
    app.command("gsm8k")(gsm8k_command)
    app.command("unused")(lambda: None)
    res = CliRunner().invoke(
        app,
        [
            "gsm8k",
            "--model",
            "ouro-tiny",
            "--weights",
            "random",
            "--arms",
            arms,
            "--limit",
            "5",
            "--num-fewshot",
            "0",
            "--max-gen-toks",
            "8",
            "--batch-size",
            "4",
            "--device",
            device,
            "--tokenizer",
            str(tok_path),
            "--result-dir",
            str(out),
            *extra,
        ],
    )
    return res, out


@pytest.mark.slow  # about 50 s: both arms through the interpreter
def test_tiny_model_two_arms(tmp_path) -> None:
    """torch vs exact with the exact kernels really running: on CPU the default scope 'graph' would
    run torch's ops in both arms (no capture), so the exact arm runs with --scope all here and its
    norms and RoPE run through the Triton interpreter (fp32 SiLU on CPU is routed to torch)."""
    res, out = _run(tmp_path, "torch,exact", "cpu", "--scope", "all")
    assert res.exit_code == 0, res.output
    assert "RANDOM WEIGHTS" in res.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["random_weights"] and summary["n"] == 5 and summary["overall"] == "identical"
    (cmp,) = summary["comparisons"]
    assert cmp["arm"] == "exact" and cmp["sequences_differ"] == 0 and (cmp["n10"], cmp["n01"]) == (0, 0)
    rows = [json.loads(x) for x in (out / "questions.jsonl").read_text().splitlines()]
    assert len(rows) == 5
    for row in rows:
        t, e = row["arms"]["torch"], row["arms"]["exact"]
        assert 1 <= t["gen_tokens"] <= 8 and len(t["token_ids"]) == t["gen_tokens"]
        assert t["token_ids"] == e["token_ids"] and t["response"] == e["response"]
        assert all(0 <= i < 256 for i in t["token_ids"])
    for arm in ("torch", "exact"):
        assert summary["arms"][arm]["questions_per_s"] > 0
    fused = json.loads((out / "arms.json").read_text())["exact"]["engine_stats"]["ops"]["fused"]
    rope = fused.get("rope_neox", 0) + fused.get("rope_neox_store", 0)  # the latter: RLTBENCH_FUSE_KV_WRITE
    assert fused.get("rms_norm", 0) > 0 and rope > 0  # the kernels really ran
    assert "RANDOM WEIGHTS" in (out / "table.md").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["random_weights"] is True and manifest["status"] == "complete"
    assert manifest["config"]["tokenizer_source"].startswith("file:")
    # arms interleaved over chunks of one batch (4 questions: chunks of 4 and 1), ABBA
    chunks = [json.loads(x) for x in (out / "chunks.jsonl").read_text().splitlines()]
    order = [(c["chunk"], c["arm"]) for c in chunks]
    assert order == [(0, "torch"), (0, "exact"), (1, "exact"), (1, "torch")]
    assert all(c["cold_work"]["graph_captures"] == 0 for c in chunks)
    # identity on the reference's own batches, chunk by chunk
    replays = [json.loads(x) for x in (out / "replay.jsonl").read_text().splitlines()]
    assert [(r["arm"], r["chunk"], r["identical"], r["compared"]) for r in replays] == [
        ("exact", 0, 4, 4),
        ("exact", 1, 1, 1),
    ]
    assert summary["throughput"]["chunks"] == 2 and summary["replay"]["exact"]["identical"] == 5
    table = (out / "table.md").read_text()
    assert "arms interleaved" in table and "No speed verdict: CPU timings" in table


def test_random_weights_arm_that_differs_is_inconclusive(tmp_path, monkeypatch) -> None:
    """The old gate passed approx on random weights with 81/87 sequences different (both arms score
    0%). One differing sequence in the exact arm's output (altered after generation) makes it
    'inconclusive: random weights', exit 3, whatever the statistics say."""
    import rltbench.commands.gsm8k.evaluate as ev

    orig = ev.run_arm

    def exact_differs(name, *a, **k):
        res = orig(name, *a, **k)
        if name == "exact":
            first = res.rows[min(res.rows)]
            first["token_ids"] = [*first["token_ids"][:-1], (first["token_ids"][-1] + 1) % 256]
        return res

    monkeypatch.setattr(ev, "run_arm", exact_differs)
    res, out = _run(tmp_path, "torch,exact", "cpu")
    assert res.exit_code == 3, res.output
    summary = json.loads((out / "summary.json").read_text())
    (cmp,) = summary["comparisons"]
    assert cmp["sequences_differ"] == 1 and (cmp["n10"], cmp["n01"]) == (0, 0)
    assert (cmp["verdict"], cmp["verdict_reason"]) == ("inconclusive", "random weights")
    assert cmp["needed_n"] is None  # more questions cannot cure random weights
    text = " ".join(res.output.split())
    assert "overall: inconclusive: random weights (exit 3)" in text
    assert "exact: inconclusive: random weights: 1/5 sequences differ" in text
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["verdict"], manifest["verdict_reason"], manifest["exit_code"]) == (
        "inconclusive",
        "random weights",
        3,
    )


@pytest.mark.gpu
def test_tiny_model_cuda_graph_arms(tmp_path) -> None:
    """On CUDA the decode steps replay per-arm graphs (the fused kernels run): exact must equal torch."""
    res, out = _run(tmp_path, "torch,exact,approx", "cuda")
    assert res.exit_code in (0, 3), res.output  # random weights: identical (0) or inconclusive (3)
    summary = json.loads((out / "summary.json").read_text())
    exact = next(c for c in summary["comparisons"] if c["arm"] == "exact")
    assert exact["sequences_differ"] == 0 and exact["verdict"] == "identical"
    approx = next(c for c in summary["comparisons"] if c["arm"] == "approx")
    if approx["sequences_differ"]:  # random weights: a differing arm is never a pass or a fail
        assert (approx["verdict"], approx["verdict_reason"]) == ("inconclusive", "random weights")
        assert res.exit_code == 3 and "inconclusive: random weights" in res.output
    stats = json.loads((out / "arms.json").read_text())["exact"]["engine_stats"]
    assert stats.get("graph_replays", 1) > 0
    # prefill included: the replay runs the exact kernels in eager steps too, and must match
    rep = summary["replay"]["exact"]
    assert rep["identical"] == rep["compared"] == 5 and rep["kernels_in_eager"]
    assert not summary["exact_mismatch"]
    assert all(not a["cold_chunks"] for a in summary["throughput"]["arms"].values())
