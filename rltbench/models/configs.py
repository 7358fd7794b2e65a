"""Model configurations: one dataclass per family, named presets, and parsing of HF `config.json`.

The published numbers come from the models' own HF configs (docs/contracts/models.md). Tiny presets keep
the real structure (Ouro: sandwich layers looped; Huginn: 2 prelude + 4 core x r + 2 coda) at widths
that run in seconds on a CPU, so every code path is exercised by the CPU tests.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import torch

from rltbench.errors import UsageError

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def dtype_from_name(name: str) -> torch.dtype:
    """Map a config/CLI dtype name (`bfloat16`, `bf16`, `float32`, ...) to a torch dtype."""
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
               "float": "float32"}
    key = aliases.get(name, name)
    if key not in _DTYPES:
        raise UsageError(f"unknown dtype {name!r}; use one of: {', '.join(_DTYPES)}")
    return _DTYPES[key]


@dataclass
class OuroConfig:
    """Ouro (LoopLM): `num_layers` weight-shared sandwich layers applied `num_loops` times."""

    name: str = "ouro"
    hidden_size: int = 2048
    intermediate_size: int = 5632
    num_layers: int = 24
    num_loops: int = 4
    num_heads: int = 16
    num_kv_heads: int = 16
    head_dim: int = 128
    vocab_size: int = 49152
    max_position_embeddings: int = 65536
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    # the exit gate's threshold, read by the reference rule (rltbench.models.ouro, "Exit gate"); a
    # checkpoint's value as it is, 1.0 included; None (the presets): no gate, every token takes the last loop
    early_exit_threshold: float | None = None
    # a reading option, not in HF configs: ignore the threshold, every token takes the last loop (how vLLM
    # reads the released 1.0); `gate_threshold` is then None
    never_exit: bool = False
    # a serving option, not in HF configs: stop a decode step's loops once every row has exited
    # (rltbench.models.ouro, "Compute-saving exit")
    stop_at_exit: bool = False
    torch_dtype: str = "bfloat16"
    bos_token_id: int | None = 0
    eos_token_ids: tuple[int, ...] = (0, 2)
    family: str = field(default="ouro", init=False)

    @property
    def num_kv_planes(self) -> int:
        """One KV plane per (loop, layer): plane = loop * num_layers + layer."""
        return self.num_loops * self.num_layers

    @property
    def num_layer_applications(self) -> int:
        return self.num_loops * self.num_layers

    @property
    def gate_threshold(self) -> float | None:
        """The threshold the exit gate is evaluated with; None: no gate (fixed depth, the last loop)."""
        return None if self.never_exit else self.early_exit_threshold

    def validate(self) -> None:
        """Structural sanity (a zero-loop model would silently return its embeddings)."""
        if self.num_loops < 1 or self.num_layers < 1:
            raise UsageError(f"Ouro needs >= 1 layer and >= 1 loop, got {self.num_layers} layers x "
                             f"{self.num_loops} loops")
        if self.early_exit_threshold is not None and not math.isfinite(self.early_exit_threshold):
            raise UsageError(f"Ouro early_exit_threshold {self.early_exit_threshold}: must be finite")
        if self.stop_at_exit and self.never_exit:
            raise UsageError("--exit-mode stop needs the exit gate, which --never-exit ignores: give one")
        if self.stop_at_exit and self.gate_threshold is None:
            raise UsageError("stopping at the exit needs an exit threshold (--exit-threshold)")
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise UsageError(f"Ouro num_heads {self.num_heads} must be a multiple of num_kv_heads "
                             f"{self.num_kv_heads}")


def exit_rule(config: OuroConfig, dtype: str) -> str:
    """One line for manifests and tables: how this Ouro model picks each token's loop, in the words a user
    reads next to the results (the threshold 1.0 means different things in the reference and vLLM)."""
    q, loops = config.early_exit_threshold, config.num_loops
    if config.never_exit:
        held = "" if q is None else f"; the threshold {q} is read as never, as vLLM does"
        return f"exit gate ignored (--never-exit): every token takes the last of {loops} loops{held}"
    if q is None:
        return f"exit gate off (no threshold): every token takes the last of {loops} loops"
    return (f"exit threshold {q}: each token exits at the first of {loops} loops whose cumulative exit "
            f"probability, in {dtype}, reaches it (the reference rule, 1.0 included; --never-exit takes the "
            "last loop)")


KV_LAYOUTS = ("full", "compress")
STATE_NOISE = ("position", "random", "zero")


@dataclass
class HuginnConfig:
    """Huginn-0125 (Raven): prelude, a 4-layer core block iterated `mean_recurrence` times, coda."""

    name: str = "huginn"
    hidden_size: int = 5280
    intermediate_size: int = 17920
    num_prelude: int = 2
    num_core: int = 4
    num_coda: int = 2
    mean_recurrence: int = 32
    num_heads: int = 55
    num_kv_heads: int = 55
    head_dim: int = 96
    vocab_size: int = 65536
    max_position_embeddings: int = 4096  # `block_size`: length of the RoPE table
    rope_theta: float = 50_000.0
    rms_norm_eps: float = 1e-6
    qk_bias: bool = True
    # HF `tie_embeddings`: the LM head is `wte` (the released model); False: its own `lm_head.weight`
    tie_embeddings: bool = True
    kv_layout: str = "full"
    state_noise: str = "position"
    state_seed: int = 0
    torch_dtype: str = "bfloat16"
    bos_token_id: int | None = 65504
    eos_token_ids: tuple[int, ...] = (65505, 65508)
    family: str = field(default="huginn", init=False)

    @property
    def embed_scale(self) -> float:
        """sqrt(n_embd): applied to the embeddings and to the initial random state."""
        return math.sqrt(self.hidden_size)

    @property
    def init_std(self) -> float:
        """HF `init_values["std"]` = sqrt(2 / (5 * n_embd)) (the random state's std before scaling)."""
        return math.sqrt(2.0 / (5.0 * self.hidden_size))

    @property
    def num_kv_planes(self) -> int:
        """full: 2 + 4r + 2 planes (one per layer application); compress: one per physical layer."""
        if self.kv_layout == "compress":
            return self.num_prelude + self.num_core + self.num_coda
        return self.num_prelude + self.num_core * self.mean_recurrence + self.num_coda

    @property
    def num_layer_applications(self) -> int:
        return self.num_prelude + self.num_core * self.mean_recurrence + self.num_coda

    def validate(self) -> None:
        if self.kv_layout not in KV_LAYOUTS:
            raise UsageError(f"unknown Huginn kv_layout {self.kv_layout!r}; use one of: "
                             f"{', '.join(KV_LAYOUTS)}")
        if self.state_noise not in STATE_NOISE:
            raise UsageError(f"unknown Huginn state_noise {self.state_noise!r}; use one of: "
                             f"{', '.join(STATE_NOISE)}")
        if self.mean_recurrence < 1:
            raise UsageError(f"Huginn recurrence must be >= 1, got {self.mean_recurrence}")


ModelConfig = Union[OuroConfig, HuginnConfig]

_PRESETS: dict[str, ModelConfig] = {
    "ouro-1.4b": OuroConfig(name="ouro-1.4b"),
    "ouro-2.6b": OuroConfig(name="ouro-2.6b", num_layers=48),
    "huginn-0125": HuginnConfig(name="huginn-0125"),
    "ouro-tiny": OuroConfig(
        name="ouro-tiny", hidden_size=64, intermediate_size=128, num_layers=2, num_loops=3, num_heads=4,
        num_kv_heads=4, head_dim=16, vocab_size=256, max_position_embeddings=512, eos_token_ids=(0,),
        torch_dtype="float32",
    ),
    "huginn-tiny": HuginnConfig(
        name="huginn-tiny", hidden_size=48, intermediate_size=96, mean_recurrence=3, num_heads=4,
        num_kv_heads=4, head_dim=12, vocab_size=256, max_position_embeddings=512, bos_token_id=1,
        eos_token_ids=(2,), torch_dtype="float32",
    ),
}


def list_presets() -> list[str]:
    """Names accepted by `get_config` / `build_model`."""
    return list(_PRESETS)


def get_config(name: str, **overrides: Any) -> ModelConfig:
    """A fresh copy of preset `name`, with dataclass fields overridden (e.g. mean_recurrence=8)."""
    if name not in _PRESETS:
        raise UsageError(f"unknown model preset {name!r}; presets: {', '.join(_PRESETS)}")
    return apply_overrides(_PRESETS[name], **overrides)


def apply_overrides(config: ModelConfig, **overrides: Any) -> ModelConfig:
    """Copy `config` with the non-None `overrides`; unknown field names are a UsageError."""
    names = {f.name for f in dataclasses.fields(config) if f.init}
    clean = {k: v for k, v in overrides.items() if v is not None}
    bad = sorted(set(clean) - names)
    if bad:
        raise UsageError(f"unknown {config.family} config field(s): {', '.join(bad)}")
    out = dataclasses.replace(config, **clean)
    out.validate()
    return out


def _eos_tuple(value: Any, where: str = "config.json") -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) for v in value):
        raise UsageError(f"{where}: field 'eos_token_id' must be an integer or a list of integers, "
                         f"got {value!r}")
    return tuple(int(v) for v in value)


