"""Validation before trust: a norm kernel that claims torch CUDA's summation order is compared with
torch on this GPU and torch version, bit for bit, before any call may use it.

Why: the order (torch_order.py) was read from torch's sources, and it depends on the torch release
(the warp-shuffle order changed in 2.10) and on the device; reading can be wrong and Triton's
lowering can change. So the first use of a (GPU, torch version, dtype, width) runs adversarial
rows through every form (plain, residual, Huginn add, norm-add-norm, and the variance itself), for
every reduction plan of that width, contiguous and strided, against the torch expressions. The
torch version's warp order is tried first, then the other; only an order with zero mismatches is
trusted. A kernel family (the Triton one-launch norm, the native norm) owns one `Trust`: its results
per key, its refusals counted by reason, the trust decision for an input and the report for the
manifests. Never validated during a CUDA-graph capture: a missing validation then means "no".
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import triton

from rltbench.kernels import reference as ref
from rltbench.kernels.norm.torch_order import WARP_ORDERS, default_warp_order, plan_for
from rltbench.kernels.rounding import DTYPE_CODES

VALIDATION_TOKENS = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33, 100, 257, 1000, 2048, 4099, 8192)
VALIDATION_FORMS = 7   # comparisons per validation_case
# strided cases as (row stride - width, first element in the buffer). ALIGNED keeps the pointer
# 16-byte aligned and the stride as divisible by 16 as the width: the Triton specialisation of
# contiguous rows, the only one the one-launch kernels are given (onelaunch.layout_reason).
# UNALIGNED (odd stride, start off 16 bytes): rows the native norm takes through its scalar path.
ALIGNED_STRIDED = (16, 16)
UNALIGNED_STRIDED = (5, 3)
Key = tuple[str, str, str, int]            # (GPU name, torch version, dtype, width)
Mismatch = dict[str, Any]
CaseCounts = tuple[int, int, list[Mismatch], set[int]]   # (comparisons, elements, mismatches, lanes)


@dataclass
class ValidationResult:
    """Outcome of comparing one kernel family with torch on one (GPU, torch, dtype, width)."""

    passed: bool
    device_name: str
    torch_version: str
    dtype: str
    width: int
    reason: str = ""
    warp_order: str = ""            # the order that passed (used by the kernels from then on)
    expected_warp_order: str = ""   # default_warp_order(torch version), tried first
    orders_tried: dict[str, int] = field(default_factory=dict)   # order -> failing comparisons
    cases: int = 0
    elements: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    lanes_covered: list[int] = field(default_factory=list)
    layout: str = ""                # which kernel layout served the cases
    layout_refused: str = ""        # why the configured layout was refused here ("": it was not)
    triton_version: str = triton.__version__
    allocator_backend: str = ""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def validation_key(device: torch.device, dtype: torch.dtype, width: int) -> Key:
    return (device_name(device), torch.__version__, str(dtype).replace("torch.", ""), int(width))


def adversarial(shape: tuple[int, int], dtype: torch.dtype, gen: torch.Generator, device: torch.device
                ) -> torch.Tensor:
    """Random values scaled by 2**randint per element (wide magnitude range: the sum is order
    sensitive) plus a few huge elements that absorb the small ones' low bits."""
    lim = 11 if dtype == torch.float16 else 20
    x = torch.randn(shape, generator=gen, device=device)
    x = x * torch.exp2(torch.randint(-lim, lim + 1, shape, generator=gen, device=device).float())
    spikes = torch.rand(shape, generator=gen, device=device) < 0.002
    x = torch.where(spikes, x.sign() * 2.0 ** (lim + 2), x)
    return x.to(dtype)


