"""`rltbench profile --bench decode` without a GPU (ouro-tiny, eager CPU engine): the engine decode table with
its A/A arm and labels, the four-engine attribution (context class x pool size), and the table that
reports them, including a cold timed cell."""

from __future__ import annotations

import pytest
import torch

from rltbench.bench.decode import decode_engine_config, decode_step_table
from rltbench.commands.profile import decode_steps
from rltbench.engine import Engine
from rltbench.kernels import ARMS
from rltbench.models import build_model

ARMS4 = ["torch", "exact", "approx", "torch#2"]


@pytest.fixture(scope="module")
def ds() -> dict:
    return vars(decode_steps)


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    return build_model("ouro-tiny", device="cpu", dtype=torch.float32, seed=0)


@pytest.fixture(scope="module")
def attr(ds, tiny) -> list[dict]:
    return ds["attribution"](tiny, ["torch", "exact", "torch#2"], reps=2, iters=1, context=20, warmup=0)


def test_attribution_times_four_engines(attr) -> None:
    # on CPU the step is eager: it covers the blocks in use (32 positions), not a graph's class
    assert [(r["context_class"], r["class"], r["pool"], r["num_blocks"]) for r in attr] == [
        (32, "capped", "one request", 6 + 8), (32, "capped", "serving", 512),
        (32, "serving", "one request", 16 + 8), (32, "serving", "serving", 512)]  # CPU "serving": 512
    for r in attr:
        assert set(r["median_ms"]) == {"torch", "exact", "torch#2"} and r["cold_cells"] == []
        assert {s["arm"]: s["label"] for s in r["speedups"]}["torch#2"] == "A/A"


def test_table_reports_speedups_labels_and_cold_cells(ds, tiny, attr) -> None:
    cfg = decode_engine_config(4, 40, extra_tokens=8, use_cuda_graph=False, num_blocks=64, model_max_len=512)
    engine = Engine(tiny, {a: ARMS[a.split("#")[0]] for a in ARMS4}, cfg)
    step = decode_step_table(engine, ARMS4, batch_sizes=(1, 2), context_len=40, iters=2, warmup=0, reps=2,
                             host_tokens=4)
    step["warm"][3] = {**step["warm"][3], "captures": 1, "warm": False}
    model_rows = [{"arm": a, "batch": 1, "context": 512, "median_ms": 1.0, "p10_ms": 0.9, "p90_ms": 1.1,
                   "n": 4, "rep_median_ms": [1.0, 1.0], "logits_equal_torch": a != "approx"} for a in ARMS4]
    model_step = {"rows": model_rows, "warm": [{"arm": "torch", "rep": 0, "warm": True}],
                  "speedups": ds["compare_to_reference"]({r["arm"]: [1.0, 1.02] for r in model_rows}, "torch",
                                                         "torch#2")}
    text = ds["table"]({"model": "ouro-tiny", "model_step": model_step, "engine_step": step,
                        "attribution": attr})
    assert "**1 of 16 timed cells were not warm**" in text
    assert "| exact | 2 | 48 | 2 |" in text    # batch 2: context class (eager: blocks in use), bucket
    assert "within noise" in text and "A/A" in text and "| approx | 1.000 (0.900-1.100) |" in text
    assert "## Attribution: batch-1 engine step" in text and "| 32 (serving) | serving (512) |" in text