def _need(cfg: dict[str, Any], key: str, where: str) -> Any:
    if cfg.get(key) is None:
        raise UsageError(f"{where}: missing field {key!r}")
    return cfg[key]


def _typed(where: str, key: str, value: Any, cast: Any) -> Any:
    """`cast(value)`, or a UsageError naming the config.json field (never a bare int() traceback)."""
    if isinstance(value, bool) or (cast is int and isinstance(value, float) and not value.is_integer()):
        raise UsageError(f"{where}: field {key!r} must be a number, got {value!r}")
    try:
        return cast(value)
    except (TypeError, ValueError):
        raise UsageError(f"{where}: field {key!r} must be a number, got {value!r}") from None


def _int(hf: dict[str, Any], key: str, where: str, default: Any = ...) -> int:
    """Integer field `key` (required when no default; null counts as absent)."""
    value = _need(hf, key, where) if default is ... else (hf.get(key) if hf.get(key) is not None else default)
    return _typed(where, key, value, int)


def _float(hf: dict[str, Any], key: str, where: str, default: float) -> float:
    value = hf.get(key)
    return _typed(where, key, default if value is None else value, float)


def config_from_hf(hf: dict[str, Any] | str | Path, name: str | None = None) -> ModelConfig:
    """Build a config from an HF `config.json` (dict or path) of Ouro (`ouro`) or Huginn (`huginn_raven`)."""
    where = "config.json"
    if not isinstance(hf, dict):
        path = Path(hf)
        where = str(path)
        if not path.is_file():
            raise UsageError(f"config file not found: {path}")
        try:
            hf = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}: not valid JSON ({exc.msg})") from None
    if not isinstance(hf, dict):
        raise UsageError(f"{where}: expected a JSON object, got {type(hf).__name__}")
    model_type = hf.get("model_type", "")
    archs = hf.get("architectures") or []
    if model_type == "ouro" or "OuroForCausalLM" in archs:
        return _ouro_from_hf(hf, where, name)
    if model_type == "huginn_raven" or "RavenForCausalLM" in archs:
        return _huginn_from_hf(hf, where, name)
    raise UsageError(f"{where}: unsupported model_type {model_type!r} (supported: ouro, huginn_raven)")


