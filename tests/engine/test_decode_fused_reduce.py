"""The fused split-K reduce of the decode-attention kernel (``fused_reduce=True``).

With several splits, the partial programs of a head group count themselves on a device counter and the
last one combines the partials, instead of a second (reduce) launch. Both paths share the combine code
and its fixed split order, so the fused output must be *bitwise* the two-launch output (not just
close); both are also checked against the torch reference. The counters must be back at zero after
every call (the next call and every CUDA-graph replay start from a clean buffer).

CPU runs the kernels under TRITON_INTERPRET=1, where programs run one after another (so the last
program trivially sees every partial); the GPU test (``--run-gpu``) checks the same bits on CUDA, where
the programs race, including inside a CUDA graph replayed with new inputs.
"""

from __future__ import annotations

import pytest
import torch

from rltbench.engine import attention as attn
from rltbench.engine.attention import _decode_torch, _decode_triton
from tests.engine.test_attention import decode_oracle, make_case

# (Hq, Hkv, D, block_size, seq_lens, hint): padding rows (0), lengths off the partition grid, GQA,
# an odd max_len (hint) and a wide table whose capacity leaves most splits empty (as in the engine)
CASES = [
    pytest.param(4, 4, 16, 4, [37], None, id="b1"),
    pytest.param(6, 3, 24, 8, [17, 0, 70, 8], None, id="gqa2-pad"),
    pytest.param(8, 2, 16, 4, [0, 5, 33, 0, 48, 1], 49, id="gqa4-odd-hint"),
    pytest.param(5, 5, 20, 16, [0, 0], None, id="all-padding"),
]
# knobs of the fused call (partition_size goes positionally); heads 4 of Hq 6 leaves a half-empty group
KNOBS = [
    pytest.param({"partition_size": 16, "tile_tokens": 8}, id="p16-t8-h1"),
    pytest.param({"partition_size": 16, "heads_per_program": 2}, id="p16-h2"),
    pytest.param({"partition_size": 32, "heads_per_program": 4, "tile_tokens": 16}, id="p32-h4"),
]


def _counters_clean(device: torch.device) -> bool:
    return all(int(buf.abs().sum()) == 0 for buf in attn._COUNTERS.get(device, []))


def _call(
    q: torch.Tensor, paged: tuple[torch.Tensor, ...], scale: float, max_len: int, knobs: dict, fused: bool
) -> torch.Tensor:
    """One call, two-launch or fused, with partition_size taken from the knobs."""
    knobs = dict(knobs)
    part = knobs.pop("partition_size", None)
    return _decode_triton(q, *paged, scale, max_len, part, **knobs, fused_reduce=fused)


def _both(
    q: torch.Tensor, paged: tuple[torch.Tensor, ...], scale: float, max_len: int, knobs: dict
) -> tuple[torch.Tensor, torch.Tensor]:
    """(two-launch, fused) outputs of one call's inputs and knobs."""
    return _call(q, paged, scale, max_len, knobs, False), _call(q, paged, scale, max_len, knobs, True)


@pytest.mark.parametrize("knobs", KNOBS)
@pytest.mark.parametrize("hq,hkv,d,bs,lens,hint", CASES)
# bf16 doubles the interpreted grid (about 45 s): behind --slow, fp32 always runs
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)])
def test_fused_reduce_is_bitwise_the_two_launch_path(
    hq: int, hkv: int, d: int, bs: int, lens: list[int], hint: int | None, knobs: dict, dtype: torch.dtype
) -> None:
    case = make_case(lens, hkv, d, bs, dtype=dtype, seed=hq + d + len(lens), table_pad=6)
    q = torch.randn(len(lens), hq, d, generator=torch.Generator().manual_seed(len(lens))).to(dtype)
    scale = d**-0.5
    max_len = hint if hint is not None else case.block_tables.shape[1] * bs
    two, fused = _both(q, case.paged, scale, max_len, knobs)
    assert torch.equal(two, fused)
    assert _counters_clean(q.device)
    if dtype == torch.float32:
        torch.testing.assert_close(fused.double(), decode_oracle(q, case, scale), atol=2e-6, rtol=2e-6)
    else:
        ref = _decode_torch(q, *case.paged, scale, max_len)
        torch.testing.assert_close(fused.float(), ref.float(), atol=1e-2, rtol=1e-2)
    for r, n in enumerate(lens):
        if n == 0:
            assert torch.equal(fused[r], torch.zeros_like(fused[r]))


def test_fused_reduce_consecutive_calls_reuse_clean_counters() -> None:
    """Two calls with different inputs (and a different grid) both right: the first left zeros behind."""
    scale = 0.25
    for seed, lens in ((1, [9, 0, 40]), (2, [3, 27, 0, 64, 12])):
        case = make_case(lens, 2, 16, 4, seed=seed, table_pad=4)
        q = torch.randn(len(lens), 4, 16, generator=torch.Generator().manual_seed(seed))
        max_len = case.block_tables.shape[1] * 4
        out = _decode_triton(q, *case.paged, scale, max_len, 16, fused_reduce=True)
        torch.testing.assert_close(out.double(), decode_oracle(q, case, scale), atol=2e-6, rtol=2e-6)
        assert _counters_clean(q.device)


