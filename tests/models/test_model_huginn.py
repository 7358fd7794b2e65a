"""Huginn specifics: the initial-state modes, the position-keyed noise, and the two KV layouts."""

from __future__ import annotations

import math

import torch
from models_testutil import random_prompt, run_prefill

from rltbench.models import build_model
from rltbench.models.huginn import hash_u32, position_noise


def test_hash_matches_python_reference():
    def ref(x):
        m = 0xFFFFFFFF
        x &= m
        x ^= x >> 16
        x = (x * 0x7FEB352D) & m
        x ^= x >> 15
        x = (x * 0x846CA68B) & m
        return x ^ (x >> 16)

    xs = [0, 1, 2, 12345, 0xFFFFFFFF, 0xDEADBEEF, 4095]
    assert hash_u32(torch.tensor(xs)).tolist() == [ref(x) for x in xs]


def test_position_noise_keyed_by_seed_and_position():
    model = build_model("huginn-tiny", seed=0)
    fh = model.feature_hash
    std = model.config.init_std
    a = position_noise(0, torch.tensor([0, 1, 2, 3]), fh, std)
    b = position_noise(0, torch.tensor([3, 1]), fh, std)  # other batch, other order
    assert torch.equal(a[3], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(a, position_noise(1, torch.tensor([0, 1, 2, 3]), fh, std))
    big = position_noise(7, torch.arange(2000), torch.arange(64) * 7919, 1.0)
    assert float(big.abs().max()) <= 3.0
    # truncated N(0,1) at +-3 has std 0.9866
    assert abs(float(big.mean())) < 0.01 and abs(float(big.std()) - 0.9866) < 0.01


def test_state_modes():
    model = build_model("huginn-tiny", seed=0)
    e = torch.zeros(3, model.config.hidden_size)
    pos = torch.tensor([0, 1, 2])
    assert model.prefix_cache_safe
    s = model.initial_state(pos, e)
    expect = position_noise(0, pos, model.feature_hash, model.config.init_std) * math.sqrt(48)
    torch.testing.assert_close(s, expect)
    model.config.state_noise = "zero"
    assert model.prefix_cache_safe and not model.initial_state(pos, e).any()
    model.config.state_noise = "random"
    assert not model.prefix_cache_safe
    r1, r2 = model.initial_state(pos, e), model.initial_state(pos, e)
    assert not torch.equal(r1, r2)
    bound = 3 * model.config.init_std * model.config.embed_scale
    assert float(r1.abs().max()) <= bound * (1 + 1e-6)


def test_state_noise_changes_the_output(ref_ops):
    prompt = random_prompt(5, seed=1)
    outs = {}
    for mode in ("position", "zero"):
        model = build_model("huginn-tiny", seed=2, state_noise=mode)
        outs[mode] = run_prefill(model, [prompt], ref_ops)[0]
    assert not torch.allclose(outs["position"], outs["zero"])
    seeded = build_model("huginn-tiny", seed=2, state_seed=5)
    assert not torch.allclose(run_prefill(seeded, [prompt], ref_ops)[0], outs["position"])


def test_plane_maps():
    full = build_model("huginn-tiny", seed=0)  # r = 3
    assert full.config.num_kv_planes == 2 + 4 * 3 + 2
    assert [full.core_plane(i, j) for i in range(3) for j in range(4)] == list(range(2, 14))
    assert [full.coda_plane(j) for j in range(2)] == [14, 15]
    comp = build_model("huginn-tiny", seed=0, kv_layout="compress")
    assert comp.config.num_kv_planes == 8
    assert {comp.core_plane(i, j) for i in range(3) for j in range(4)} == {2, 3, 4, 5}
    assert [comp.coda_plane(j) for j in range(2)] == [6, 7]


def test_compress_layout_semantics(ref_ops):
    """Prefill: identical (each iteration rewrites all positions before attending). Decode: the past
    tokens' K/V come from their last iteration, so the output differs from the full layout."""
    prompt = random_prompt(6, seed=3)
    outs = {}
    for layout in ("full", "compress"):
        model = build_model("huginn-tiny", seed=4, kv_layout=layout)
        hidden, cache = run_prefill(model, [prompt], ref_ops)
        cache.begin([0], [6])
        dec = model.forward(torch.tensor([9]), torch.tensor([6]), cache, ref_ops)
        outs[layout] = (hidden, dec, cache)
    torch.testing.assert_close(outs["full"][0], outs["compress"][0], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(outs["full"][1], outs["compress"][1], atol=1e-4)
    full_k, comp_k = outs["full"][2].k, outs["compress"][2].k
    # after the prefill, compress core plane j holds the full layout's LAST-iteration plane of layer j
    for j in range(4):
        torch.testing.assert_close(comp_k[2 + j, :, :, :6], full_k[2 + 4 * 2 + j, :, :, :6])
    torch.testing.assert_close(comp_k[6:8, :, :, :6], full_k[14:16, :, :, :6])


def test_recurrence_one_layouts_agree(ref_ops):
    prompt = random_prompt(4, seed=5)
    outs = []
    for layout in ("full", "compress"):
        model = build_model("huginn-tiny", seed=6, kv_layout=layout, mean_recurrence=1)
        assert model.config.num_kv_planes == 8
        hidden, cache = run_prefill(model, [prompt], ref_ops)
        cache.begin([0], [4])
        outs.append(model.forward(torch.tensor([3]), torch.tensor([4]), cache, ref_ops))
    assert torch.equal(outs[0], outs[1])
