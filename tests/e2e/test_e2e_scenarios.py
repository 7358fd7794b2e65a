"""The serving scenarios of the e2e command on tiny models (CPU, fp32): Huginn sessions with the prefix
cache off and on, and Ouro with an exit gate whose depths are part of identity."""

from __future__ import annotations

import json

import pytest

from rltbench.backends.engine import EngineBackend
from rltbench.cli import main
from rltbench.commands.e2e.report import mismatch_cause
from rltbench.results import RunDir


def _run(args: list[str], tmp_path, name: str, model: str = "ouro-tiny"):
    out = tmp_path / name
    rc = main(["e2e", "--model", model, "--device", "cpu", "--no-live", "--result-dir", str(out), *args])
    return rc, out


def _conversation(tmp_path) -> str:
    """4 turns of one conversation: each turn extends the previous prompt (shared hash ids)."""
    trace = tmp_path / "conv.jsonl"
    recs = [
        {"timestamp": 300 * i, "input_length": 512 * (i + 2) - 100, "output_length": 64,
         "hash_ids": list(range(i + 2))}
        for i in range(4)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return str(trace)


def test_huginn_session_cache_off_and_on(tmp_path, capsys):
    """Cache off (torch, its A/A copy torch#2) and on (torch+cache), interleaved: the cache-on run hits,
    the cache-off runs do not, and every cache-off run replays the cache-on schedule, hit prefixes
    recomputed, to the same tokens."""
    args = (f"--workload session --trace {_conversation(tmp_path)} --trace-length-scale 0.0625 "
            "--trace-time-scale 0.1 --arms torch,torch --prefix-cache off,on --repeats 2 --warmup-requests 1")
    rc, out = _run(args.split(), tmp_path, "cache", model="huginn-tiny")
    assert rc == 0
    run = RunDir.open(out)
    cfg = run.manifest["config"]
    assert cfg["arm_names"] == ["torch", "torch#2", "torch+cache"]
    assert cfg["reference_arm"] == "torch" and cfg["replay_reference_arm"] == "torch+cache"
    assert cfg["arm_specs"]["torch+cache"]["prefix_cache"] == "on"
    assert cfg["arm_specs"]["torch#2"]["prefix_cache"] == "off"
    cells = run.read_json("cells.json")
    hit = {c["arm"]: c["measured_prefix_hit_rate"] for c in cells}
    assert hit["torch+cache"] > 0 and hit["torch"] == hit["torch#2"] == 0
    summary = json.loads((out / "summary.json").read_text())
    replays = {r["arm"]: r for r in summary["replay_identity"]}
    assert set(replays) == {"torch", "torch#2"}
    assert all(r["identical"] == r["compared"] == 8 and r["exact_arm"] for r in replays.values())
    assert all(r.get("information") for r in replays.values())  # the cache verdict is row-invariant
    assert summary["exact_arm_mismatch"] is False
    # the verdict on the cache: torch+cache's schedule replayed with the cache on and off, both with
    # row-invariant prefill, once per cell
    assert cfg["row_invariant_pairs"] == [["torch+cache", "torch"]] and cfg["row_invariant_tile"] == 64
    (inv,) = summary["row_invariant_identity"]
    assert inv["identical"] == inv["compared"] == 4 and not inv["mismatch"] and not inv["skipped"]
    assert "under row-invariant replay (the verdict on the cache)" in (out / "table.md").read_text()
    comparison = json.loads((out / "comparison.json").read_text())
    metrics = {(r["arm"], r["metric"]) for r in comparison if r["delta"] is not None}
    assert {("torch+cache", "output_tok_s"), ("torch+cache", "ttft")} <= metrics
    printed = capsys.readouterr().out
    assert "torch+cache" in printed and "identical to torch+cache" in printed


def _gated_burst(tmp_path, name: str):
    args = ("--arms torch,exact --scope all --exit-threshold 0.75 --concurrency 2 --input-len 6 "
            "--output-len 3 --repeats 1 --warmup-requests 1")
    return _run(args.split(), tmp_path, name)


@pytest.mark.slow  # about 13 s
def test_exit_depths_recorded_and_identical(tmp_path):
    rc, out = _gated_burst(tmp_path, "depths")
    assert rc == 0
    run = RunDir.open(out)
    assert run.manifest["config"]["exit_threshold"] == 0.75
    recs = run.read_jsonl("requests.jsonl")
    assert all(len(r["exit_depths"]) == len(r["token_ids"]) == 3 for r in recs)
    assert {d for r in recs for d in r["exit_depths"]} <= {1, 2, 3}
    cells = run.read_json("cells.json")
    assert all(1 <= c["mean_exit_depth"] <= 3 for c in cells)
    summary = json.loads((out / "summary.json").read_text())
    (row,) = summary["replay_identity"]
    assert row["arm"] == "exact" and row["identical"] == row["compared"] == 2
    assert "mean exit depth" in (out / "table.md").read_text()


def test_exit_depth_mismatch_fails_the_exact_arm(tmp_path, monkeypatch, capsys):
    """Same tokens, one exit depth off: an exactness failure, reported as a depth and exit 1."""
    orig = EngineBackend.replay

    def shifted(self, arm, schedule, requests):
        got = orig(self, arm, schedule, requests)
        first = min(self.last_replay_depths)
        depths = self.last_replay_depths[first]
        depths[1] = 1 + depths[1] % 3
        return got

    monkeypatch.setattr(EngineBackend, "replay", shifted)
    rc, out = _gated_burst(tmp_path, "mismatch")
    assert rc == 1
    summary = json.loads((out / "summary.json").read_text())
    (m,) = summary["exact_arm_mismatches"]
    assert m["arm"] == "exact" and m["first_divergence"]["kind"] == "depth"
    assert m["first_divergence"]["token_index"] == 1
    assert "exit depth" in capsys.readouterr().out


def test_compute_saving_exit_is_labelled_and_counts_the_loops_run(tmp_path):
    """--exit-mode stop: the run says it is the compute-saving mode, each cell records its decode
    steps by loops run, fewer than every loop on average at this threshold, and exact equals torch."""
    args = ("--arms torch,exact --scope all --exit-threshold 0.45 --exit-mode stop --concurrency 2 "
            "--input-len 6 --output-len 4 --repeats 1 --warmup-requests 1 --seed 0")
    rc, out = _run(args.split(), tmp_path, "stop")
    assert rc == 0
    run = RunDir.open(out)
    assert run.manifest["config"]["exit_mode"] == "stop"
    cells = run.read_json("cells.json")
    hists = [c["decode_loops_hist"] for c in cells]
    steps = sum(v for h in hists for v in h.values())
    loops = sum(int(k) * v for h in hists for k, v in h.items())
    assert steps and loops < 3 * steps, hists  # ouro-tiny has 3 loops
    summary = json.loads((out / "summary.json").read_text())
    (row,) = summary["replay_identity"]
    assert row["arm"] == "exact" and row["identical"] == row["compared"] == 2
    table = (out / "table.md").read_text()
    assert "compute-saving exit (--exit-mode stop)" in table and "loops run per decode step" in table


@pytest.mark.slow  # about 70 s: three runs
def test_both_exit_modes_interleaved_in_one_run(tmp_path):
    """--exit-mode all,stop: every arm runs both ways in one interleaving; the compute-saving arms are
    compared with torch+stop, give the tokens of a stop-only run, and each arm's modes are compared."""
    base = ("--arms torch,exact,torch --scope all --exit-threshold 0.45 --concurrency 2 --input-len 6 "
            "--output-len 4 --repeats 2 --warmup-requests 1 --seed 0").split()
    rc, out = _run([*base, "--exit-mode", "all,stop"], tmp_path, "both")
    assert rc == 0
    run = RunDir.open(out)
    cfg = run.manifest["config"]
    assert cfg["arm_names"] == ["torch", "exact", "torch#2", "torch+stop", "exact+stop"]
    assert cfg["exit_mode"] == "all,stop" and cfg["reference_arm"] == "torch"
    assert cfg["identity_references"] == {"torch+stop": "torch+stop", "exact+stop": "torch+stop"}
    assert cfg["arm_specs"]["exact+stop"]["exit_mode"] == "stop" and "exact+stop" in cfg["exact_arms"]
    summary = json.loads((out / "summary.json").read_text())
    replays = {r["arm"]: r for r in summary["replay_identity"]}
    assert set(replays) == {"exact", "torch#2", "exact+stop"}
    assert replays["exact+stop"]["ref"] == "torch+stop" and replays["exact"]["ref"] == "torch"
    assert all(r["identical"] == r["compared"] == 4 for r in replays.values())
    assert not summary["exact_arm_mismatch"] and not summary["exact_arm_unverified"]
    cells = run.read_json("cells.json")
    loops = {c["arm"] for c in cells if c.get("decode_loops_hist")}
    assert loops == {"torch+stop", "exact+stop"}
    stats = run.manifest["engine_stats"]  # each variant's own mode and counters
    assert stats["exact+stop"]["stop_at_exit"] and stats["exact+stop"]["decode_loops_hist"]
    assert not stats["exact"]["stop_at_exit"] and not stats["exact"]["decode_loops_hist"]
    modes = json.loads((out / "mode_comparison.json").read_text())
    assert {(r["arm"], r["against"]) for r in modes} == {("torch+stop", "torch"), ("exact+stop", "exact")}
    table = (out / "table.md").read_text()
    assert "Compute-saving exit against every loop" in table
    assert "compared with the tokens of torch+stop" in table

    def tokens(path, arm):
        recs = RunDir.open(path).read_jsonl("requests.jsonl")
        return {(r["cell"], r["rep"], r["request"]): (r["token_ids"], r["exit_depths"])
                for r in recs if r["arm"] == arm}

    for mode, arm in (("stop", "torch+stop"), ("all", "torch")):  # each mode as if run alone
        rc, alone = _run([*base, "--exit-mode", mode], tmp_path, f"{mode}-only")
        assert rc == 0 and tokens(out, arm) == tokens(alone, "torch"), mode


@pytest.mark.parametrize(
    "args,model",
    [
        (["--exit-threshold", "1.5"], "ouro-tiny"),
        (["--exit-threshold", "0.5"], "huginn-tiny"),
        (["--exit-mode", "stop"], "ouro-tiny"),
        (["--exit-mode", "halt", "--exit-threshold", "0.5"], "ouro-tiny"),
        (["--exit-mode", "all,all", "--exit-threshold", "0.5"], "ouro-tiny"),
        (["--exit-mode", "all,stop"], "ouro-tiny"),
        (["--exit-mode", "all,stop", "--exit-threshold", "0.5", "--prefix-cache", "off,on"], "ouro-tiny"),
        (["--exit-mode", "stop", "--exit-threshold", "0.5"], "huginn-tiny"),
        (["--prefix-cache", "maybe"], "ouro-tiny"),
        (["--prefix-cache", "on,on"], "ouro-tiny"),
        (["--backend", "openai", "--arm", "a=http://127.0.0.1:1", "--prefix-cache", "off,on"], "ouro-tiny"),
    ],
)
def test_bad_scenario_flags_exit_2(args, model, tmp_path, capsys):
    rc, out = _run(["--input-len", "8", "--output-len", "2", *args], tmp_path, "bad", model=model)
    assert rc == 2 and not out.exists()
    err = capsys.readouterr().err
    assert "error" in err and "Traceback" not in err


def test_mismatch_cause_names_the_prefix_cache_when_it_is_varied():
    """With the cache varied, a replay mismatch may come from prefix K/V computed in steps of other
    shapes, so the report does not call it a kernel bug outright."""
    assert mismatch_cause({"prefix_cache": ["off"]}) == "a kernel bug"
    assert "batch-invariant" in mismatch_cause({"prefix_cache": ["off", "on"]})
    # with row-invariant pairs deciding the cache, a remaining replay mismatch is a kernel's
    pairs = [["torch+cache", "torch"]]
    assert mismatch_cause({"prefix_cache": ["off", "on"], "row_invariant_pairs": pairs}) == "a kernel bug"
