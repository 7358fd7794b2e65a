"""`rltbench serve` over HTTP on ouro-tiny (random weights, float32, CPU): the OpenAI endpoints, every
refused input, disconnects, capacity, metrics, and that every KV block is free after shutdown."""

from __future__ import annotations

import threading

import pytest
from serve_fixtures import InProcessServer, OpenStream, all_blocks_free, metrics, request, sse, wait_for

PROMPT = [5, 17, 33, 2, 101, 77, 9]


@pytest.fixture(scope="module")
def server():
    """No tokenizer (token-id prompts only), no prefix caching: what a burst benchmark runs against."""
    srv = InProcessServer(prefix_caching=False)
    with srv:
        yield srv
    assert srv.final_stats["free_blocks"] == srv.final_stats["total_blocks"] == 512


def _complete(url: str, prompt=PROMPT, **kw):
    status, _, body = request(url, "/v1/completions", {"prompt": prompt, "return_token_ids": True, **kw})
    assert status == 200, body
    return body


def test_models_and_health(server):
    status, _, body = request(server.url, "/v1/models")
    assert status == 200
    (card,) = body["data"]
    assert card["id"] == "ouro-tiny:exact" and card["arm"] == "exact" and card["max_model_len"] == 512
    assert card["weights"] == "random" and card["tokenizer"].startswith("none")
    assert request(server.url, "/health")[:1] == (200,)
    assert any(line.startswith("ready on http://127.0.0.1:") for line in server.lines)


def test_completion_non_streaming(server):
    body = _complete(server.url, max_tokens=6, ignore_eos=True)
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 6
    assert choice["text"] == ""  # no tokenizer: ids only
    assert body["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 6,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert body["model"] == "ouro-tiny:exact" and body["object"] == "text_completion"
    assert body["prompt_token_ids"] == PROMPT
    assert (
        _complete(server.url, max_tokens=6, ignore_eos=True)["choices"][0]["token_ids"] == choice["token_ids"]
    )


def test_completion_streaming_matches_non_streaming(server):
    want = _complete(server.url, max_tokens=5, ignore_eos=True)["choices"][0]["token_ids"]
    events = sse(
        server.url,
        "/v1/completions",
        {
            "prompt": PROMPT,
            "max_tokens": 5,
            "stream": True,
            "ignore_eos": True,
            "return_token_ids": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
            "model": "ouro-tiny:exact",
        },
    )
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 5
    chunks = events[:-2]
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == want
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 4 + ["length"]
    assert all(c["object"] == "text_completion" for c in chunks)


def test_stop_token_ids_and_continuous_usage(server):
    first = _complete(server.url, max_tokens=3, ignore_eos=True)["choices"][0]["token_ids"][1]
    body = _complete(server.url, max_tokens=3, ignore_eos=True, stop_token_ids=[first])
    assert body["choices"][0]["finish_reason"] == "stop" and body["choices"][0]["token_ids"][-1] == first
    events = sse(
        server.url,
        "/v1/completions",
        {
            "prompt": PROMPT,
            "max_tokens": 3,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    assert [e["usage"]["completion_tokens"] for e in events[:3]] == [1, 2, 3]
    assert "token_ids" not in events[0]["choices"][0]  # only when asked (return_token_ids)


BAD = [
    (b"{not json", 400, "invalid_json", "not valid JSON"),
    (b"[1, 2]", 400, "invalid_json", "JSON object"),
    ({"prompt": PROMPT, "model": "ouro-tiny:torch"}, 404, "model_not_found", "ouro-tiny:exact"),
    ({"prompt": list(range(1, 200)) * 3}, 400, "context_length_exceeded", "597 tokens is too long"),
    ({"prompt": PROMPT, "max_tokens": 506}, 400, "context_length_exceeded", "exceeds the context of 512"),
    ({"prompt": PROMPT, "max_tokens": 0}, 400, "invalid_value", "max_tokens must be an integer >= 1"),
    ({"prompt": PROMPT, "max_tokens": -3}, 400, "invalid_value", "max_tokens must be"),
    ({"prompt": PROMPT, "max_tokens": "8"}, 400, "invalid_value", "max_tokens must be"),
    ({"prompt": PROMPT, "temperature": 0.7}, 400, "unsupported_value", "greedy decoding only"),
    ({"prompt": PROMPT, "n": 2}, 400, "unsupported_value", "unsupported n=2"),
    ({"prompt": PROMPT, "logprobs": 1}, 400, "unsupported_value", "logprobs"),
    ({"prompt": PROMPT, "top_p": 0.5}, 400, "unsupported_value", "top_p"),
    ({"prompt": PROMPT, "frobnicate": 1}, 400, "unsupported_parameter", "frobnicate"),
    ({"prompt": PROMPT, "stream_options": {"include_usage": True}}, 400, "invalid_value", "stream: true"),
    ({"prompt": []}, 400, "invalid_value", "non-empty"),
    ({"prompt": [1, 256]}, 400, "invalid_value", "token id 256 outside the vocabulary [0, 256)"),
    ({"prompt": [[1, 2], [3, 4]]}, 400, "invalid_value", "one prompt per request"),
    ({"max_tokens": 3}, 400, "invalid_value", "prompt is required"),
    ({"prompt": "hello"}, 400, "tokenizer_required", "--tokenizer"),
    ({"prompt": PROMPT, "stop": ["\n"]}, 400, "tokenizer_required", "stop strings need a tokenizer"),
]


@pytest.mark.parametrize(
    ("body", "status", "code", "fragment"), BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)]
)
def test_bad_input_is_refused_clearly(server, body, status, code, fragment):
    got, _, err = request(server.url, "/v1/completions", body)
    assert got == status, err
    assert err["error"]["code"] == code and fragment in err["error"]["message"], err
    assert err["error"]["type"] in ("invalid_request_error", "not_found_error")


def test_bad_routes_and_chat_without_tokenizer(server):
    status, _, err = request(server.url, "/v1/completions", method="GET")
    assert status == 405 and err["error"]["code"] == "method_not_allowed"
    status, _, err = request(server.url, "/v2/nothing")
    assert status == 404 and err["error"]["code"] == "not_found"
    status, _, err = request(
        server.url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}
    )
    assert status == 400 and err["error"]["code"] == "tokenizer_required"
    status, _, err = request(
        server.url, "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}
    )
    assert status == 400 and "role must be one of" in err["error"]["message"]
    assert request(server.url, "/health")[0] == 200  # still serving


