"""The Ops object the models call: routes each op to torch, the exact, approx or native kernels.

Routing per call:
1. family selected ``off``                                  -> torch reference (counted "reference")
2. scope ``graph`` and not capturing a CUDA graph           -> torch reference (counted "reference")
3. input the kernels do not support (see ``_check_*``)      -> torch reference, counted as a
   fallback with its reason; a wrong answer is never an option
4. otherwise the fused kernel                               -> counted "fused"
The native arm (``cuda``: CUDA C++ operators, rltbench.native) follows the same steps; an Ops that
selects it needs the native extension (UsageError otherwise). Which norm kernel serves a call is
the norm dispatch table's (norm.route): the exact norm in one launch where validated, else three;
the native norm only where validated against torch on this GPU, else torch runs and the reason is
counted. ``rope_neox_store`` (the kernel arms, where RopeKvConfig enables it) is an optional
capability rather than an op: it returns None where it does not fuse, and its caller then runs
``rope_neox`` and its own KV write.
Counts are host-side: inside a captured graph they count captures, not replays. Kernels need
grad disabled when any input requires grad (run models under torch.inference_mode()).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch

from rltbench import native, tuned
from rltbench.arms import ArmSpec as OpSelection
from rltbench.kernels import act, norm, rope
from rltbench.kernels import reference as ref
from rltbench.kernels.layout import rows_view
from rltbench.kernels.rope.config import RopeKvConfig
from rltbench.kernels.rounding import DTYPE_CODES, interpret_mode

Tensor = torch.Tensor


class OpStats:
    """Counters per op: fused kernel calls, reference calls (off / eager under scope graph) and
    fallbacks to the reference per reason."""

    def __init__(self) -> None:
        self.fused: Counter[str] = Counter()
        self.reference: Counter[str] = Counter()
        self.fallbacks: Counter[tuple[str, str]] = Counter()
        # which exact norm kernel ran: "onelaunch" (validated single launch) or "3launch" (norm.route)
        self.paths: Counter[tuple[str, str]] = Counter()
        # native (CUDA C++) kernel calls per op, and whether the native norm's trust was consulted
        self.native: Counter[str] = Counter()
        self.native_norm_checked = False

    def reset(self) -> None:
        self.fused.clear()
        self.reference.clear()
        self.fallbacks.clear()
        self.paths.clear()
        self.native.clear()
        self.native_norm_checked = False

    def fallback_count(self, op: str | None = None, reason: str | None = None) -> int:
        return sum(
            n
            for (o, r), n in self.fallbacks.items()
            if (op is None or o == op) and (reason is None or r == reason)
        )

    def to_dict(self) -> dict:
        """JSON-ready: {"fused": {op: n}, "reference": {op: n}, "fallbacks": {op: {reason: n}}}."""
        fb: dict[str, dict[str, int]] = {}
        for (op, reason), n in sorted(self.fallbacks.items()):
            fb.setdefault(op, {})[reason] = n
        paths: dict[str, dict[str, int]] = {}
        for (op, path), n in sorted(self.paths.items()):
            paths.setdefault(op, {})[path] = n
        return {
            "fused": dict(sorted(self.fused.items())),
            "reference": dict(sorted(self.reference.items())),
            "fallbacks": fb,
            "exact_norm_paths": paths,
            "onelaunch_validation": norm.onelaunch.validation_report() if paths else None,
            "native_calls": dict(sorted(self.native.items())),
            "native_norm_validation": norm.native.validation_report() if self.native_norm_checked else None,
        }


def _capturing(t: Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _common_reason(tensors: list[Tensor], native_impl: bool = False) -> str | None:
    """Reason the kernels cannot take these tensors (dtype/device/grad), or None. The native
    kernels (`native_impl`) run on CUDA tensors only, Triton's interpreter or not."""
    t0 = tensors[0]
    if t0.dtype not in DTYPE_CODES:
        return "dtype"
    if any(t.dtype != t0.dtype for t in tensors):
        return "mixed_dtype"
    if any(t.device != t0.device for t in tensors):
        return "device"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "requires_grad"
    if native_impl:
        return None if t0.device.type == "cuda" else "not_cuda"
    if t0.device.type == "cpu":
        if not interpret_mode():
            return "cpu_no_interpreter"
    elif t0.device.type == "cuda":
        if interpret_mode():
            return "cuda_under_interpreter"
    else:
        return "device"
    return None


