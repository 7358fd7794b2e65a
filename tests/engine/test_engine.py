"""Engine behaviour on CPU with tiny fp32 models (eager decode; graphs are covered by the GPU tests)."""

from __future__ import annotations

import pytest
import torch

from rltbench.bench.decode_benchmark import DecodeBenchmark
from rltbench.engine import Engine, EngineConfig, EngineRequestError, SamplingParams
from rltbench.errors import UsageError
from tests.engine.engine_testutil import prompts, torch_ops

# Lengths around the block size 4: 1 token, exact blocks, one past a block, long enough to chunk.
LENGTHS = [5, 1, 8, 13, 4, 9]


def make_engine(model, ops, **kw) -> Engine:
    cfg = dict(block_size=4, max_num_batched_tokens=16, max_num_seqs=8, num_blocks=96)
    cfg.update(kw)
    return Engine(model, {"torch": ops}, EngineConfig(**cfg))


def assert_idle_and_free(eng: Engine) -> None:
    assert not eng.has_unfinished()
    assert eng.blocks.check_all_free(), eng.stats()
    assert eng.stats()["free_blocks"] == eng.stats()["total_blocks"]


def run(eng: Engine, ps, max_tokens=6, **kw):
    outs = eng.generate(ps, SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw))
    return [o.token_ids for o in outs]


@pytest.mark.parametrize("family", ["ouro", "huginn"])
def test_mixed_batch_equals_plain_generate(family, ouro_tiny, huginn_tiny, ops):
    model = ouro_tiny if family == "ouro" else huginn_tiny
    ps = prompts(1, LENGTHS)
    eng = make_engine(model, ops)
    got = run(eng, ps)
    ref = [model.generate(p, 6, ops=ops) for p in ps]
    assert got == ref
    s = eng.stats()
    assert s["prefill_steps"] >= 3  # 40 prompt tokens under a 16-token budget: chunked
    assert s["decode_steps"] >= 5
    assert_idle_and_free(eng)


def test_prefill_metadata_is_read_once_per_step_not_per_plane(ouro_tiny, ops, monkeypatch):
    """The model attends once per KV plane; the step's row plan (host reads) is built once."""
    from rltbench.engine import attention

    calls = []
    real = attention.prefill_plan
    monkeypatch.setattr(attention, "prefill_plan", lambda *a, **k: calls.append(1) or real(*a, **k))
    eng = make_engine(ouro_tiny, ops, max_num_batched_tokens=4096, enable_prefix_caching=False)
    run(eng, prompts(5, [9, 6]), max_tokens=2)
    assert ouro_tiny.config.num_kv_planes > 1
    assert len(calls) == eng.stats()["prefill_steps"] == 1
    assert_idle_and_free(eng)


def test_chunked_prefill_equals_unchunked(ouro_tiny, ops):
    ps = prompts(2, [23, 7, 16])
    a = make_engine(ouro_tiny, ops, max_num_batched_tokens=3, enable_prefix_caching=False)
    b = make_engine(ouro_tiny, ops, max_num_batched_tokens=4096, enable_prefix_caching=False)
    out_a, out_b = run(a, ps), run(b, ps)
    assert out_a == out_b
    assert a.stats()["prefill_steps"] > b.stats()["prefill_steps"] == 1
    assert_idle_and_free(a)
    assert_idle_and_free(b)


def test_prefix_cache_hits_give_identical_outputs(ouro_tiny, ops):
    shared = prompts(3, [12])[0]
    tails = prompts(4, [3, 5, 1])
    ps = [shared + t for t in tails] + [shared]
    cold = make_engine(ouro_tiny, ops, enable_prefix_caching=False)
    ref = run(cold, ps)
    eng = make_engine(ouro_tiny, ops)
    first = run(eng, ps[:1])
    assert eng.stats()["prefix_hit_tokens"] == 0
    hits_before = eng.stats()["prefix_hit_tokens"]
    outs = eng.generate(ps, SamplingParams(max_tokens=6, ignore_eos=True))
    assert first[0] == ref[0]
    assert [o.token_ids for o in outs] == ref
    # Every prompt reuses the 3 full shared blocks (12 tokens); the bare `shared` prompt can reuse only
    # 2 (its last token must be computed).
    assert [o.prefix_hit_tokens for o in outs] == [12, 12, 12, 8]
    s = eng.stats()
    assert s["prefix_hit_tokens"] - hits_before == 44
    assert s["prefix_hit_requests"] == 4
    assert_idle_and_free(eng)
    eng.reset_prefix_cache()
    outs = eng.generate(ps[:1], SamplingParams(max_tokens=6, ignore_eos=True))
    assert outs[0].prefix_hit_tokens == 0 and outs[0].token_ids == ref[0]
    assert_idle_and_free(eng)


