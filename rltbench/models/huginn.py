"""Huginn-0125 (recurrent depth): prelude, a 4-layer core iterated r times, coda (spec models.md section 2).

Forward over flattened tokens: `forward(input_ids [N], positions [N], attn, ops)`:

    e = wte(ids) * sqrt(H)                       -> prelude blocks (planes 0, 1)
    s = initial state (see `state_noise`)
    r times: x = adapter(cat(s, e)); 4 core blocks; s = x
    y = ln_f(s) -> coda blocks -> ln_f            (ln_f used twice; the head in compute_logits)

* LM head: `wte` when `tie_embeddings` (the released model, HF ties them); a checkpoint saved with
  `tie_embeddings: false` has its own `lm_head.weight`, which is then the head, as in HF.

* Sandwich block: x = norm_2(x + attn(norm_1(x))); x = norm_4(x + mlp(norm_3(x))) with the Huginn norm
  form (`ops.rms_norm_huginn`, `ops.add_rms_norm_huginn`), fused Wqkv with qk_bias added before RoPE,
  interleaved RoPE (`ops.rope_interleaved`) from an fp32 table (base 5e4, `max_position_embeddings`
  rows; a checkpoint's `freqs_cis` replaces the computed table when present, as HF loading would).
* KV planes: layout "full" = one plane per layer application (prelude j -> j, core (i, j) ->
  2 + 4i + j, coda j -> 2 + 4r + j); layout "compress" = one plane per physical layer (core j -> 2 + j,
  coda j -> 6 + j): later iterations overwrite the earlier ones' K/V at the same position, the HF
  `compress-s4` strategy / the authors' vLLM plugin. `config.num_kv_planes` reflects the layout.
* Initial state `state_noise`:
  - "position" (default): truncated normal N(0, std) at +-3 std (std = sqrt(2/(5H))), times sqrt(H), as
    HF's `initialize_state`, but drawn from a counter-based hash of (state_seed, token position,
    feature) instead of an RNG stream. The same prefix therefore always gets the same state (prefix
    caching is valid), it is independent of batching, and it is plain tensor arithmetic (CUDA-graph
    capturable). The integer hash is identical on CPU and GPU; the fp32 erfinv that shapes it may
    differ by an ulp between devices.
  - "random": HF's behaviour, fresh draws from torch's global RNG on every forward (not prefix-safe).
  - "zero": init_scale 0, zero state (deterministic; HF-vs-vLLM tests use it).
  `model.prefix_cache_safe` is True for "position" and "zero".
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rltbench.models.base import LoopedModel
from rltbench.models.configs import HuginnConfig

_M32 = 0xFFFFFFFF


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32) without int64 overflow (c split in 16-bit halves)."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def hash_u32(x: Tensor) -> Tensor:
    """A 32-bit integer finaliser (xorshift-multiply, 'lowbias32' constants) on int64 tensors."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def position_noise(seed: int, positions: Tensor, feature_hash: Tensor, std: float) -> Tensor:
    """fp32 [N, H]: truncated normal(0, std) on [-3 std, 3 std], keyed by (seed, position, feature).

    Uniform u in (0, 1) from the hash (24 bits), then HF/torch trunc_normal_'s inverse-CDF recipe:
    v = (2 Phi(-3) - 1) + u * 2 (Phi(3) - Phi(-3)); z = erfinv(v) * sqrt(2) * std, clamped to +-3 std.
    """
    seed_hash = int(hash_u32(torch.tensor(seed & _M32, dtype=torch.int64)))  # a CPU scalar: no device sync
    base = hash_u32(positions.to(torch.int64) ^ seed_hash)
    bits = hash_u32(base.unsqueeze(1) ^ feature_hash.unsqueeze(0))
    u = ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    lo = 0.5 * (1.0 + math.erf(-3.0 / math.sqrt(2.0)))
    hi = 0.5 * (1.0 + math.erf(3.0 / math.sqrt(2.0)))
    v = (2.0 * lo - 1.0) + u * (2.0 * (hi - lo))
    return (torch.erfinv(v) * (std * math.sqrt(2.0))).clamp(-3.0 * std, 3.0 * std)


class HuginnBlock(nn.Module):
    """Weights of one sandwich block (HF names: norm_1..4, attn.Wqkv/qk_bias/proj, mlp.fc/proj)."""

    def __init__(self, c: HuginnConfig, dtype: torch.dtype) -> None:
        super().__init__()
        h, e = c.hidden_size, dict(dtype=dtype)
        self.norm_1 = nn.Parameter(torch.empty(h, **e))
        self.norm_2 = nn.Parameter(torch.empty(h, **e))
        self.norm_3 = nn.Parameter(torch.empty(h, **e))
        self.norm_4 = nn.Parameter(torch.empty(h, **e))
        self.Wqkv = nn.Parameter(torch.empty((c.num_heads + 2 * c.num_kv_heads) * c.head_dim, h, **e))
        self.qk_bias = nn.Parameter(torch.empty(2, 1, c.num_heads, c.head_dim, **e)) if c.qk_bias else None
        self.proj = nn.Parameter(torch.empty(h, c.num_heads * c.head_dim, **e))
        self.fc = nn.Parameter(torch.empty(2 * c.intermediate_size, h, **e))
        self.mlp_proj = nn.Parameter(torch.empty(h, c.intermediate_size, **e))

    HF_NAMES = {
        "norm_1": "norm_1.weight", "norm_2": "norm_2.weight", "norm_3": "norm_3.weight",
        "norm_4": "norm_4.weight", "Wqkv": "attn.Wqkv.weight", "qk_bias": "attn.qk_bias",
        "proj": "attn.proj.weight", "fc": "mlp.fc.weight", "mlp_proj": "mlp.proj.weight",
    }