def _rope_reason(kind: str, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> str | None:
    """Reason the RoPE kernels cannot take these shapes/layouts (beyond _common_reason), or None."""
    if q.dim() != 3 or k.dim() != 3 or cos.dim() != 2 or sin.dim() != 2:
        return "shape"
    T, _, D = q.shape
    cw = D if kind == "neox" else D // 2
    if D % 2 or k.shape[0] != T or k.shape[2] != D or cos.shape != (T, cw) or sin.shape != (T, cw):
        return "shape"
    if kind == "interleaved":  # fp32 tables: not covered by the common dtype/device check
        if cos.dtype != torch.float32 or sin.dtype != torch.float32:
            return "mixed_dtype"
        if cos.device != q.device or sin.device != q.device:
            return "device"
    if any(t.shape[-1] > 1 and t.stride(-1) != 1 for t in (q, k, cos, sin)):
        return "layout"
    return None


def _kv_store_reason(
    k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> str | None:
    """Reason the fused KV store cannot take these (the unfused write then runs and validates), or None."""
    if v.shape != k.shape or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        return "shape"
    if tuple(k_cache.shape[2:]) != tuple(k.shape[1:]) or k_cache.shape[1] < 1:
        return "shape"
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != k.shape[0]:
        return "shape"
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        return "slot_dtype"
    if slot_mapping.device != k.device:
        return "device"
    if any(t.shape[-1] > 1 and t.stride(-1) != 1 for t in (v, k_cache, v_cache)):
        return "layout"
    return None


def fuse_kv_write_enabled() -> bool:
    """Whether ``Ops.rope_neox_store`` may fuse: the tuned RopeKvConfig in force (rope/config.py)."""
    return tuned.config(RopeKvConfig).enabled


class Ops:
    """One arm's ops (method semantics = the functions in reference.py)."""

    def __init__(self, selection: OpSelection, onelaunch_norm: bool = True) -> None:
        self.selection = selection
        self.stats = OpStats()
        # The exact norm runs in one launch where that kernel is validated bitwise against torch on
        # this GPU/torch/dtype/width (norm.route); False keeps it on the 3-launch path.
        self.onelaunch_norm = onelaunch_norm
        # the native kernels are built/loaded here, never silently replaced by torch (UsageError)
        native.require([selection])

    # -- routing -------------------------------------------------------------------------------------------
    def _impl(
        self, op: str, family: str, tensors: list[Tensor], check: Callable[[], str | None]
    ) -> str | None:
        """The kernel implementation to run ("exact"/"approx"/"cuda"), or None for the torch reference."""
        impl = getattr(self.selection, family)
        if impl == "off" or (self.selection.scope == "graph" and not _capturing(tensors[0])):
            self.stats.reference[op] += 1
            return None
        reason = _common_reason(tensors, impl == native.NATIVE_IMPL) or check()
        if reason is not None:
            self.stats.fallbacks[(op, reason)] += 1
            return None
        self.stats.fused[op] += 1
        if impl == native.NATIVE_IMPL:
            self.stats.native[op] += 1
        return impl

    # -- norms ---------------------------------------------------------------------------------------------
    def _route(self, x: Tensor, others: tuple[Tensor | None, ...] = ()) -> norm.Route:
        """norm.route for this arm (the dispatch table) over x and the tensors read beside it;
        consulting the native norm's trust is recorded so the stats carry its validation report."""
        if self.selection.norm == native.NATIVE_IMPL:
            self.stats.native_norm_checked = True
        return norm.route(self.selection.norm, x, self.onelaunch_norm, others)

    def _norm(
        self,
        op: str,
        x: Tensor,
        w: Tensor,
        eps: float,
        branch: Tensor | None,
        residual: Tensor | None,
        reference: Callable[[], Tensor],
    ) -> Tensor:
        extra = [t for t in (branch, residual) if t is not None]
        views: dict[str, Tensor | None] = {}
        routed: list[norm.Route] = []

        def check() -> str | None:
            if (
                w.dim() != 1
                or w.shape[0] != x.shape[-1]
                or w.stride(0) != 1
                or any(t.shape != x.shape for t in extra)
            ):
                return "shape"
            for name, t in (("x", x), ("branch", branch), ("residual", residual)):
                if t is not None:
                    views[name] = rows_view(t)
                    if views[name] is None:
                        return "layout"
            routed.append(self._route(x, (branch, residual, w)))
            return routed[0].fallback

        impl = self._impl(op, "norm", [x, w, *extra], check)
        if impl is None:
            return reference()
        r = routed[0]
        if impl == "exact":
            self.stats.paths[(op, r.kernel)] += 1
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        r.rows(
            views["x"],
            w,
            eps,
            out.view(-1, x.shape[-1]),
            branch=views.get("branch"),
            residual=views.get("residual"),
        )
        return out

    def rms_norm(self, x: Tensor, w: Tensor, eps: float) -> Tensor:
        """Ouro/Llama RMSNorm ``w * (x.float() * rsqrt(mean(x^2) + eps)).to(x.dtype)``."""
        return self._norm("rms_norm", x, w, eps, None, None, lambda: ref.rms_norm(x, w, eps))

    def rms_norm_huginn(self, x: Tensor, w: Tensor, eps: float) -> Tensor:
        """Huginn RMSNorm ``(...).type_as(x) * w`` (same bits as rms_norm; kept as its own op)."""
        return self._norm("rms_norm_huginn", x, w, eps, None, None, lambda: ref.rms_norm_huginn(x, w, eps))

    def residual_rms_norm(self, residual: Tensor, branch: Tensor, w: Tensor, eps: float) -> Tensor:
        """Ouro sandwich ``residual + rms_norm(branch, w, eps)``."""
        return self._norm(
            "residual_rms_norm",
            branch,
            w,
            eps,
            None,
            residual,
            lambda: ref.residual_rms_norm(residual, branch, w, eps),
        )

    def add_rms_norm_huginn(self, x: Tensor, branch: Tensor, w: Tensor, eps: float) -> Tensor:
        """Huginn ``rms_norm_huginn(x + branch, w, eps)``."""
        return self._norm(
            "add_rms_norm_huginn", x, w, eps, branch, None, lambda: ref.add_rms_norm_huginn(x, branch, w, eps)
        )

    def residual_rms_norm_norm(
        self, residual: Tensor, branch: Tensor, w1: Tensor, w2: Tensor, eps: float
    ) -> tuple[Tensor, Tensor]:
        """``h = residual + rms_norm(branch, w1)``, ``y = rms_norm(h, w2)``: one launch producing both
        in the exact arm where the one-launch norm is validated, else the two ops composed."""
        fused = self._norm_norm_fused(residual, branch, w1, w2, eps)
        if fused is not None:
            return fused
        h = self.residual_rms_norm(residual, branch, w1, eps)
        return h, self.rms_norm(h, w2, eps)

    def _norm_norm_fused(
        self, residual: Tensor, branch: Tensor, w1: Tensor, w2: Tensor, eps: float
    ) -> tuple[Tensor, Tensor] | None:
        """The one-launch norm-add-norm where every condition holds, else None: the caller composes
        two norms, which count their own routes and fallbacks. The approx arm always runs its
        one-launch kernel (_norm_norm_approx)."""
        sel = self.selection
        if sel.norm == "approx":
            return self._norm_norm_approx(residual, branch, w1, w2, eps)
        if sel.norm not in ("exact", native.NATIVE_IMPL) or (sel.norm == "exact" and not self.onelaunch_norm):
            return None
        if sel.scope == "graph" and not _capturing(branch):
            return None
        tensors = [residual, branch, w1, w2]
        if _common_reason(tensors, sel.norm == native.NATIVE_IMPL) is not None:
            return None
        if residual.shape != branch.shape:
            return None
        W = branch.shape[-1]
        if any(w.dim() != 1 or w.shape[0] != W or w.stride(0) != 1 for w in (w1, w2)):
            return None
        rv, bv = rows_view(residual), rows_view(branch)
        if rv is None or bv is None:
            return None
        r = self._route(branch, (residual, w1, w2))
        if r.norm_norm is None:
            return None
        h = torch.empty(branch.shape, dtype=branch.dtype, device=branch.device)
        y = torch.empty_like(h)
        r.norm_norm(rv, bv, w1, w2, eps, h.view(-1, W), y.view(-1, W))
        self.stats.fused["residual_rms_norm_norm"] += 1
        if sel.norm == "exact":
            self.stats.paths[("residual_rms_norm_norm", r.kernel)] += 1
        else:
            self.stats.native["residual_rms_norm_norm"] += 1
        return h, y

    def _norm_norm_approx(
        self, residual: Tensor, branch: Tensor, w1: Tensor, w2: Tensor, eps: float
    ) -> tuple[Tensor, Tensor]:
        """Approx norm-add-norm in one launch (two in the composed approx ops: 388 norm launches per
        Ouro decode step instead of 196); unsupported inputs run torch's reference, counted once
        under "residual_rms_norm_norm"."""
        views: dict[str, Tensor | None] = {}
        W = branch.shape[-1]

        def check() -> str | None:
            if residual.shape != branch.shape or any(
                w.dim() != 1 or w.shape[0] != W or w.stride(0) != 1 for w in (w1, w2)
            ):
                return "shape"
            views["r"], views["x"] = rows_view(residual), rows_view(branch)
            if views["r"] is None or views["x"] is None:
                return "layout"
            routed.append(self._route(branch))
            return routed[0].fallback

        routed: list[norm.Route] = []
        impl = self._impl("residual_rms_norm_norm", "norm", [residual, branch, w1, w2], check)
        if impl is None:
            return ref.residual_rms_norm_norm(residual, branch, w1, w2, eps)
        h = torch.empty(branch.shape, dtype=branch.dtype, device=branch.device)
        y = torch.empty_like(h)
        routed[0].norm_norm(views["r"], views["x"], w1, w2, eps, h.view(-1, W), y.view(-1, W))
        return h, y

    # -- rope ----------------------------------------------------------------------------------------------
    def _rope(
        self, op: str, kind: str, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor
    ) -> tuple[Tensor, Tensor]:
        reference = ref.rope_neox if kind == "neox" else ref.rope_interleaved
        tensors = [q, k] + ([cos, sin] if kind == "neox" else [])

        def check() -> str | None:
            reason = _rope_reason(kind, q, k, cos, sin)
            native_impl = self.selection.rope == native.NATIVE_IMPL
            if reason is None and native_impl and q.numel() + k.numel() >= 2**31:
                return "size"   # the native kernel indexes with 32 bits
            return reason

        impl = self._impl(op, "rope", tensors, check)
        if impl is None:
            return reference(q, k, cos, sin)
        qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        ko = torch.empty(k.shape, dtype=k.dtype, device=k.device)
        rope.KERNELS[impl](kind, q, k, cos, sin, qo, ko)
        return qo, ko

    def rope_neox(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """NeoX RoPE of q [T, Hq, D] and k [T, Hk, D]; cos/sin [T, D] in q's dtype."""
        return self._rope("rope_neox", "neox", q, k, cos, sin)

    def rope_interleaved(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Huginn interleaved RoPE; cos/sin [T, D/2] fp32."""
        return self._rope("rope_interleaved", "interleaved", q, k, cos, sin)

    def rope_neox_store(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        cos: Tensor,
        sin: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        slot_mapping: Tensor,
    ) -> Tensor | None:
        """``rope_neox`` whose launch also stores the rotated k and the raw v rows into one plane's
        paged KV cache (``[num_blocks, block_size, Hk, D]``) at ``slot_mapping`` (slot < 0 skips a
        row): the engine's separate KV-write launch disappears. Returns the rotated q, or None where
        this arm does not fuse here; the caller then runs ``rope_neox`` and its own write.

        Why a capability and not an op: only the kernel arms fuse (the cache must hold exactly the
        bits of their rope-then-write: the exact arm's torch bits, the approx arm's rope_approx
        bits), and only when enabled (``fuse_kv_write_enabled``: the tuned RopeKvConfig) and in the
        rope's scope. Inputs the kernel cannot take count as fallbacks of
        "rope_neox_store"; the unfused path that follows counts as "rope_neox"."""
        sel = self.selection
        if sel.rope not in ("exact", "approx") or not fuse_kv_write_enabled():
            return None
        if sel.scope == "graph" and not _capturing(q):
            return None
        reason = (
            _common_reason([q, k, v, cos, sin, k_cache, v_cache])
            or _rope_reason("neox", q, k, cos, sin)
            or _kv_store_reason(k, v, k_cache, v_cache, slot_mapping)
        )
        if reason is not None:
            self.stats.fallbacks[("rope_neox_store", reason)] += 1
            return None
        qo = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        rope.STORE[sel.rope](q, k, v, cos, sin, qo, k_cache, v_cache, slot_mapping)
        self.stats.fused["rope_neox_store"] += 1
        return qo

    # -- activation ----------------------------------------------------------------------------------------
    def silu_mul(self, gate: Tensor, up: Tensor) -> Tensor:
        """``silu(gate) * up``."""
        views: dict[str, Tensor | None] = {}

        def check() -> str | None:
            if gate.shape != up.shape:
                return "shape"
            if self.selection.act == "exact" and gate.device.type == "cpu" and gate.dtype == torch.float32:
                # torch CPU computes fp32 exp with SLEEF (expf_u10, std::exp on loop tails); the
                # interpreter's correctly rounded exp differs by 1 ulp in ~4% of values, so the
                # exact arm hands fp32 SiLU on CPU to torch rather than give a different answer.
                return "cpu_fp32_exp"
            views["g"], views["u"] = rows_view(gate), rows_view(up)
            return "layout" if views["g"] is None or views["u"] is None else None

        impl = self._impl("silu_mul", "act", [gate, up], check)
        if impl is None:
            return ref.silu_mul(gate, up)
        out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
        act.KERNELS[impl](views["g"], views["u"], out.view(-1, gate.shape[-1]))
        return out


def make_ops(selection: OpSelection | None = None) -> Ops:
    """An Ops for `selection` (default: the torch reference arm)."""
    return Ops(selection if selection is not None else OpSelection.torch())
