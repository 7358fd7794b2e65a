"""A dense (contiguous) KV cache implementing the `AttentionContext` protocol of DESIGN.md section 2.

Used by `model.generate` (the engine's reference) and by `models.bench` (a captured decode step). The
engine has its own paged KV; this one is deliberately simple:

* storage: `k`, `v` of shape [planes, max_seqs, num_kv_heads, max_len, head_dim] in the model dtype, so
  one plane of one sequence is already in SDPA's [heads, seq, dim] layout;
* writes: `k[plane][seq_ids, :, positions] = k_new` (one index_put per plane, CUDA-graph capturable);
* attention: torch SDPA with an explicit boolean mask `key_pos <= query_pos` (attend over the cached keys
  of the token's own sequence and plane, itself included). `impl="fp32"` instead computes an explicit
  fp32 softmax (`softmax(q k^T * scale)` in fp32, cast back), a slower second reference.

Before each forward the caller describes the new tokens with one of:

* `begin(seq_ids, positions)` (host lists, eager): tokens are grouped into per-sequence segments on the
  host, each segment attends over exactly `max(pos) + 1` keys. Any mix of prefill chunks and decode
  tokens of several sequences. Not for graph capture (Python slicing by host-known lengths).
* `begin_static(seq_ids, positions, rows_are_seqs)` (device tensors, capturable): every token attends
  over the full `max_len` keys of its sequence, masked by position, so the shapes never change between
  steps. Call it *inside* the captured region: it computes the mask from the (static) position buffer,
  so a replay after the caller updated that buffer in place sees the new positions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


class DenseKVCache:
    """Contiguous per-plane K/V for one or more sequences (see module docstring)."""

    def __init__(
        self,
        num_planes: int,
        max_seqs: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        impl: str = "sdpa",
    ) -> None:
        if impl not in ("sdpa", "fp32"):
            raise ValueError(f"unknown attention impl {impl!r} (sdpa | fp32)")
        shape = (num_planes, max_seqs, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_planes, self.max_seqs, self.max_len = num_planes, max_seqs, max_len
        self.impl = impl
        self._key_pos = torch.arange(max_len, device=device)
        self._seq_ids: Tensor | None = None
        self._positions: Tensor | None = None
        self._segments: list[tuple[int, int, int, int]] | None = None  # (seq, start, end, kv_len)
        self._mask: Tensor | None = None
        self._rows_are_seqs = False

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    # ---- describing the new tokens --------------------------------------------------------------
    def begin(self, seq_ids: Sequence[int], positions: Sequence[int]) -> None:
        """Eager path: tokens of one sequence must be adjacent in the flattened batch."""
        if len(seq_ids) != len(positions) or not seq_ids:
            raise ValueError("begin(): seq_ids and positions must be non-empty and of equal length")
        segments: list[tuple[int, int, int, int]] = []
        seen: set[int] = set()
        start = 0
        for i in range(1, len(seq_ids) + 1):
            if i == len(seq_ids) or seq_ids[i] != seq_ids[start]:
                seq = int(seq_ids[start])
                if seq in seen:
                    raise ValueError(f"begin(): tokens of sequence {seq} are not adjacent")
                if not 0 <= seq < self.max_seqs:
                    raise ValueError(f"begin(): sequence id {seq} outside [0, {self.max_seqs})")
                kv_len = max(int(p) for p in positions[start:i]) + 1
                if kv_len > self.max_len or min(int(p) for p in positions[start:i]) < 0:
                    raise ValueError(f"begin(): positions of sequence {seq} outside [0, {self.max_len})")
                seen.add(seq)
                segments.append((seq, start, i, kv_len))
                start = i
        device = self.k.device
        self._seq_ids = torch.tensor(list(seq_ids), dtype=torch.long, device=device)
        self._positions = torch.tensor(list(positions), dtype=torch.long, device=device)
        self._segments = segments
        self._mask = None

    def begin_static(self, seq_ids: Tensor, positions: Tensor, rows_are_seqs: bool = False) -> None:
        """Capturable path. `rows_are_seqs=True` promises seq_ids == arange(N) (batched decode), which
        lets attention read the cache rows in place instead of gathering them per token."""
        self._seq_ids, self._positions = seq_ids, positions
        self._segments = None
        self._rows_are_seqs = rows_are_seqs
        # [N, 1, 1, max_len]: broadcast over heads and the single query row of each token.
        self._mask = (self._key_pos.unsqueeze(0) <= positions.unsqueeze(1))[:, None, None, :]

    # ---- AttentionContext -------------------------------------------------------------------------
    def attend(self, plane: int, q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
        """Write k/v [N, Hkv, D] at the tokens' positions of `plane`, return causal attention [N, Hq, D]."""
        if self._seq_ids is None or self._positions is None:
            raise RuntimeError("DenseKVCache.attend() before begin()/begin_static()")
        kp, vp = self.k[plane], self.v[plane]
        kp[self._seq_ids, :, self._positions] = k
        vp[self._seq_ids, :, self._positions] = v
        if self._segments is None:
            return self._attend_static(kp, vp, q, scale)
        out = torch.empty_like(q)
        for seq, a, b, kv_len in self._segments:
            qs = q[a:b].transpose(0, 1)  # [Hq, L, D]
            mask = self._key_pos[:kv_len].unsqueeze(0) <= self._positions[a:b].unsqueeze(1)  # [L, kv_len]
            o = self._core(qs, kp[seq, :, :kv_len], vp[seq, :, :kv_len], mask, scale)
            out[a:b] = o.transpose(0, 1)
        return out

    def _attend_static(self, kp: Tensor, vp: Tensor, q: Tensor, scale: float) -> Tensor:
        n = q.shape[0]
        if self._rows_are_seqs:
            keys, values = kp[:n], vp[:n]
        else:
            keys, values = kp[self._seq_ids], vp[self._seq_ids]
        o = self._core(q.unsqueeze(2), keys, values, self._mask, scale)  # [N, Hq, 1, D]
        return o.squeeze(2)

    def _core(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
        """q [..., Hq, L, D], k/v [..., Hkv, S, D], mask broadcastable to [..., Hq, L, S] (True = keep)."""
        hq, hkv = q.shape[-3], k.shape[-3]
        if hq != hkv:
            k = k.repeat_interleave(hq // hkv, dim=-3)
            v = v.repeat_interleave(hq // hkv, dim=-3)
        if self.impl == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
        scores = scores.masked_fill(~mask, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v.float()).to(q.dtype)
