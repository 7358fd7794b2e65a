"""Two real processes over gloo on CPU: the pd command end to end (ouro-tiny, huginn-tiny) with tokens
equal to the colocated engine, one payload message per request, and the failure cases (corrupt
header, wrong size, lost payload, a peer killed mid-transfer): only the affected requests fail, every
KV block comes back on both sides, and nothing hangs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rltbench.cli import main
from rltbench.disagg.link import NO_MULTICAST_ENV
from rltbench.results import RunDir

ROOT = Path(__file__).resolve().parents[2]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pd(tmp_path: Path, *args: str) -> tuple[int, RunDir]:
    out = tmp_path / "run"
    rc = main(
        [
            "pd",
            "--devices",
            "cpu,cpu",
            "--input-len",
            "9",
            "--output-len",
            "4",
            "--repeats",
            "1",
            "--probe-reps",
            "1",
            "--warmup-requests",
            "1",
            "--result-dir",
            str(out),
            *args,
        ]
    )
    return rc, RunDir.open(out)


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, layout",
    [("ouro-tiny", None), ("huginn-tiny", "full"), ("huginn-tiny", "compress")],
)
def test_pd_command_over_gloo_matches_the_colocated_engine(tmp_path, model, layout) -> None:
    extra = ["--kv-layout", layout] if layout else []
    rc, run = _pd(tmp_path, "--model", model, "--concurrency", "3", "--no-aa", *extra)
    m = run.manifest
    assert rc == 0 and m["status"] == "complete", m.get("ranks")
    assert m["all_blocks_free"] == {"prefill": True, "decode": True}
    assert m["multicast_env"]["prefill"] == m["multicast_env"]["decode"] == NO_MULTICAST_ENV
    recs = run.read_jsonl("requests.jsonl")
    pd_recs = [r for r in recs if r["arm"] == "pd"]
    assert len(pd_recs) == 3 and all(r["status"] == "ok" and len(r["token_ids"]) == 4 for r in pd_recs)
    assert all(r["pd"]["payload_messages"] == 1 for r in pd_recs)  # one coalesced payload per request
    colo = {r["request"]: r["token_ids"] for r in recs if r["arm"] == "colocated"}
    assert {r["request"]: r["token_ids"] for r in pd_recs} == colo  # free-running: equal here too
    (replay,) = run.read_jsonl("replay.jsonl")
    assert replay["identical"] == replay["compared"] == 3 and replay["exact_arm"]
    summary = json.loads((run.path / "summary.json").read_text())
    assert not summary["exact_arm_mismatch"] and summary["failed_requests"] == 0
    (row,) = json.loads((run.path / "transfer.json").read_text())
    planes = m["config"]["num_kv_planes"]
    assert row["bytes_per_request"] == m["config"]["kv_bytes_per_block"]  # 9 tokens: one 16-token block
    assert planes == {"ouro-tiny": 6, "huginn-tiny": 16 if layout == "full" else 8}[model]
    text = (run.path / "table.md").read_text()
    assert "KV transfer per request" in text and "no speed verdicts" in text
    (run.path / "table.md").unlink()
    assert main(["report", str(run.path)]) == 0 and (run.path / "table.md").read_text() == text


def peers(faults: dict[int, str], timeout: float, C: int, **extra: object) -> list[dict]:
    """Run both ranks of tests/pd/pd_peer.py; per rank its exit code, last JSON line and stderr."""
    base = {
        "port": _port(),
        "preset": "ouro-tiny",
        "C": C,
        "input_len": 9,
        "output_len": 4,
        "timeout": timeout,
        "faults": faults,
        **extra,
    }
    env = dict(os.environ, **NO_MULTICAST_ENV, PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.pd.pd_peer", json.dumps({**base, "rank": r})],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)  # nothing hangs: both exit well inside this
        lines = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
        out.append({"rc": p.returncode, "result": lines[-1] if lines else None, "stderr": stderr})
    return out


# request index -> (fault, the reason its record must name); requests 0, 3 and 6 carry none
FAULTS = {
    1: ("corrupt_header", "header_corrupt"),
    2: ("wrong_size", "size_mismatch"),
    4: ("short_payload", "size_mismatch"),
    5: ("lose_payload", "timeout"),
}


def test_each_failed_transfer_fails_only_its_request_and_each_request_is_one_payload() -> None:
    p, d = peers({k: f for k, (f, _r) in FAULTS.items()}, timeout=1.5, C=7)
    assert p["rc"] == d["rc"] == 0, (p["stderr"], d["stderr"])
    r = p["result"]
    by = {x["request"]: x for x in r["records"]}
    for i, (_fault, reason) in FAULTS.items():
        assert by[i]["status"] == "error" and reason in by[i]["error"], by[i]["error"]
    for i in (0, 3, 6):
        assert by[i]["status"] == "ok" and by[i]["token_ids"] == r["colocated"][i]
        assert by[i]["pd"]["payload_messages"] == 1
    assert r["all_free"] and r["decode_all_free"] and d["result"]["all_free"]
    # one header per request; one payload per accepted one (the two refused headers send none);
    # control: cell + stop, ready + records; one reply per header
    assert r["sent"] == {"json": 2, "header": 7, "payload": 5}
    assert d["result"]["sent"] == {"json": 2, "reply": 7}
    assert [x["reason"] for x in r["rejections"]] == ["header_corrupt", "size_mismatch"]


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["prefill", "decode"])
def test_a_peer_killed_mid_transfer_ends_the_other_in_one_line(victim) -> None:
    p, d = peers({1: f"kill_{victim}"}, timeout=3.0, C=3)
    dead, alive = (p, d) if victim == "prefill" else (d, p)
    assert dead["rc"] == -9
    survivor = "decode" if victim == "prefill" else "prefill"
    lines = alive["stderr"].strip().splitlines()
    assert alive["rc"] == 3 and len(lines) == 1, alive["stderr"]
    assert lines[0].startswith(f"pd {survivor}: link to the {victim} rank lost (")
    assert "peer gone" in lines[0] and lines[0].endswith("every KV block returned")
    if survivor == "prefill":  # its records: every request failed with the reason, all blocks back
        r = alive["result"]
        assert r["all_free"] and all(x["status"] == "error" for x in r["records"])
