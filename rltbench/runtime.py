"""What every command sets up the same way: device and dtype, the model, and the engine with its KV pool.

Why one module: `--device`, `--dtype` and `--weights` must mean the same thing in every command, and a
KV pool must be sized the same way wherever a load is served. Everything that can be checked without
weights (device, dtype, preset or checkpoint config) is checked by `check` before any run directory
exists, and fails as one UsageError line. The options themselves are declared in rltbench.options
(torch-free, so that every command's --help is instant).

- device: `auto` (or none given) = cuda when a GPU is visible, else cpu; cuda without a GPU is an error.
- dtype: `auto` = bf16 on CUDA, fp32 on the CPU; bf16/fp16/fp32 (the names help shows in every command)
  and the torch names (bfloat16, float16, float32) are accepted.
- model: `--weights random` builds preset `--model` with weights drawn from `--seed`; `--weights DIR`
  loads an HF checkpoint directory (config.json + safetensors).
- engine: `build_engine` sizes a CPU pool to what the load needs (and refuses one that cannot fit in
  memory), and refuses a pool smaller than the load instead of shrinking the load.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from rltbench.arms import ArmSpec
from rltbench.engine.engine import Engine
from rltbench.engine.paged_context import kv_bytes_per_block
from rltbench.engine.types import EngineConfig
from rltbench.errors import UsageError
from rltbench.models import build_model, config_from_hf, cpu_size_note, get_config, load_model
from rltbench.models.configs import ModelConfig, apply_overrides, dtype_from_name
from rltbench.options import AUTO

CPU_MIN_BLOCKS = 64  # a CPU pool sized to the load never goes below this (tiny loads, tests)
CPU_MEMORY_SHARE = 0.8  # a CPU pool may take at most this share of the memory the OS can give


def resolve_device(device: str | None) -> str:
    """`auto`/None -> cuda if a GPU is visible, else cpu; a cuda device without CUDA is a UsageError."""
    if device in (None, AUTO):
        return "cuda" if torch.cuda.is_available() else "cpu"
    dev = device
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {dev}: CUDA is not available on this machine")
    if not (dev == "cpu" or dev.startswith("cuda")):
        raise UsageError(f"--device {dev}: expected auto, cpu, cuda or cuda:N")
    return dev


def resolve_dtype(dtype: str | None, device: str) -> torch.dtype:
    """`auto`/None -> bfloat16 on CUDA, float32 on the CPU; else the named dtype (UsageError if unknown)."""
    if dtype in (None, AUTO):
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        return dtype_from_name(dtype)
    except UsageError:
        raise UsageError(f"--dtype {dtype}: use auto, bf16, fp16 or fp32 (bfloat16, float16, float32 "
                         "are accepted too)") from None


def dtype_name(dtype: torch.dtype) -> str:
    """'bfloat16' for torch.bfloat16: how manifests and tables name a dtype."""
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class ModelSource:
    """Which model to run: preset `preset` with seeded random weights, or the checkpoint `weights`;
    `kv_layout` overrides a Huginn model's KV layout (full: one plane per layer application, or
    compress), None keeps the model's own; `exit_threshold` sets an Ouro model's exit gate (each token
    takes the first loop whose exit CDF reaches it), None keeps the model's own (a checkpoint's value,
    1.0 included, read by the reference rule); `never_exit` ignores the gate (every token takes the last
    loop: vLLM's reading of 1.0); `stop_at_exit` turns on the compute-saving exit (decode steps stop once
    every row has exited; rltbench.engine.exit_stop)."""

    preset: str = "ouro-1.4b"
    weights: str = "random"
    seed: int = 0
    kv_layout: str | None = None
    exit_threshold: float | None = None
    stop_at_exit: bool = False
    never_exit: bool = False

    @property
    def random(self) -> bool:
        return self.weights == "random"

    @property
    def label(self) -> str:
        """How manifests name the model: the preset, or the checkpoint directory."""
        return self.preset if self.random else f"{self.weights} (checkpoint)"

    @property
    def overrides(self) -> dict[str, Any]:
        """The config fields this source overrides, as the model builders take them."""
        out: dict[str, Any] = {} if self.kv_layout is None else {"kv_layout": self.kv_layout}
        if self.exit_threshold is not None:
            out["early_exit_threshold"] = self.exit_threshold
        if self.stop_at_exit:
            out["stop_at_exit"] = True
        if self.never_exit:
            out["never_exit"] = True
        return out

    def config(self) -> ModelConfig:
        """The model's config without its weights: bad presets, checkpoints and overrides fail here, early."""
        if self.random:
            config = get_config(self.preset)  # lists the presets for an unknown name
        else:
            ckpt = Path(self.weights)
            if not ckpt.is_dir():
                raise UsageError(
                    f"--weights {self.weights}: not a checkpoint directory (or use --weights random)"
                )
            if not (ckpt / "config.json").is_file():
                raise UsageError(f"--weights {self.weights}: no config.json there (or use --weights random)")
            config = config_from_hf(ckpt / "config.json")
        if self.kv_layout is not None and config.family != "huginn":
            raise UsageError(f"--kv-layout is a Huginn option; {config.name} is {config.family}")
        if self.exit_threshold is not None:
            if config.family != "ouro":
                raise UsageError(f"--exit-threshold is an Ouro option; {config.name} is {config.family}")
            if not 0.0 < self.exit_threshold <= 1.0:
                raise UsageError(f"--exit-threshold {self.exit_threshold:g}: must lie in (0, 1]")
            if self.never_exit:
                raise UsageError("--exit-threshold and --never-exit: give one (--never-exit ignores it)")
        if self.never_exit and config.family != "ouro":
            raise UsageError(f"--never-exit is an Ouro option; {config.name} is {config.family}")
        if self.stop_at_exit and config.family != "ouro":  # (OuroConfig.validate wants a threshold)
            raise UsageError(f"--exit-mode is an Ouro option; {config.name} is {config.family}")
        return apply_overrides(config, **self.overrides) if self.overrides else config


