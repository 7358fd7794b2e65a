"""HF checkpoint layout: save a random tiny model, load it back (single file and sharded), and every
loader error is a UsageError naming the problem."""

from __future__ import annotations

import json

import pytest
import torch
from models_testutil import random_prompt, run_prefill
from safetensors.torch import load_file, save_file

from rltbench.errors import UsageError
from rltbench.models import HuginnForCausalLM, OuroForCausalLM, build_model, load_model, save_hf_checkpoint
from rltbench.models.loading import Tokenizer


def _write_tokenizer(path, extra=("<|im_end|>", "<|end_turn|>")):
    from tokenizers import Tokenizer as T
    from tokenizers import models, pre_tokenizers

    vocab = {"<unk>": 0, "hello": 1, "world": 2, **{w: 3 + i for i, w in enumerate(extra)}}
    tok = T(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(list(extra))
    tok.save(str(path))


def _save(model, tmp_path, shard=None, tokenizer=True):
    out = save_hf_checkpoint(model, tmp_path / "ckpt", max_shard_bytes=shard)
    if tokenizer:
        _write_tokenizer(out / "tokenizer.json")
    return out


@pytest.mark.parametrize("shard", [None, 20_000])
@pytest.mark.parametrize("name", ["ouro-tiny", "huginn-tiny"])
def test_round_trip(name, shard, tmp_path, ref_ops):
    model = build_model(name, seed=21)
    ckpt = _save(model, tmp_path, shard)
    sharded = (ckpt / "model.safetensors.index.json").is_file()
    assert sharded == (shard is not None) and (not sharded or len(list(ckpt.glob("model-*"))) > 1)
    loaded, tok = load_model(ckpt, device="cpu")
    assert type(loaded) is type(model) and not loaded.random_weights and model.random_weights
    assert loaded.dtype == torch.float32 and loaded.config.num_kv_planes == model.config.num_kv_planes
    for (k1, v1), (k2, v2) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert k1 == k2 and torch.equal(v1, v2), k1
    prompt = random_prompt(7, seed=21)
    assert torch.equal(run_prefill(model, [prompt], ref_ops)[0], run_prefill(loaded, [prompt], ref_ops)[0])
    assert tok.encode("hello world") == [1, 2] and tok.decode([1, 2]) == "hello world"
    assert {3, 4} <= set(tok.eos_token_ids) and set(model.config.eos_token_ids) <= set(tok.eos_token_ids)


def test_hf_key_layout_ouro(tmp_path):
    model = build_model("ouro-tiny", seed=1)
    sd = load_file(str(_save(model, tmp_path) / "model.safetensors"))
    assert set(sd) == set(OuroForCausalLM.hf_key_shapes(model.config))
    assert "model.layers.1.self_attn.q_proj.weight" in sd and "model.layers.0.mlp.up_proj.weight" in sd
    layer = model.layers[1]
    q = model.config.num_heads * model.config.head_dim
    assert torch.equal(sd["model.layers.1.self_attn.k_proj.weight"], layer.qkv_proj[q:2 * q])
    assert torch.equal(sd["model.layers.1.mlp.up_proj.weight"], layer.gate_up_proj[128:])
    assert sd["model.early_exit_gate.bias"].shape == (1,)


def test_hf_key_layout_huginn_and_dtype(tmp_path):
    model = build_model("huginn-tiny", dtype=torch.bfloat16, seed=1)
    ckpt = _save(model, tmp_path)
    sd = load_file(str(ckpt / "model.safetensors"))
    assert set(sd) == set(HuginnForCausalLM.hf_key_shapes(model.config)) | {"lm_head.weight", "freqs_cis"}
    assert sd["transformer.core_block.3.attn.qk_bias"].shape == (2, 1, 4, 12)
    assert sd["freqs_cis"].dtype == torch.float32 and sd["transformer.wte.weight"].dtype == torch.bfloat16
    loaded, _ = load_model(ckpt, device="cpu")  # dtype from config.json
    assert loaded.dtype == torch.bfloat16
    as32, _ = load_model(ckpt, device="cpu", dtype=torch.float32, mean_recurrence=5, kv_layout="compress")
    assert as32.dtype == torch.float32 and as32.config.mean_recurrence == 5 and as32.config.num_kv_planes == 8


def test_huginn_freqs_cis_is_used(tmp_path, ref_ops):
    model = build_model("huginn-tiny", seed=2)
    ckpt = _save(model, tmp_path)
    sd = load_file(str(ckpt / "model.safetensors"))
    sd["freqs_cis"] = sd["freqs_cis"].flip(1).contiguous()  # a different table must change the result
    save_file(sd, str(ckpt / "model.safetensors"))
    loaded, _ = load_model(ckpt, device="cpu")
    assert torch.equal(loaded.rope_cos, sd["freqs_cis"][0, :, 0, :, 0])
    del sd["freqs_cis"], sd["lm_head.weight"]  # both optional
    save_file(sd, str(ckpt / "model.safetensors"))
    loaded, _ = load_model(ckpt, device="cpu")
    assert torch.equal(loaded.rope_cos, model.rope_cos)


def _edit(ckpt, fn):
    path = ckpt / "model.safetensors"
    sd = load_file(str(path))
    fn(sd)
    save_file(sd, str(path))


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda sd: sd.pop("model.layers.1.mlp.up_proj.weight"), "missing tensor 'model.layers.1.mlp.up_"),
        (lambda sd: sd.update({"model.layers.9.extra.weight": torch.zeros(2)}), "unexpected tensor"),
        (lambda sd: sd.update({"model.norm.weight": torch.zeros(3)}), "'model.norm.weight' has shape"),
        (lambda sd: sd.update({"model.norm.weight": torch.zeros(64, dtype=torch.int32)}), "dtype"),
    ],
)
def test_loader_errors(edit, match, tmp_path):
    ckpt = _save(build_model("ouro-tiny", seed=3), tmp_path)
    _edit(ckpt, edit)
    with pytest.raises(UsageError, match=match):
        load_model(ckpt, device="cpu")