def test_prefix_cache_lru_eviction_under_pressure(ouro_tiny, ops):
    # A pool of 12 blocks (48 tokens): each request needs 5-6 blocks, so cached blocks of earlier
    # requests are evicted to admit later ones; outputs must still equal the cold engine's.
    ps = prompts(5, [13, 17, 13, 9, 17])
    ps[2] = ps[0][:12] + ps[2][12:]  # shares 3 blocks with ps[0]
    ref = run(make_engine(ouro_tiny, ops, enable_prefix_caching=False, num_blocks=12), ps)
    eng = make_engine(ouro_tiny, ops, num_blocks=12)
    got = []
    for p in ps:  # one at a time so reuse/eviction order is forced
        got += run(eng, [p])
    assert got == ref
    assert eng.stats()["prefix_hit_tokens"] == 12
    assert_idle_and_free(eng)


def test_cancellation_mid_stream_returns_blocks(ouro_tiny, ops):
    eng = make_engine(ouro_tiny, ops)
    ps = prompts(6, [9, 6, 11])
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    for i, p in enumerate(ps):
        eng.add_request(f"r{i}", p, params)
    seen: dict[str, list[int]] = {"r0": [], "r1": [], "r2": []}
    for _ in range(4):
        for ev in eng.step():
            seen[ev.request_id] += ev.token_ids
    assert len(seen["r1"]) >= 1  # mid-stream
    assert eng.abort_request("r1") is True
    assert eng.abort_request("r1") is False
    assert eng.abort_request("nope") is False
    while eng.has_unfinished():
        for ev in eng.step():
            assert ev.request_id != "r1"
            seen[ev.request_id] += ev.token_ids
    assert seen["r0"] == ouro_tiny.generate(ps[0], 20, ops=ops)
    assert seen["r2"] == ouro_tiny.generate(ps[2], 20, ops=ops)
    assert_idle_and_free(eng)
    # Abort while still waiting (never admitted).
    eng.add_request("w", ps[0], params)
    assert eng.abort_request("w") and not eng.has_unfinished()
    assert_idle_and_free(eng)


def test_request_id_reuse_and_duplicate_live_id(ouro_tiny, ops):
    eng = make_engine(ouro_tiny, ops)
    p = prompts(7, [5])[0]
    eng.add_request("x", p, SamplingParams(max_tokens=3, ignore_eos=True))
    with pytest.raises(EngineRequestError, match="already live"):
        eng.add_request("x", p, SamplingParams(max_tokens=3, ignore_eos=True))
    first = []
    while eng.has_unfinished():
        first += [t for ev in eng.step() for t in ev.token_ids]
    eng.add_request("x", p, SamplingParams(max_tokens=3, ignore_eos=True))
    second = []
    while eng.has_unfinished():
        second += [t for ev in eng.step() for t in ev.token_ids]
    assert first == second == ouro_tiny.generate(p, 3, ops=ops)
    assert_idle_and_free(eng)


@pytest.mark.parametrize(
    "prompt, params, match",
    [
        ([], SamplingParams(), "empty prompt"),
        ([1] * 300, SamplingParams(), "exceeds the context"),  # > the 256-token pool
        ([1] * 600, SamplingParams(), "exceeds the context"),  # > the model's 512 positions
        ([1, 2], SamplingParams(max_tokens=0), "max_tokens"),
        ([1, 2], SamplingParams(max_tokens=-3), "max_tokens"),
        ([1, 256], SamplingParams(), "outside"),
        ([-1, 2], SamplingParams(), "outside"),
        (["a"], SamplingParams(), "sequence of token ids"),
    ],
)
def test_bad_requests_rejected_while_others_finish(prompt, params, match, ouro_tiny, ops):
    eng = make_engine(ouro_tiny, ops, num_blocks=64)  # 256 tokens; ouro-tiny context is 512
    good = prompts(8, [6])[0]
    eng.add_request("good", good, SamplingParams(max_tokens=4, ignore_eos=True))
    out = [t for ev in eng.step() for t in ev.token_ids]
    with pytest.raises(EngineRequestError, match=match) as ei:
        eng.add_request("bad", prompt, params)
    assert isinstance(ei.value, ValueError)
    while eng.has_unfinished():
        out += [t for ev in eng.step() for t in ev.token_ids]
    assert out == ouro_tiny.generate(good, 4, ops=ops)
    assert_idle_and_free(eng)