def weights(width: int, dtype: torch.dtype, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """Norm weights ~ N(0, 1): |w * x / rms(x)| <= 5 * sqrt(width) never overflows fp16, so the
    outputs stay finite and torch.equal (NaN != NaN) stays a meaningful comparison."""
    return torch.randn(width, generator=gen, device=device).to(dtype)


def _cmp(name: str, tokens: int, out: torch.Tensor, want: torch.Tensor, bad: list[Mismatch]) -> int:
    """Bitwise comparison (torch.equal); a mismatch is recorded with its count and first index
    (a NaN where the reference has a NaN counts as equal)."""
    if not torch.equal(out, want):
        diff = (out != want) & ~(torch.isnan(out) & torch.isnan(want))
        n = int(diff.sum())
        if n:
            first = int(diff.flatten().nonzero()[0])
            bad.append({"form": name, "tokens": tokens, "n_diff": n, "first_index": first})
    return out.numel()


@dataclass(frozen=True)
class NormKernels:
    """The kernels under test: `rows(x, w, eps, out, branch=, residual=, var_out=, warp_order=)` and
    `norm_norm(residual, branch, w1, w2, eps, h, y, var_out=, warp_order=)` (onelaunch.py's
    signatures)."""

    rows: Callable[..., None]
    norm_norm: Callable[..., None]


def validation_case(device: torch.device, dtype: torch.dtype, width: int, T: int, gen: torch.Generator,
                    strided: bool, order: str, bad: list[Mismatch], kernels: NormKernels,
                    strided_layout: tuple[int, int] = ALIGNED_STRIDED) -> int:
    """One case: T adversarial rows (``strided``: starting mid-buffer with a row stride > width,
    `strided_layout` = (stride - width, start)),
    every form and the stored variance against the torch expressions, bitwise. Mismatches are
    appended to `bad`; returns the number of elements compared. The tuner's bitwise checks run
    the same cases, so a configuration it times is one validation would accept."""
    eps = 1e-6
    norm, norm_norm = kernels.rows, kernels.norm_norm
    x, r, b = (adversarial((T, width), dtype, gen, device) for _ in range(3))
    w1, w2 = weights(width, dtype, gen, device), weights(width, dtype, gen, device)
    if strided:
        pad, start = strided_layout
        buf = torch.empty(start + T * (width + pad), dtype=dtype, device=device)
        view = buf[start:].view(T, width + pad)[:, :width]
        view.copy_(x)
        x = view
    out = torch.empty((T, width), dtype=dtype, device=device)
    var = torch.empty(T, dtype=torch.float32, device=device)
    norm(x, w1, eps, out, var_out=var, warp_order=order)
    elems = _cmp("var", T, var, x.float().pow(2).mean(-1), bad)
    elems += _cmp("ouro", T, out, ref.rms_norm(x, w1, eps), bad)
    norm(x, w1, eps, out, warp_order=order)
    elems += _cmp("huginn", T, out, ref.rms_norm_huginn(x, w1, eps), bad)
    norm(x, w1, eps, out, residual=r, warp_order=order)
    elems += _cmp("residual", T, out, ref.residual_rms_norm(r, x, w1, eps), bad)
    norm(x, w1, eps, out, branch=b, warp_order=order)
    elems += _cmp("add_huginn", T, out, ref.add_rms_norm_huginn(x, b, w1, eps), bad)
    h, y = torch.empty_like(out), torch.empty_like(out)
    norm_norm(r, x, w1, w2, eps, h, y, warp_order=order)
    rh, ry = ref.residual_rms_norm_norm(r, x, w1, w2, eps)
    return elems + _cmp("norm_norm.h", T, h, rh, bad) + _cmp("norm_norm.y", T, y, ry, bad)


def run_cases(device: torch.device, dtype: torch.dtype, width: int, order: str, kernels: NormKernels,
              seed: int = 0, tokens: tuple[int, ...] = VALIDATION_TOKENS,
              strided_layout: tuple[int, int] = ALIGNED_STRIDED) -> CaseCounts:
    """Every form against torch for every token count whose plan is reproducible (every third case
    strided, as `strided_layout`: the rows the family's kernels are given)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    cases, elems, bad, lanes = 0, 0, [], set()
    for i, T in enumerate(tokens):
        plan = plan_for(T, width, device)
        if plan.unsupported_reason is not None:
            continue
        lanes.add(plan.lanes)
        elems += validation_case(device, dtype, width, T, gen, i % 3 == 1, order, bad, kernels,
                                 strided_layout)
        cases += VALIDATION_FORMS
    torch.cuda.synchronize(device)
    return cases, elems, bad, lanes


# run(device, dtype, width, order, result) -> CaseCounts: one family's cases with one warp order
CaseRunner = Callable[[torch.device, torch.dtype, int, str, ValidationResult], CaseCounts]


class Trust:
    """One kernel family's validations per (GPU, torch, dtype, width) and refusals by reason."""

    def __init__(self, run: CaseRunner) -> None:
        self._run = run
        self._results: dict[Key, ValidationResult] = {}
        self._refusals: Counter[str] = Counter()
        self._lock = threading.RLock()

    def validate(self, device: torch.device | str, dtype: torch.dtype, width: int) -> ValidationResult:
        """The validation procedure (module docstring), cached per key. Never during a capture."""
        device = torch.device(device)
        key = validation_key(device, dtype, width)
        with self._lock:
            if key in self._results:
                return self._results[key]
            expected = default_warp_order(torch.__version__)
            res = ValidationResult(False, key[0], key[1], key[2], int(width), expected_warp_order=expected)
            t0 = time.perf_counter()
            if device.type != "cuda":
                res.reason = ("not a CUDA device: the modelled order is torch CUDA's (torch CPU sums "
                              "differently)")
            elif dtype not in DTYPE_CODES:
                res.reason = f"dtype {dtype} not supported"
            else:
                self._try_orders(device, dtype, width, expected, res)
            res.seconds = time.perf_counter() - t0
            self._results[key] = res
            return res

    def _try_orders(self, device: torch.device, dtype: torch.dtype, width: int, expected: str,
                    res: ValidationResult) -> None:
        res.allocator_backend = str(torch.cuda.get_allocator_backend())
        first_bad: list[Mismatch] | None = None
        for order in (expected, *[o for o in WARP_ORDERS if o != expected]):
            try:
                cases, elems, bad, lanes = self._run(device, dtype, width, order, res)
            except Exception as exc:  # a compile/launch failure must not take the caller down
                res.reason = f"validation error: {type(exc).__name__}: {exc}"
                return
            res.orders_tried[order] = len(bad)
            first_bad = bad if first_bad is None else first_bad
            if cases == 0:
                res.reason = f"no reproducible reduction plan for width {width}"
                return
            if not bad:
                res.passed, res.warp_order, res.cases, res.elements = True, order, cases, elems
                res.lanes_covered = sorted(lanes)
                if order != expected:
                    res.reason = f"passed with warp order {order!r}, not the expected {expected!r}"
                return
        res.mismatches = (first_bad or [])[:20]
        res.reason = "differs from torch with every modelled warp order"

    def result(self, device: torch.device, dtype: torch.dtype, width: int) -> ValidationResult | None:
        with self._lock:
            return self._results.get(validation_key(device, dtype, width))

    def warp_order(self, device: torch.device, dtype: torch.dtype, width: int) -> str:
        """The validated warp order for (device, dtype, width), else this torch version's default."""
        res = self.result(device, dtype, width)
        return res.warp_order if res is not None and res.passed else default_warp_order(torch.__version__)

    def prevalidate(self, widths: list[int] | tuple[int, ...],
                    dtypes: list[torch.dtype] | tuple[torch.dtype, ...],
                    device: torch.device | str | None = None) -> dict[str, Any]:
        """Validate now, e.g. in a warm-up before any CUDA-graph capture; returns report()."""
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        for dt in dtypes:
            for wd in widths:
                self.validate(torch.device(device), dt, wd)
        return self.report()

    def reason(self, x: torch.Tensor, count: bool = True) -> str | None:
        """Why x's rows ([..., width], the tensor normalised) may not take this family (None: they
        may): not CUDA, dtype, empty, torch's plan not reproducible, not validated before a
        CUDA-graph capture, validation failed, or this plan's lane count not covered. Validates
        lazily; `count` adds a refusal to the report."""
        why = self._reason(x)
        if why is not None and count:
            with self._lock:
                self._refusals[why] += 1
        return why

    def _reason(self, x: torch.Tensor) -> str | None:
        if not x.is_cuda:
            return "not_cuda"
        if x.dtype not in DTYPE_CODES:
            return "dtype"
        if x.dim() == 0 or x.numel() == 0:
            return "shape"
        W = x.shape[-1]
        plan = plan_for(x.numel() // W, W, x.device)
        if plan.unsupported_reason is not None:
            return "plan_not_reproducible"
        res = self.result(x.device, x.dtype, W)
        if res is None:
            if torch.cuda.is_current_stream_capturing():
                return "not_prevalidated_before_capture"
            res = self.validate(x.device, x.dtype, W)
        if not res.passed:
            return "validation_failed"
        if plan.lanes not in res.lanes_covered:
            return "plan_not_validated"
        return None

    def refuse(self, why: str) -> None:
        """Count a refusal decided outside `reason` (e.g. onelaunch.layout_reason) in the report."""
        with self._lock:
            self._refusals[why] += 1

    def report(self) -> dict[str, Any]:
        """JSON-ready: every validation of this process and the refusals by reason."""
        with self._lock:
            results = [r.to_dict() for r in self._results.values()]
            return {"results": results, "refusals": dict(self._refusals)}

    def reset(self) -> None:
        """Forget validations and refusal counts (tests)."""
        with self._lock:
            self._results.clear()
            self._refusals.clear()
