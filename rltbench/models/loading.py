"""Building models: real checkpoints (`load_model`), random weights (`build_model`), HF-layout export.

No `transformers`: config.json is parsed by `configs.config_from_hf`, tensors are read with
`safetensors` (single `model.safetensors` or sharded `model.safetensors.index.json`), the tokenizer with
`tokenizers`. Every problem with the files is a `UsageError` naming the file or tensor: a missing or
unexpected key, a wrong shape, a non-float dtype, a missing directory/file. There is no partial load.

Models are constructed on the meta device and materialised directly on the target device
(`to_empty`), so neither loading nor random init pays for a CPU-side initialisation of 1.4B params.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer as _HFTokenizer

from rltbench.errors import UsageError
from rltbench.models.base import LoopedModel
from rltbench.models.configs import (
    HuginnConfig,
    ModelConfig,
    OuroConfig,
    apply_overrides,
    config_from_hf,
    config_to_hf,
    dtype_from_name,
    get_config,
)
from rltbench.models.huginn import HuginnForCausalLM
from rltbench.models.ouro import OuroForCausalLM

_FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}
_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|end_turn|>", "<|end_text|>")


class Tokenizer:
    """Thin wrapper over `tokenizers.Tokenizer` with the model's stop ids."""

    def __init__(self, path: str | Path, eos_token_ids: Iterable[int] = (), bos_token_id: int | None = None):
        path = Path(path)
        if not path.is_file():
            raise UsageError(f"tokenizer file not found: {path}")
        try:
            self._tok = _HFTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a plain Exception on bad JSON
            raise UsageError(f"{path}: cannot load tokenizer ({exc})") from None
        self.path = path
        self.bos_token_id = bos_token_id
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(int(t) for t in eos_token_ids))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)


def _open_safetensors(path: Path) -> Any:
    """`safe_open` of one weights file; a corrupt or truncated file is a UsageError naming it."""
    try:
        return safe_open(str(path), framework="pt")
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own SafetensorError / OSError
        raise UsageError(f"{path}: not a readable safetensors file ({exc})") from None


def _check_device(device: torch.device | str) -> None:
    """A CUDA device on a machine without one: one clear line instead of torch's assertion."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device {str(device)!r} requested but no CUDA GPU is available (use device='cpu')")


def _model_class(config: ModelConfig) -> type[LoopedModel]:
    return OuroForCausalLM if isinstance(config, OuroConfig) else HuginnForCausalLM


def _materialise(config: ModelConfig, device: torch.device | str, dtype: torch.dtype) -> LoopedModel:
    _check_device(device)
    with torch.device("meta"):
        model = _model_class(config)(config, dtype=dtype)  # type: ignore[call-arg]
    model.to_empty(device=device)
    model.reset_buffers()
    return model


# ---- random weights -------------------------------------------------------------------------------------
@torch.no_grad()
def build_model(
    preset: str | ModelConfig,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    seed: int = 0,
    **overrides: Any,
) -> LoopedModel:
    """A model of preset `preset` (or a config) with random weights at the true shape, made on `device`.

    Linear/embedding weights ~ N(0, 0.02), norm weights ~ 1 + N(0, 0.1) (not exactly 1, so a wrong norm
    weight shows in tests), gate bias and qk_bias ~ N(0, 0.02); drawn in parameter order from a
    generator seeded with `seed` on `device` (so weights differ between CPU and CUDA builds).
    `overrides` are config fields (e.g. mean_recurrence=4, kv_layout="compress").
    """
    if isinstance(preset, str):
        config = get_config(preset, **overrides)
    else:
        config = apply_overrides(preset, **overrides)
    dtype = dtype or dtype_from_name(config.torch_dtype)
    model = _materialise(config, device, dtype)
    gen = torch.Generator(device=model.device).manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32)
        if p.ndim == 1 and not name.endswith("bias"):  # norm weights
            p.copy_(1.0 + 0.1 * noise)
        else:
            p.copy_(0.02 * noise)
    model.random_weights = True
    model.requires_grad_(False).eval()  # inference only: no autograd graph, fused ops accept the tensors
    return model


# ---- checkpoints ----------------------------------------------------------------------------------------
def _checkpoint_files(ckpt: Path) -> dict[str, Path]:
    """key -> safetensors file, from the index (sharded) or the single file's header."""
    index = ckpt / "model.safetensors.index.json"
    single = ckpt / "model.safetensors"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UsageError(f"{index}: not a valid safetensors index (no weight_map)") from None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise UsageError(f"{index}: weight_map must map tensor names to shard file names")
        files = {name: ckpt / name for name in set(weight_map.values())}
        for path in files.values():
            if not path.is_file():
                raise UsageError(f"checkpoint shard not found: {path}")
        located: dict[str, Path] = {}
        for path in sorted(files.values()):
            with _open_safetensors(path) as f:
                for key in f.keys():
                    located[key] = path
        for key, name in weight_map.items():
            if located.get(key) != files[name]:
                raise UsageError(f"{index}: tensor {key!r} is not in {name}")
        return located
    if single.is_file():
        with _open_safetensors(single) as f:
            return {key: single for key in f.keys()}
    raise UsageError(f"no model.safetensors or model.safetensors.index.json in {ckpt}")


