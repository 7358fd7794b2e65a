"""The kernel arms' RoPE with the KV write fused in (`Ops.rope_neox_store`, switched by the tuned
RopeKvConfig): q and the paged KV cache hold exactly the bits of the arm's own `rope_neox`
followed by `write_kv` (CPU, Triton interpreter; the exact arm's are torch's), the engine gives the
same tokens and KV pool with the flag on and off, and with the flag off nothing takes the fused
path. One GPU test per arm: the same inside a CUDA graph at Ouro-1.4B shapes."""

from __future__ import annotations

import pytest
import torch

from rltbench import tuned
from rltbench.arms import ArmSpec
from rltbench.engine import Engine, EngineConfig, SamplingParams
from rltbench.engine import attention as attn
from rltbench.engine.paged_context import PagedAttentionContext
from rltbench.kernels import make_ops, rope
from rltbench.kernels import ops as ops_module
from rltbench.kernels import reference as ref
from rltbench.models import build_model
from tests.engine.engine_testutil import prompts
from tests.kernels._util import randn, with_specials

_INT = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
ROPE_ONLY = ArmSpec(norm="off", rope="exact", act="off", scope="all")  # only rope runs kernels


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Identical bits, NaN payloads included (fused and unfused must store the very same bits)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.view(_INT[a.dtype]), b.view(_INT[b.dtype]))


def set_fuse(monkeypatch, on: bool) -> None:
    """The tuned rope_kv switch as Ops reads it (rltbench/kernels/rope/config.py)."""
    monkeypatch.setattr(ops_module, "fuse_kv_write_enabled", lambda: on)


@pytest.fixture
def fuse_on(monkeypatch):
    set_fuse(monkeypatch, True)


@pytest.fixture
def fuse_off(monkeypatch):
    set_fuse(monkeypatch, False)


def split_qkv(qkv: torch.Tensor, hq: int, hkv: int, d: int) -> tuple[torch.Tensor, ...]:
    """Strided q/k/v views of one merged qkv GEMM output, as the Ouro model makes them."""
    t = qkv.shape[0]
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return q.view(t, hq, d), k.view(t, hkv, d), v.view(t, hkv, d)


