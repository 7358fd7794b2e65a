"""`rltbench serve` with a tokenizer (the gsm8k gate's fallback byte-level BPE): text prompts, chat,
stop strings, the prefix cache, and rltbench's own gsm8k client against it."""

from __future__ import annotations

import json

import pytest
from serve_fixtures import InProcessServer, all_blocks_free, metrics, request, sse, wait_for


@pytest.fixture(scope="module")
def text_server():
    srv = InProcessServer(tokenizer="fallback", max_num_seqs=4)
    with srv:
        yield srv
    assert srv.final_stats["free_blocks"] == srv.final_stats["total_blocks"]


def _text(url: str, prompt: str, **kw) -> dict:
    status, _, body = request(url, "/v1/completions", {"prompt": prompt, "return_token_ids": True, **kw})
    assert status == 200, body
    return body["choices"][0]


def _printable_stop(text: str, width: int) -> str:
    """A stop string of `width` printable ASCII characters taken from the middle of `text`."""
    for i in range(1, len(text) - width):
        s = text[i : i + width]
        if all(c.isascii() and c.isprintable() and not c.isspace() for c in s):
            return s
    pytest.skip("random output without printable ASCII")


def test_text_prompt_streams_the_same_text(text_server):
    full = _text(text_server.url, "Question: 2 + 3 = ?", max_tokens=12, ignore_eos=True)
    assert len(full["token_ids"]) == 12 and full["finish_reason"] == "length"
    events = sse(
        text_server.url,
        "/v1/completions",
        {"prompt": "Question: 2 + 3 = ?", "max_tokens": 12, "ignore_eos": True, "stream": True},
    )
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == full["text"]


@pytest.mark.parametrize("width", [1, 2], ids=["one-token-stop", "multi-token-stop"])
def test_stop_string_cuts_the_text(text_server, width):
    prompt = "The answer is"
    full = _text(text_server.url, prompt, max_tokens=24, ignore_eos=True)
    stop = _printable_stop(full["text"], width)
    cut = _text(text_server.url, prompt, max_tokens=24, ignore_eos=True, stop=[stop])
    assert cut["finish_reason"] == "stop"
    assert cut["text"] == full["text"][: full["text"].find(stop)]
    assert len(cut["token_ids"]) < 24
    events = sse(
        text_server.url,
        "/v1/completions",
        {"prompt": prompt, "max_tokens": 24, "ignore_eos": True, "stream": True, "stop": stop},
    )
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == cut["text"]
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    wait_for(lambda: all_blocks_free(text_server.url), what="blocks of the stopped request")


def test_chat_completion(text_server):
    body = {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_tokens": 6,
        "ignore_eos": True,
    }
    status, _, resp = request(text_server.url, "/v1/chat/completions", body)
    assert status == 200, resp
    msg = resp["choices"][0]["message"]
    assert msg["role"] == "assistant" and isinstance(msg["content"], str)
    assert resp["object"] == "chat.completion" and resp["usage"]["completion_tokens"] == 6
    # ChatML template, encoded by the fallback byte tokenizer: one token per byte
    template = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert resp["usage"]["prompt_tokens"] == len(template.encode())
    events = sse(
        text_server.url,
        "/v1/chat/completions",
        {**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    chunks = events[:-2]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == msg["content"]
    status, _, err = request(text_server.url, "/v1/chat/completions", {**body, "max_completion_tokens": 0})
    assert status == 400 and "max_completion_tokens" in err["error"]["message"]


def test_prefix_cache_hits_are_counted(text_server):
    before = metrics(text_server.url)["rltbench_prefix_cache_hit_tokens_total"]
    prompt = list(range(3, 43))  # 40 ids: two full blocks of 16 cached after the first request
    cached = [
        request(text_server.url, "/v1/completions", {"prompt": prompt, "max_tokens": 2})[2]["usage"][
            "prompt_tokens_details"
        ]["cached_tokens"]
        for _ in range(2)
    ]
    assert cached[1] == 32
    m = metrics(text_server.url)
    assert m["rltbench_prefix_cache_hit_tokens_total"] - before >= 32
    assert m["rltbench_kv_blocks_cached"] >= 2 and m["rltbench_kv_blocks_used"] == 0


@pytest.mark.slow  # about 5 s: lm-eval builds the task
def test_gsm8k_client_against_the_server(text_server, tmp_path):
    from rltbench.cli import main

    rc = main(
        [
            "gsm8k",
            "--backend",
            "openai",
            "--arm",
            f"torch={text_server.url}",
            "--limit",
            "2",
            "--num-fewshot",
            "0",
            "--max-gen-toks",
            "8",
            "--batch-size",
            "2",
            "--result-dir",
            str(tmp_path / "g"),
        ]
    )
    assert rc in (0, 3), rc  # one arm: nothing to gate, the pipeline ran
    rows = [json.loads(x) for x in (tmp_path / "g" / "questions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["arms"]["torch"]["gen_tokens"] >= 1 for r in rows)
    wait_for(lambda: all_blocks_free(text_server.url), what="blocks after the gsm8k run")
