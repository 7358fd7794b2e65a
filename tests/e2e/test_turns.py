"""Session conversations: which request continues which, think time between turns (the engine and the
OpenAI backends send a later turn that long after its previous turn's last token), cache busting (the
theoretical and the measured prefix-hit rate) and the session flags of the command."""

from __future__ import annotations

import json

import numpy as np
import pytest
from e2e_fakes import FakeEngine
from test_openai_backend import fake_server

from rltbench.backends.base import Request, SendOrder, Timeouts, parse_servers
from rltbench.backends.engine import EngineBackend
from rltbench.backends.openai import OpenAIBackend
from rltbench.bench.turns import (
    ThinkTime,
    bust_width,
    cache_bust,
    conversations,
    previous_turns,
    with_think_time,
)
from rltbench.bench.workload import allowed_ids, load_trace, materialize_session, resolve_trace
from rltbench.bench.workload import theoretical_prefix_hit_rate as theoretical
from rltbench.cli import main
from rltbench.commands.e2e.session import SessionSpec, session_requests, session_spec_of
from rltbench.errors import UsageError
from rltbench.models import get_config
from rltbench.results import RunDir

TINY = get_config("ouro-tiny")


def _req(i, hash_ids, arrival=0.0, n=8, out=3):
    return Request(index=i, prompt=[20 + i] * n, output_len=out, arrival=arrival, hash_ids=tuple(hash_ids))


def test_previous_turn_is_the_latest_request_whose_full_blocks_begin_this_one():
    reqs = [_req(0, [0, 3]),  # a system prompt and one partial block: too little to be continued
            _req(1, [0, 1, 2]),
            _req(2, [0, 1, 5, 6]),  # turn 2 of request 1's conversation (its last block was partial)
            _req(3, [0, 7]),  # shares the system prompt only: a new conversation
            _req(4, [0, 1, 5, 6, 9]),
            _req(5, [0, 1, 2, 8])]  # continues request 1 (a branch)
    assert previous_turns(reqs) == [None, None, 1, None, 2, 1]
    assert conversations(previous_turns(reqs)) == [0, 1, 1, 3, 1, 1]


def test_shipped_multiturn_trace_has_eight_conversations_of_four_turns():
    path, preset = resolve_trace("multiturn-tiny")
    sess = materialize_session(TINY, load_trace(path), 0, length_scale=preset["length_scale"])
    prev = previous_turns(sess.requests)
    roots = conversations(prev)
    assert sum(p is None for p in prev) == 8 and len(set(roots)) == 8
    assert sorted(roots.count(r) for r in set(roots)) == [4] * 8
    for j, p in enumerate(prev):  # a turn's prompt extends its previous turn's
        if p is not None:
            assert sess.requests[j].prompt[:len(sess.requests[p].prompt)] == sess.requests[p].prompt


def test_think_time_fixed_or_drawn_clipped_and_deterministic():
    reqs = [_req(0, [0, 1, 2]), _req(1, [0, 1, 2, 3]), _req(2, [5, 6])]
    fixed = with_think_time(reqs, ThinkTime(0.5), np.random.default_rng(0))
    assert [(r.after, r.think) for r in fixed] == [(None, 0.0), (0, 0.5), (None, 0.0)]
    draws = ThinkTime(0.1, 0.2).draw(1000, np.random.default_rng(1))
    assert draws.min() == 0.0 and 0.1 < draws.mean() < 0.25  # normal, clipped at 0
    again = ThinkTime(0.1, 0.2).draw(1000, np.random.default_rng(1))
    assert np.array_equal(draws, again)


def test_cache_bust_session_keeps_a_conversations_own_prefix_and_nothing_else():
    ids = allowed_ids(TINY)
    width = bust_width(ids.size)
    blocks = ([0, 1, 2], [0, 1, 2, 3], [0, 4, 5])  # 0 -> 1; 2 shares block 0 only
    base = [Request(index=i, prompt=list(range(30, 30 + 4 * len(h))), output_len=3, hash_ids=tuple(h))
            for i, h in enumerate(blocks)]
    rep0 = cache_bust(base, "session", 0, ids)
    rep1 = cache_bust(base, "session", 1, ids)
    assert [len(r.prompt) for r in rep0] == [len(r.prompt) for r in base]
    assert rep0[1].prompt[:len(rep0[0].prompt)] == rep0[0].prompt  # the conversation still shares
    assert rep0[0].prompt[:width] != rep0[2].prompt[:width]  # another conversation: from token 0
    assert rep0[0].prompt[:width] != rep1[0].prompt[:width]  # another repetition
    assert all(a.prompt[width:] == b.prompt[width:] for a, b in zip(base, rep0, strict=True))
    assert theoretical(base, 4) > theoretical(rep0, 4) > 0  # the shared block 0 no longer counts
    assert theoretical(cache_bust(base, "request", 0, ids), 4) == 0
    assert cache_bust(base, "off", 0, ids) == base


def test_send_order_releases_a_later_turn_after_its_previous_one_ended():
    reqs = [Request(0, [1], 1, arrival=0.0), Request(1, [1], 1, arrival=5.0, after=0, think=0.25),
            Request(2, [1], 1, arrival=1.0)]
    order = SendOrder(reqs, 100.0)
    assert order.pop(100.0)[0].index == 0 and order.pop(100.5) is None and order.next_time() == 101.0
    assert [r.index for r in order.unsent_requests()] == [1, 2]
    order.ended(0, 100.2)  # request 1 is now due at 100.45, before request 2
    assert order.pop(100.5) == (reqs[1], pytest.approx(100.45)) and order.pop(101.0)[0].index == 2
    assert order.unsent == 0 and order.next_time() is None