def test_optional_ouro_keys_accepted(tmp_path):
    ckpt = _save(build_model("ouro-tiny", seed=3), tmp_path)
    _edit(ckpt, lambda sd: sd.update({"model.rotary_emb.inv_freq": torch.zeros(8)}))
    load_model(ckpt, device="cpu")


def test_missing_files(tmp_path):
    with pytest.raises(UsageError, match="directory not found"):
        load_model(tmp_path / "nope", device="cpu")
    ckpt = _save(build_model("huginn-tiny", seed=3), tmp_path, shard=20_000)
    shard = sorted(ckpt.glob("model-*.safetensors"))[0]
    shard.rename(shard.with_suffix(".bak"))
    with pytest.raises(UsageError, match="shard not found"):
        load_model(ckpt, device="cpu")
    (ckpt / "model.safetensors.index.json").unlink()
    with pytest.raises(UsageError, match="no model.safetensors"):
        load_model(ckpt, device="cpu")
    (ckpt / "tokenizer.json").unlink()
    with pytest.raises(UsageError, match="tokenizer"):
        load_model(ckpt, device="cpu")
    (ckpt / "config.json").unlink()
    with pytest.raises(UsageError, match="config"):
        load_model(ckpt, device="cpu")


def test_index_pointing_to_wrong_shard(tmp_path):
    ckpt = _save(build_model("ouro-tiny", seed=3), tmp_path, shard=20_000)
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    names = sorted(set(index["weight_map"].values()))
    key = next(k for k, v in index["weight_map"].items() if v == names[0])
    index["weight_map"][key] = names[1]
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UsageError, match=key):
        load_model(ckpt, device="cpu")


def test_tokenizer_wrapper_errors(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        Tokenizer(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UsageError, match="cannot load"):
        Tokenizer(tmp_path / "bad.json")


def test_load_without_tokenizer_and_generation_config(tmp_path):
    model = build_model("ouro-tiny", seed=4)
    ckpt = _save(model, tmp_path, tokenizer=False)
    (ckpt / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 6]}))
    loaded, tok = load_model(ckpt, device="cpu", tokenizer=False)
    assert tok is None and loaded.config.eos_token_ids == (0, 5, 6)
