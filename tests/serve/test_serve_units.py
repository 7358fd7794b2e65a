"""Pieces of `rltbench serve` without a model: incremental text and stop strings, the Prometheus text,
request validation, and the engine loop surviving an engine that fails."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from serve_fixtures import InProcessServer, request

from rltbench.engine import SamplingParams
from rltbench.errors import UsageError
from rltbench.server.app import ServerApp
from rltbench.server.loop import EngineLoop
from rltbench.server.metrics import Histogram, ServerMetrics
from rltbench.server.protocol import ApiError, ServedModel, parse_request
from rltbench.server.server import Built
from rltbench.server.textstream import TextStream


class CharCodec:
    """id -> chr(id); ids >= 1000 decode to U+FFFD unless followed by id 999 (a 2-part character)."""

    def decode(self, ids):
        out, i = [], 0
        while i < len(ids):
            if ids[i] >= 1000:
                out.append("é" if i + 1 < len(ids) and ids[i + 1] == 999 else "\ufffd")
                i += 2 if out[-1] == "é" else 1
            else:
                out.append(chr(ids[i]))
                i += 1
        return "".join(out)

    def encode(self, text):
        return [ord(c) for c in text]

    def token_id(self, text):
        return ord(text) if len(text) == 1 else None


def _feed(stream: TextStream, text: str) -> list[str]:
    return [stream.add([ord(c)], final=(i == len(text) - 1)) for i, c in enumerate(text)]


def test_text_stream_holds_back_a_possible_stop_prefix():
    s = TextStream(CharCodec(), [ord("x")], stop=["END"])
    deltas = _feed(s, "abcENxEND tail")
    assert "".join(deltas) == "abcENx" and s.stopped
    assert deltas[:3] == ["", "", "a"]  # two characters held: they could start "END"


def test_text_stream_stop_across_tokens_and_drop_last():
    s = TextStream(CharCodec(), [], stop=["cd"])
    assert s.add([ord("a"), ord("b"), ord("c")]) == "ab"
    assert s.add([ord("d"), ord("e")]) == "" and s.text == "ab" and s.stopped
    t = TextStream(CharCodec(), [])
    assert t.add([ord("h"), ord("i"), ord("!")], final=True, drop_last=True) == "hi"


def test_text_stream_waits_for_a_complete_character():
    s = TextStream(CharCodec(), [])
    assert s.add([ord("a")]) == "a"
    assert s.add([1000]) == ""  # incomplete: held
    assert s.add([999], final=True) == "é"
    assert TextStream(None, [1, 2]).add([3], final=True) == ""  # no tokenizer: no text


def test_histogram_and_metrics_text():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 2.0):
        h.observe(v)
    lines = h.lines("x", {"m": "a"})
    assert lines[:3] == [
        'x_bucket{m="a",le="0.1"} 2',
        'x_bucket{m="a",le="1.0"} 3',
        'x_bucket{m="a",le="+Inf"} 4',
    ]
    assert lines[-1] == 'x_count{m="a"} 4'
    m = ServerMetrics('we"ird')
    text = m.render({"total_blocks": 10, "free_blocks": 7, "new_counter": 3}, 2, 1, {"arm": "exact"})
    assert 'rltbench_kv_blocks_used{model_name="we\\"ird"} 3' in text
    assert "new_counter" not in text and "prefix_cache_hit" not in text  # absent keys are skipped
    assert 'rltbench_requests_running{model_name="we\\"ird"} 2' in text


SERVED = ServedModel("m:exact", max_model_len=64, vocab_size=500, codec=CharCodec())


@pytest.mark.parametrize(
    ("body", "check"),
    [
        ({"prompt": "hi"}, lambda r: r.prompt_ids == [104, 105] and r.max_tokens == 16 and not r.stream),
        ({"prompt": ["hi"], "stop": "!"}, lambda r: r.stop == ("!",) and r.stop_token_ids == (33,)),
        ({"prompt": [[1, 2]], "top_k": -1, "seed": 3, "user": "u"}, lambda r: r.prompt_ids == [1, 2]),
        (
            {"prompt": "a", "stream": True, "stream_options": {"include_usage": True}},
            lambda r: r.include_usage and not r.continuous_usage,
        ),
    ],
)
def test_parse_accepts(body, check):
    assert check(parse_request(body, SERVED, chat=False))


def test_parse_chat_defaults_to_the_rest_of_the_context():
    req = parse_request(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "yo"}]}]}, SERVED, True
    )
    assert req.max_tokens == 64 - len(req.prompt_ids) and req.chat
    with pytest.raises(ApiError, match="only text content parts"):
        parse_request({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, SERVED, True)


class FailingEngine:
    """Produces one token per step for every live request; step number `fail_at` raises."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at, self.steps, self.live = fail_at, 0, {}

    def add_request(self, rid, prompt, params):
        self.live[rid] = params.max_tokens

    def abort_request(self, rid):
        return self.live.pop(rid, None) is not None

    def has_unfinished(self):
        return bool(self.live)

    def step(self):
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("device lost")
        time.sleep(0.01)
        return [
            SimpleNamespace(
                request_id=r, token_ids=[7], time=time.perf_counter(), finished=False, finish_reason=None
            )
            for r in self.live
        ]

    def stats(self):
        return {"total_blocks": 4, "free_blocks": 4 - len(self.live)}


def test_engine_failure_fails_requests_not_the_server():
    engine = FailingEngine(fail_at=3)
    app = ServerApp(
        EngineLoop(engine), ServedModel("fake:torch", 64, 50), SamplingParams, 8, {"arm": "torch"}
    )
    with InProcessServer(built=Built(app, lambda e: None, "fake engine")) as srv:
        status, _, err = request(srv.url, "/v1/completions", {"prompt": [1, 2], "max_tokens": 10})
        assert (
            status == 500
            and err["error"]["code"] == "engine_error"
            and "device lost" in err["error"]["message"]
        )
        status, _, body = request(srv.url, "/health")
        assert status == 503 and "device lost" in body["message"]
        status, _, err = request(srv.url, "/v1/completions", {"prompt": [1, 2]})
        assert status == 503 and err["error"]["code"] == "engine_error"
        assert request(srv.url, "/v1/models")[0] == 200
    assert not engine.live  # aborted, so its blocks went back


def test_a_failed_warm_up_is_one_clear_error():
    def warmup(engine):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore lines")

    served = ServedModel("fake:torch", 64, 50)
    app = ServerApp(EngineLoop(FailingEngine(fail_at=0)), served, SamplingParams, 8, {})
    srv = InProcessServer(built=Built(app, warmup, "fake engine"))
    with pytest.raises(RuntimeError, match="did not start"):
        srv.__enter__()
    assert isinstance(srv.error, UsageError)
    assert "warm-up failed (RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB)" in str(srv.error)
    assert "--kv-cache-gib" in str(srv.error)
