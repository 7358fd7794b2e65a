"""Loader and config problems a new user hits: each one a UsageError naming the file or field.

Found by using the public API as a user would (a corrupt weights file, a hand-edited config.json, a
re-saved checkpoint directory, a CUDA device on a CPU machine); every case here failed before with a
raw SafetensorError / TypeError / AttributeError, or loaded stale weights without a word.
"""

from __future__ import annotations

import json

import pytest
import torch

from rltbench.errors import UsageError
from rltbench.models import build_model, config_from_hf, load_model, save_hf_checkpoint


@pytest.mark.parametrize("name", ["ouro-tiny", "huginn-tiny"])
def test_resave_unsharded_over_sharded_loads_the_new_weights(name, tmp_path):
    old, new = build_model(name, seed=1), build_model(name, seed=2)
    save_hf_checkpoint(old, tmp_path, max_shard_bytes=20_000)
    save_hf_checkpoint(new, tmp_path)  # same directory, now one file: the old index must go
    assert not (tmp_path / "model.safetensors.index.json").exists()
    assert not list(tmp_path.glob("model-*-of-*.safetensors"))
    loaded, _ = load_model(tmp_path, device="cpu", tokenizer=False)
    for (k, a), b in zip(new.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    save_hf_checkpoint(old, tmp_path, max_shard_bytes=20_000)  # and back: no stale single file
    assert not (tmp_path / "model.safetensors").exists()


@pytest.mark.parametrize("payload", [b"", b"not a safetensors file at all"])
def test_corrupt_safetensors_names_the_file(payload, tmp_path):
    save_hf_checkpoint(build_model("ouro-tiny"), tmp_path)
    (tmp_path / "model.safetensors").write_bytes(payload)
    with pytest.raises(UsageError, match=r"model\.safetensors: not a readable safetensors file"):
        load_model(tmp_path, device="cpu", tokenizer=False)


def test_corrupt_shard_names_the_shard(tmp_path):
    save_hf_checkpoint(build_model("huginn-tiny"), tmp_path, max_shard_bytes=20_000)
    shard = sorted(tmp_path.glob("model-*-of-*.safetensors"))[1]
    shard.write_bytes(b"\x00" * 16)
    with pytest.raises(UsageError, match=shard.name):
        load_model(tmp_path, device="cpu", tokenizer=False)


def _ouro_hf() -> dict:
    from rltbench.models.configs import config_to_hf

    return config_to_hf(build_model("ouro-tiny").config)


@pytest.mark.parametrize("edit, match", [
    ({"intermediate_size": None}, "missing field 'intermediate_size'"),
    ({"hidden_size": "abc"}, "field 'hidden_size' must be a number"),
    ({"num_hidden_layers": 2.5}, "field 'num_hidden_layers' must be a number"),
    ({"rope_theta": "fast"}, "field 'rope_theta'"),
    ({"early_exit_threshold": "x"}, "field 'early_exit_threshold'"),
    ({"eos_token_id": "x"}, "eos_token_id"),
    ({"total_ut_steps": 0}, "loop"),
])
def test_bad_config_fields_are_named(edit, match, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_ouro_hf(), **edit}))
    with pytest.raises(UsageError, match=match):
        load_model(tmp_path, device="cpu", tokenizer=False)


def test_config_json_not_an_object_and_huginn_heads(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[1, 2]")
    with pytest.raises(UsageError, match="expected a JSON object"):
        config_from_hf(path)
    with pytest.raises(UsageError, match="multiple of the 5 heads"):
        config_from_hf({"model_type": "huginn_raven", "n_embd": 48, "n_heads": 5, "intermediate_size": 96,
                        "vocab_size": 256})


def test_bad_generation_config_eos(tmp_path):
    save_hf_checkpoint(build_model("ouro-tiny"), tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": ["x"]}))
    with pytest.raises(UsageError, match=r"generation_config\.json: eos_token_id"):
        load_model(tmp_path, device="cpu", tokenizer=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_device_without_gpu_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="no CUDA GPU"):
        build_model("ouro-tiny", device="cuda")
    save_hf_checkpoint(build_model("ouro-tiny"), tmp_path)
    with pytest.raises(UsageError, match="no CUDA GPU"):
        load_model(tmp_path, tokenizer=False)  # the default device is cuda


def test_zero_loop_ouro_is_refused():
    with pytest.raises(UsageError, match="loop"):
        build_model("ouro-tiny", num_loops=0)
    with pytest.raises(UsageError, match="num_kv_heads"):
        build_model("ouro-tiny", num_kv_heads=3)