class HuginnForCausalLM(LoopedModel):
    """Huginn with the model interface of DESIGN.md section 2 (see module docstring)."""

    def __init__(self, config: HuginnConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        config.validate()
        c = self.config = config
        e = dict(dtype=dtype)
        self.wte = nn.Parameter(torch.empty(c.vocab_size, c.hidden_size, **e))
        self.prelude = nn.ModuleList(HuginnBlock(c, dtype) for _ in range(c.num_prelude))
        self.adapter = nn.Parameter(torch.empty(c.hidden_size, 2 * c.hidden_size, **e))
        self.core_block = nn.ModuleList(HuginnBlock(c, dtype) for _ in range(c.num_core))
        self.coda = nn.ModuleList(HuginnBlock(c, dtype) for _ in range(c.num_coda))
        self.ln_f = nn.Parameter(torch.empty(c.hidden_size, **e))
        untied = None if c.tie_embeddings else torch.empty(c.vocab_size, c.hidden_size, **e)
        self.lm_head = None if untied is None else nn.Parameter(untied)  # None: the head is wte
        half = c.head_dim // 2
        self.register_buffer("rope_cos", torch.empty(c.max_position_embeddings, half), persistent=False)
        self.register_buffer("rope_sin", torch.empty(c.max_position_embeddings, half), persistent=False)
        self.register_buffer("feature_hash", torch.empty(c.hidden_size, dtype=torch.int64), persistent=False)
        self.random_weights = False
        self._q = c.num_heads * c.head_dim
        self._kv = c.num_kv_heads * c.head_dim
        self._scale = 1.0 / math.sqrt(c.head_dim)
        if self.wte.device.type != "meta":
            self.reset_buffers()

    @property
    def prefix_cache_safe(self) -> bool:
        """True when the initial state depends only on (seed, position): prefix K/V can be reused."""
        return self.config.state_noise in ("position", "zero")

    def head_weight(self) -> Tensor:
        return self.wte if self.lm_head is None else self.lm_head

    def reset_buffers(self) -> None:
        """RoPE table (HF `precompute_freqs_cis`, fp32, on the CPU then moved) and the feature hash."""
        c, device = self.config, self.wte.device
        d = c.head_dim
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        t = torch.arange(c.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(t, inv).float()
        self.rope_cos = torch.cos(freqs).to(device)
        self.rope_sin = torch.sin(freqs).to(device)
        feats = torch.arange(c.hidden_size, dtype=torch.int64)
        self.feature_hash = hash_u32(feats * 0x9E3779B1 + 0x632BE5AB).to(device)

    def set_rope_table(self, freqs_cis: Tensor) -> None:
        """Use a checkpoint's `freqs_cis` [1, max_pos, 1, D/2, 2] (cos, sin) as the RoPE table (fp32)."""
        fc = freqs_cis.to(device=self.rope_cos.device, dtype=torch.float32)
        self.rope_cos = fc[0, :, 0, :, 0].contiguous()
        self.rope_sin = fc[0, :, 0, :, 1].contiguous()

    # ---- KV planes ----------------------------------------------------------------------------------
    def core_plane(self, i: int, j: int) -> int:
        c = self.config
        if c.kv_layout == "compress":
            return c.num_prelude + j
        return c.num_prelude + c.num_core * i + j

    def coda_plane(self, j: int) -> int:
        c = self.config
        core = c.num_core if c.kv_layout == "compress" else c.num_core * c.mean_recurrence
        return c.num_prelude + core + j

    # ---- forward --------------------------------------------------------------------------------------
    def initial_state(self, positions: Tensor, like: Tensor) -> Tensor:
        """The recurrence's starting state s0 [N, H] in the model dtype (see module docstring)."""
        c = self.config
        if c.state_noise == "zero":
            return torch.zeros_like(like)
        if c.state_noise == "random":
            x = torch.randn_like(like)  # consumes the RNG like HF does before trunc_normal_
            std = c.init_std
            torch.nn.init.trunc_normal_(x, mean=0.0, std=std, a=-3 * std, b=3 * std)
            return x * c.embed_scale
        noise = position_noise(c.state_seed, positions, self.feature_hash, c.init_std)
        return noise.to(like.dtype) * c.embed_scale

    def _block(self, blk: HuginnBlock, x: Tensor, plane: int, cos: Tensor, sin: Tensor, attn: Any,
               ops: Any) -> Tensor:
        c, n, eps = self.config, x.shape[0], self.config.rms_norm_eps
        h = ops.rms_norm_huginn(x, blk.norm_1, eps)
        q, k, v = F.linear(h, blk.Wqkv).split([self._q, self._kv, self._kv], dim=-1)
        q = q.view(n, c.num_heads, c.head_dim)
        k = k.view(n, c.num_kv_heads, c.head_dim)
        v = v.view(n, c.num_kv_heads, c.head_dim)
        if blk.qk_bias is not None:
            q = q + blk.qk_bias[0]
            k = k + blk.qk_bias[1]
        q, k = ops.rope_interleaved(q, k, cos, sin)
        a = attn.attend(plane, q, k, v, self._scale)
        x = ops.add_rms_norm_huginn(x, F.linear(a.reshape(n, self._q), blk.proj), blk.norm_2, eps)
        h = ops.rms_norm_huginn(x, blk.norm_3, eps)
        gate, up = F.linear(h, blk.fc).chunk(2, dim=-1)
        return ops.add_rms_norm_huginn(x, F.linear(ops.silu_mul(gate, up), blk.mlp_proj), blk.norm_4, eps)

    def forward(self, input_ids: Tensor, positions: Tensor, attn: Any, ops: Any) -> Tensor:
        c = self.config
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        e = F.embedding(input_ids, self.wte) * c.embed_scale
        for j, blk in enumerate(self.prelude):
            e = self._block(blk, e, j, cos, sin, attn, ops)
        s = self.initial_state(positions, e)
        for i in range(c.mean_recurrence):
            x = F.linear(torch.cat((s, e), dim=-1), self.adapter)
            for j, blk in enumerate(self.core_block):
                x = self._block(blk, x, self.core_plane(i, j), cos, sin, attn, ops)
            s = x
        y = ops.rms_norm_huginn(s, self.ln_f, c.rms_norm_eps)
        for j, blk in enumerate(self.coda):
            y = self._block(blk, y, self.coda_plane(j), cos, sin, attn, ops)
        return ops.rms_norm_huginn(y, self.ln_f, c.rms_norm_eps)

    # ---- HF checkpoint layout -------------------------------------------------------------------------
    def _hf_targets(self) -> dict[str, Tensor]:
        t: dict[str, Tensor] = {"transformer.wte.weight": self.wte}
        for group in ("prelude", "core_block", "coda"):
            for i, blk in enumerate(getattr(self, group)):
                for attr, hf in HuginnBlock.HF_NAMES.items():
                    p = getattr(blk, attr)
                    if p is not None:
                        t[f"transformer.{group}.{i}.{hf}"] = p
        t["transformer.adapter.weight"] = self.adapter
        t["transformer.ln_f.weight"] = self.ln_f
        if self.lm_head is not None:
            t["lm_head.weight"] = self.lm_head
        return t

    @staticmethod
    def hf_key_shapes(c: HuginnConfig) -> dict[str, tuple[int, ...]]:
        """Required HF tensors and shapes (`lm_head.weight` when untied; `freqs_cis` and a tied model's
        duplicate `lm_head.weight` are optional)."""
        with torch.device("meta"):
            model = HuginnForCausalLM(c)
        return {k: tuple(v.shape) for k, v in model._hf_targets().items()}

    @staticmethod
    def optional_hf_key_shapes(c: HuginnConfig) -> dict[str, tuple[int, ...]]:
        out = {"freqs_cis": (1, c.max_position_embeddings, 1, c.head_dim // 2, 2)}
        if c.tie_embeddings:
            out["lm_head.weight"] = (c.vocab_size, c.hidden_size)
        return out

    @torch.no_grad()
    def load_hf_tensors(self, get: Any, present: set[str] | None = None) -> None:
        """Copy the HF tensors into place; `freqs_cis`, when in `present`, replaces the RoPE table.
        A tied model ignores a stored `lm_head.weight` (its head is `transformer.wte`, as HF ties them);
        an untied one loads it as its head."""
        for key, target in self._hf_targets().items():
            target.copy_(get(key))
        if present and "freqs_cis" in present:
            self.set_rope_table(get("freqs_cis"))

    def hf_state_dict(self) -> dict[str, Tensor]:
        """HF layout, including `lm_head.weight` (a tied model's duplicate of `wte`) and the fp32
        `freqs_cis` buffer."""
        sd = {k: v.detach().contiguous().clone() for k, v in self._hf_targets().items()}
        sd["lm_head.weight"] = self.head_weight().detach().contiguous().clone()
        table = torch.stack((self.rope_cos, self.rope_sin), dim=-1)  # [max_pos, D/2, 2]
        sd["freqs_cis"] = table[None, :, None].contiguous().cpu()
        return sd