def _turns(think: float) -> list[Request]:
    """Two conversations of two turns each (indices 0 -> 2, 1 -> 3), think time `think` seconds."""
    reqs = [_req(0, [0, 1, 2]), _req(1, [5, 6, 7], arrival=0.01), _req(2, [0, 1, 2, 3], arrival=0.02),
            _req(3, [5, 6, 7, 8], arrival=0.03)]
    return with_think_time(reqs, ThinkTime(think), np.random.default_rng(0))


def _check_think(recs: list[dict], think: float) -> None:
    by = {r["request"]: r for r in recs}
    assert all(r["status"] == "ok" for r in recs)
    for later, first in ((2, 0), (3, 1)):
        assert by[later]["scheduled"] == pytest.approx(by[first]["last"] + think, abs=1e-6)
        assert by[later]["send"] >= by[later]["scheduled"] - 1e-6


def test_engine_backend_sends_a_later_turn_think_time_after_the_last_token():
    be = EngineBackend(FakeEngine(step_sleep=0.002), ["torch"])
    _check_think(be.run_cell("torch", "s", _turns(0.05), Timeouts()).records, 0.05)


def test_openai_backend_sends_a_later_turn_think_time_after_the_last_token_and_reads_cached_tokens():
    with fake_server(cached=2) as (url, _seen):
        be = OpenAIBackend(parse_servers([f"A={url}"]))
        be.warmup("A", [], Timeouts())
        recs = be.run_cell("A", "s", _turns(0.05), Timeouts()).records
    _check_think(recs, 0.05)
    assert all(r["prefix_hit_tokens"] == 2 for r in recs)


@pytest.mark.parametrize("flags, needle", [
    (dict(think_time=float("nan")), "--think-time must be a finite"),
    (dict(think_time=float("inf")), "--think-time must be a finite"),
    (dict(think_time=-1.0), "--think-time must be a finite"),
    (dict(think_time=10.0, think_time_stddev=float("nan")), "--think-time-stddev must be a finite"),
    (dict(think_time_stddev=5.0), "give --think-time too"),
    (dict(cache_bust="on"), "--cache-bust must be off, session, request"),
])
def test_bad_session_flags_are_one_line_usage_errors(flags, needle):
    args = {"think_time": None, "think_time_stddev": None, "cache_bust": None, **flags}
    with pytest.raises(UsageError, match=needle):
        session_spec_of("session", **args)


def test_session_flags_belong_to_the_session_workload():
    with pytest.raises(UsageError, match="--cache-bust is for --workload session"):
        session_spec_of("burst", None, None, "session")
    spec = session_spec_of("session", 200.0, 50.0, "request")
    assert spec == SessionSpec(ThinkTime(0.2, 0.05), "request")
    assert session_spec_of("session", None, None, None) == SessionSpec()


def test_repetitions_are_busted_apart_and_the_same_for_every_arm():
    path, preset = resolve_trace("multiturn-tiny")
    trace = materialize_session(TINY, load_trace(path), 0, length_scale=preset["length_scale"]).requests
    spec = SessionSpec(ThinkTime(0.1, 0.05), "session")
    rep0, again, rep1 = (session_requests(TINY, trace, spec, 0, rep) for rep in (0, 0, 1))
    assert rep0 == again and [r.prompt for r in rep0] != [r.prompt for r in rep1]
    assert [r.think for r in rep0] != [r.think for r in rep1]


def _conversation_trace(tmp_path) -> str:
    """Two conversations of two turns (each turn extends its previous prompt by one block)."""
    recs = [{"timestamp": 0, "input_length": 1400, "output_length": 16, "hash_ids": [0, 1, 2]},
            {"timestamp": 0, "input_length": 1400, "output_length": 16, "hash_ids": [9, 10, 11]},
            {"timestamp": 5000, "input_length": 1900, "output_length": 16, "hash_ids": [0, 1, 2, 3]},
            {"timestamp": 5000, "input_length": 1900, "output_length": 16, "hash_ids": [9, 10, 11, 12]}]
    path = tmp_path / "conv.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return str(path)


def test_session_command_with_think_time_and_cache_busting(tmp_path):
    """The trace's second turns arrive at 5 s (0.5 s at time scale 0.1); with 30 ms of think time they
    are sent 30 ms after their previous turn's last token. Busting per session: each second turn hits
    its own first turn's blocks, never the other conversation's nor an earlier repetition's."""
    out = tmp_path / "run"
    args = (f"e2e --model ouro-tiny --device cpu --no-live --arms torch --workload session --trace "
            f"{_conversation_trace(tmp_path)} --trace-length-scale 0.03125 --trace-time-scale 0.1 "
            "--repeats 2 --warmup-requests 1 --think-time 30 --cache-bust session")
    assert main([*args.split(), "--result-dir", str(out)]) == 0
    run = RunDir.open(out)
    sess = run.manifest["config"]["session"]
    assert (sess["later_turns"], sess["conversations"], sess["cache_bust"]) == (2, 2, "session")
    assert sess["think_time_ms"] == 30.0 and "think time 30 ms" in run.manifest["config"]["workload_note"]
    recs = run.read_jsonl("requests.jsonl")
    for rep in (0, 1):
        by = {r["request"]: r for r in recs if r["rep"] == rep}
        for later, first in ((2, 0), (3, 1)):
            assert by[later]["scheduled"] == pytest.approx(by[first]["last"] + 0.03, abs=1e-6)
    cells = run.read_json("cells.json")
    assert all(0 < c["measured_prefix_hit_rate"] <= c["theoretical_prefix_hit_rate"] for c in cells)
    table = (out / "table.md").read_text()
    assert "Cache busting per session" in table and "## Session prefix cache" in table
