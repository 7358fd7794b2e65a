"""Per-GPU tuned configs (rltbench/tuned.py): the file round trip, the one override
(RLTBENCH_TUNED = a file, or `none`), typed configs read once with their code defaults, bad values as
one-line usage errors, and what the manifests record. The shipped H200 file parses into the
configurations it was measured with and holds no machine paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rltbench import tuned
from rltbench.engine import attention as attn
from rltbench.errors import UsageError
from rltbench.kernels.act.config import ActExactConfig
from rltbench.kernels.norm.config import (
    ApproxNormConfig,
    ApproxNormLaunch,
    ExactNormRouting,
    OneLaunchConfig,
)
from rltbench.kernels.rope.config import RopeKvConfig

DEV = "NVIDIA Test GPU"
H200 = tuned.TUNED_DIR / "NVIDIA_H200.json"


@pytest.fixture
def fake_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tuned, "TUNED_DIR", tmp_path)
    monkeypatch.setattr(tuned, "_current_device_name", lambda: DEV)
    monkeypatch.delenv("RLTBENCH_TUNED", raising=False)
    tuned.reload()
    yield tmp_path
    tuned.reload()


def test_slug_round_trip_and_merge(fake_gpu: Path) -> None:
    assert tuned.device_slug("NVIDIA H200") == "NVIDIA_H200"
    assert tuned.section("norm_onelaunch") is None and tuned.active().origin == "none"
    p = tuned.write_section(DEV, "norm_onelaunch", {"warps": 2}, {"command": "x"})
    assert p == fake_gpu / "NVIDIA_Test_GPU.json"
    assert tuned.section("norm_onelaunch") == {"warps": 2} and tuned.active().origin == "gpu"
    tuned.write_section(DEV, "act_exact", {"block_few_rows": 256}, {"command": "y"})
    data = json.loads(p.read_text())
    assert data["norm_onelaunch"] == {"warps": 2} and data["sources"]["act_exact"] == {"command": "y"}


def test_configs_are_code_defaults_without_a_file_and_read_the_file(fake_gpu: Path) -> None:
    assert tuned.config(OneLaunchConfig) == OneLaunchConfig(layout="lowwarp", warps=4, tree="tl_sum")
    assert tuned.config(ExactNormRouting) == ExactNormRouting()
    assert not tuned.config(RopeKvConfig).enabled
    record = {"warps": 2, "config": "lowwarp-flat-sum-w2", "summed_us": {}}
    tuned.write_section(DEV, "norm_onelaunch", record, {})
    cfg = tuned.config(OneLaunchConfig)
    assert (cfg.warps, cfg.tree, cfg.name) == (2, "tl_sum", "lowwarp-flat-sum-w2")   # records ignored
    assert tuned.config(OneLaunchConfig) is cfg                                          # read once


def test_override_file_replaces_the_gpus_and_none_means_code_defaults(
        fake_gpu: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tuned.write_section(DEV, "rope_kv", {"enabled": True}, {})
    other = tmp_path / "mine.json"
    other.write_text(json.dumps({"norm_exact": {"wide_min_rows": 128}}))
    monkeypatch.setenv("RLTBENCH_TUNED", str(other))
    tuned.reload()
    assert tuned.config(ExactNormRouting).wide_min_rows == 128
    assert not tuned.config(RopeKvConfig).enabled                      # the GPU's file is not read
    assert tuned.in_use() == {"origin": "override", "file": str(other),
                              "sections": {"norm_exact": {"wide_min_rows": 128}}}
    monkeypatch.setenv("RLTBENCH_TUNED", "none")
    tuned.reload()
    assert tuned.in_use() is None and tuned.config(ExactNormRouting).wide_min_rows == 1


def test_bad_override_and_bad_values_are_one_line_usage_errors(fake_gpu: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLTBENCH_TUNED", str(tmp_path / "missing.json"))
    tuned.reload()
    with pytest.raises(UsageError, match="RLTBENCH_TUNED="):
        tuned.check()
    monkeypatch.setenv("RLTBENCH_TUNED", "0")   # the old off switch: the error names the new one
    tuned.reload()
    with pytest.raises(UsageError, match="RLTBENCH_TUNED=none"):
        tuned.check()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"norm_onelaunch": {"warps": 3}}))
    monkeypatch.setenv("RLTBENCH_TUNED", str(bad))
    tuned.reload()
    with pytest.raises(UsageError, match="norm_onelaunch.*power of two"):
        tuned.check()
    for section, value in (("norm_onelaunch", {"layout": "fast"}), ("norm_approx", {"wload": 3}),
                           ("norm_approx", {"pdl": 7}), ("act_exact", {"block_few_rows": 100}),
                           ("rope_kv", {"enabled": "yes"}), ("norm_exact", {"wide_min_rows": 0})):
        with tuned.use({section: value}), pytest.raises(UsageError, match=section):
            tuned.check()


def test_use_swaps_the_data_for_a_block_only(fake_gpu: Path) -> None:
    with tuned.use({"act_exact": {"block_few_rows": 128}}):
        assert tuned.config(ActExactConfig).block_for(1) == 128
        with tuned.use(None):
            assert tuned.config(ActExactConfig).block_for(1) == 512
    assert tuned.config(ActExactConfig) == ActExactConfig()


def test_approx_per_width_entries_over_the_section_default(fake_gpu: Path) -> None:
    section = {"persist": 8, "stream": 0, "warps": 4, "config": "x",
               "by_width": {"2048": {"persist": 0, "stream": 1, "config": "y"}}}
    tuned.write_section(DEV, "norm_approx", section, {})
    cfg = tuned.config(ApproxNormConfig)
    assert cfg.for_width(2048) == ApproxNormLaunch(persist=0, stream=True, warps=4)
    assert cfg.for_width(5280) == ApproxNormLaunch(persist=8, warps=4)     # no entry: the default


def test_decode_attention_rows_from_file(fake_gpu: Path) -> None:
    assert attn.decode_config(1, 16, 512) == attn.DecodeConfig()   # no file: built-in
    rows = [{"max_batch": 1, "max_len": 2048, "tile_tokens": 64, "partition_size": 64, "measured": {}},
            {"max_batch": 1 << 30, "max_len": 1 << 30, "num_warps": 8}]
    tuned.write_section(DEV, "decode_attention", rows, {})
    cfg = attn.decode_config(1, 16, 1024)
    assert (cfg.tile_tokens, cfg.partition_size) == (64, 64)
    assert attn.decode_config(2, 16, 1024).num_warps == 8
    tuned.write_section(DEV, "decode_attention", [{"max_batch": "x"}], {})
    assert attn.decode_config(1, 16, 512) == attn.DecodeConfig()   # a broken table is ignored


def test_manifest_records_the_file_in_force(fake_gpu: Path) -> None:
    assert tuned.in_use() is None
    tuned.write_section(DEV, "rope_kv", {"enabled": True}, {"command": "test"})
    assert tuned.in_use() == {"origin": "gpu", "file": "rltbench/tuned_configs/NVIDIA_Test_GPU.json",
                              "sections": {"device": DEV, "rope_kv": {"enabled": True}}}


def test_shipped_h200_file_parses_to_its_measured_configs_and_holds_no_machine_paths() -> None:
    data = json.loads(H200.read_text())
    with tuned.use(H200):
        tuned.check()
        assert tuned.config(OneLaunchConfig) == OneLaunchConfig()   # the code default is the H200's
        assert tuned.config(OneLaunchConfig).name == data["norm_onelaunch"]["config"]
        assert tuned.config(RopeKvConfig).enabled
        assert tuned.config(ActExactConfig) == ActExactConfig(128, 512)
        approx = tuned.config(ApproxNormConfig)
        assert approx.for_width(2048).name == data["norm_approx"]["by_width"]["2048"]["config"]
        assert approx.for_width(5280).name == data["norm_approx"]["by_width"]["5280"]["config"]
    text = H200.read_text()
    for word in ("/work", "/tmp", "/home", "session"):
        assert word not in text, word
