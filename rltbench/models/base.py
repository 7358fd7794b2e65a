"""What both looped families share: the model interface of DESIGN.md section 2 and plain greedy generate.

A model is built with its parameters uninitialised (possibly on the meta device, see `loading.py`);
`reset_buffers()` (re)computes the non-persistent tables (RoPE, noise hash) on the model's device.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from rltbench.arms import ARMS
from rltbench.errors import UsageError
from rltbench.kernels.ops import make_ops
from rltbench.models.dense_kv import DenseKVCache


class LoopedModel(nn.Module):
    """Base class of `OuroForCausalLM` and `HuginnForCausalLM`."""

    config: Any
    random_weights: bool = False

    # ---- to be provided by each family ----------------------------------------------------------
    def forward(self, input_ids: Tensor, positions: Tensor, attn: Any, ops: Any) -> Tensor:
        raise NotImplementedError

    def head_weight(self) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def reset_buffers(self) -> None:  # pragma: no cover
        raise NotImplementedError

    # ---- shared ---------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.head_weight().device

    @property
    def dtype(self) -> torch.dtype:
        return self.head_weight().dtype

    def compute_logits(self, hidden: Tensor) -> Tensor:
        """hidden [M, H] -> fp32 logits [M, V] (head GEMM in the model dtype, then upcast, as HF does)."""
        return torch.nn.functional.linear(hidden, self.head_weight()).float()

    def new_kv_cache(self, max_seqs: int, max_len: int, impl: str = "sdpa") -> DenseKVCache:
        """A dense KV cache sized for this model's planes/heads, on its device and dtype."""
        c = self.config
        return DenseKVCache(c.num_kv_planes, max_seqs, max_len, c.num_kv_heads, c.head_dim, self.dtype,
                            self.device, impl=impl)

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int,
        ops: Any = None,
        stop_token_ids: Iterable[int] = (),
    ) -> list[int]:
        """Plain greedy decoding of one sequence: prefill the prompt, then one token per forward.

        Returns the generated ids only (not the prompt). Stops after `max_new_tokens`, or right after
        emitting a token in `stop_token_ids` (that token is included). Argmax ties go to the lowest id.
        """
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise UsageError("generate(): the prompt is empty")
        if max_new_tokens < 1:
            raise UsageError(f"generate(): max_new_tokens must be >= 1, got {max_new_tokens}")
        vocab = self.config.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise UsageError(f"generate(): prompt token ids must lie in [0, {vocab})")
        total = len(prompt) + max_new_tokens
        if total > self.config.max_position_embeddings:
            raise UsageError(
                f"generate(): prompt + max_new_tokens = {total} exceeds the model's "
                f"{self.config.max_position_embeddings} positions"
            )
        ops = make_ops(ARMS["torch"]) if ops is None else ops  # default: the torch reference arm
        stops = {int(t) for t in stop_token_ids}
        cache = self.new_kv_cache(max_seqs=1, max_len=total)
        device = self.device
        ids = torch.tensor(prompt, dtype=torch.long, device=device)
        positions = torch.arange(len(prompt), device=device)
        cache.begin([0] * len(prompt), list(range(len(prompt))))
        out: list[int] = []
        while True:
            hidden = self.forward(ids, positions, cache, ops)
            token = int(self.compute_logits(hidden[-1:]).argmax(dim=-1).item())
            out.append(token)
            if len(out) >= max_new_tokens or token in stops:
                return out
            pos = len(prompt) + len(out) - 1
            ids = torch.tensor([token], dtype=torch.long, device=device)
            positions = torch.tensor([pos], dtype=torch.long, device=device)
            cache.begin([0], [pos])
