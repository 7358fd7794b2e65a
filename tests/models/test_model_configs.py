"""Presets carry the published numbers; HF config.json parsing round-trips; bad names are UsageErrors."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rltbench.errors import UsageError
from rltbench.models import config_from_hf, get_config, list_presets
from rltbench.models.configs import config_to_hf, dtype_from_name


def test_presets_listed():
    assert {"ouro-1.4b", "ouro-2.6b", "huginn-0125", "ouro-tiny", "huginn-tiny"} <= set(list_presets())


def test_ouro_published_numbers():
    c = get_config("ouro-1.4b")
    assert (c.hidden_size, c.intermediate_size, c.num_layers, c.num_loops) == (2048, 5632, 24, 4)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (16, 16, 128, 49152)
    assert (c.rope_theta, c.rms_norm_eps, c.max_position_embeddings) == (1e6, 1e-6, 65536)
    assert c.num_kv_planes == 96 and c.family == "ouro" and c.early_exit_threshold is None
    assert get_config("ouro-2.6b").num_kv_planes == 192


def test_huginn_published_numbers():
    c = get_config("huginn-0125")
    assert (c.hidden_size, c.intermediate_size, c.num_heads, c.head_dim) == (5280, 17920, 55, 96)
    assert (c.num_prelude, c.num_core, c.num_coda, c.mean_recurrence) == (2, 4, 2, 32)
    assert (c.vocab_size, c.max_position_embeddings, c.rope_theta) == (65536, 4096, 50000.0)
    assert c.num_kv_planes == 132 and c.family == "huginn"
    assert abs(c.embed_scale - 72.6636) < 1e-3 and abs(c.init_std - 0.0087039) < 1e-6
    assert get_config("huginn-0125", kv_layout="compress").num_kv_planes == 8
    assert get_config("huginn-0125", mean_recurrence=4).num_kv_planes == 20


def test_unknown_preset_lists_presets():
    with pytest.raises(UsageError, match="ouro-1.4b"):
        get_config("ouro-9b")


def test_bad_overrides():
    with pytest.raises(UsageError, match="no_such_field"):
        get_config("ouro-tiny", no_such_field=1)
    with pytest.raises(UsageError, match="kv_layout"):
        get_config("huginn-tiny", kv_layout="sparse")
    with pytest.raises(UsageError, match="dtype"):
        dtype_from_name("int8")


@pytest.mark.parametrize("name", ["ouro-1.4b", "huginn-0125", "ouro-tiny", "huginn-tiny"])
def test_hf_round_trip(name, tmp_path):
    c = get_config(name)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config_to_hf(c)))
    back = config_from_hf(path, name=name)
    assert back == c


def test_hf_ouro_released_style():
    """The released Ouro config: eos 0, early_exit_threshold 1.0 (kept: the reference rule reads it as a
    threshold), explicit head_dim."""
    hf = {"model_type": "ouro", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
          "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 49152, "rope_theta": 1e6,
          "total_ut_steps": 4, "early_exit_threshold": 1.0, "eos_token_id": 0, "rope_scaling": None}
    c = config_from_hf(hf)
    assert c.early_exit_threshold == 1.0 and c.eos_token_ids == (0,) and c.head_dim == 128
    assert c.gate_threshold == 1.0 and dataclasses.replace(c, never_exit=True).gate_threshold is None
    assert config_from_hf({**hf, "early_exit_threshold": 0.7}).early_exit_threshold == 0.7
    assert config_from_hf({**hf, "early_exit_threshold": None}).gate_threshold is None  # no gate, as in HF
    for bad in (float("nan"), float("inf")):
        with pytest.raises(UsageError, match="early_exit_threshold"):
            config_from_hf({**hf, "early_exit_threshold": bad})


def test_hf_errors(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        config_from_hf(tmp_path / "missing.json")
    with pytest.raises(UsageError, match="model_type"):
        config_from_hf({"model_type": "llama"})
    with pytest.raises(UsageError, match="hidden_size"):
        config_from_hf({"model_type": "ouro"})
    with pytest.raises(UsageError, match="rope_scaling"):
        config_from_hf({**config_to_hf(get_config("ouro-tiny")), "rope_scaling": {"type": "yarn"}})
