"""What a KV pool of a given size holds: bytes per token of a KV layout, the pool's blocks, the blocks
one request reserves and how many requests fit at once.

Why one module: the Engine sizes its pool with `pool_blocks` (`blocks_in_budget`), and its scheduler
reserves `blocks_for_tokens(kv_tokens_needed(...))` blocks per request at admission (every block a
request can ever need, so a request admitted is never preempted). `rltbench capacity` predicts with these same
functions, so its numbers cannot drift from what the engine allocates and admits; a test holds the
prediction against a real engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rltbench.engine.paged_context import kv_bytes_per_block
from rltbench.engine.types import EngineConfig
from rltbench.errors import UsageError

GIB = 2**30


def kv_tokens_needed(prompt_len: int, max_new: int) -> int:
    """Tokens whose K/V a request ever writes: its prompt and every generated token but the last
    (the last sampled token is never fed back)."""
    return prompt_len + max_new - 1


def blocks_for_tokens(tokens: int, block_size: int) -> int:
    """Blocks that hold `tokens` tokens (the last one partly filled)."""
    return -(-tokens // block_size)


def blocks_in_budget(budget_bytes: float, bytes_per_block: int) -> int:
    """Whole blocks of `bytes_per_block` bytes in `budget_bytes` (how the engine sizes its pool)."""
    return int(budget_bytes // bytes_per_block)


def cuda_free_bytes(device: torch.device) -> int:
    """Free memory this process may still take on `device`: the driver's free bytes, capped by the
    process's memory fraction when one is set (``torch.cuda.set_per_process_memory_fraction``, e.g.
    by the GPU test runner's workers), minus what the allocator already holds against that cap."""
    free, total = torch.cuda.mem_get_info(device)
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if get_fraction is not None:
        fraction = float(get_fraction(device))
        if fraction < 1.0:
            free = min(free, int(fraction * total) - torch.cuda.memory_reserved(device))
    return max(0, int(free))


@dataclass(frozen=True)
class KVLayout:
    """One way to allocate a model's KV: `planes` planes per token, each K and V of
    `kv_heads` x `head_dim` elements of `dtype`."""

    name: str
    planes: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def bytes_per_block(self, block_size: int) -> int:
        """The engine's own figure (paged_context.kv_bytes_per_block): what one block id reserves."""
        return kv_bytes_per_block(self.planes, block_size, self.kv_heads, self.head_dim, self.dtype)

    @property
    def bytes_per_token(self) -> int:
        return self.bytes_per_block(1)

    @property
    def bytes_per_token_plane(self) -> int:
        """K and V of one token in one plane (one layer application)."""
        return kv_bytes_per_block(1, 1, self.kv_heads, self.head_dim, self.dtype)


def engine_layout(config: Any, dtype: torch.dtype) -> KVLayout:
    """The layout the engine allocates for `config`: `config.num_kv_planes` planes (Ouro: one per
    (loop, layer); Huginn: per its `kv_layout`)."""
    name = getattr(config, "kv_layout", None) if getattr(config, "family", "") == "huginn" else None
    return KVLayout(name or "engine", int(config.num_kv_planes), int(config.num_kv_heads),
                    int(config.head_dim), dtype)


def pool_blocks(config: EngineConfig, layout: KVLayout, device: torch.device) -> int:
    """The engine's pool size in blocks, first match wins (`EngineConfig`): `num_blocks`, `kv_cache_gib`,
    on CUDA the free memory minus `kv_headroom_gib`, on CPU `cpu_num_blocks`. UsageError, naming the
    budget, when not even one block fits."""
    bs, bpb = config.block_size, layout.bytes_per_block(config.block_size)
    if config.num_blocks is not None:
        n, budget = config.num_blocks, "num_blocks"
    elif config.kv_cache_gib is not None:
        n = blocks_in_budget(config.kv_cache_gib * 2**30, bpb)
        budget = f"--kv-cache-gib {config.kv_cache_gib:g} ({config.kv_cache_gib * 2**30:,.0f} bytes)"
    elif device.type == "cuda":
        free = cuda_free_bytes(device)
        n = blocks_in_budget(free - config.kv_headroom_gib * 2**30, bpb)
        budget = f"free GPU memory {free / 2**30:.1f} GiB minus {config.kv_headroom_gib:g} GiB headroom"
    else:
        n, budget = config.cpu_num_blocks, "cpu_num_blocks"
    if n < 1:
        raise UsageError(
            f"KV pool too small: one block of {bs} tokens needs {bpb:,} bytes ({layout.planes} planes "
            f"x K,V x {layout.kv_heads} heads x {layout.head_dim}), more than {budget}"
        )
    return n


def per_application_layout(config: Any, dtype: torch.dtype) -> KVLayout:
    """The unpacked baseline: one KV plane per layer application (`config.num_layer_applications`),
    what an implementation allocates that gives every recurrent application its own cache."""
    return KVLayout("per-application", int(config.num_layer_applications), int(config.num_kv_heads),
                    int(config.head_dim), dtype)


@dataclass(frozen=True)
class Capacity:
    """What a pool of `budget_bytes` admits for requests of `prompt_len` + `output_len` tokens."""

    budget_bytes: float
    block_size: int
    num_blocks: int  # the pool the engine allocates for this budget
    blocks_per_seq: int  # what the scheduler reserves per request at admission
    max_seqs: int  # requests admitted at once (KV-limited; max_num_seqs is set to it)

    @property
    def pool_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def as_dict(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget_bytes, "block_size": self.block_size,
                "num_blocks": self.num_blocks, "pool_tokens": self.pool_tokens,
                "blocks_per_seq": self.blocks_per_seq, "max_seqs": self.max_seqs}


def capacity(layout: KVLayout, budget_bytes: float, block_size: int, prompt_len: int,
             output_len: int) -> Capacity:
    """The pool the engine allocates for `budget_bytes` and how many requests it admits at once
    (each reserves all of its blocks at admission, so the count is whole requests, none preempted)."""
    n = max(0, blocks_in_budget(budget_bytes, layout.bytes_per_block(block_size)))
    per_seq = blocks_for_tokens(kv_tokens_needed(prompt_len, output_len), block_size)
    return Capacity(budget_bytes, block_size, n, per_seq, n // per_seq)