def _ouro_from_hf(hf: dict[str, Any], where: str, name: str | None) -> OuroConfig:
    if hf.get("rope_scaling"):
        raise UsageError(f"{where}: rope_scaling {hf['rope_scaling']!r} is not supported (default RoPE only)")
    if hf.get("use_sliding_window"):
        raise UsageError(f"{where}: sliding-window attention is not supported")
    hidden = _int(hf, "hidden_size", where)
    heads = _int(hf, "num_attention_heads", where)
    threshold = hf.get("early_exit_threshold")
    threshold = None if threshold is None else _typed(where, "early_exit_threshold", threshold, float)
    if threshold is not None and not math.isfinite(threshold):
        raise UsageError(f"{where}: field 'early_exit_threshold' must be a finite number, got {threshold}")
    return OuroConfig(
        name=name or hf.get("_name_or_path") or "ouro",
        hidden_size=hidden,
        intermediate_size=_int(hf, "intermediate_size", where),
        num_layers=_int(hf, "num_hidden_layers", where),
        num_loops=_int(hf, "total_ut_steps", where, 4),
        num_heads=heads,
        num_kv_heads=_int(hf, "num_key_value_heads", where, heads),
        head_dim=_int(hf, "head_dim", where, hidden // max(1, heads)),
        vocab_size=_int(hf, "vocab_size", where),
        max_position_embeddings=_int(hf, "max_position_embeddings", where, 65536),
        rope_theta=_float(hf, "rope_theta", where, 10000.0),
        rms_norm_eps=_float(hf, "rms_norm_eps", where, 1e-6),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        # as the reference reads it: 1.0 (the released config) is a threshold too (never_exit reads it
        # as "last loop", as vLLM does)
        early_exit_threshold=threshold,
        torch_dtype=str(hf.get("torch_dtype") or hf.get("dtype") or "bfloat16"),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=_eos_tuple(hf.get("eos_token_id"), where),
    )


def _huginn_from_hf(hf: dict[str, Any], where: str, name: str | None) -> HuginnConfig:
    hidden = _int(hf, "n_embd", where) if hf.get("n_embd") is not None else _int(hf, "hidden_size", where)
    heads = _int(hf, "n_heads", where) if hf.get("n_heads") is not None else _int(hf, "num_attention_heads",
                                                                                    where)
    if heads < 1 or hidden % heads:
        raise UsageError(f"{where}: hidden size {hidden} is not a multiple of the {heads} heads")
    if hf.get("injection_type", "linear") != "linear":
        raise UsageError(f"{where}: injection_type {hf['injection_type']!r} is not supported (linear only)")
    if hf.get("bias"):
        raise UsageError(f"{where}: Linear biases (bias=true) are not supported")
    cfg = HuginnConfig(
        name=name or hf.get("_name_or_path") or "huginn",
        hidden_size=hidden,
        intermediate_size=_int(hf, "intermediate_size", where),
        num_prelude=_int(hf, "n_layers_in_prelude", where, 2),
        num_core=_int(hf, "n_layers_in_recurrent_block", where, 4),
        num_coda=_int(hf, "n_layers_in_coda", where, 2),
        mean_recurrence=_int(hf, "mean_recurrence", where, 32),
        num_heads=heads,
        num_kv_heads=_int(hf, "num_key_value_heads", where, heads),
        head_dim=hidden // heads,
        vocab_size=(_int(hf, "padded_vocab_size", where) if hf.get("padded_vocab_size") is not None
                    else _int(hf, "vocab_size", where)),
        max_position_embeddings=_int(hf, "block_size", where, 4096),
        rope_theta=_float(hf, "rope_base", where, 50_000.0),
        rms_norm_eps=_float(hf, "norm_eps", where, 1e-6),
        qk_bias=bool(hf.get("qk_bias", True)),
        tie_embeddings=bool(hf.get("tie_embeddings", hf.get("tie_word_embeddings", True))),
        torch_dtype=str(hf.get("torch_dtype") or hf.get("dtype") or "bfloat16"),
        bos_token_id=hf.get("bos_token_id", 65504),
        eos_token_ids=_eos_tuple(hf.get("eos_token_id", (65505, 65508)), where),
    )
    if cfg.num_kv_heads != cfg.num_heads:
        raise UsageError(f"{where}: Huginn with num_key_value_heads != n_heads is not supported")
    return cfg


def config_to_hf(config: ModelConfig) -> dict[str, Any]:
    """The HF `config.json` dict for `config` (used by `save_hf_checkpoint`; round-trips `config_from_hf`)."""
    if isinstance(config, OuroConfig):
        return {
            "architectures": ["OuroForCausalLM"], "model_type": "ouro", "_name_or_path": config.name,
            "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
            "num_hidden_layers": config.num_layers, "total_ut_steps": config.num_loops,
            "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
            "head_dim": config.head_dim, "vocab_size": config.vocab_size,
            "max_position_embeddings": config.max_position_embeddings, "rope_theta": config.rope_theta,
            "rope_scaling": None, "rms_norm_eps": config.rms_norm_eps, "hidden_act": "silu",
            "tie_word_embeddings": config.tie_word_embeddings, "use_sliding_window": False,
            "early_exit_threshold": config.early_exit_threshold,  # null: no gate, in the reference too
            "torch_dtype": config.torch_dtype, "bos_token_id": config.bos_token_id,
            "eos_token_id": list(config.eos_token_ids),
        }
    return {
        "architectures": ["RavenForCausalLM"], "model_type": "huginn_raven", "_name_or_path": config.name,
        "n_embd": config.hidden_size, "intermediate_size": config.intermediate_size,
        "n_layers_in_prelude": config.num_prelude, "n_layers_in_recurrent_block": config.num_core,
        "n_layers_in_coda": config.num_coda, "mean_recurrence": config.mean_recurrence,
        "n_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "vocab_size": config.vocab_size, "padded_vocab_size": config.vocab_size,
        "block_size": config.max_position_embeddings, "rope_base": config.rope_theta,
        "norm_eps": config.rms_norm_eps, "qk_bias": config.qk_bias, "bias": False,
        "tie_embeddings": config.tie_embeddings, "tie_word_embeddings": config.tie_embeddings,
        "injection_type": "linear", "torch_dtype": config.torch_dtype, "bos_token_id": config.bos_token_id,
        "eos_token_id": list(config.eos_token_ids),
    }
