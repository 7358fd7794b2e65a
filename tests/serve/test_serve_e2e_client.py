"""rltbench's own load client (`rltbench e2e --backend openai`) against `rltbench serve`, and the same
burst in-process: every request completes with its token count, and at C=1 the served tokens equal the
in-process engine's (same seeded weights, same prompts, same batch)."""

from __future__ import annotations

from serve_fixtures import InProcessServer, all_blocks_free, wait_for

from rltbench.cli import main
from rltbench.results import RunDir

LOAD = [
    "--model",
    "ouro-tiny",
    "--concurrency",
    "1,4",
    "--input-len",
    "16",
    "--output-len",
    "8",
    "--repeats",
    "1",
    "--no-live",
    "--dtype",
    "float32",
    "--device",
    "cpu",
]


def _tokens_by_request(path) -> dict:
    recs = RunDir.open(path).read_jsonl("requests.jsonl")
    assert recs and all(r["status"] == "ok" and len(r["token_ids"]) == 8 for r in recs), recs[:2]
    return {(r["cell"], r["request"]): r["token_ids"] for r in recs}


def test_e2e_openai_backend_against_the_server(tmp_path):
    with InProcessServer(prefix_caching=False) as srv:
        rc = main(
            [
                "e2e",
                "--backend",
                "openai",
                "--arm",
                f"exact={srv.url}",
                *LOAD,
                "--result-dir",
                str(tmp_path / "http"),
            ]
        )
        assert rc == 0
        wait_for(lambda: all_blocks_free(srv.url), what="blocks after the burst")
    assert srv.final_stats["free_blocks"] == srv.final_stats["total_blocks"]
    run = RunDir.open(tmp_path / "http")
    assert run.manifest["status"] == "complete"
    assert run.manifest["servers"]["exact"]["model"] == "ouro-tiny:exact"
    assert set(run.manifest["servers"]["exact"]["extra_fields"]) == {
        "ignore_eos",
        "return_token_ids",
        "stream_options",
    }
    served = _tokens_by_request(tmp_path / "http")
    assert (
        main(["e2e", "--backend", "engine", "--arms", "exact", *LOAD, "--result-dir", str(tmp_path / "in")])
        == 0
    )
    local = _tokens_by_request(tmp_path / "in")
    assert served.keys() == local.keys() and len(served) == 1 + 4
    assert served[("C=1", 0)] == local[("C=1", 0)]
