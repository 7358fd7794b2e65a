"""Per-GPU tuned knobs (rltbench/tuned.py): file round trip, precedence env > file > default, the
off switch, and the two readers that matter most (decode attention rows, fast-norm warps)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rltbench import tuned
from rltbench.commands.tune import attention as ab
from rltbench.engine import attention as attn
from rltbench.kernels import norm_onelaunch_fast as fast

DEV = "NVIDIA Test GPU"


@pytest.fixture
def fake_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tuned, "TUNED_DIR", tmp_path)
    monkeypatch.setattr(tuned, "_current_device_name", lambda: DEV)
    monkeypatch.delenv("RLTBENCH_TUNED", raising=False)
    monkeypatch.delenv("RLTBENCH_NORM_FAST_WARPS", raising=False)
    tuned._load.cache_clear()
    yield tmp_path
    tuned._load.cache_clear()


def test_slug_and_round_trip(fake_gpu: Path) -> None:
    assert tuned.device_slug("NVIDIA H200") == "NVIDIA_H200"
    assert tuned.section("norm_fast") is None
    p = tuned.write_section(DEV, "norm_fast", {"warps": 2}, {"command": "x"})
    assert p == fake_gpu / "NVIDIA_Test_GPU.json"
    assert tuned.section("norm_fast") == {"warps": 2}
    tuned.write_section(DEV, "act_exact", {"block_few_rows": 256}, {"command": "y"})
    assert tuned.section("norm_fast") == {"warps": 2}          # merged, not replaced
    assert tuned.section("norm_fast", device_name="other") is None


def test_precedence_env_file_default(fake_gpu: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert tuned.knob("RLTBENCH_NORM_FAST_WARPS", "norm_fast", "warps", 4) == 4
    tuned.write_section(DEV, "norm_fast", {"warps": 1}, {})
    assert tuned.knob("RLTBENCH_NORM_FAST_WARPS", "norm_fast", "warps", 4) == 1
    assert fast.num_warps_for(512, interpret=False) == 1
    monkeypatch.setenv("RLTBENCH_NORM_FAST_WARPS", "8")
    assert fast.num_warps_for(512, interpret=False) == 8
    assert fast.num_warps_for(256, interpret=False) == 4   # scaled to the plan (elements per thread)
    assert fast.num_warps_for(32, interpret=False) == 1    # at most lanes / 32
    monkeypatch.delenv("RLTBENCH_NORM_FAST_WARPS")
    monkeypatch.setenv("RLTBENCH_TUNED", "0")
    assert tuned.knob("RLTBENCH_NORM_FAST_WARPS", "norm_fast", "warps", 4) == 4


def test_decode_attention_rows_from_file(fake_gpu: Path) -> None:
    assert attn.decode_config(1, 16, 512) == attn.DecodeConfig()   # no file: built-in
    rows = [{"max_batch": 1, "max_len": 2048, "tile_tokens": 64, "partition_size": 64, "measured": {}},
            {"max_batch": 1 << 30, "max_len": 1 << 30, "num_warps": 8}]
    tuned.write_section(DEV, "decode_attention", rows, {})
    cfg = attn.decode_config(1, 16, 1024)
    assert (cfg.tile_tokens, cfg.partition_size) == (64, 64)
    assert attn.decode_config(2, 16, 1024).num_warps == 8
    tuned.write_section(DEV, "decode_attention", [{"max_batch": "x"}], {})
    assert attn.decode_config(1, 16, 512) == attn.DecodeConfig()   # a broken file is ignored


def test_sweep_best_becomes_rows() -> None:
    knobs = {"tile_tokens": 32, "heads_per_program": 1, "num_warps": 4, "num_stages": 1,
             "target_programs": 528,
             "single_launch": True, "median_us": 1.0, "kv_gbps": 1.0}
    res = {"variants": ab.SWEEP_VARIANTS, "cases": [
        {"batch": 1, "context_len": 512, "best": knobs | {"name": "p64t64h1w4", "partition_size": 64}},
        {"batch": 32, "context_len": 512, "best": knobs | {"name": "t32h1w4", "partition_size": 256}},
        {"batch": 1, "context_len": 4096, "best": None},
    ]}
    rows = ab.tuned_rows(res)
    assert [(r["max_batch"], r["max_len"], r["partition_size"]) for r in rows] == [
        (1, ab._SHORT_LEN, 64), (1 << 30, ab._SHORT_LEN, None)]


def test_manifest_records_the_tuned_file_in_use(fake_gpu: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert tuned.in_use() is None
    tuned.write_section(DEV, "pdl", {"mode": 1}, {"command": "test"})
    got = tuned.in_use()
    assert got == {"file": "rltbench/tuned_configs/NVIDIA_Test_GPU.json",
                   "sections": {"device": DEV, "pdl": {"mode": 1}}}
    monkeypatch.setenv("RLTBENCH_TUNED", "0")
    assert tuned.in_use() is None


def test_pdl_mode_precedence_and_cpu_off(fake_gpu: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PDL: env > tuned file > off; never on for CPU tensors or the interpreter; bad values refused."""
    import torch

    from rltbench.kernels import pdl

    monkeypatch.delenv("RLTBENCH_PDL", raising=False)
    assert pdl.requested_mode() == 0
    tuned.write_section(DEV, "pdl", {"mode": 2}, {"command": "test"})
    assert pdl.requested_mode() == 2
    monkeypatch.setenv("RLTBENCH_PDL", "1")
    assert pdl.requested_mode() == 1
    assert pdl.mode_for(torch.zeros(1), interpret=False) == 0
    assert pdl.launch_kwargs(0) == {"PDL": 0}
    assert pdl.launch_kwargs(2) == {"PDL": 2, "launch_pdl": True}
    monkeypatch.setenv("RLTBENCH_PDL", "3")
    with pytest.raises(ValueError, match="RLTBENCH_PDL"):
        pdl.requested_mode()


def test_per_width_values_win_over_the_section_default(fake_gpu: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """norm_approx holds a default configuration and per-width ones (kernel_tune.py: the best at each
    width); the approx norm reads the one for its width, the environment still wins."""
    from rltbench.kernels import norm_approx as na

    for env in ("RLTBENCH_APPROX_NORM_PERSIST", "RLTBENCH_APPROX_NORM_STREAM", "RLTBENCH_APPROX_NORM_WARPS"):
        monkeypatch.delenv(env, raising=False)
    tuned.write_section(DEV, "norm_approx", {"persist": 8, "stream": 0, "warps": 4,
                                              "by_width": {"2048": {"persist": 0, "stream": 1}}}, {})
    assert (na._persist(2048), na._stream(2048)) == (0, True)
    assert (na._persist(5280), na._stream(5280)) == (8, False)   # no entry: the section's default
    assert na._warps(2048, 2048) == 4                            # not in the entry: the default
    monkeypatch.setenv("RLTBENCH_APPROX_NORM_PERSIST", "4")
    assert na._persist(2048) == 4
