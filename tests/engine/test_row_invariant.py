"""Row-invariant prefill (replay.row_invariant): a token's K/V and first token do not depend on the
step it is prefilled in, so a prefix-cache hit and its recomputation give the same tokens.

Why: the prefix cache's identity claim compares K/V cached from an earlier request's steps with the
same positions recomputed in a step of another shape; that comparison is only a property of the
kernels when every token's values are independent of its companions and chunking.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rltbench.engine import Engine, SamplingParams
from rltbench.engine.replay import row_invariant
from rltbench.engine.row_invariant import token_tiles
from rltbench.engine.schedule import PREFILL, Schedule
from rltbench.errors import UsageError
from rltbench.models import build_model
from tests.engine.engine_testutil import prompts, record_run, small_engine, tiny_model

TILE = 8


def _prefill_alone_and_crowded(eng: Engine, prompt: list[int]) -> list[tuple[torch.Tensor, int]]:
    """`prompt` prefilled (held for export) twice: alone in one step, then behind a 7-token companion
    (so its chunks start at other offsets and share steps); its KV bytes and first token each time."""
    out = []
    for companions in ([], prompts(9, [7])):
        for k, c in enumerate(companions):
            eng.add_request(f"c{k}", c, SamplingParams(max_tokens=2, ignore_eos=True))
        eng.add_prefill_request("p", prompt)
        first = None
        while eng.has_unfinished():
            for ev in eng.step():
                if ev.request_id == "p":
                    first = ev.token_ids[0]
        packed, _meta = eng.held.export("p")
        out.append((packed.clone(), first))
        eng.held.release("p")
    return out


def test_a_prompt_prefilled_alone_or_in_a_bigger_step_has_the_same_kv_bits(huginn_tiny):
    """Under the mode the prompt's K/V (every plane, whole blocks) and its first token are bitwise the
    same alone and beside another request with other chunk boundaries."""
    eng = small_engine(huginn_tiny, enable_prefix_caching=False)
    prompt = prompts(5, [12])[0]  # three whole blocks of 4: no stale slots in the exported blocks
    with row_invariant(eng.runner, TILE):
        (kv_alone, tok_alone), (kv_crowded, tok_crowded) = _prefill_alone_and_crowded(eng, prompt)
    assert torch.equal(kv_alone, kv_crowded)
    assert tok_alone == tok_crowded
    assert eng.stats()["row_invariant_tiles"] > 0


def test_tiles_cover_the_step_in_order_with_inert_padding():
    """Tiles keep the step's token order, pad with rows that write no KV (slot -1) and attend to
    nothing (seq_len 0), and report the finishing rows in the step's order."""
    ids, pos = np.arange(10, 21), np.r_[np.arange(4, 9), np.arange(0, 6)]
    slots, rows_of = np.arange(100, 111), np.r_[np.zeros(5, int), np.ones(6, int)]
    tables = np.array([[7, 8, 0], [3, 4, 5]])
    tiles = list(token_tiles(ids, pos, slots, rows_of, tables, [4, 10], 4, width=5))
    assert [int((t.packed[12:16] > 0).sum()) for t in tiles] == [4, 4, 3]   # real rows: seq_len > 0
    assert [t.finishing for t in tiles] == [(), (0,), (2,)]
    last = tiles[-1].packed
    cols, bt = last[:16].reshape(4, 4), last[16:].reshape(4, 5)
    assert cols[:, 3].tolist() == [0, 0, -1, 0]  # padding row: id 0, position 0, slot -1, seq_len 0
    assert cols[3, :3].tolist() == [4, 5, 6] and bt[0].tolist() == [3, 4, 5, 0, 0]


def _session(eng: Engine) -> tuple[Schedule, dict, dict]:
    """Three turns of two conversations (each turn's prompt extends the last one), arriving over time,
    recorded with the prefix cache on."""
    heads, adds = prompts(11, [9, 6]), prompts(12, [5, 7, 6, 3])
    ps = {"a1": heads[0], "b1": heads[1]}
    ps["a2"], ps["b2"] = ps["a1"] + adds[0], ps["b1"] + adds[1]
    ps["a3"], ps["b3"] = ps["a2"] + adds[2], ps["b2"] + adds[3]
    mt = {rid: 3 + i % 3 for i, rid in enumerate(ps)}
    arrivals = {0: ["a1", "b1"], 4: ["a2"], 6: ["b2"], 9: ["a3", "b3"]}

    def on_step(step: int, out: dict[str, list[int]]) -> None:
        for rid in arrivals.get(step, []):
            eng.add_request(rid, ps[rid], SamplingParams(max_tokens=mt[rid], ignore_eos=True))

    sched, _ = record_run(eng, on_step, min_steps=10)
    return sched, ps, mt


def test_cache_on_and_off_replays_are_identical_under_the_mode(huginn_tiny):
    """The cache-on schedule replayed with the cache on and, recomputing each hit prefix, with it off:
    every request's tokens are the same under the mode."""
    eng = small_engine(huginn_tiny)
    sched, ps, mt = _session(eng)
    assert any(r[1] > 0 for st in sched.steps if st.kind == PREFILL for r in st.rows if r[0][1] != "1")
    on = eng.replay(sched, ps, mt, row_invariant_tile=TILE)
    eng.set_prefix_caching(False)
    off = eng.replay(sched, ps, mt, row_invariant_tile=TILE)
    assert set(on) == set(ps) and on == off
    assert eng.runner.row_tile is None  # the mode ends with the replay


def test_the_mode_refuses_compress_layout_and_bad_tiles():
    compress = build_model("huginn-tiny", device="cpu", dtype=torch.float32, kv_layout="compress").eval()
    eng = small_engine(compress, enable_prefix_caching=False)
    with pytest.raises(UsageError, match="compress"), row_invariant(eng.runner, TILE):
        pass
    eng = small_engine(tiny_model("ouro-tiny"))
    for bad in (0, -3, 2.5, True):
        with pytest.raises(UsageError, match="tile"), row_invariant(eng.runner, bad):
            pass