def test_mid_stream_disconnect_aborts_and_frees_blocks(server):
    before = metrics(server.url)
    stream = OpenStream(
        server.url,
        "/v1/completions",
        {"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True},
    )
    assert stream.resp.status == 200 and stream.next_event()["choices"]
    other: dict = {}
    worker = threading.Thread(
        target=lambda: other.update(body=_complete(server.url, max_tokens=20, ignore_eos=True))
    )
    worker.start()
    stream.close()
    worker.join(60)
    assert len(other["body"]["choices"][0]["token_ids"]) == 20  # the neighbour is not disturbed
    wait_for(lambda: all_blocks_free(server.url), what="blocks of the aborted request")
    after = metrics(server.url)
    assert (
        after['rltbench_requests_total{status="aborted"}']
        == before['rltbench_requests_total{status="aborted"}'] + 1
    )
    assert after["rltbench_generation_tokens_total"] < before["rltbench_generation_tokens_total"] + 400 + 20


def test_beyond_capacity_is_503_with_retry_after(server):
    app = server.app
    old = app.capacity
    app.capacity = 1
    stream = OpenStream(
        server.url,
        "/v1/completions",
        {"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True},
    )
    try:
        assert stream.next_event() is not None
        status, headers, err = request(server.url, "/v1/completions", {"prompt": PROMPT})
        assert status == 503 and headers["Retry-After"] == "1"
        assert err["error"]["code"] == "server_overloaded" and "--max-queue" in err["error"]["message"]
        assert err["error"]["type"] == "server_error"
    finally:
        stream.close()
        app.capacity = old
    wait_for(lambda: all_blocks_free(server.url), what="blocks of the disconnected request")
    assert metrics(server.url)['rltbench_requests_total{status="overloaded"}'] >= 1


def test_metrics_series(server):
    _complete(server.url, max_tokens=4, ignore_eos=True)
    m = metrics(server.url)
    for name in (
        "rltbench_prompt_tokens_total",
        "rltbench_generation_tokens_total",
        "rltbench_kv_blocks_used",
        "rltbench_prefix_cache_hit_tokens_total",
        "rltbench_requests_running",
        "rltbench_requests_waiting",
        'rltbench_engine_steps_total{kind="decode"}',
    ):
        assert name in m, name
    assert m['rltbench_requests_total{status="ok"}'] >= 1 and m["rltbench_kv_blocks_used"] == 0
    n = m["rltbench_time_to_first_token_seconds_count"]
    assert n >= 1 and m['rltbench_time_to_first_token_seconds_bucket{le="+Inf"}'] == n
    assert m["rltbench_inter_token_latency_seconds_count"] >= 3
    buckets = [v for k, v in m.items() if k.startswith("rltbench_inter_token_latency_seconds_bucket")]
    assert buckets == sorted(buckets)  # cumulative
