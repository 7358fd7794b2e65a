"""OpenAI-compatible backend against a small local aiohttp streaming server (127.0.0.1, stops itself)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from contextlib import contextmanager

import pytest
from aiohttp import web

from rltbench.backends.base import Request, Timeouts, parse_servers
from rltbench.backends.openai import OpenAIBackend
from rltbench.errors import UsageError

VOCAB = 50


def tok(prompt, i):
    return (sum(prompt) * 3 + i * 5) % VOCAB


@contextmanager
def fake_server(ids=True, reject_extras=False, stall_prompt0=None, gap=0.002, life_s=60.0, reject_all=False,
                cached=None):
    """Serve /v1/models and streaming /v1/completions; yields the base URL. Stops itself after life_s.
    `cached`: prompt tokens the usage says came from a prefix cache (prompt_tokens_details)."""
    seen: list[dict] = []

    async def models(request):
        return web.json_response({"data": [{"id": "fake-model"}]})

    async def completions(request):
        body = await request.json()
        seen.append(body)
        if reject_all:
            return web.json_response({"error": "prompt must be a string"}, status=400)
        if reject_extras and ("return_token_ids" in body or "ignore_eos" in body or "stream_options" in body):
            return web.json_response({"error": "unknown field"}, status=400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        prompt, n = body["prompt"], body["max_tokens"]
        for i in range(n):
            if stall_prompt0 is not None and prompt[0] == stall_prompt0 and i == 1:
                await asyncio.sleep(1.0)
            await asyncio.sleep(gap)
            choice = {
                "index": 0,
                "text": f" t{tok(prompt, i)}",
                "finish_reason": "length" if i == n - 1 else None,
            }
            if ids and body.get("return_token_ids"):
                choice["token_ids"] = [tok(prompt, i)]
            await resp.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
        usage = {"choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": n}}
        if cached is not None:
            usage["usage"]["prompt_tokens_details"] = {"cached_tokens": cached}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return resp

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict = {}

    def serve():
        asyncio.set_event_loop(loop)
        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        state["port"] = site._server.sockets[0].getsockname()[1]
        state["runner"] = runner
        loop.call_later(life_s, loop.stop)
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{state['port']}", seen
    finally:
        loop.call_soon_threadsafe(loop.stop)
        th.join(10)


def reqs(n, out=4):
    return [Request(index=i, prompt=[i + 1, 7, 9], output_len=out) for i in range(n)]


def test_burst_streams_token_ids_and_metrics():
    with fake_server() as (url, seen):
        be = OpenAIBackend(parse_servers([f"A={url}/v1"]))
        be.warmup("A", reqs(1, out=2), Timeouts())
        assert be.notes["A"]["model"] == "fake-model"
        recs = be.run_cell("A", "C=3", reqs(3), Timeouts()).records
    assert [r["status"] for r in recs] == ["ok"] * 3
    for r in recs:
        assert r["token_ids"] == [tok([r["request"] + 1, 7, 9], i) for i in range(4)]
        assert len(r["event_times"]) == 4 and r["send"] < r["first"] <= r["last"]
    body = seen[-1]
    assert body["stream"] is True and body["temperature"] == 0.0 and isinstance(body["prompt"], list)
    assert body["ignore_eos"] is True and body["model"] == "fake-model"


def test_server_rejecting_extras_falls_back_to_counting_events():
    with fake_server(reject_extras=True) as (url, _seen):
        be = OpenAIBackend({"A": url}, model_name="m")
        be.warmup("A", [], Timeouts())
        assert be.notes["A"]["extra_fields"] == []
        recs = be.run_cell("A", "C=2", reqs(2, out=3), Timeouts()).records
    for r in recs:
        assert r["status"] == "ok" and r["token_ids"] is None and r["n_tokens"] == 3


def test_server_rejecting_token_id_prompts_is_a_usage_error():
    with fake_server(reject_all=True) as (url, _seen):
        be = OpenAIBackend({"A": url}, model_name="m")
        with pytest.raises(UsageError, match="rejects streaming token-id completions"):
            be.warmup("A", [], Timeouts())


def test_stalled_stream_times_out_others_finish():
    with fake_server(stall_prompt0=2) as (url, _seen):
        be = OpenAIBackend({"A": url}, model_name="m")
        t0 = time.perf_counter()
        recs = be.run_cell("A", "C=2", reqs(2), Timeouts(first_token=2.0, stall=0.3)).records
        assert time.perf_counter() - t0 < 3.0
    assert recs[0]["status"] == "ok"
    assert recs[1]["status"] == "timeout" and "next token" in recs[1]["error"]


def test_unreachable_server_is_a_request_error():
    be = OpenAIBackend({"A": "http://127.0.0.1:9"}, model_name="m")
    recs = be.run_cell("A", "C=1", reqs(1), Timeouts(first_token=2.0, stall=2.0)).records
    assert recs[0]["status"] == "error"


@pytest.mark.parametrize("spec", [["A"], ["A=ftp://x"], ["=http://x"], ["A=http://x", "A=http://y"]])
def test_bad_arm_urls(spec):
    with pytest.raises(UsageError):
        parse_servers(spec)


def test_cli_openai_backend_two_servers_end_to_end(tmp_path):
    from rltbench.cli import main
    from rltbench.results import RunDir

    with fake_server() as (url_a, _), fake_server() as (url_b, _):
        args = f"e2e --backend openai --arm torch={url_a} --arm exact={url_b} --model ouro-tiny"
        args += " --concurrency 1,3 --input-len 8 --output-len 3 --repeats 2 --no-live"
        rc = main([*args.split(), "--result-dir", str(tmp_path / "run")])
    assert rc == 0
    run = RunDir.open(tmp_path / "run")
    assert run.manifest["status"] == "complete" and run.manifest["config"]["backend"] == "openai"
    recs = run.read_jsonl("requests.jsonl")
    assert len(recs) == 2 * 2 * (1 + 3) and all(r["status"] == "ok" for r in recs)
    summary = run.read_json("summary.json")
    assert not summary["exact_arm_mismatch"]
    assert all(r["identical"] == r["compared"] for r in summary["identity"])
    assert "one server per arm" in (tmp_path / "run" / "table.md").read_text()