def test_stop_token_ids_and_eos(ouro_tiny, ops):
    p = prompts(9, [7])[0]
    ref = ouro_tiny.generate(p, 8, ops=ops)
    stop = ref[2]
    k = ref.index(stop)
    eng = make_engine(ouro_tiny, ops)
    out = eng.generate([p], SamplingParams(max_tokens=8, ignore_eos=True, stop_token_ids=(stop,)))[0]
    assert out.token_ids == ref[: k + 1] and out.finish_reason == "stop"
    # The model's EOS stops a request unless ignore_eos.
    eos = set(ouro_tiny.config.eos_token_ids)
    out = eng.generate([p], SamplingParams(max_tokens=8))[0]
    cut = next((i for i, t in enumerate(ref) if t in eos), None)
    assert out.token_ids == (ref if cut is None else ref[: cut + 1])
    out = eng.generate([p], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert out.token_ids == ref and out.finish_reason == "length"
    assert_idle_and_free(eng)


def _trace(model, ops, ps, **kw):
    eng = make_engine(model, ops, **kw)
    for i, p in enumerate(ps):
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=4 + i % 3, ignore_eos=True))
    steps = []
    last = 0.0
    while eng.has_unfinished():
        evs = eng.step()
        for ev in evs:
            assert ev.time >= last
            last = ev.time
        steps.append([(ev.request_id, tuple(ev.token_ids), ev.finished) for ev in evs])
    assert_idle_and_free(eng)
    return steps, eng.stats()


def test_deterministic_batches_and_limits(ouro_tiny, ops):
    ps = prompts(10, [9, 3, 14, 6, 11, 2, 7])
    kw = dict(max_num_seqs=3, max_num_batched_tokens=8, num_blocks=14)
    t1, s1 = _trace(ouro_tiny, ops, ps, **kw)
    t2, s2 = _trace(ouro_tiny, ops, ps, **kw)
    assert t1 == t2
    assert s1["batch_size_hist"] == s2["batch_size_hist"]
    assert max(s1["batch_size_hist"]) <= 3
    # FCFS: first tokens appear in submission order.
    firsts = []
    for step in t1:
        for rid, _, _ in step:
            if rid not in firsts:
                firsts.append(rid)
    assert firsts == [f"r{i}" for i in range(len(ps))]
    # Token identity with plain generate despite block pressure and the seq limit.
    toks: dict[str, list[int]] = {}
    for step in t1:
        for rid, tk, _ in step:
            toks.setdefault(rid, []).extend(tk)
    for i, p in enumerate(ps):
        assert toks[f"r{i}"] == ouro_tiny.generate(p, 4 + i % 3, ops=ops)


def test_arms_switch_resets_pool_and_cache(ouro_tiny):
    eng = Engine(ouro_tiny, {"a": torch_ops(), "b": torch_ops()}, EngineConfig(block_size=4, num_blocks=64))
    ps = prompts(11, [9, 5])
    out_a = run(eng, ps)
    assert eng.stats()["cached_blocks"] > 0
    eng.add_request("busy", ps[0], SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="idle"):
        eng.set_arm("b")
    eng.abort_request("busy")
    eng.set_arm("b")
    assert eng.arm == "b" and eng.stats()["cached_blocks"] == 0
    assert run(eng, ps) == out_a
    assert eng.stats()["prefix_hit_tokens"] == 0
    with pytest.raises(UsageError):
        eng.set_arm("c")
    assert_idle_and_free(eng)


def test_huginn_prefix_cache_refused_unless_safe(huginn_tiny, ops, monkeypatch):
    assert huginn_tiny.prefix_cache_safe
    Engine(huginn_tiny, {"t": ops}, EngineConfig(num_blocks=8))
    monkeypatch.setattr(type(huginn_tiny), "prefix_cache_safe", property(lambda self: False))
    with pytest.raises(UsageError, match="prefix caching"):
        Engine(huginn_tiny, {"t": ops}, EngineConfig(num_blocks=8))
    Engine(huginn_tiny, {"t": ops}, EngineConfig(num_blocks=8, enable_prefix_caching=False))


def test_max_model_len_caps_output(ouro_tiny, ops):
    eng = make_engine(ouro_tiny, ops, max_model_len=12)
    p = prompts(12, [10])[0]
    out = eng.generate([p], SamplingParams(max_tokens=50, ignore_eos=True))[0]
    assert len(out.token_ids) == 3 and out.finish_reason == "length"  # KV of positions 0..11 at most
    assert out.token_ids == ouro_tiny.generate(p, 3, ops=ops)
    assert_idle_and_free(eng)


def test_decode_benchmark_cpu_and_release(ouro_tiny, ops):
    eng = make_engine(ouro_tiny, ops)
    with DecodeBenchmark(eng, batch_size=3, context_len=10) as bench:
        assert bench.graph is None  # CPU: eager replay
        assert eng.blocks.num_free_blocks == 96 - 3 * 3
        with pytest.raises(RuntimeError):
            eng.step()
        r = bench.time_ms(iters=3, warmup=1)
        assert set(r) >= {"median", "p10", "p90", "n"} and r["n"] == 3 and r["p10"] <= r["median"] <= r["p90"]
        assert bench.output is not None and bench.output.shape == (3,)
    assert_idle_and_free(eng)
    with pytest.raises(UsageError):
        DecodeBenchmark(eng, batch_size=100, context_len=200)
    # The engine serves normally afterwards.
    p = prompts(13, [5])[0]
    assert run(eng, [p], 3)[0] == ouro_tiny.generate(p, 3, ops=ops)


