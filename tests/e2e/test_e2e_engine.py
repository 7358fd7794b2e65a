"""End to end through the CLI with the real engine and the ouro-tiny model (CPU, fp32)."""

from __future__ import annotations

import json
import os

import pytest

from rltbench.cli import main
from rltbench.commands.e2e.report import render
from rltbench.results import RunDir


def _run(args, tmp_path, name):
    out = tmp_path / name
    rc = main(
        ["e2e", "--model", "ouro-tiny", "--device", "cpu", "--no-live", "--result-dir", str(out), *args]
    )
    return rc, out


@pytest.mark.slow  # about 25 s: a burst with the exact kernels interpreted
def test_burst_torch_vs_exact_all_scope(tmp_path):
    args = "--arms torch,exact --scope all --concurrency 2 --input-len 8 --output-len 3 --repeats 2"
    rc, out = _run([*args.split(), "--warmup-requests", "1"], tmp_path, "burst")
    assert rc == 0
    run = RunDir.open(out)
    assert run.manifest["status"] == "complete" and run.manifest["config"]["random_weights"] is True
    # the exact arm really ran fused kernels (Triton interpreter on CPU), it is not torch in disguise;
    # under --run-gpu the interpreter is off and CPU tensors fall back to torch by design
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert sum(run.manifest["engine_stats"]["exact"]["ops"]["fused"].values()) > 0
    recs = run.read_jsonl("requests.jsonl")
    assert len(recs) == 2 * 2 * 2 and all(r["status"] == "ok" and len(r["token_ids"]) == 3 for r in recs)
    assert all(len(r["token_ids"]) == 3 and r["prompt_len"] == 8 for r in recs)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exact_arm_mismatch"] is False and summary["cells_invalid"] == 0
    ident = [r for r in summary["identity"] if r["arm"] == "exact"]
    assert ident and all(r["identical"] == r["compared"] == 4 for r in ident)
    # prompts: same per rep across arms, fresh across reps
    by = {(r["arm"], r["rep"], r["request"]): r for r in recs}
    assert by[("torch", 0, 0)]["token_ids"] == by[("exact", 0, 0)]["token_ids"]
    text = (out / "table.md").read_text()
    assert "random weights: text is not meaningful" in text and "## Metric definitions" in text
    assert "exact (" in text and "speedup" in text
    assert "no A/A arm (torch run twice, e.g. --arms torch,exact,torch)" in text
    assert "run the torch reference ops" not in text  # --scope all: the kernels really ran
    # render from raw files only reproduces the same table
    (out / "table.md").unlink()
    render(out)
    assert (out / "table.md").read_text() == text


def test_session_replay_aa_with_prefix_hits(tmp_path, capsys):
    # 4 turns of one conversation, 0.6 s apart: each turn extends the previous prompt (shared hash ids)
    trace = tmp_path / "conv.jsonl"
    recs = [
        {
            "timestamp": 600 * i,
            "input_length": 512 * (i + 2) - 100,
            "output_length": 64,
            "hash_ids": list(range(i + 2)),
        }
        for i in range(4)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in recs))
    rc, out = _run(
        [
            "--workload",
            "session",
            "--arms",
            "torch,torch",
            "--trace",
            str(trace),
            "--trace-length-scale",
            "0.0625",
            "--trace-time-scale",
            "1",
            "--repeats",
            "1",
            "--warmup-requests",
            "1",
        ],
        tmp_path,
        "session",
    )
    assert rc == 0
    run = RunDir.open(out)
    sess = run.manifest["config"]["session"]
    assert sess["requests"] == 4 and sess["block_size"] == 32
    # turn i >= 1 finds its first i+1 blocks of 32 seen: (64 + 96 + 128) / (58 + 90 + 122 + 154)
    assert sess["theoretical_prefix_hit_rate"] == pytest.approx(288 / 424)
    recs = run.read_jsonl("requests.jsonl")
    assert len(recs) == 8 and all(r["status"] == "ok" and len(r["token_ids"]) == 4 for r in recs)
    cells = run.read_json("cells.json")
    assert all(0 < c["measured_prefix_hit_rate"] <= sess["theoretical_prefix_hit_rate"] for c in cells)
    ident = json.loads((out / "summary.json").read_text())["identity"]
    # session batches depend on timing, so the A/A identity is reported, not required to be 100%
    assert ident[0]["arm"] == "torch#2" and ident[0]["compared"] == 4 and ident[0]["aa"]
    assert "Session prefix cache" in (out / "table.md").read_text()
    assert "no A/A arm" not in (out / "table.md").read_text()
    # the spec asks to print both rates: the console says them too, not only table.md
    m = cells[0]["measured_prefix_hit_rate"]
    printed = capsys.readouterr().out
    assert f"prefix-hit rate: theoretical {288 / 424:.1%}, measured torch {m:.1%}" in printed


