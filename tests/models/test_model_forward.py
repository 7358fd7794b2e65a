"""Forward semantics on tiny models: prefill+decode == one full forward, batching == alone, KV paths agree.

Tolerances, not bitwise: a decode step and a prefill use different GEMM shapes, which may round
differently (batch invariance is not a goal); bitwise identity is only required between arms
(test_model_exact_arm.py).
"""

from __future__ import annotations

import pytest
import torch
from models_testutil import random_prompt, run_prefill

from rltbench.errors import UsageError
from rltbench.models import build_model

FAMILIES = ["ouro-tiny", "huginn-tiny"]
TOL = {torch.float32: dict(atol=2e-4, rtol=2e-4), torch.bfloat16: dict(atol=1e-2, rtol=1e-2)}


def _full_logits(model, prompt, ops):
    hidden, _ = run_prefill(model, [prompt], ops)
    return model.compute_logits(hidden)


def _decode_logits(model, prompt, ops, n_prefill):
    """Prefill the first n_prefill tokens, then feed the rest one token per forward."""
    cache = model.new_kv_cache(max_seqs=1, max_len=64)
    cache.begin([0] * n_prefill, list(range(n_prefill)))
    outs = [model.forward(torch.tensor(prompt[:n_prefill]), torch.arange(n_prefill), cache, ops)]
    for p in range(n_prefill, len(prompt)):
        cache.begin([0], [p])
        outs.append(model.forward(torch.tensor([prompt[p]]), torch.tensor([p]), cache, ops))
    return model.compute_logits(torch.cat(outs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", FAMILIES)
def test_prefill_then_decode_matches_full_forward(name, dtype, ref_ops):
    model = build_model(name, dtype=dtype, seed=1)
    prompt = random_prompt(12, seed=2)
    full = _full_logits(model, prompt, ref_ops)
    inc = _decode_logits(model, prompt, ref_ops, n_prefill=5)
    assert full.dtype == torch.float32 and full.shape == (12, 256)
    torch.testing.assert_close(inc, full, **TOL[dtype])
    if dtype == torch.float32:
        assert torch.equal(inc.argmax(-1), full.argmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", FAMILIES)
def test_batch_of_requests_matches_each_alone(name, dtype, ref_ops):
    model = build_model(name, dtype=dtype, seed=3)
    prompts = [random_prompt(n, seed=10 + n) for n in (3, 9, 6)]
    hidden, cache = run_prefill(model, prompts, ref_ops)
    # then one batched decode step: a new token for every sequence, eager and capturable paths
    new = [7, 8, 9]
    pos = [len(p) for p in prompts]
    cache.begin([0, 1, 2], pos)
    dec = model.forward(torch.tensor(new), torch.tensor(pos), cache, ref_ops)
    start = 0
    for i, p in enumerate(prompts):
        alone, _ = run_prefill(model, [p + [new[i]]], ref_ops)
        torch.testing.assert_close(hidden[start:start + len(p)], alone[:-1], **TOL[dtype])
        torch.testing.assert_close(dec[i], alone[-1], **TOL[dtype])
        start += len(p)


@pytest.mark.parametrize("name", FAMILIES)
def test_static_path_matches_eager_path(name, ref_ops):
    """begin_static (the capturable masked-full-length path) == begin (host segments), both layouts."""
    model = build_model(name, seed=4)
    prompts = [random_prompt(n, seed=20 + n) for n in (4, 7)]
    outs = []
    for static in (False, True):
        _, cache = run_prefill(model, prompts, ref_ops)
        ids, pos = torch.tensor([5, 6]), torch.tensor([4, 7])
        if static:
            cache.begin_static(torch.tensor([0, 1]), pos, rows_are_seqs=True)
        else:
            cache.begin([0, 1], [4, 7])
        outs.append(model.forward(ids, pos, cache, ref_ops))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    # a gathered (rows_are_seqs=False) static prefill chunk of sequence 1 equals the eager one
    _, cache = run_prefill(model, prompts, ref_ops)
    cache.begin_static(torch.tensor([1, 1]), torch.tensor([7, 8]))
    a = model.forward(torch.tensor([5, 9]), torch.tensor([7, 8]), cache, ref_ops)
    _, cache = run_prefill(model, prompts, ref_ops)
    cache.begin([1, 1], [7, 8])
    b = model.forward(torch.tensor([5, 9]), torch.tensor([7, 8]), cache, ref_ops)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_sdpa_and_fp32_attention_agree(name, ref_ops):
    model = build_model(name, seed=5)
    prompt = random_prompt(10, seed=5)
    a, _ = run_prefill(model, [prompt], ref_ops, impl="sdpa")
    b, _ = run_prefill(model, [prompt], ref_ops, impl="fp32")
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_kv_planes_all_used_and_attention_uses_the_past(name, ref_ops):
    model = build_model(name, seed=6)
    prompt = random_prompt(6, seed=6)
    hidden, cache = run_prefill(model, [prompt], ref_ops)
    assert cache.k.shape[0] == model.config.num_kv_planes
    written = cache.k[:, 0, :, :6].abs().amax(dim=(1, 2, 3))
    assert bool((written > 0).all()), "every KV plane must be written"
    assert not bool(cache.k[:, 0, :, 6:].any())
    # the last token's output depends on the earlier tokens (attention reads the cache)
    other, _ = run_prefill(model, [[prompt[0] + 1] + prompt[1:]], ref_ops)
    assert not torch.allclose(hidden[-1], other[-1])


def test_generate_is_greedy_over_full_forward(ref_ops):
    model = build_model("ouro-tiny", seed=7)
    prompt = random_prompt(5, seed=7)
    out = model.generate(prompt, 6, ops=ref_ops)
    assert len(out) == 6
    seq = list(prompt)
    for tok in out:  # each generated token is the argmax of a full forward over the sequence so far
        logits = _full_logits(model, seq, ref_ops)
        assert int(logits[-1].argmax()) == tok
        seq.append(tok)
    stop = model.generate(prompt, 6, ops=ref_ops, stop_token_ids=[out[2]])
    assert stop == out[: out.index(out[2]) + 1]


def test_generate_errors():
    model = build_model("huginn-tiny", seed=0)
    with pytest.raises(UsageError, match="exceeds"):
        model.generate([1, 2], 600)
    with pytest.raises(UsageError, match="empty"):
        model.generate([], 3)
    with pytest.raises(UsageError, match="token ids"):
        model.generate([1, 999], 3)


def test_bench_helpers_on_cpu():
    from rltbench.bench.model_step import decode_step_ms, fill_random_kv

    model = build_model("ouro-tiny", seed=0)
    cache = model.new_kv_cache(max_seqs=2, max_len=8)
    fill_random_kv(cache, 5, seed=1)
    assert bool(cache.k[:, :, :, :5].ne(0).all()) and not bool(cache.v[:, :, :, 5:].any())
    with pytest.raises(RuntimeError, match="CUDA"):
        decode_step_ms(model, None)