def _validate(
    located: dict[str, Path],
    required: dict[str, tuple[int, ...]],
    optional: dict[str, tuple[int, ...]],
    optional_pred: Any,
    ckpt: Path,
) -> None:
    missing = sorted(set(required) - set(located))
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise UsageError(f"checkpoint {ckpt}: missing tensor {missing[0]!r}{more}")
    known = lambda k: k in required or k in optional or optional_pred(k)
    unexpected = sorted(k for k in located if not known(k))
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise UsageError(f"checkpoint {ckpt}: unexpected tensor {unexpected[0]!r}{more}")
    by_file: dict[Path, list[str]] = {}
    for key, path in located.items():
        by_file.setdefault(path, []).append(key)
    for path, keys in by_file.items():
        with _open_safetensors(path) as f:
            for key in keys:
                sl = f.get_slice(key)
                want = required.get(key) or optional.get(key)
                shape = tuple(sl.get_shape())
                if want is not None and shape != want:
                    raise UsageError(f"{path}: tensor {key!r} has shape {list(shape)}, expected {list(want)}")
                if sl.get_dtype() not in _FLOAT_DTYPES:
                    raise UsageError(f"{path}: tensor {key!r} has dtype {sl.get_dtype()}, expected a float")


def _eos_ids(ckpt: Path, config: ModelConfig, tokenizer: Tokenizer | None) -> tuple[int, ...]:
    ids = list(config.eos_token_ids)
    gen = ckpt / "generation_config.json"
    if gen.is_file():
        try:
            value = json.loads(gen.read_text()).get("eos_token_id")
        except (json.JSONDecodeError, AttributeError):
            raise UsageError(f"{gen}: not valid JSON (an object with eos_token_id)") from None
        value = [value] if isinstance(value, int) else (value or [])
        if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
            raise UsageError(f"{gen}: eos_token_id must be an integer or a list of integers, got {value!r}")
        ids += value
    if tokenizer is not None:
        ids += [t for t in (tokenizer.token_to_id(s) for s in _END_TOKENS) if t is not None]
    return tuple(dict.fromkeys(int(i) for i in ids))


