"""`rltbench serve` on CUDA (run with --run-gpu): CUDA graphs captured on the engine thread before
listening, replayed while serving with no new decode capture; a concurrent burst over HTTP gives every
request its tokens and returns every block; the served ids equal the in-process engine's at batch 1."""

from __future__ import annotations

import threading

import pytest
import torch
from serve_fixtures import InProcessServer, all_blocks_free, metrics, request, wait_for

pytestmark = pytest.mark.gpu

PROMPT = list(range(3, 67))  # 64 ids


def _complete(url: str, prompt: list[int], n: int) -> list[int]:
    status, _, body = request(
        url,
        "/v1/completions",
        {"prompt": prompt, "max_tokens": n, "ignore_eos": True, "return_token_ids": True},
    )
    assert status == 200, body
    return body["choices"][0]["token_ids"]


def test_served_on_cuda_with_graphs_matches_in_process():
    from rltbench.engine import Engine, EngineConfig, SamplingParams
    from rltbench.models import build_model

    opts = dict(
        device="cuda",
        dtype="bfloat16",
        arm="exact",
        max_num_seqs=16,
        max_model_len=256,
        warmup_prefill_lens=(64,),
        prefix_caching=False,
        kv_cache_gib=0.5,
    )
    with InProcessServer(**opts) as srv:
        m0 = metrics(srv.url)
        assert m0['rltbench_cuda_graph_captures_total{kind="decode"}'] > 0  # captured before listening
        served = _complete(srv.url, PROMPT, 24)
        out: list = [None] * 12
        threads = [
            threading.Thread(target=lambda i=i: out.__setitem__(i, _complete(srv.url, PROMPT[i:] + [5], 16)))
            for i in range(12)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert all(o is not None and len(o) == 16 for o in out)
        wait_for(lambda: all_blocks_free(srv.url), what="blocks after the burst")
        m1 = metrics(srv.url)
        assert (
            m1['rltbench_cuda_graph_captures_total{kind="decode"}']
            == m0['rltbench_cuda_graph_captures_total{kind="decode"}']
        )
        assert (
            m1['rltbench_cuda_graph_replays_total{kind="decode"}']
            > m0['rltbench_cuda_graph_replays_total{kind="decode"}']
        )
    assert srv.final_stats["free_blocks"] == srv.final_stats["total_blocks"]
    model = build_model("ouro-tiny", device="cuda", dtype=torch.bfloat16, seed=0)
    eng = Engine(
        model,
        arms=["exact"],
        config=EngineConfig(
            max_num_seqs=16, max_model_len=256, kv_cache_gib=0.5, enable_prefix_caching=False
        ),
    )
    eng.runner.warmup()
    (res,) = eng.generate([PROMPT], SamplingParams(max_tokens=24, ignore_eos=True))
    assert res.token_ids == served
