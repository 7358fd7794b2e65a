"""Looped language models (Ouro, Huginn): configs/presets, forward over flattened tokens, loading.

Public API (DESIGN.md section 2): `get_config`, `list_presets`, `build_model`, `load_model`,
`save_hf_checkpoint`, `DenseKVCache`, the model classes and `Tokenizer`.
"""

from rltbench.models.configs import (
    HuginnConfig,
    ModelConfig,
    OuroConfig,
    config_from_hf,
    get_config,
    list_presets,
)
from rltbench.models.dense_kv import DenseKVCache
from rltbench.models.huginn import HuginnForCausalLM
from rltbench.models.loading import Tokenizer, build_model, cpu_size_note, load_model, save_hf_checkpoint
from rltbench.models.ouro import OuroForCausalLM

__all__ = [
    "DenseKVCache",
    "HuginnConfig",
    "HuginnForCausalLM",
    "ModelConfig",
    "OuroConfig",
    "OuroForCausalLM",
    "Tokenizer",
    "build_model",
    "config_from_hf",
    "cpu_size_note",
    "get_config",
    "list_presets",
    "load_model",
    "save_hf_checkpoint",
]