def test_decode_step_table_cpu(ouro_tiny):
    from rltbench.bench.decode import decode_step_table

    ops = {"a": torch_ops(), "b": torch_ops(), "a#2": torch_ops()}
    eng = Engine(ouro_tiny, ops, EngineConfig(block_size=4, num_blocks=64))
    res = decode_step_table(eng, batch_sizes=(1, 2), context_len=8, iters=2, warmup=0, reps=2, host_tokens=4)
    assert res["order"] == ["a", "b", "a#2", "a#2", "b", "a"]  # ABBA with the A/A arm
    assert (res["ref"], res["aa"]) == ("a", "a#2")
    assert [(r["arm"], r["batch"]) for r in res["rows"]] == [
        ("a", 1), ("b", 1), ("a#2", 1), ("a", 2), ("b", 2), ("a#2", 2)]
    assert all(r["n"] == 4 and len(r["rep_median_ms"]) == 2 for r in res["rows"])
    assert all(r["len_class"] == 12 and r["bucket"] == r["batch"] for r in res["rows"])  # CPU: eager
    # every timed cell is warm (CPU: no compile observable in the interpreter, no pool to grow)
    assert len(res["warm"]) == 12
    assert all(w["cold_work"]["graph_captures"] == 0 and w["warm"] for w in res["warm"])
    labels = {(s["batch"], s["arm"]): s["label"] for s in res["speedups"]}
    assert labels[(1, "a#2")] == "A/A" and set(labels) == {(b, a) for b in (1, 2) for a in ("b", "a#2")}
    assert all(s["speedup"]["n"] == 2 for s in res["speedups"])
    assert [h["arm"] for h in res["host_overhead"]] == ["a", "b", "a#2"]
    assert all(h["n_tokens"] == 4 and h["ratio"] > 0 for h in res["host_overhead"])
    assert_idle_and_free(eng)


def test_engine_with_tensor_prompt_and_bf16_pool_dtype(ouro_tiny, ops):
    eng = make_engine(ouro_tiny, ops)
    assert eng.kv.dtype == torch.float32 and eng.kv.shape[0] == ouro_tiny.config.num_kv_planes
    p = torch.tensor(prompts(14, [6])[0])
    eng.add_request("t", p, SamplingParams(max_tokens=2, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    assert_idle_and_free(eng)


def test_arm_names_from_kernels_registry(ouro_tiny):
    eng = Engine(ouro_tiny, ["torch", "exact"], EngineConfig(block_size=4, num_blocks=32))
    assert eng.arm_names == ["torch", "exact"]
    p = prompts(15, [6])[0]
    a = run(eng, [p], 3)
    eng.set_arm("exact")
    assert run(eng, [p], 3) == a  # on CPU scope "graph" keeps torch's reference in eager steps
    import json

    json.dumps(eng.stats())  # plain data, ops stats included
    with pytest.raises(UsageError, match="unknown arm"):
        Engine(ouro_tiny, ["nope"], EngineConfig(num_blocks=8))


def test_kv_pool_too_small_names_the_block_size_and_budget(ouro_tiny, ops):
    with pytest.raises(UsageError, match=r"one block of 4 tokens needs [\d,]+ bytes .*--kv-cache-gib 1e-07"):
        make_engine(ouro_tiny, ops, num_blocks=None, kv_cache_gib=1e-7)


def test_gsm8k_engine_kv_pool_is_sized_to_its_workload() -> None:
    """The gsm8k engine holds batch_size + 1 sequences of max_context tokens, not all free memory
    (sized from free memory it took 129 GiB of an H200 for a 4 x 2k-token run)."""
    from rltbench.commands.gsm8k.cli import make_engine as gsm8k_engine
    from tests.engine.engine_testutil import tiny_model as _tiny

    eng = gsm8k_engine(_tiny("ouro-tiny"), ["torch"], batch_size=3, max_context=200)
    per_seq = -(-200 // eng.blocks.block_size)
    assert eng.num_blocks == 4 * per_seq
    assert eng.max_model_len == 200


def test_cuda_free_bytes_honours_the_process_memory_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a per-process cap (pytest-xdist GPU workers) the free-memory KV sizing stays inside it."""
    from rltbench.engine import kv_capacity

    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (100 * gib, 140 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 5 * gib)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda d: 0.25, raising=False)
    assert kv_capacity.cuda_free_bytes(torch.device("cuda", 0)) == 35 * gib - 5 * gib
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda d: 1.0, raising=False)
    assert kv_capacity.cuda_free_bytes(torch.device("cuda", 0)) == 100 * gib
