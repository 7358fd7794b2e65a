"""The whole command over the OpenAI backend against fake servers: each verdict and its exit code."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import aiohttp  # noqa: F401 - a test dependency (pyproject [test]): missing must fail, not skip
import lm_eval  # noqa: F401 - a test dependency (pyproject [test]): missing must fail, not skip
import pytest
import typer  # noqa: E402
from aiohttp import web  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from rltbench.commands.gsm8k.cli import gsm8k_command  # noqa: E402
from rltbench.commands.gsm8k.report import render  # noqa: E402
from rltbench.commands.gsm8k.tasks import DATA_DIR  # noqa: E402

TARGETS = {}
ORDER = []
N_QUESTIONS = 8  # 8 of 8 wrong is a fail at 95%; 5 of 5 is not evidence enough (results/gsm8k_stats.py)
for _line in (DATA_DIR / "test.jsonl").read_text().splitlines()[:N_QUESTIONS]:
    _doc = json.loads(_line)
    TARGETS[_doc["question"]] = _doc["answer"].split("####")[-1].strip()
    ORDER.append(_doc["question"])
WRONG = {"good": set(), "wrong_all": set(range(N_QUESTIONS)), "wrong0": {0}, "wrong1": {1}}


def _app() -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        mode = request.match_info["mode"]
        question = body["prompt"].rsplit("Q: ", 1)[1].rsplit("\nA:", 1)[0]
        idx = ORDER.index(question)
        answer = TARGETS[question] if idx not in WRONG[mode] else "-1"
        assert body["temperature"] == 0.0 and "Q:" in body["stop"] and body["stream"] is True
        text = f" So it is {answer}. The answer is {answer}."
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunks = [
            {"choices": [{"text": text[:8], "finish_reason": None}]},
            {"choices": [{"text": text[8:], "finish_reason": "stop"}]},
            {"choices": [], "usage": {"completion_tokens": 9, "prompt_tokens": 50}},
        ]
        for chunk in chunks:
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "fake-model"}]})

    app = web.Application()
    app.router.add_post("/{mode}/v1/completions", completions)
    app.router.add_get("/{mode}/v1/models", models)
    return app


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_app())
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    loop.run_until_complete(runner.cleanup())


def _invoke(args: list[str]):
    app = typer.Typer()
    app.command("gsm8k")(gsm8k_command)
    app.command("unused")(lambda: None)
    return CliRunner().invoke(app, ["gsm8k", *args])


@pytest.mark.parametrize(
    ("variant", "code", "verdict"),
    [("good", 0, "identical"), ("wrong_all", 1, "fail"), ("wrong0", 3, "inconclusive")],
)
def test_verdict_exit_codes(server: str, tmp_path, variant: str, code: int, verdict: str) -> None:
    ref = "wrong1" if variant == "wrong0" else "good"
    out = tmp_path / variant
    res = _invoke(
        [
            "--backend",
            "openai",
            "--arm",
            f"torch={server}/{ref}",
            "--arm",
            f"exact={server}/{variant}",
            "--limit",
            str(N_QUESTIONS),
            "--num-fewshot",
            "0",
            "--result-dir",
            str(out),
        ]
    )
    assert res.exit_code == code, res.output
    summary = json.loads((out / "summary.json").read_text())
    (cmp,) = summary["comparisons"]
    assert cmp["verdict"] == verdict and summary["overall"] == verdict and summary["exit_code"] == code
    assert not summary["random_weights"]
    if variant == "good":
        assert cmp["sequences_differ"] == 0 and summary["arms"]["torch"]["strict_acc"] == 100.0
    if variant == "wrong0":
        assert (cmp["n10"], cmp["n01"], cmp["drop"]) == (1, 1, 0.0) and cmp["needed_n"] > N_QUESTIONS
    rows = [json.loads(x) for x in (out / "questions.jsonl").read_text().splitlines()]
    assert [r["doc_id"] for r in rows] == list(range(N_QUESTIONS))
    cell = rows[0]["arms"]["torch"]
    assert {
        "response",
        "strict_answer",
        "flexible_answer",
        "strict_correct",
        "flexible_correct",
        "gen_tokens",
    } <= set(cell)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["verdict"] == verdict
    table = (out / "table.md").read_text()
    (out / "table.md").unlink()
    manifest_bytes = (out / "manifest.json").read_bytes()
    render(out)  # re-created from the raw files alone, the manifest untouched
    assert (out / "table.md").read_text() == table and (out / "accuracy.png").stat().st_size > 0
    assert (out / "manifest.json").read_bytes() == manifest_bytes


def test_usage_errors_exit_2_before_work(tmp_path) -> None:
    from rltbench.errors import UsageError

    # a bound the option declares is refused while the command line is parsed (exit 2, one line
    # naming the option: tests/test_option_walk.py walks every option through rltbench.cli.main)
    res = _invoke(["--limit", "0", "--result-dir", str(tmp_path / "r")])
    assert res.exit_code == 2 and "--limit" in res.output and not (tmp_path / "r").exists(), res.output
    for args in (
        ["--arms", "exact"],
        ["--gate-mode", "maybe"],
        ["--task", "mmlu"],
        ["--weights", str(tmp_path / "missing")],
    ):
        res = _invoke([*args, "--result-dir", str(tmp_path / "r")])
        assert isinstance(res.exception, UsageError), (args, res.output)