@pytest.mark.parametrize(
    "args",
    [
        ["--workload", "nope"],
        ["--concurrency", "0"],
        ["--concurrency", "a,b"],
        ["--arms", "torch,fast"],
        ["--arms", "torch,exact", "--scope", "sometimes"],
        ["--backend", "openai"],
        ["--arm", "x=http://127.0.0.1:1"],
        ["--workload", "session", "--trace", "/nonexistent.jsonl"],
        ["--input-len", "600"],
        ["--max-num-seqs", "1", "--concurrency", "4"],
        ["--repeats", "0"],
        ["--dtype", "float7"],
        ["--block-size", "0"],
        ["--workload", "session", "--trace", "mooncake-tiny", "--trace-time-scale", "-1"],
        ["--weights", "/nonexistent/ckpt"],
        ["--arms", "torch", "--norm", "fast"],
        ["--kv-cache-gib", "0"],
    ],
)
def test_bad_flags_exit_2(args, tmp_path, capsys):
    rc, _ = _run(["--input-len", "8", "--output-len", "2", *args], tmp_path, "bad")
    assert rc == 2
    err = capsys.readouterr().err
    assert "error" in err and "Traceback" not in err


def test_ctrl_c_and_deadline_leave_readable_runs(tmp_path, monkeypatch, capsys):
    from rltbench.backends.engine import EngineBackend

    orig = EngineBackend.run_cell
    calls = {"n": 0}

    def flaky(self, arm, tag, *a, **k):
        if tag != "warmup":
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt
        return orig(self, arm, tag, *a, **k)

    monkeypatch.setattr(EngineBackend, "run_cell", flaky)
    base = [
        "--arms",
        "torch",
        "--concurrency",
        "1,2",
        "--input-len",
        "8",
        "--output-len",
        "2",
        "--repeats",
        "1",
    ]
    rc, out = _run(base, tmp_path, "interrupted")
    assert rc == 130
    run = RunDir.open(out)
    assert run.manifest["status"] == "interrupted"
    assert len(run.read_jsonl("requests.jsonl")) == 1 and (out / "table.md").is_file()
    # one line, from the CLI, with what the command said finished
    out_text, err_text = capsys.readouterr()
    said = [ln for ln in (out_text + err_text).splitlines() if ln.startswith("interrupted")]
    assert said == [f"interrupted: finished results were kept in {out} (1 finished cells, table.md rendered)"]
    monkeypatch.setattr(EngineBackend, "run_cell", orig)
    base[1] = "torch,exact"  # scope graph on CPU: exact runs torch's ops, said, and no verdict (exit 3)
    rc, out = _run([*base, "--scope", "graph", "--deadline", "0.001"], tmp_path, "deadline")
    assert rc == 3
    run = RunDir.open(out)
    assert run.manifest["status"] == "interrupted" and run.manifest["skipped_cells"] == 4
    assert "deadline" in run.manifest["interrupted_by"]
    assert "interrupted:" not in capsys.readouterr().err  # the deadline is reported as such
    assert "scope=graph arm(s) exact run the torch reference ops" in run.manifest["config"]["notes"][0]
    text = (out / "table.md").read_text()
    assert "run the torch reference ops" in text
    assert "- status: interrupted (global deadline (--deadline); 4 cells skipped)" in text
