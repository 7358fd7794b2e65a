"""The models' AttentionContext over the engine's paged KV pool.

The pool is one tensor `kv [num_planes, 2, num_blocks, block_size, Hkv, D]`; every plane shares
the step's metadata (slot mapping, block tables, seq lens), so the model's per-plane `attend` calls
do no host work: decode metadata lives in static device tensors that a CUDA graph can capture.
Prefill rows need a host-side plan (row bounds, block lists, causal masks); the engine builds it from
its host copy of the metadata (`prefill_plan_from_host`), so prefill steps can be captured too. A
`varlen` context instead runs `prefill_attention.paged_prefill_attention_varlen`, which reads the row
metadata on the device: one graph then serves every step of a token-count bucket.

`attend_rope_neox` (used by NeoX-RoPE models when present) lets the arm's ops fold the K/V write into
their RoPE launch (`ops.rope_neox_store`, opt-in); decode and prefill steps both take it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rltbench.engine import attention as _attn
from rltbench.engine import prefill_attention as _varlen


@dataclass
class PagedAttentionContext:
    """One step's view of the pool. `query_start_loc`/`context_lens` set -> prefill (chunked, causal);
    otherwise decode (one new token per row; padding rows have seq_len 0 and slot -1)."""

    kv: Tensor
    slot_mapping: Tensor  # int64 [N]
    block_tables: Tensor  # int32 [B, W]
    seq_lens: Tensor  # int32 [B], tokens in cache including the new ones
    query_start_loc: Tensor | None = None  # int32 [B+1] (prefill)
    context_lens: Tensor | None = None  # int32 [B] tokens cached before this chunk (prefill)
    max_seq_len_hint: int | None = None
    # prefill whose attention reads every row's metadata on the device (a bucketed prefill graph):
    # no host plan, the token count may include trailing padding tokens (slot -1, output 0)
    varlen: bool = False
    _prefill_plan: list[_attn.PrefillRow] | None = field(default=None, repr=False)

    @property
    def is_prefill(self) -> bool:
        return self.query_start_loc is not None

    def attend(self, plane: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        """Write the new tokens' k/v into `plane`, then attend causally over each row's cache."""
        k_cache, v_cache = self.kv[plane, 0], self.kv[plane, 1]
        _attn.write_kv(k_cache, v_cache, k, v, self.slot_mapping)
        return self._attend_cached(q, k_cache, v_cache, scale)

    def attend_rope_neox(
        self, plane: int, q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, ops: Any, scale: float
    ) -> Tensor:
        """`ops.rope_neox(q, k, cos, sin)` then `attend`, with the same bits. Where the arm's
        `rope_neox_store` fuses, one launch rotates q and k and stores the rotated k and v into the
        plane's caches, so the separate K/V-write launch disappears; otherwise the unfused path runs."""
        k_cache, v_cache = self.kv[plane, 0], self.kv[plane, 1]
        fused = getattr(ops, "rope_neox_store", None)
        q_rot = fused(q, k, v, cos, sin, k_cache, v_cache, self.slot_mapping) if fused is not None else None
        if q_rot is None:
            q_rot, k_rot = ops.rope_neox(q, k, cos, sin)
            _attn.write_kv(k_cache, v_cache, k_rot, v, self.slot_mapping)
        return self._attend_cached(q_rot, k_cache, v_cache, scale)

    def _attend_cached(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, scale: float) -> Tensor:
        """Causal attention of the new tokens over one plane's cache (their own K/V already written)."""
        if self.query_start_loc is None:
            return _attn.paged_decode_attention(
                q, k_cache, v_cache, self.block_tables, self.seq_lens, scale, self.max_seq_len_hint
            )
        assert self.context_lens is not None
        if self.varlen:
            return _varlen.paged_prefill_attention_varlen(
                q, k_cache, v_cache, self.block_tables, self.query_start_loc, self.context_lens, scale
            )
        if self._prefill_plan is None:  # no host plan given: read the device metadata once per step
            self._prefill_plan = _attn.prefill_plan(
                self.block_tables,
                self.seq_lens,
                self.query_start_loc,
                self.context_lens,
                k_cache.shape[1],
                q.shape[0],
            )
        return _attn.paged_prefill_attention(
            q,
            k_cache,
            v_cache,
            self.block_tables,
            self.seq_lens,
            self.query_start_loc,
            self.context_lens,
            scale,
            plan=self._prefill_plan,
        )


def prefill_plan_from_host(
    block_tables: Tensor,
    query_start_loc: Sequence[int],
    context_lens: Sequence[int],
    seq_lens: Sequence[int],
    block_size: int,
    num_queries: int,
) -> list[_attn.PrefillRow]:
    """`_attn.prefill_plan` fed with metadata the engine already holds on the host: the same rows
    and checks, but its reads of the row metadata hit CPU tensors, so there is no device-to-host
    sync. The block indices and causal masks are device ops on `block_tables` (the step's static
    device buffer) with fixed host shapes, so the plan can be built inside a CUDA-graph capture."""

    def host(xs: Sequence[int]) -> Tensor:
        return torch.tensor(list(xs), dtype=torch.int64)

    return _attn.prefill_plan(
        block_tables, host(seq_lens), host(query_start_loc), host(context_lens), block_size, num_queries
    )


def allocate_kv_pool(
    num_planes: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> Tensor:
    """Zero-filled pool: never-written slots hold finite values, so masked reads cannot make NaN."""
    return torch.zeros(
        num_planes, 2, num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device
    )


def kv_bytes_per_block(
    num_planes: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return num_planes * 2 * block_size * num_kv_heads * head_dim * elem


def copy_exit_planes(kv: Tensor, slot_mapping: Tensor, depths: Tensor, num_loops: int) -> None:
    """Ouro's compute-saving exit: the K/V of each row's token in the planes of the loops after its
    exit loop `depths[i]` become those of its exit loop, in every layer (plane = loop * layers + layer).

    Why: a decode step that stops once every row has exited leaves the later planes unwritten, and a
    row that exited while its batch ran on wrote K/V of loops it does not use. Copying the exit loop's
    K/V makes both the same, so what a request generates does not depend on its batch. Sync-free (it
    runs inside the step's CUDA graph); rows with `slot < 0` (padding) are skipped the way `write_kv`
    skips them: redirected to the first valid row's slot carrying that row's own values."""
    planes, _, nb, bs, hkv, d = kv.shape
    if planes % num_loops:
        raise ValueError(f"{planes} KV planes are not {num_loops} loops of whole layers")
    n = slot_mapping.shape[0]
    if n == 0 or num_loops == 1:
        return
    by_slot = kv.view(num_loops, planes // num_loops, 2, nb * bs, hkv, d).permute(3, 0, 1, 2, 4, 5)
    slots = slot_mapping.to(torch.int64)
    valid = slots >= 0
    first = torch.argmax(valid.to(torch.int32)).reshape(1)  # first valid row (0 when none)
    slots = torch.where(valid, slots, slots.index_select(0, first)).clamp(min=0)
    exit_loop = torch.where(valid, depths, depths.index_select(0, first))
    rows = by_slot[slots]                                    # [N, loops, layers, 2, Hkv, D]
    source = rows[torch.arange(n, device=rows.device), exit_loop]
    later = torch.arange(num_loops, device=rows.device)[None, :] > exit_loop[:, None]
    later &= valid.any()                                     # no valid row: write the values back
    torch.where(later[:, :, None, None, None, None], source[:, None], rows, out=rows)
    by_slot.index_put_((slots,), rows)