@torch.no_grad()
def load_model(
    ckpt_dir: str | Path,
    device: torch.device | str = "cuda",
    dtype: torch.dtype | None = None,
    *,
    tokenizer: bool = True,
    **overrides: Any,
) -> tuple[LoopedModel, Tokenizer | None]:
    """(model, tokenizer) from an HF directory: config.json, safetensors weights, tokenizer.json.

    `dtype` None = the config's `torch_dtype`. `overrides` are config fields (e.g. Huginn
    mean_recurrence / kv_layout / state_noise, Ouro early_exit_threshold). `tokenizer=False` skips
    tokenizer.json (returns None for it). Stop ids = config eos + generation_config.json eos + the
    tokenizer's end-of-turn tokens present in its vocabulary.
    """
    ckpt = Path(ckpt_dir)
    if not ckpt.is_dir():
        raise UsageError(f"checkpoint directory not found: {ckpt}")
    config = apply_overrides(config_from_hf(ckpt / "config.json"), **overrides)
    tok = None
    if tokenizer:
        tok = Tokenizer(ckpt / "tokenizer.json", bos_token_id=config.bos_token_id)
    config.eos_token_ids = _eos_ids(ckpt, config, tok)
    if tok is not None:
        tok.eos_token_ids = config.eos_token_ids
    located = _checkpoint_files(ckpt)
    if isinstance(config, OuroConfig):
        required = OuroForCausalLM.hf_key_shapes(config)
        optional: dict[str, tuple[int, ...]] = {}
        if config.tie_word_embeddings:
            optional["lm_head.weight"] = (config.vocab_size, config.hidden_size)
        pred = lambda k: OuroForCausalLM.is_optional_hf_key(config, k)
    else:
        required = HuginnForCausalLM.hf_key_shapes(config)
        optional = HuginnForCausalLM.optional_hf_key_shapes(config)
        pred = lambda k: False
    _validate(located, required, optional, pred, ckpt)
    model = _materialise(config, device, dtype or dtype_from_name(config.torch_dtype))
    handles: dict[Path, Any] = {}
    try:
        for path in set(located.values()):
            handles[path] = _open_safetensors(path).__enter__()
        get = lambda key: handles[located[key]].get_tensor(key)
        if isinstance(model, HuginnForCausalLM):
            model.load_hf_tensors(get, present=set(located))
        else:
            model.load_hf_tensors(get)
    finally:
        for h in handles.values():
            h.__exit__(None, None, None)
    model.random_weights = False
    model.requires_grad_(False).eval()
    return model, tok


def save_hf_checkpoint(model: LoopedModel, out_dir: str | Path, max_shard_bytes: int | None = None) -> Path:
    """Write config.json + safetensors in the HF key layout (sharded with an index when the weights exceed
    `max_shard_bytes`). For fixtures and tests; no tokenizer is written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # A previous save's index or shards would shadow (index) or sit beside the new weights: the
    # loader prefers an index, so a stale one silently loads the old model.
    stale = [
        out / "model.safetensors.index.json",
        out / "model.safetensors",
        *out.glob("model-*-of-*.safetensors"),
    ]
    for path in stale:
        if path.is_file():
            path.unlink()
    hf_config = config_to_hf(model.config)
    hf_config["torch_dtype"] = str(model.dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(hf_config, indent=2))
    sd = {k: v.cpu() for k, v in model.hf_state_dict().items()}
    total = sum(t.numel() * t.element_size() for t in sd.values())
    if max_shard_bytes is None or total <= max_shard_bytes:
        save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
        return out
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, t in sd.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = t
        size += nbytes
    weight_map = {}
    width = max(5, int(math.log10(len(shards))) + 1)
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:0{width}d}-of-{len(shards):0{width}d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return out


__all__ = ["HuginnConfig", "OuroConfig", "Tokenizer", "build_model", "load_model", "save_hf_checkpoint"]


def cpu_size_note(model: torch.nn.Module, limit_params: int = 50_000_000) -> str | None:
    """A one-line warning when a full-size model runs on the CPU (hours per benchmark), else None.

    Commands print it before long work so a user who forgot `--device cuda` or meant a tiny
    preset finds out at once rather than after an hour."""
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu":
        return None
    n = sum(p.numel() for p in model.parameters())
    if n <= limit_params:
        return None
    return (
        f"{n / 1e9:.2f}B parameters on the CPU: every token runs all loops of the model here, so this "
        "will be very slow; use a GPU (--device cuda) or a tiny preset (--model ouro-tiny / huginn-tiny)"
    )
