"""Ouro (ByteDance LoopLM): 24 weight-shared sandwich layers looped 4 times (spec models.md section 1).

Forward over flattened tokens (vLLM style): `forward(input_ids [N], positions [N], attn, ops)`.

* Every norm, RoPE and SiLU*up goes through the arm's `ops`, so the torch / exact / approx arms differ
  only there. Where a sandwich `h = r + norm(a)` is followed by a norm of h (post-attention -> pre-MLP,
  post-MLP -> next layer's pre-attention, last layer's post-MLP -> the per-loop final `model.norm`),
  `ops.residual_rms_norm_norm` is used; it is the composition of the two by contract, so the reference
  semantics are unchanged.
* Merged projections (an engine-wide choice, the same for every arm): q, k, v are one GEMM with the rows
  [q; k; v] and gate, up one GEMM with rows [gate; up] (as vLLM does). One GEMM instead of three / two
  saves launches; its result is not guaranteed to be bitwise equal to three separate HF GEMMs, which is
  why it is fixed for all arms rather than being an arm option. Loading concatenates the HF rows.
* RoPE (NeoX, theta 1e6): cos/sin computed once per forward in fp32 from the positions, cast to the
  activation dtype, shared by all loops and layers. A context with `attend_rope_neox` (the engine's
  paged KV) gets the RoPE with the attention call, so an arm may fuse the K/V write into its RoPE
  launch; other contexts (DenseKVCache) get `ops.rope_neox` then `attend`.
* KV plane of (loop, layer) = loop * num_layers + layer: every loop of every token writes its own K/V and
  attends to the same loop's K/V of the earlier tokens (HF `UniversalTransformerCache`, vLLM layout).
* Exit gate (spec 1.7, the reference rule of Ouro's published modeling code): with no threshold
  (`model.exit_threshold` None: a preset, a checkpoint without one, or `never_exit`) the last loop's output
  is returned and the gate is not evaluated. With a threshold q, gate logits are computed after every loop
  in the model dtype as HF does, turned into the exit pdf and its cumulative sum (`torch.cumsum`, in the
  model dtype), and each token takes the hidden state of the first loop whose CDF >= q (last loop if
  none). q = 1.0 (the released config's value) is a threshold like any other: in bf16 the CDF reaches it
  once the probability left after a loop falls below about 0.002. All loops are still computed for every
  token, as in HF: the later-loop KV planes hold the token's own later-loop K/V (reference semantics).
  `last_exit_depths` holds the chosen loop per token of the last forward (a device tensor, no sync).
* Compute-saving exit (`stop_at_exit`, a serving option, not HF's semantics): the forward runs loop by
  loop (`OuroRun`), so the engine can stop a decode step once every row has exited. The exit pdf is then
  filled in loop by loop (it must be known before the later loops run) and its CDF taken with the same
  `torch.cumsum` over the same [N, loops] buffer as the reference rule, so a token's exit loop is the one
  the reference rule picks from the same gates. A generated token's K/V in the planes after its exit
  loop are its exit loop's (the engine copies them, see `rltbench.engine.paged_context.copy_exit_planes`),
  so what a request generates does not depend on whether its batch ran further. Prompt tokens run every
  loop and keep their own K/V.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rltbench.models.base import LoopedModel
from rltbench.models.configs import OuroConfig


def exit_pdf(gate_logits: list[Tensor]) -> Tensor:
    """Per-token exit distribution over loops, [N, T], from the gate logits [N, 1] of each loop.

    lambda_t = sigmoid(logit_t); p_t = lambda_t * prod_{s<t} (1 - lambda_s); the last loop absorbs the
    rest. Computed in the logits' dtype with HF's operation order.
    """
    remaining = torch.ones_like(gate_logits[0].squeeze(-1))
    pdf = []
    for t, logit in enumerate(gate_logits):
        lam = torch.sigmoid(logit.squeeze(-1))
        if t < len(gate_logits) - 1:
            pdf.append(lam * remaining)
            remaining = remaining * (1.0 - lam)
        else:
            pdf.append(remaining)
    return torch.stack(pdf, dim=1)


def select_exit(pdf: Tensor, threshold: float) -> Tensor:
    """Per token the first loop whose CDF >= threshold, else the last loop. [N, T] -> int64 [N].

    The CDF is `torch.cumsum` in the pdf's dtype, compared with the threshold as HF does (a bf16 CDF
    can round to 1.0 before the last loop, so 1.0 is a threshold, not "never")."""
    reached = torch.cumsum(pdf, dim=1) >= threshold
    first = torch.argmax(reached.to(torch.float32), dim=1)
    last = torch.full_like(first, pdf.shape[1] - 1)
    return torch.where(reached.any(dim=1), first, last)


class OuroLayer(nn.Module):
    """Weights of one physical layer (merged qkv and gate_up; the four sandwich norms)."""

    def __init__(self, c: OuroConfig, dtype: torch.dtype) -> None:
        super().__init__()
        h, d = c.hidden_size, c.head_dim
        e = dict(dtype=dtype)
        self.qkv_proj = nn.Parameter(torch.empty((c.num_heads + 2 * c.num_kv_heads) * d, h, **e))
        self.o_proj = nn.Parameter(torch.empty(h, c.num_heads * d, **e))
        self.gate_up_proj = nn.Parameter(torch.empty(2 * c.intermediate_size, h, **e))
        self.down_proj = nn.Parameter(torch.empty(h, c.intermediate_size, **e))
        self.input_layernorm = nn.Parameter(torch.empty(h, **e))
        self.input_layernorm_2 = nn.Parameter(torch.empty(h, **e))
        self.post_attention_layernorm = nn.Parameter(torch.empty(h, **e))
        self.post_attention_layernorm_2 = nn.Parameter(torch.empty(h, **e))


class OuroForCausalLM(LoopedModel):
    """Ouro with the model interface of DESIGN.md section 2 (see module docstring)."""

    def __init__(self, config: OuroConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        c = self.config = config
        e = dict(dtype=dtype)
        self.embed_tokens = nn.Parameter(torch.empty(c.vocab_size, c.hidden_size, **e))
        self.layers = nn.ModuleList(OuroLayer(c, dtype) for _ in range(c.num_layers))
        self.norm = nn.Parameter(torch.empty(c.hidden_size, **e))
        self.exit_gate_weight = nn.Parameter(torch.empty(1, c.hidden_size, **e))
        self.exit_gate_bias = nn.Parameter(torch.empty(1, **e))
        self.lm_head = nn.Parameter(torch.empty(c.vocab_size, c.hidden_size, **e))
        self.register_buffer("inv_freq", torch.empty(c.head_dim // 2), persistent=False)
        self.exit_threshold: float | None = c.gate_threshold  # None: the gate is not evaluated
        self.last_exit_depths: Tensor | None = None
        self.random_weights = False
        self._q = c.num_heads * c.head_dim
        self._kv = c.num_kv_heads * c.head_dim
        self._scale = c.head_dim ** -0.5
        if not torch.device(self.embed_tokens.device).type == "meta":
            self.reset_buffers()

    def head_weight(self) -> Tensor:
        return self.lm_head

    def reset_buffers(self) -> None:
        """inv_freq[j] = 1 / theta^(2j/D), computed on the CPU in fp32 (HF's expression) then moved."""
        d = self.config.head_dim
        inv = 1.0 / (self.config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        self.inv_freq = inv.to(self.embed_tokens.device)

    def rope_cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos/sin [N, D] = cat(freqs, freqs) in fp32, cast to the activation dtype (HF order)."""
        freqs = positions.to(torch.float32).unsqueeze(1) * self.inv_freq.unsqueeze(0)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, input_ids: Tensor, positions: Tensor, attn: Any, ops: Any,
                stepwise: bool | None = None) -> Tensor:
        run = self.start(input_ids, positions, attn, ops, stepwise)
        for loop in range(self.config.num_loops):
            run.loop(loop)
        return run.finish()

    def start(self, input_ids: Tensor, positions: Tensor, attn: Any, ops: Any,
              stepwise: bool | None = None) -> OuroRun:
        """A forward that the caller runs loop by loop (`OuroRun.loop`, then `OuroRun.finish`).
        `stepwise`: the compute-saving exit's way of computing the exit (None: the config's
        `stop_at_exit`); an engine that serves both modes passes its current one."""
        return OuroRun(self, input_ids, positions, attn, ops, stepwise)

    # ---- HF checkpoint layout ---------------------------------------------------------------------
    @staticmethod
    def hf_key_shapes(c: OuroConfig) -> dict[str, tuple[int, ...]]:
        """Every tensor of an HF Ouro checkpoint with its shape (lm_head omitted when tied)."""
        h, d, m = c.hidden_size, c.head_dim, c.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h)}
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            shapes[p + "self_attn.q_proj.weight"] = (c.num_heads * d, h)
            shapes[p + "self_attn.k_proj.weight"] = (c.num_kv_heads * d, h)
            shapes[p + "self_attn.v_proj.weight"] = (c.num_kv_heads * d, h)
            shapes[p + "self_attn.o_proj.weight"] = (h, c.num_heads * d)
            shapes[p + "mlp.gate_proj.weight"] = (m, h)
            shapes[p + "mlp.up_proj.weight"] = (m, h)
            shapes[p + "mlp.down_proj.weight"] = (h, m)
            for norm in ("input_layernorm", "input_layernorm_2", "post_attention_layernorm",
                         "post_attention_layernorm_2"):
                shapes[p + norm + ".weight"] = (h,)
        shapes["model.norm.weight"] = (h,)
        shapes["model.early_exit_gate.weight"] = (1, h)
        shapes["model.early_exit_gate.bias"] = (1,)
        if not c.tie_word_embeddings:
            shapes["lm_head.weight"] = (c.vocab_size, h)
        return shapes

    @staticmethod
    def is_optional_hf_key(c: OuroConfig, key: str) -> bool:
        """Keys that may be present and are ignored: rotary inv_freq buffers, a tied duplicate lm_head."""
        return key.endswith("rotary_emb.inv_freq") or (c.tie_word_embeddings and key == "lm_head.weight")

    def _hf_targets(self) -> dict[str, Tensor]:
        """HF key -> the (slice of the) parameter it lives in."""
        c, t = self.config, {}
        t["model.embed_tokens.weight"] = self.embed_tokens
        q, kv, m = self._q, self._kv, c.intermediate_size
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            t[p + "self_attn.q_proj.weight"] = layer.qkv_proj[:q]
            t[p + "self_attn.k_proj.weight"] = layer.qkv_proj[q:q + kv]
            t[p + "self_attn.v_proj.weight"] = layer.qkv_proj[q + kv:]
            t[p + "self_attn.o_proj.weight"] = layer.o_proj
            t[p + "mlp.gate_proj.weight"] = layer.gate_up_proj[:m]
            t[p + "mlp.up_proj.weight"] = layer.gate_up_proj[m:]
            t[p + "mlp.down_proj.weight"] = layer.down_proj
            for norm in ("input_layernorm", "input_layernorm_2", "post_attention_layernorm",
                         "post_attention_layernorm_2"):
                t[p + norm + ".weight"] = getattr(layer, norm)
        t["model.norm.weight"] = self.norm
        t["model.early_exit_gate.weight"] = self.exit_gate_weight
        t["model.early_exit_gate.bias"] = self.exit_gate_bias
        if not c.tie_word_embeddings:
            t["lm_head.weight"] = self.lm_head
        return t

    @torch.no_grad()
    def load_hf_tensors(self, get: Any) -> None:
        """Copy every HF tensor (`get(key)` -> Tensor, already validated) into place."""
        for key, target in self._hf_targets().items():
            target.copy_(get(key))
        if self.config.tie_word_embeddings:
            self.lm_head.copy_(self.embed_tokens)

    def hf_state_dict(self) -> dict[str, Tensor]:
        """The weights in the HF key layout (q/k/v and gate/up split again), contiguous copies."""
        return {k: v.detach().contiguous().clone() for k, v in self._hf_targets().items()}


class OuroRun:
    """One Ouro forward, loop by loop: `loop(j)` for j = 0 .. num_loops - 1 in order (or up to the loop
    after which `all_exited` holds, with `stop_at_exit`), then `finish()`, the hidden state each token
    takes. Why a class: the engine captures each loop of a compute-saving decode step as its own CUDA
    graph and decides on the host, between them, whether to run the next; everything a later loop or
    `finish` reads is kept here, and with `stop_at_exit` it is updated in place, so the tensors
    `finish` reads are the same whichever loop the step stopped after."""

    def __init__(self, model: OuroForCausalLM, input_ids: Tensor, positions: Tensor, attn: Any,
                 ops: Any, stepwise: bool | None = None) -> None:
        c = model.config
        self.model, self.attn, self.ops = model, attn, ops
        self.n = n = input_ids.shape[0]
        self.h = F.embedding(input_ids, model.embed_tokens)
        self.cos, self.sin = model.rope_cos_sin(positions, self.h.dtype)
        self.x = ops.rms_norm(self.h, model.layers[0].input_layernorm, c.rms_norm_eps)
        self.use_gate = model.exit_threshold is not None
        self.stepwise = self.use_gate and (c.stop_at_exit if stepwise is None else stepwise)
        self.hs: list[Tensor] = []
        self.gates: list[Tensor] = []
        if self.stepwise:
            e = dict(dtype=self.h.dtype, device=self.h.device)
            self.hs_by_loop = torch.empty(n, c.num_loops, c.hidden_size, **e)
            self.remaining = torch.ones(n, **e)
            self.pdf = torch.zeros(n, c.num_loops, **e)  # loops not run yet stay 0
            self.depths = torch.full((n,), c.num_loops - 1, dtype=torch.long, device=self.h.device)
            self.open = torch.ones(n, dtype=torch.bool, device=self.h.device)

    def loop(self, loop: int) -> None:
        """Run loop `loop` over every layer (and its exit gate, when the model has a threshold)."""
        m, c, ops, attn = self.model, self.model.config, self.ops, self.attn
        n, eps, layers = self.n, c.rms_norm_eps, m.layers
        num_layers = len(layers)
        attend_rope = getattr(attn, "attend_rope_neox", None)
        h, x = self.h, self.x
        for i, layer in enumerate(layers):
            q, k, v = F.linear(x, layer.qkv_proj).split([m._q, m._kv, m._kv], dim=-1)
            q = q.view(n, c.num_heads, c.head_dim)
            k = k.view(n, c.num_kv_heads, c.head_dim)
            v = v.view(n, c.num_kv_heads, c.head_dim)
            plane = loop * num_layers + i
            if attend_rope is not None:
                a = attend_rope(plane, q, k, v, self.cos, self.sin, ops, m._scale)
            else:
                q, k = ops.rope_neox(q, k, self.cos, self.sin)
                a = attn.attend(plane, q, k, v, m._scale)
            o = F.linear(a.reshape(n, m._q), layer.o_proj)
            h, x = ops.residual_rms_norm_norm(h, o, layer.input_layernorm_2, layer.post_attention_layernorm,
                                              eps)
            gate, up = F.linear(x, layer.gate_up_proj).chunk(2, dim=-1)
            mlp = F.linear(ops.silu_mul(gate, up), layer.down_proj)
            if i + 1 < num_layers:
                h, x = ops.residual_rms_norm_norm(h, mlp, layer.post_attention_layernorm_2,
                                                  layers[i + 1].input_layernorm, eps)
            else:  # end of a loop: h <- model.norm(h + norm(m)), which also feeds the next loop
                _, h = ops.residual_rms_norm_norm(h, mlp, layer.post_attention_layernorm_2, m.norm, eps)
        if self.stepwise:
            self.hs_by_loop[:, loop].copy_(h)
            self._exit_step(loop, F.linear(h, m.exit_gate_weight, m.exit_gate_bias))
        else:
            self.hs.append(h)
            if self.use_gate:
                self.gates.append(F.linear(h, m.exit_gate_weight, m.exit_gate_bias))
        if loop + 1 < c.num_loops:
            x = ops.rms_norm(h, layers[0].input_layernorm, eps)
        self.h, self.x = h, x

    def _exit_step(self, loop: int, logit: Tensor) -> None:
        """Write loop `loop`'s exit probability (exit_pdf's expressions) into the pdf buffer and record
        the loop as the exit of the tokens whose CDF reaches the threshold now. The CDF is the
        `torch.cumsum` of the whole [N, loops] buffer, as `select_exit` takes it: a scan's prefix at
        `loop` reads only the loops up to it (the later ones are 0), so it is bitwise the prefix that
        the every-loop forward compares, on every device."""
        lam = torch.sigmoid(logit.squeeze(-1))
        if loop < self.model.config.num_loops - 1:
            p = lam * self.remaining
            self.remaining.copy_(self.remaining * (1.0 - lam))
        else:
            p = self.remaining
        self.pdf[:, loop].copy_(p)
        cdf = torch.cumsum(self.pdf, dim=1)[:, loop]
        exits_now = self.open & (cdf >= float(self.model.exit_threshold))
        self.depths.masked_fill_(exits_now, loop)
        self.open.logical_and_(~exits_now)

    def all_exited(self, rows: Tensor | None = None) -> Tensor:
        """A device bool: every token (of `rows`, a bool mask; padding rows excluded) has exited by the
        loops run so far. Only with `stop_at_exit`."""
        if not self.stepwise:
            raise RuntimeError("all_exited needs a model with stop_at_exit")
        still = self.open if rows is None else self.open & rows
        return ~still.any()

    def finish(self) -> Tensor:
        """The hidden state each token takes [N, H]; sets the model's `last_exit_depths`."""
        c = self.model.config
        if self.stepwise:
            self.model.last_exit_depths = self.depths
            index = self.depths.view(self.n, 1, 1).expand(self.n, 1, c.hidden_size)
            return torch.gather(self.hs_by_loop, 1, index).squeeze(1)
        if not self.use_gate:
            self.model.last_exit_depths = torch.full((self.n,), c.num_loops - 1, dtype=torch.long,
                                                     device=self.h.device)
            return self.h
        depths = select_exit(exit_pdf(self.gates), float(self.model.exit_threshold))
        self.model.last_exit_depths = depths
        stacked = torch.stack(self.hs, dim=1)  # [N, T, H]
        index = depths.view(self.n, 1, 1).expand(self.n, 1, stacked.shape[-1])
        return torch.gather(stacked, 1, index).squeeze(1)