def cos_sin(positions: torch.Tensor, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The Ouro tables (theta 1e6, cat(freqs, freqs) in fp32, cast)."""
    inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)).to(positions.device)
    f = positions.to(torch.float32)[:, None] * inv[None, :]
    emb = torch.cat((f, f), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def slots_with_padding(t: int, num_slots: int, gen: torch.Generator, dtype=torch.int64) -> torch.Tensor:
    """Distinct random slots; every third row and the last row (when t > 1) are padding (-1)."""
    s = torch.randperm(num_slots, generator=gen)[:t]
    if t > 1:
        s[::3] = -1
        s[-1] = -1
    return s.to(dtype)


# (tokens, Hq, Hkv, head dim, block size, specials, slot dtype)
CASES = [
    (1, 4, 2, 32, 4, False, torch.int64),
    (6, 4, 1, 64, 16, True, torch.int64),
    (19, 2, 2, 128, 8, False, torch.int32),
]


@pytest.mark.parametrize("arm", ["exact", "approx"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_store_bitwise_equals_rope_then_write_kv(fuse_on, dtype: torch.dtype, arm: str) -> None:
    """Each kernel arm's fused launch stores the bits of its own rope followed by write_kv (the
    approx arm's cache holds rope_approx's bits, so a fused and an unfused approx run agree)."""
    ops = make_ops(ArmSpec.exact(scope="all") if arm == "exact" else ArmSpec.approx(scope="all"))
    gen = torch.Generator().manual_seed(5)
    for t, hq, hkv, d, bs, specials, sdt in CASES:
        qkv = randn((t, (hq + 2 * hkv) * d), dtype, gen, 3.0)
        if specials:
            qkv = with_specials(qkv, gen)
        q, k, v = split_qkv(qkv, hq, hkv, d)
        cos, sin = cos_sin(torch.randint(0, 4096, (t,), generator=gen), d, dtype)
        nb = 6
        pool = randn((2, 2, nb, bs, hkv, d), dtype, gen)  # rows never written must keep these bits
        slots = slots_with_padding(t, nb * bs, gen, sdt)
        expect = pool.clone()
        q_ref, k_ref = ops.rope_neox(q, k, cos, sin)
        attn.write_kv(expect[1, 0], expect[1, 1], k_ref, v, slots)
        q_rot = ops.rope_neox_store(q, k, v, cos, sin, pool[1, 0], pool[1, 1], slots)
        what = f"{dtype} T={t} Hq={hq} Hkv={hkv} D={d}"
        assert q_rot is not None, (what, ops.stats.to_dict())
        assert same_bits(q_rot, q_ref), what
        assert same_bits(pool, expect), what
        if not specials and arm == "exact":  # and both equal torch's expression (exact arm)
            assert torch.equal(q_rot, ref.rope_neox(q, k, cos, sin)[0]), what
    assert ops.stats.fused["rope_neox_store"] == len(CASES) and ops.stats.fallback_count() == 0


def _small_inputs(dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(9)
    q, k, v = split_qkv(randn((3, 4 * 16), dtype, gen), 2, 1, 16)
    cos, sin = cos_sin(torch.arange(3), 16, dtype)
    pool = torch.zeros(1, 2, 2, 4, 1, 16, dtype=dtype)
    return q, k, v, cos, sin, pool, torch.tensor([0, 5, -1])


def test_flag_off_torch_arm_and_eager_graph_scope_do_not_fuse(monkeypatch) -> None:
    q, k, v, cos, sin, pool, slots = _small_inputs()
    args = (q, k, v, cos, sin, pool[0, 0], pool[0, 1], slots)
    kernel_arms = [make_ops(ArmSpec.exact(scope="all")), make_ops(ArmSpec.approx(scope="all"))]
    with tuned.use(None):   # no tuned file: off by default
        for ops in kernel_arms:
            assert ops.rope_neox_store(*args) is None
    set_fuse(monkeypatch, False)
    for ops in kernel_arms:
        assert ops.rope_neox_store(*args) is None
    set_fuse(monkeypatch, True)
    for sel in (ArmSpec.torch(scope="all"), ArmSpec.exact(), ArmSpec.approx(),
                ArmSpec(norm="approx", rope="off", act="approx", scope="all")):
        ops = make_ops(sel)  # torch arm or rope off: never; scope "graph" outside a capture: neither
        assert ops.rope_neox_store(*args) is None
        assert not ops.stats.fused and not ops.stats.fallbacks
    for ops in kernel_arms:
        assert not ops.stats.fused and not ops.stats.fallbacks
    assert not pool.any()  # nothing written


def test_tuned_file_switches_the_fusion() -> None:
    with tuned.use({"rope_kv": {"enabled": True}}):
        assert ops_module.fuse_kv_write_enabled()
    with tuned.use({"rope_kv": {"enabled": False}}):
        assert not ops_module.fuse_kv_write_enabled()


def test_unsupported_inputs_are_counted_fallbacks(fuse_on) -> None:
    q, k, v, cos, sin, pool, slots = _small_inputs()
    ops = make_ops(ArmSpec.exact(scope="all"))
    kc, vc = pool[0, 0], pool[0, 1]
    v_gappy = torch.empty(*v.shape[:-1], 2 * v.shape[-1], dtype=v.dtype)[..., ::2]  # last-dim stride 2
    v_gappy.copy_(v)
    cases = {
        "mixed_dtype": (q, k, v, cos, sin, kc.float(), vc.float(), slots),
        "shape": (q, k, v, cos, sin, kc, vc, slots[:2]),
        "slot_dtype": (q, k, v, cos, sin, kc, vc, slots.float()),
        "layout": (q, k, v_gappy, cos, sin, kc, vc, slots),
    }
    for reason, args in cases.items():
        assert ops.rope_neox_store(*args) is None, reason
        assert ops.stats.fallback_count("rope_neox_store", reason) == 1, ops.stats.to_dict()
    assert not ops.stats.fused and not pool.any()


def _decode_ctx(pool: torch.Tensor) -> PagedAttentionContext:
    """Two live rows (seq_lens 5 and 2) and one padding row (seq_len 0, slot -1), block size 4."""
    bt = torch.tensor([[1, 3], [2, 0], [0, 0]], dtype=torch.int32)
    seq_lens = torch.tensor([5, 2, 0], dtype=torch.int32)
    return PagedAttentionContext(pool, torch.tensor([12, 9, -1]), bt, seq_lens)


def _prefill_ctx(pool: torch.Tensor) -> PagedAttentionContext:
    """Row 0: 2 cached + 3 new tokens; row 1: 2 new tokens."""
    bt = torch.tensor([[1, 3], [2, 0]], dtype=torch.int32)
    return PagedAttentionContext(
        pool,
        torch.tensor([6, 7, 12, 8, 9]),
        bt,
        torch.tensor([5, 2], dtype=torch.int32),
        torch.tensor([0, 3, 5], dtype=torch.int32),
        torch.tensor([2, 0], dtype=torch.int32),
    )


@pytest.mark.parametrize("make_ctx", [_decode_ctx, _prefill_ctx], ids=["decode", "prefill"])
def test_context_attend_rope_fused_equals_unfused(fuse_on, make_ctx) -> None:
    gen = torch.Generator().manual_seed(3)
    hq, hkv, d, dtype = 4, 2, 16, torch.bfloat16
    pool = randn((2, 2, 5, 4, hkv, d), dtype, gen)
    ctx_probe = make_ctx(pool)
    n = ctx_probe.slot_mapping.shape[0]
    q, k, v = split_qkv(randn((n, (hq + 2 * hkv) * d), dtype, gen), hq, hkv, d)
    cos, sin = cos_sin(torch.arange(n) + 2, d, dtype)
    unfused_pool = pool.clone()
    ops = make_ops(ROPE_ONLY)
    out = make_ctx(pool).attend_rope_neox(1, q, k, v, cos, sin, ops, d**-0.5)
    assert ops.stats.fused["rope_neox_store"] == 1 and "rope_neox" not in ops.stats.fused
    q_rot, k_rot = ref.rope_neox(q, k, cos, sin)
    expect = make_ctx(unfused_pool).attend(1, q_rot, k_rot, v, d**-0.5)
    assert same_bits(pool, unfused_pool)
    assert same_bits(out, expect)


def _counting(monkeypatch, module, name: str) -> list[int]:
    """Count the calls of `module.name` (still calling it)."""
    calls: list[int] = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


def _engine_run(model, sel: ArmSpec, monkeypatch) -> tuple[list[list[int]], Engine, int, int]:
    """Tokens, the engine, write_kv calls and fused rope+store launches of one generate()."""
    with monkeypatch.context() as m:
        writes = _counting(m, attn, "write_kv")
        fused: list[int] = []
        if sel.rope in rope.STORE:
            real = rope.STORE[sel.rope]
            m.setitem(rope.STORE, sel.rope, lambda *a, **kw: fused.append(1) or real(*a, **kw))
        cfg = EngineConfig(block_size=4, max_num_batched_tokens=16, max_num_seqs=8, num_blocks=48)
        eng = Engine(model, {"arm": sel}, cfg)
        outs = eng.generate(prompts(21, [7, 12, 2]), SamplingParams(max_tokens=4, ignore_eos=True))
    return [o.token_ids for o in outs], eng, len(writes), len(fused)


@pytest.fixture(scope="module")
def ouro_gqa_bf16() -> torch.nn.Module:
    return build_model("ouro-tiny", device="cpu", dtype=torch.bfloat16, seed=4, num_kv_heads=2).eval()


@pytest.mark.slow  # about 15 s over its arms
@pytest.mark.parametrize("arm", ["exact", "approx"])
def test_engine_flag_on_equals_off_and_takes_fused_path(ouro_gqa_bf16, monkeypatch, arm: str) -> None:
    """Prefill (chunked) and decode steps both fuse: no write_kv call at all with the flag on; with the
    flag off the fused kernel never launches. Same tokens and KV pool bits either way (the exact
    arm's also as torch's)."""
    model = ouro_gqa_bf16
    planes = model.config.num_kv_planes
    sel = ROPE_ONLY if arm == "exact" else ArmSpec(norm="off", rope="approx", act="off", scope="all")
    set_fuse(monkeypatch, True)
    tok_on, eng_on, writes_on, fused_on = _engine_run(model, sel, monkeypatch)
    set_fuse(monkeypatch, False)
    tok_off, eng_off, writes_off, fused_off = _engine_run(model, sel, monkeypatch)
    tok_ref, eng_ref, _, _ = _engine_run(model, ArmSpec.torch(), monkeypatch)
    s_on, s_off = eng_on.stats(), eng_off.stats()
    steps = s_on["prefill_steps"] + s_on["decode_steps"]
    assert s_on["prefill_steps"] >= 2 and s_on["decode_steps"] >= 3
    assert s_on["ops"]["fused"] == {"rope_neox_store": planes * steps} == {"rope_neox_store": fused_on}
    assert writes_on == 0
    assert s_off["ops"]["fused"] == {"rope_neox": planes * steps} and writes_off == planes * steps
    assert fused_off == 0
    assert tok_on == tok_off
    assert same_bits(eng_on.kv, eng_off.kv)
    if arm == "exact":
        assert tok_on == tok_ref and same_bits(eng_on.kv, eng_ref.kv)


def test_dense_kv_context_keeps_unfused_path(ouro_gqa_bf16, fuse_on) -> None:
    """model.generate's DenseKVCache has no attend_rope_neox: the plain rope + attend path runs."""
    ops = make_ops(ROPE_ONLY)
    with torch.no_grad():
        out = ouro_gqa_bf16.generate(prompts(22, [5])[0], 2, ops=ops)
    assert len(out) == 2 and ops.stats.fused["rope_neox"] > 0 and "rope_neox_store" not in ops.stats.fused


