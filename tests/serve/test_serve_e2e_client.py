"""rltbench's own load client (`rltbench e2e --backend openai`) against `rltbench serve`, and the same
burst in-process: every request completes with its token count, and at C=1 the served tokens equal the
in-process engine's (same seeded weights, same prompts, same batch). Also the GPU script's helpers
(rltbench.server.bench): the soak of consecutive bursts, /metrics scrapes and the comparison tables,
peer client included."""

from __future__ import annotations

import json

import pytest
from serve_fixtures import InProcessServer, all_blocks_free, wait_for

from rltbench.cli import main
from rltbench.results import RunDir
from rltbench.server import bench

LOAD = ["--model", "ouro-tiny", "--concurrency", "1,4", "--input-len", "16", "--output-len", "8",
        "--repeats", "1", "--no-live", "--dtype", "float32", "--device", "cpu"]


def _tokens_by_request(path) -> dict:
    recs = RunDir.open(path).read_jsonl("requests.jsonl")
    assert recs and all(r["status"] == "ok" and len(r["token_ids"]) == 8 for r in recs), recs[:2]
    return {(r["cell"], r["request"]): r["token_ids"] for r in recs}


def test_e2e_openai_backend_against_the_server(tmp_path):
    with InProcessServer(prefix_caching=False) as srv:
        assert bench.main(["scrape", srv.url, str(tmp_path / "metrics_http_before.json")]) == 0
        http_run = ["e2e", "--backend", "openai", "--arm", f"exact={srv.url}", *LOAD]
        assert main([*http_run, "--result-dir", str(tmp_path / "http")]) == 0
        assert bench.main(["scrape", srv.url, str(tmp_path / "metrics_http_after.json")]) == 0
        wait_for(lambda: all_blocks_free(srv.url), what="blocks after the burst")
        assert bench.soak(srv.url, "ouro-tiny", 2, 3, 8, 4, 0, tmp_path / "soak") == 0
        assert "Result: CLEAN: 0 failed requests; 2/2 bursts" in (tmp_path / "soak" / "soak.md").read_text()
    assert srv.final_stats["free_blocks"] == srv.final_stats["total_blocks"]
    run = RunDir.open(tmp_path / "http")
    assert run.manifest["status"] == "complete"
    served_as = run.manifest["servers"]["exact"]
    assert served_as["model"] == "ouro-tiny:exact"
    assert set(served_as["extra_fields"]) == {"ignore_eos", "return_token_ids", "stream_options"}
    served = _tokens_by_request(tmp_path / "http")
    in_process = ["e2e", "--backend", "engine", "--arms", "exact", *LOAD]
    assert main([*in_process, "--result-dir", str(tmp_path / "in")]) == 0
    local = _tokens_by_request(tmp_path / "in")
    assert served.keys() == local.keys() and len(served) == 1 + 4
    assert served[("C=1", 0)] == local[("C=1", 0)]

    compare = ["compare", "--http", str(tmp_path / "http"), "--inproc", str(tmp_path / "in"), "--peer",
               str(_fake_guidellm(tmp_path)), "--scrapes", str(tmp_path), "--out", str(tmp_path / "t.md")]
    assert bench.main(compare) == 0
    table = (tmp_path / "t.md").read_text()
    assert "NOT A GPU RUN" in table and "| 4 | TPOT p50 ms |" in table
    assert "identical over HTTP and in-process: " in table
    peer_rows = [line for line in table.splitlines() if line.startswith("| 1 | TTFT p50 ms") and "%" in line]
    assert len(peer_rows) == 2  # overhead row and peer row
    assert "| 1 | guidellm TPOT (incl. TTFT) ms | - | - | - | 70.00 | - |" in table
    assert "| rltbench e2e | 10 |" in table  # the server counted: probe, 4 warm-up, 1 + 4 measured


def _fake_guidellm(tmp_path):
    """The fields of a guidellm JSON report that the comparison reads: one burst of C=1, 8 tokens."""
    timings = {"request_start": 100.0, "first_token_iteration": 100.05, "last_token_iteration": 100.4}
    req = {"info": {"timings": timings}, "output_metrics": {"text_tokens": 8}}
    medians = (("time_to_first_token_ms", 50.0), ("inter_token_latency_ms", 50.0),
               ("time_per_output_token_ms", 70.0))
    metrics = {name: {"successful": {"median": v}} for name, v in medians}
    metrics["output_tokens_per_second"] = {"successful": {"mean": 20.0}}
    row = {"config": {"strategy": {"streams": 1}}, "metrics": metrics,
           "requests": {"successful": [req], "errored": [], "incomplete": []}}
    path = tmp_path / "guidellm.json"
    path.write_text(json.dumps({"benchmarks": [row]}))
    cell = bench.peer_cells(path)[1]["rlt"]
    assert cell["ttft_p50"] == pytest.approx(0.05) and cell["tpot_p50"] == pytest.approx(0.05)
    assert cell["output_tok_s"] == pytest.approx(8 / 0.4)
    return path