def check(source: ModelSource, device: str | None, dtype: str | None) -> tuple[str, torch.dtype, ModelConfig]:
    """Device, dtype and model config, resolved without building anything (fails as a UsageError)."""
    dev = resolve_device(device)
    return dev, resolve_dtype(dtype, dev), source.config()


def load(source: ModelSource, device: str, dtype: torch.dtype, tokenizer: bool = False) -> tuple[Any, Any]:
    """(model in eval mode, its checkpoint tokenizer or None). A full-size model on the CPU gets a
    one-line warning on stderr first: every token runs every loop there, for hours."""
    if source.random:
        model = build_model(source.preset, device=device, dtype=dtype, seed=source.seed, **source.overrides)
        tok = None
    else:
        model, tok = load_model(source.weights, device=device, dtype=dtype, tokenizer=tokenizer,
                                **source.overrides)
    model.eval()
    note = cpu_size_note(model)
    if note:
        Console(stderr=True).print(f"[yellow]{note}[/]", highlight=False)
    return model, tok


def check_engine_flags(config: EngineConfig) -> None:
    """The engine's own checks of its sizing (EngineConfig.validate), worded with the flags that set
    it, before any model work: `--block-size 0` fails in one line, not after a model was built."""
    try:
        config.validate()
    except ValueError as exc:
        msg = str(exc)
        for field in ("max_num_batched_tokens", "max_num_seqs", "kv_cache_gib", "block_size"):
            msg = msg.replace(field, "--" + field.replace("_", "-"))
        raise UsageError(msg) from None


def _available_memory_bytes() -> int | None:
    """Memory the OS can give this process now (Linux), None where it cannot be read."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_cpu_kv_bytes(need: int, what: str) -> None:
    """Refuse, in one line, a CPU KV cache of `need` bytes that cannot fit in memory (instead of an
    allocator error later); `what` says what the bytes hold."""
    avail = _available_memory_bytes()
    if avail is not None and need > CPU_MEMORY_SHARE * avail:
        raise UsageError(
            f"the load needs {need / 2**30:.1f} GiB of KV cache ({what}) but this machine has "
            f"{avail / 2**30:.1f} GiB free: lower --concurrency / --input-len / --output-len, or use a tiny "
            "preset (--model ouro-tiny) on CPU"
        )


def check_cpu_pool(model: Any, num_blocks: int, block_size: int) -> None:
    """Refuse, in one line, a CPU KV pool that cannot fit in memory (instead of an allocator error)."""
    mc = model.config
    dtype = next(model.parameters()).dtype
    need = num_blocks * kv_bytes_per_block(
        int(mc.num_kv_planes), block_size, int(mc.num_kv_heads), int(mc.head_dim), dtype
    )
    check_cpu_kv_bytes(need, f"{num_blocks} blocks of {block_size} tokens, {int(mc.num_kv_planes)} KV planes")


def build_engine(model: Any, arms: dict[str, ArmSpec], config: EngineConfig,
                 need_blocks: int | None = None) -> Engine:
    """The engine over `model` for `arms`. `need_blocks`: KV blocks the load needs at once; a CPU pool
    without an explicit size gets exactly that (at least CPU_MIN_BLOCKS), and a pool that ends up
    smaller is a UsageError (the load is never shrunk to fit)."""
    on_cpu = next(model.parameters()).device.type == "cpu"
    if on_cpu and need_blocks is not None and config.kv_cache_gib is None and config.num_blocks is None:
        config = dataclasses.replace(config, num_blocks=max(need_blocks, CPU_MIN_BLOCKS))
        check_cpu_pool(model, config.num_blocks, config.block_size)
    try:
        engine = Engine(model, arms=arms, config=config)
    except (ValueError, RuntimeError) as exc:
        raise UsageError(f"engine: {exc}") from None
    if need_blocks is not None and engine.num_blocks < need_blocks:
        raise UsageError(
            f"KV pool holds {engine.num_blocks} blocks of {config.block_size} tokens but the load needs "
            f"{need_blocks}: raise --kv-cache-gib or lower --concurrency (the load is never shrunk silently)"
        )
    return engine
