"""kv_transfer: pack/unpack bit-exact across planes (real plane counts at tiny widths), the header's
checks, and the engine's export/import path against the colocated engine."""

from __future__ import annotations

import pytest
import torch

from rltbench.engine import Engine, EngineConfig, EngineRequestError, SamplingParams
from rltbench.engine.kv_transfer import (
    HEADER_WORDS,
    HeaderError,
    KVGeometry,
    PromptMismatch,
    SizeMismatch,
    TransferHeader,
    pack_blocks,
    unpack_blocks,
)
from rltbench.engine.paged_context import allocate_kv_pool
from rltbench.models import build_model, get_config

# (preset, overrides, planes): the real plane counts (Ouro-1.4B 24 x 4, Huginn-0125 full 2 + 4 x 32 + 2,
# compress 8) on the tiny presets' widths
LAYOUTS = [
    ("ouro-tiny", {"num_layers": 24, "num_loops": 4}, 96),
    ("huginn-tiny", {"mean_recurrence": 32, "kv_layout": "full"}, 132),
    ("huginn-tiny", {"mean_recurrence": 32, "kv_layout": "compress"}, 8),
]


def _random_bits_pool(
    planes: int, blocks: int, bs: int, heads: int, hd: int, dtype: torch.dtype
) -> torch.Tensor:
    """A pool whose every element is random bits: NaNs with payloads, infinities, -0.0, subnormals."""
    kv = allocate_kv_pool(planes, blocks, bs, heads, hd, dtype, torch.device("cpu"))
    raw = kv.view({2: torch.int16, 4: torch.int32}[kv.element_size()])
    info = torch.iinfo(raw.dtype)
    raw.copy_(torch.randint(info.min, info.max, raw.shape, dtype=raw.dtype))
    flat = kv.view(-1)
    flat[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0], dtype=dtype)
    return kv


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.parametrize("preset, overrides, planes", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_pack_unpack_round_trip_bit_exact(preset, overrides, planes, dtype) -> None:
    cfg = get_config(preset, **overrides)
    assert cfg.num_kv_planes == planes
    bs, heads, hd = 4, cfg.num_kv_heads, cfg.head_dim
    src = _random_bits_pool(planes, 11, bs, heads, hd, dtype)
    dst = _random_bits_pool(planes, 9, bs, heads, hd, dtype)
    before = dst.clone()
    src_blocks, dst_blocks = [5, 0, 10, 3], [8, 2, 4, 1]  # odd order, not contiguous, offsets
    packed = pack_blocks(src, src_blocks)
    geo = KVGeometry.of_pool(src)
    assert packed.dtype == torch.uint8 and packed.is_contiguous()
    assert packed.numel() == len(src_blocks) * geo.bytes_per_block
    unpack_blocks(dst, dst_blocks, packed)
    for s, d in zip(src_blocks, dst_blocks, strict=True):
        assert torch.equal(_bits(dst[:, :, d]), _bits(src[:, :, s]))
    untouched = [b for b in range(9) if b not in dst_blocks]
    assert torch.equal(_bits(dst[:, :, untouched]), _bits(before[:, :, untouched]))
    # skip: blocks the receiver already holds are left alone
    again = before.clone()
    unpack_blocks(again, dst_blocks, packed, skip=2)
    assert torch.equal(_bits(again[:, :, dst_blocks[:2]]), _bits(before[:, :, dst_blocks[:2]]))
    assert torch.equal(_bits(again[:, :, dst_blocks[2:]]), _bits(src[:, :, src_blocks[2:]]))


def test_unpack_refuses_a_wrong_size() -> None:
    kv = allocate_kv_pool(3, 6, 4, 2, 8, torch.float32, torch.device("cpu"))
    packed = pack_blocks(kv, [1, 2])
    with pytest.raises(SizeMismatch, match="does not fill 3 blocks"):
        unpack_blocks(kv, [0, 1, 2], packed)
    with pytest.raises(SizeMismatch):
        unpack_blocks(kv, [0, 1], packed[:-1])


def test_header_round_trip_and_every_corrupted_word_is_refused() -> None:
    geo = KVGeometry(96, 16, 16, 128, torch.bfloat16)
    prompt = list(range(100, 613))
    h = TransferHeader.for_kv(7, 3, prompt, 42, geo)
    t = h.encode()
    assert t.shape == (HEADER_WORDS,) and TransferHeader.decode(t) == h
    assert h.n_blocks == 33 and h.payload_bytes == 33 * 96 * 2 * 16 * 16 * 128 * 2
    h.check_kv(geo, prompt, 49152)
    for i in range(HEADER_WORDS):
        bad = t.clone()
        bad[i] ^= 1 << (i % 60)
        with pytest.raises(HeaderError):
            TransferHeader.decode(bad)
    with pytest.raises(HeaderError, match="words"):
        TransferHeader.decode(t[:-1])
    cancel = TransferHeader.cancel(8, 4)
    assert TransferHeader.decode(cancel.encode()) == cancel


def test_header_checks_against_the_receiving_pool() -> None:
    geo = KVGeometry(8, 16, 4, 12, torch.float32)
    prompt = list(range(3, 40))
    h = TransferHeader.for_kv(0, 0, prompt, 5, geo)
    with pytest.raises(SizeMismatch, match="geometry"):
        h.check_kv(KVGeometry(132, 16, 4, 12, torch.float32), prompt, 256)
    with pytest.raises(SizeMismatch, match="payload bytes"):
        TransferHeader(**{**h.__dict__, "payload_bytes": h.payload_bytes - 4}).check_kv(geo, prompt, 256)
    with pytest.raises(PromptMismatch, match="another prompt"):
        h.check_kv(geo, prompt[:-1] + [99], 256)
    with pytest.raises(PromptMismatch, match="first token"):
        TransferHeader(**{**h.__dict__, "first_token": 256}).check_kv(geo, prompt, 256)


def _engine(model: torch.nn.Module, blocks: int = 64) -> Engine:
    return Engine(
        model,
        ["torch"],
        EngineConfig(
            block_size=4,
            num_blocks=blocks,
            max_num_batched_tokens=24,
            enable_prefix_caching=False,
            max_model_len=64,
        ),
    )


@pytest.mark.parametrize(
    "preset, overrides",
    [
        ("ouro-tiny", {}),
        ("huginn-tiny", {"kv_layout": "full"}),
        ("huginn-tiny", {"kv_layout": "compress"}),
    ],
)
def test_export_import_decodes_like_the_colocated_engine(preset, overrides) -> None:
    model = build_model(preset, device="cpu", dtype=torch.float32, seed=3, **overrides).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 250, (n,), generator=g).tolist() for n in (9, 16, 5)]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    want = [o.token_ids for o in _engine(model).generate(prompts, params)]
    prefill, decode = _engine(model), _engine(model)
    for i, p in enumerate(prompts):
        prefill.add_prefill_request(f"r{i}", p)
    firsts = {}
    while prefill.has_unfinished():
        for ev in prefill.step():
            assert ev.finished and ev.finish_reason == "length"
            firsts[ev.request_id] = ev.token_ids[0]
    assert prefill.held.request_ids == ["r0", "r1", "r2"]
    assert prefill.blocks.num_free_blocks == 64 - (3 + 4 + 2)
    for i, p in enumerate(prompts):
        packed, meta = prefill.held.export(f"r{i}")
        assert meta.first_token == firsts[f"r{i}"] and meta.n_blocks == -(-len(p) // 4)
        ev = decode.import_prefilled(f"r{i}", p, params, packed, meta.first_token)
        assert ev.token_ids == [firsts[f"r{i}"]] and not ev.finished
        assert prefill.held.release(f"r{i}") and not prefill.held.release(f"r{i}")
    assert prefill.blocks.check_all_free()
    got: dict[str, list[int]] = {f"r{i}": [firsts[f"r{i}"]] for i in range(3)}
    while decode.has_unfinished():
        for ev in decode.step():
            got[ev.request_id].extend(ev.token_ids)
    assert [got[f"r{i}"] for i in range(3)] == want
    assert decode.blocks.check_all_free()


def test_import_failures_leave_nothing_allocated() -> None:
    model = build_model("ouro-tiny", device="cpu", dtype=torch.float32, seed=0).eval()
    prefill, decode = _engine(model), _engine(model, blocks=6)
    prefill.add_prefill_request("a", list(range(3, 15)))
    prefill.step()
    packed, meta = prefill.held.export("a")
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    with pytest.raises(EngineRequestError, match="does not fill"):
        decode.import_prefilled("a", list(range(3, 15)), params, packed[:-8], meta.first_token)
    with pytest.raises(EngineRequestError, match="first token"):
        decode.import_prefilled("a", list(range(3, 15)), params, packed, 999)
    assert decode.blocks.check_all_free() and not decode.has_unfinished()
    decode.import_prefilled("a", list(range(3, 15)), params, packed, meta.first_token)  # 4 of 6 blocks
    with pytest.raises(EngineRequestError, match="no room"):
        decode.import_prefilled("b", list(range(3, 15)), params, packed, meta.first_token)
    assert decode.abort_request("a") and decode.blocks.check_all_free() and not decode.has_unfinished()
    assert decode.blocks_to_import(12, 4) == 4
    with pytest.raises(EngineRequestError, match="not a prefilled request"):
        prefill.held.export("b")
    assert prefill.held.release("a") and prefill.blocks.check_all_free()


class _LoopLink:
    """A link whose peer is a fixed reply (handshake tests, no processes)."""

    def __init__(self, rank: int, incoming: dict) -> None:
        self.rank, self.incoming, self.sent = rank, incoming, []

    def send_json(self, obj, timeout_s) -> None:
        self.sent.append(obj)

    def recv_json(self, timeout_s, what="") -> dict:
        return self.incoming


def test_handshake_refuses_ranks_with_different_weights() -> None:
    from rltbench.commands.pd.driver import handshake
    from rltbench.disagg.rank import fingerprint
    from rltbench.errors import UsageError

    spec = {"model": "ouro-tiny", "init_timeout": 1.0}
    a, b = (build_model("ouro-tiny", device="cpu", dtype=torch.float32, seed=s) for s in (0, 1))
    eng = _engine(a)
    prefill = _LoopLink(0, {"ok": True})
    handshake(prefill, spec, eng, fingerprint(a))
    facts = prefill.sent[0]
    handshake(_LoopLink(1, facts), spec, eng, fingerprint(a))  # same model: accepted
    decode = _LoopLink(1, facts)
    with pytest.raises(UsageError, match="differ in .*weights"):
        handshake(decode, spec, _engine(b), fingerprint(b))
    assert decode.sent[0]["ok"] is False  # the prefill rank is told too