@pytest.mark.gpu
@pytest.mark.parametrize("arm", ["exact", "approx"])
@pytest.mark.parametrize("tokens", [1, 8, 300])
def test_gpu_fused_store_in_cuda_graph_ouro_1p4b(tokens: int, arm: str, monkeypatch) -> None:
    """Ouro-1.4B shapes (16 q/kv heads, head dim 128, bf16, block size 16): the fused launch and
    rope + write_kv, each captured in a CUDA graph (scope graph), replayed with new q/k/v, positions
    and slots (padding included): same rotated q and the same KV pool bits; q equals torch's rope."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from rltbench.models import get_config

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    set_fuse(monkeypatch, True)
    cfg = get_config("ouro-1.4b")
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    bs, nb, dtype, dev = 16, 64, torch.bfloat16, "cuda"
    qkv = torch.zeros(tokens, (hq + 2 * hkv) * d, dtype=dtype, device=dev)  # static inputs
    cos, sin = (torch.zeros(tokens, d, dtype=dtype, device=dev) for _ in range(2))
    slots = torch.full((tokens,), -1, dtype=torch.int64, device=dev)
    pools = {name: torch.zeros(2, 2, nb, bs, hkv, d, dtype=dtype, device=dev) for name in ("fused", "plain")}

    def step(ops, fused: bool) -> torch.Tensor:
        q, k, v = split_qkv(qkv, hq, hkv, d)
        kv = pools["fused" if fused else "plain"]
        if fused:
            q_rot = ops.rope_neox_store(q, k, v, cos, sin, kv[1, 0], kv[1, 1], slots)
            assert q_rot is not None
            return q_rot
        q_rot, k_rot = ops.rope_neox(q, k, cos, sin)
        attn.write_kv(kv[1, 0], kv[1, 1], k_rot, v, slots)
        return q_rot

    make_sel = ArmSpec.exact if arm == "exact" else ArmSpec.approx
    graph_ops = make_ops(make_sel())  # scope graph: the kernels run only while capturing
    warm = make_ops(make_sel(scope="all"))
    graphs, outs = {}, {}
    with torch.no_grad():
        for fused in (True, False):
            step(warm, fused)  # compile outside the capture
            torch.cuda.synchronize()
            graphs[fused] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[fused]):
                outs[fused] = step(graph_ops, fused)
    assert graph_ops.stats.fused["rope_neox_store"] == 1 and graph_ops.stats.fused["rope_neox"] == 1
    gen = torch.Generator().manual_seed(tokens)
    for trial in range(3):
        x = randn(qkv.shape, dtype, gen, 3.0)
        qkv.copy_(with_specials(x, gen) if trial == 2 else x)
        new_cos, new_sin = cos_sin(torch.randint(0, 32768, (tokens,), generator=gen), d, dtype)
        cos.copy_(new_cos)
        sin.copy_(new_sin)
        slots.copy_(slots_with_padding(tokens, nb * bs, gen))
        graphs[True].replay()
        graphs[False].replay()
        torch.cuda.synchronize()
        assert same_bits(outs[True], outs[False]), trial
        assert same_bits(pools["fused"], pools["plain"]), trial
        if trial < 2 and arm == "exact":
            q, k, _ = split_qkv(qkv, hq, hkv, d)
            assert torch.equal(outs[True], ref.rope_neox(q, k, cos, sin)[0]), trial
