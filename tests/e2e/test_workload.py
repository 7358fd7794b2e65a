"""Workloads: burst prompts and Mooncake session materialization (pure, deterministic)."""

from __future__ import annotations

import json

import pytest

from rltbench.bench.workload import (
    WORKLOAD_DIR,
    allowed_ids,
    burst_prompts,
    load_trace,
    materialize_session,
    resolve_trace,
    special_ids,
    theoretical_prefix_hit_rate,
)
from rltbench.errors import UsageError
from rltbench.models import get_config

TINY = get_config("ouro-tiny")


def test_burst_prompts_exact_length_no_special_ids_deterministic():
    reqs = burst_prompts(TINY, 5, 33, 7, seed=3, rep=0, concurrency=5)
    bad = special_ids(TINY)
    assert bad  # eos ids at least
    assert [len(r.prompt) for r in reqs] == [33] * 5 and all(r.output_len == 7 for r in reqs)
    assert all(0 <= t < TINY.vocab_size and t not in bad for r in reqs for t in r.prompt)
    again = burst_prompts(TINY, 5, 33, 7, seed=3, rep=0, concurrency=5)
    assert [r.prompt for r in reqs] == [r.prompt for r in again]
    other_rep = burst_prompts(TINY, 5, 33, 7, seed=3, rep=1, concurrency=5)
    assert all(a.prompt != b.prompt for a, b in zip(reqs, other_rep, strict=True))
    assert len({tuple(r.prompt) for r in reqs}) == 5


def test_real_vocab_excludes_family_special_ranges():
    ouro = get_config("ouro-1.4b")
    assert set(range(17)) <= special_ids(ouro) and 17 not in special_ids(ouro)
    huginn = get_config("huginn-0125")
    ids = allowed_ids(huginn)
    assert ids.max() < 65504 and 65505 in special_ids(huginn)


def _trace(tmp_path, recs):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


RECS = [
    {"timestamp": 0, "input_length": 1200, "output_length": 10, "hash_ids": [0, 1, 2]},
    {"timestamp": 1000, "input_length": 1300, "output_length": 20, "hash_ids": [0, 1, 3]},
    {"timestamp": 2500, "input_length": 600, "output_length": 5, "hash_ids": [4, 5]},
    {"timestamp": 4000, "input_length": 1536, "output_length": 8, "hash_ids": [0, 1, 2]},
]


def test_session_shared_prefixes_really_shared_and_deterministic(tmp_path):
    recs = load_trace(_trace(tmp_path, RECS))
    s = materialize_session(TINY, recs, seed=1, time_scale=0.5, length_scale=1 / 64)
    assert s.block_size == 8
    r = s.requests
    assert [len(x.prompt) for x in r] == [19, 20, 9, 24]  # round(len / 64), inside the hash blocks
    assert r[0].prompt[:16] == r[1].prompt[:16]  # hash ids 0, 1 shared
    assert r[0].prompt[16:19] != r[1].prompt[16:19]  # 2 vs 3 differ
    assert r[3].prompt[:19] == r[0].prompt  # same hash ids, longer prompt
    assert r[2].prompt[:8] != r[0].prompt[:8]
    assert [x.arrival for x in r] == [0.0, 0.5, 1.25, 2.0]
    assert [x.output_len for x in r] == [1, 1, 1, 1]  # round(10 / 64) etc., at least 1
    s2 = materialize_session(TINY, recs, seed=1, time_scale=0.5, length_scale=1 / 64)
    assert [x.prompt for x in s2.requests] == [x.prompt for x in r]
    s3 = materialize_session(TINY, recs, seed=2, time_scale=0.5, length_scale=1 / 64)
    assert s3.requests[0].prompt != r[0].prompt
    bad = special_ids(TINY)
    assert all(t not in bad for x in r for t in x.prompt)


def test_theoretical_prefix_hit_rate_hand_computed(tmp_path):
    recs = load_trace(_trace(tmp_path, RECS))
    s = materialize_session(TINY, recs, seed=0, length_scale=1 / 64)
    # r0: 0 hits; r1: blocks 0,1 seen -> 16; r2: 0; r3: 0,1,2 seen -> min(24, 24) = 24
    total = 19 + 20 + 9 + 24
    assert theoretical_prefix_hit_rate(s.requests, s.block_size) == pytest.approx((16 + 24) / total)


def test_session_drops_too_long_and_limits(tmp_path):
    recs = load_trace(_trace(tmp_path, RECS), max_requests=3)
    assert len(recs) == 3
    s = materialize_session(TINY, recs, seed=0, length_scale=1 / 64, max_model_len=19)
    assert s.dropped_too_long == 2 and [len(x.prompt) for x in s.requests] == [9]
    with pytest.raises(UsageError):
        materialize_session(TINY, recs, seed=0, length_scale=1 / 64, max_model_len=5)


@pytest.mark.parametrize(("text", "needle"), [
    ('{"timestamp": 0, "input_length": 5}\n', "not a Mooncake record"), (None, "no such file or preset")])
def test_bad_traces_are_usage_errors(tmp_path, text, needle):
    trace = tmp_path / "trace.jsonl"
    if text is not None:
        trace.write_text(text)
    with pytest.raises(UsageError, match=needle):
        load_trace(resolve_trace(str(trace))[0])


def test_mooncake_copy_and_presets():
    path, preset = resolve_trace("mooncake-tiny")
    assert path == WORKLOAD_DIR / "mooncake" / "conversation_trace.jsonl" and path.is_file()
    assert (WORKLOAD_DIR / "mooncake" / "LICENSE").is_file()
    recs = load_trace(path, max_requests=50)
    assert recs[0]["hash_ids"][0] == 0 and len(recs) == 50
    s = materialize_session(get_config("ouro-1.4b"), recs, seed=0, length_scale=0.25)
    assert s.block_size == 128
    assert 0.0 < theoretical_prefix_hit_rate(s.requests, s.block_size) < 1.0