def test_combine_reads_live_splits_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty splits store no partials; both combines must skip them (partial buffers start as NaN)."""
    real_empty = torch.empty

    def nan_empty(*size, **kw) -> torch.Tensor:
        t = real_empty(*size, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    lens = [5, 0, 21]
    case = make_case(lens, 2, 16, 4, seed=7, table_pad=10)
    q = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(7))
    max_len = case.block_tables.shape[1] * 4  # far more splits than the longest row needs
    monkeypatch.setattr(torch, "empty", nan_empty)
    two, fused = _both(q, case.paged, 0.25, max_len, {"partition_size": 16})
    monkeypatch.undo()
    assert torch.equal(two, fused)
    torch.testing.assert_close(fused.double(), decode_oracle(q, case, 0.25), atol=2e-6, rtol=2e-6)


def test_split_counters_cache_grows_and_resets() -> None:
    dev = torch.device("cpu")
    small = attn._split_counters(dev, 1)
    assert small.dtype == torch.int32 and small.numel() >= attn._MIN_COUNTERS
    assert attn._split_counters(dev, small.numel()) is small  # cached, no new allocation per call
    big = attn._split_counters(dev, small.numel() + 1)
    assert big.numel() > small.numel() and attn._COUNTERS[dev][-2] is small  # old one kept alive
    big[3] = 7  # as an aborted launch would leave it
    attn.reset_split_counters()
    assert _counters_clean(dev)
    attn._COUNTERS[dev].pop()  # leave the default-size buffer as the current one for later tests


def test_fused_reduce_is_off_by_default() -> None:
    assert attn.DecodeConfig().fused_reduce is False
    assert attn.DecodeConfig(**{"fused_reduce": True}).fused_reduce is True


# --------------------------------------------------------------------------------------------------
# GPU (run with --run-gpu): the programs race for real; bitwise against the two-launch path, eager
# and inside a CUDA graph replayed with new inputs
# --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("hq,hkv", [(16, 16), (16, 4)])
@pytest.mark.parametrize("part,heads,warps", [(64, 1, 4), (128, 1, 8), (128, 2, 4), (32, 4, 8)])
def test_gpu_fused_reduce_bitwise(hq: int, hkv: int, part: int, heads: int, warps: int) -> None:
    d, bs, width = 128, 16, 128  # capacity 2048 tokens: most splits empty, as in the engine's graphs
    lens = [512, 0, 1, 300, 2048, 17, 1000, 64]
    case = make_case(lens, hkv, d, bs, dtype=torch.bfloat16, device="cuda", seed=part + heads,
                     table_pad=width - 2048 // bs)  # fmt: skip
    q = torch.randn(len(lens), hq, d, device="cuda", dtype=torch.bfloat16)
    knobs = {"partition_size": part, "heads_per_program": heads, "num_warps": warps, "tile_tokens": 32}
    for rows in (1, len(lens)):
        sub = (case.k_cache, case.v_cache, case.block_tables[:rows], case.seq_lens[:rows])
        for _ in range(3):  # races differ from run to run: the bits must not
            two, fused = _both(q[:rows], sub, d**-0.5, width * bs, knobs)
            assert torch.equal(two, fused)
        ref = _decode_torch(q[:rows], *sub, d**-0.5, width * bs)
        torch.testing.assert_close(fused.float(), ref.float(), atol=1e-2, rtol=1e-2)
    torch.cuda.synchronize()
    assert _counters_clean(q.device)


@pytest.mark.gpu
def test_gpu_fused_reduce_cuda_graph_replays() -> None:
    """Capture 24 fused calls (one per layer, sharing the counters) once; replay twice with new q,
    tables and lengths; every output is bitwise the eager two-launch one."""
    hq = hkv = 16
    d, bs, batch, width, layers = 128, 16, 8, 64, 24
    nb = batch * width + 4
    kc = torch.randn(nb, bs, hkv, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    q = torch.zeros(layers, batch, hq, d, device="cuda", dtype=torch.bfloat16)
    tables = torch.zeros(batch, width, device="cuda", dtype=torch.int32)
    lens = torch.zeros(batch, device="cuda", dtype=torch.int32)
    knobs = {"tile_tokens": 64, "num_warps": 4, "partition_size": 64}

    def step(fused: bool) -> list[torch.Tensor]:
        return [_call(q[i], (kc, vc, tables, lens), d**-0.5, width * bs, knobs, fused) for i in range(layers)]

    def fill(seed: int) -> None:
        g = torch.Generator(device="cuda").manual_seed(seed)
        q.copy_(torch.randn(q.shape, generator=g, device="cuda"))
        tables.copy_(torch.randperm(nb, generator=g, device="cuda")[: batch * width].view(batch, width))
        new_lens = torch.randint(1, width * bs + 1, (batch,), generator=g, device="cuda")
        new_lens[-1] = 0  # a padding row of the bucket
        lens.copy_(new_lens)

    fill(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step(True)
    for seed in (1, 2):
        fill(seed)
        graph.replay()
        torch.cuda.synchronize()
        assert _counters_clean(q.device)
        replayed = torch.stack(outs).clone()
        eager = torch.stack(step(False))
        assert torch.equal(replayed, eager)
        assert torch.equal(replayed[:, -1], torch.zeros_like(replayed[:, -1]))
        ref = _decode_torch(q[0], kc, vc, tables, lens, d**-0.5, width * bs)
        torch.testing.assert_close(replayed[0].float(), ref.float(), atol=1e-2, rtol=1e-2)
