"""Core of `rltbench kernels`: plan the cases, check each arm's correctness, time the arms.

One *case* is (op, dtype, width, tokens). For each case and arm this module produces one flat row
(a dict, the raw result stored in rows.jsonl) with:
- correctness first, on fresh random inputs: elements that differ from the torch arm (the exact
  arm must have 0), max ULP and share of differing elements vs torch and vs the fp64 oracle
  (rounded to the dtype), and how many calls actually ran fused (a fallback is not a kernel test);
- then, on a GPU only, CUDA-graph replay and eager timings (median, p10/p90), kernels per call
  (counted), GB/s, % of the measured device copy, speedup over torch. Without a GPU the timing
  fields are NaN: timings are never made up.
- beside them, a same-size copy (SIZE_COPY): the case's bytes streamed by torch's elementwise
  kernel over rotated buffers, captured and interleaved like an arm. The device copy behind
  "% copy" is a memcpy of a buffer far larger than L2, where launch and ramp costs vanish; a kernel
  of a few MB pays them like any other, so "% same-size copy" says how far an arm is from what a
  streaming kernel of its size reaches.

Every headline figure is a plain launch (pdl.plain_launches): programmatic dependent launch lets a
kernel overlap the tail of an identical predecessor, which back-to-back calls of one op offer and a
model step does not. Where the device's tuned file gives an arm a PDL mode for the case, that arm is
also captured with it and timed in the same interleaving; its figures go to `graph_pdl_*` fields,
reported beside the headline and labelled PDL.

Correctness always runs the fused arms with scope "all" so the kernels are exercised even outside
a CUDA graph; on a GPU the graph-captured outputs are compared with torch as well. The user scope
only changes what eager *timing* runs (scope "graph": the fused arms run torch in eager mode).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from rltbench.arms import ARMS, ArmSpec, is_exact
from rltbench.bench import timing
from rltbench.bench.kernel_defaults import CPU_MAX_TOKENS, CPU_MAX_WIDTH
from rltbench.bench.warmth import ColdWork
from rltbench.kernels import make_ops, op_case, pdl
from rltbench.kernels.oracle import bound_ratio
from rltbench.kernels.oracle import ulp_distance as oracle_ulp
from rltbench.results.stats import base_arm

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
MODES = ("graph", "eager", "hot")
MAX_ROUNDS = 20
PDL_SUFFIX = "+pdl"  # runner name of an arm's PDL graph in the interleaving
# graph runner beside the arms: torch's elementwise kernel streaming the case's bytes (size_copy)
SIZE_COPY = "same-size copy"
SCOPES = ("graph", "all")
PEER_ARM = "liger"
PEER_OPS = ("rmsnorm", "rope_neox", "silu_mul")
# Model widths per op: Ouro-1.4B hidden 2048 / inter 5632 / 16x128 heads; Huginn-0125 hidden 5280 /
# inter 17920 / 55x96 heads (rltbench/models/configs.py).
MODEL_WIDTHS: dict[str, tuple[int, ...]] = {
    "rmsnorm": (2048,),
    "rmsnorm_residual": (2048,),
    "rmsnorm_huginn": (5280,),
    "add_rmsnorm_huginn": (5280,),
    "rope_neox": (2048,),
    "rope_interleaved": (5280,),
    "silu_mul": (5632, 17920),
}
# width = heads * head_dim for the rope cases: widths must be multiples of the head dim.
WIDTH_MULTIPLE: dict[str, int] = {"rope_neox": 128, "rope_interleaved": 96}


@dataclass
class BenchConfig:
    """Everything that decides what is measured; stored in manifest.json as-is."""

    ops: list[str]
    tokens: list[int]
    dtypes: list[str]
    widths: list[int] | None  # None: each op's model widths
    arms: list[str]
    modes: list[str]
    repeats: int = 100
    scope: str = "all"
    seed: int = 0
    peer: bool = True
    cpu_max_tokens: int = CPU_MAX_TOKENS
    cpu_max_width: int = CPU_MAX_WIDTH
    max_sets: int = 256  # input sets per timed replay (beyond it: L2 flush before each sample)
    # calls per captured graph, cycling over the rotation sets (> 3x L2, so still cold): a replay's
    # fixed launch cost is spread over this many calls instead of inflating few big ones
    min_graph_calls: int = 32
    # graph mode: how many times each case is timed on freshly allocated inputs, outputs and graphs,
    # the rounds of all of them pooled (a streaming kernel's level moves with where its buffers lie)
    placements: int = 1
    # each arm's settings (rltbench.arms); an arm missing here is the named arm of that name
    specs: dict[str, ArmSpec] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """For the manifest (the arms' settings are stored beside it, as arm_selections)."""
        d = dataclasses.asdict(self)
        d.pop("specs")
        return d


@dataclass(frozen=True)
class Case:
    op: str
    dtype: str
    width: int
    tokens: int

    @property
    def key(self) -> dict[str, Any]:
        return {"op": self.op, "dtype": self.dtype, "width": self.width, "tokens": self.tokens}

    def seed(self, base: int) -> int:
        """A stable per-case seed (same inputs on every run and machine for the same base seed)."""
        digest = hashlib.sha256(f"{base}:{self.op}:{self.dtype}:{self.width}:{self.tokens}".encode())
        return int.from_bytes(digest.digest()[:6], "little")


@dataclass
class Plan:
    cases: list[Case]
    notes: list[str] = field(default_factory=list)


def cap_width(op: str, width: int, cap: int) -> int:
    """Largest width <= cap that the op accepts (a multiple of the head dim for RoPE)."""
    if width <= cap:
        return width
    mult = WIDTH_MULTIPLE.get(op, 1)
    return max(mult, (cap // mult) * mult)


def plan_cases(cfg: BenchConfig, on_gpu: bool) -> Plan:
    """The cases to run, in order (op, dtype, width, tokens); capped on CPU (interpreter) machines."""
    notes: list[str] = []
    tokens = list(cfg.tokens)
    if not on_gpu:
        capped = sorted({min(t, cfg.cpu_max_tokens) for t in tokens})
        if capped != sorted(set(tokens)):
            notes.append(f"no GPU: tokens capped at {cfg.cpu_max_tokens} for the Triton interpreter")
        tokens = capped
    cases: list[Case] = []
    width_capped = False
    for op in cfg.ops:
        widths = list(cfg.widths) if cfg.widths is not None else list(MODEL_WIDTHS.get(op, (2048,)))
        if not on_gpu:
            new = sorted({cap_width(op, w, cfg.cpu_max_width) for w in widths})
            width_capped |= new != sorted(set(widths))
            widths = new
        for dtype in cfg.dtypes:
            for width in widths:
                for t in tokens:
                    cases.append(Case(op, dtype, width, t))
    if width_capped:
        notes.append(f"no GPU: widths capped at {cfg.cpu_max_width} for the Triton interpreter")
    if not on_gpu:
        notes.append("no GPU: correctness only; timings need a CUDA GPU")
    return Plan(cases, notes)


# ----------------------------------------------------------------------------------------------
# arms
# ----------------------------------------------------------------------------------------------
def arm_spec(arm: str, specs: Mapping[str, ArmSpec] | None = None) -> ArmSpec | None:
    """The settings of `arm` (from `specs`, else the named arm; an A/A copy such as torch#2 is its
    arm again), None for the peer."""
    return (specs or {}).get(arm) or ARMS.get(arm) or ARMS.get(base_arm(arm))


def make_arm_ops(arm: str, scope: str, specs: Mapping[str, ArmSpec] | None = None) -> Any:
    """The Ops object of an arm with the given scope, or the Liger peer."""
    if arm == PEER_ARM:
        return LigerOps()
    spec = arm_spec(arm, specs)
    assert spec is not None, arm
    return make_ops(spec.replace(scope=scope))


def liger_available() -> bool:
    try:
        import liger_kernel  # noqa: F401  (an optional peer, never a dependency)
    except Exception:  # noqa: BLE001 - an optional peer may fail to import in many ways
        return False
    return True


class LigerOps:
    """Liger-Kernel's RMSNorm / RoPE / SiLU*up behind the Ops method names (optional peer column).

    Liger is not a dependency: only built when `liger_kernel` imports (hence the imports inside the
    methods). Its RoPE works in place on
    [B, H, T, D] views; the [T, H, D] tensors are viewed (no copy) and the results viewed back.
    """

    stats: dict[str, Any] = {}

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        return LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama")

    def rope_neox(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        from liger_kernel.transformers.rope import liger_rotary_pos_emb

        qb, kb = q.unsqueeze(0).transpose(1, 2), k.unsqueeze(0).transpose(1, 2)
        qo, ko = liger_rotary_pos_emb(qb, kb, cos.unsqueeze(0), sin.unsqueeze(0))
        return qo.transpose(1, 2).squeeze(0), ko.transpose(1, 2).squeeze(0)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        return LigerSiLUMulFunction.apply(gate, up)


# ----------------------------------------------------------------------------------------------
# comparisons
# ----------------------------------------------------------------------------------------------
def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


def clone_tree(obj: Any) -> Any:
    """Deep copy of the tensors in a nested tuple/list/dict (for ops that write their inputs)."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: clone_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        out = [clone_tree(v) for v in obj]
        return type(obj)(out) if not hasattr(obj, "_fields") else type(obj)(*out)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: clone_tree(getattr(obj, f.name))
                                           for f in dataclasses.fields(obj)})
    return obj


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """Floats mapped to int64 so that adjacent representable values differ by 1 (ULP distance)."""
    bits = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[x.dtype]
    i = x.contiguous().view(bits).to(torch.int64)
    sign_bit = 1 << (torch.iinfo(bits).bits - 1)
    return torch.where(i < 0, -(i + sign_bit), i)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in units in the last place of their (common) dtype; 0 where both are NaN.

    Kept here (not in oracle.py) because the benchmark must also compare two *arms* with each other;
    +0 and -0 are 0 ULP apart, like torch.equal treats them.
    """
    if a.dtype != b.dtype:
        raise ValueError(f"dtype mismatch {a.dtype} vs {b.dtype}")
    d = (_ordered(a) - _ordered(b)).abs()
    both_nan = torch.isnan(a) & torch.isnan(b)
    one_nan = torch.isnan(a) ^ torch.isnan(b)
    d = torch.where(both_nan, torch.zeros_like(d), d)
    return torch.where(one_nan, torch.full_like(d, torch.iinfo(torch.int64).max), d)


def compare(outs: Any, refs: Any) -> dict[str, float]:
    """Elements that differ (NaN == NaN, -0 == +0), their share, and the max ULP distance."""
    o_list, r_list = _tensors(outs), _tensors(refs)
    if len(o_list) != len(r_list):
        raise ValueError("output structure differs from the reference")
    n = diff = 0
    max_ulp = 0
    for o, r in zip(o_list, r_list, strict=True):
        if o.shape != r.shape:
            raise ValueError(f"output shape {tuple(o.shape)} differs from reference {tuple(r.shape)}")
        r = r.to(o.dtype) if r.dtype != o.dtype else r
        d = ulp_distance(o.detach(), r.detach())
        n += d.numel()
        diff += int((d != 0).sum())
        if d.numel():
            max_ulp = max(max_ulp, int(d.max()))
    return {"n_elements": n, "mismatches": diff, "mismatch_share": diff / n if n else float("nan"),
            "max_ulp": max_ulp}


def oracle_ulps(outs: Any, oracles: Any, terms: Any = None) -> dict[str, float]:
    """Max / mean distance to the fp64 oracle in ulps of the output dtype *at the oracle value*
    (oracle.ulp_distance: fractional, 0.5 = correctly rounded at best) and, with the terms'
    magnitudes, the max ratio of the error to the approx arm's stated bound (oracle.bound_ratio:
    <= 1 within it; the ULP figure alone blows up where an output cancels)."""
    mx, total, n, ratio = 0.0, 0.0, 0, 0.0
    outs_t, ys = _tensors(outs), _tensors(oracles)
    ts = _tensors(terms) if terms is not None else [None] * len(ys)
    for o, y, t in zip(outs_t, ys, ts, strict=True):
        u = oracle_ulp(o.detach(), y)
        if u.numel():
            mx = max(mx, float(u.max()))
            total += float(u.sum())
            n += u.numel()
            if t is not None:
                ratio = max(ratio, float(bound_ratio(o.detach(), y, t).max()))
    res = {"max": mx, "mean": total / n if n else float("nan")}
    if terms is not None:
        res["bound_ratio"] = ratio
    return res


def _fused_count(stats: Any) -> int | None:
    """Fused calls recorded in an Ops.stats object (structure owned by ops.py), None if unknown."""
    if stats is None:
        return None
    for attr in ("fused_total", "total_fused"):
        if hasattr(stats, attr):
            val = getattr(stats, attr)
            return int(val() if callable(val) else val)
    data = stats.to_dict() if hasattr(stats, "to_dict") else stats
    if isinstance(data, dict) and "fused" in data:
        fused = data["fused"]
        return int(sum(fused.values())) if isinstance(fused, dict) else int(fused)
    return None


def _stats_dict(stats: Any) -> Any:
    if stats is None:
        return None
    if hasattr(stats, "to_dict"):
        return stats.to_dict()
    if isinstance(stats, dict):
        return stats
    return str(stats)


# ----------------------------------------------------------------------------------------------
# one case
# ----------------------------------------------------------------------------------------------
def make_inputs(case: Case, device: torch.device, seed: int, index: int = 0) -> Any:
    gen = torch.Generator(device=device)
    gen.manual_seed(case.seed(seed) + 7919 * index)
    return op_case(case.op).make_inputs(case.tokens, case.width, DTYPES[case.dtype], device, gen)


def check_case(case: Case, arms: Iterable[str], device: torch.device, seed: int,
               ops_factory: Callable[[str, str], Any] = make_arm_ops) -> dict[str, dict[str, Any]]:
    """Correctness of every arm on one fresh random input set: vs torch and vs the fp64 oracle."""
    oc = op_case(case.op)
    inputs = make_inputs(case, device, seed)
    ref = oc.run(ops_factory("torch", "all"), clone_tree(inputs))
    oracle = oc.oracle(inputs)
    terms = oc.terms(inputs)
    oracle_r = [o.to(DTYPES[case.dtype]) for o in _tensors(oracle)]
    nbytes = int(oc.bytes_moved(inputs))
    result: dict[str, dict[str, Any]] = {}
    for arm in arms:
        ops = ops_factory(arm, "all")
        before = _fused_count(getattr(ops, "stats", None))
        out = oc.run(ops, clone_tree(inputs))
        after = _fused_count(getattr(ops, "stats", None))
        vs_ref = compare(out, ref)
        vs_oracle = compare(out, oracle_r)
        ulp_oracle = oracle_ulps(out, oracle, terms)
        fused = None if before is None or after is None else after - before
        result[arm] = {
            "nbytes": nbytes,
            "n_elements": vs_ref["n_elements"],
            "mismatches": vs_ref["mismatches"],
            "mismatch_share": vs_ref["mismatch_share"],
            "max_ulp_vs_torch": vs_ref["max_ulp"],
            "max_ulp_vs_oracle": ulp_oracle["max"],
            "mean_ulp_vs_oracle": ulp_oracle["mean"],
            "max_err_over_bound": ulp_oracle["bound_ratio"],
            "share_differs_oracle": vs_oracle["mismatch_share"],
            "fused_calls": fused,
            "ops_stats": _stats_dict(getattr(ops, "stats", None)),
        }
    return result


@dataclass
class TimingContext:
    """Per-run GPU facts shared by every case: L2 size, copy bandwidth, flush buffer."""

    device: torch.device
    l2_bytes: int
    copy: dict[str, float]
    flusher: timing.L2Flusher

    @classmethod
    def create(cls, device: torch.device) -> TimingContext:
        l2 = timing.l2_cache_bytes(device)
        return cls(device, l2, timing.measure_copy_bandwidth(device), timing.L2Flusher(device, l2))


def tuned_pdl_mode(run: Callable[[], Any]) -> int:
    """The highest PDL mode the launches of `run()` choose on this device (0: none applies)."""
    with pdl.launch_modes() as counts:
        run()
    return max((mode for mode, n in counts.items() if n), default=0)


def time_case(case: Case, arms: list[str], cfg: BenchConfig, ctx: TimingContext,
              ops_factory: Callable[[str, str], Any] = make_arm_ops) -> tuple[dict[str, dict[str, Any]],
                                                                              list[dict[str, Any]]]:
    """Graph and/or eager timings of every arm on K rotated input sets; also re-checks graph outputs.

    Returns (per-arm timing fields, sample records). Arms are interleaved; warm-up is excluded.
    """
    oc = op_case(case.op)
    first = make_inputs(case, ctx.device, cfg.seed, 0)
    plan = timing.rotation_sets(int(oc.bytes_moved(first)), ctx.l2_bytes, max_sets=cfg.max_sets)
    sets = [first] + [make_inputs(case, ctx.device, cfg.seed, i) for i in range(1, plan.sets)]
    before = ctx.flusher.flush if plan.needs_flush else None
    # rotated sets keep the data cold, not the cache state: each slot starts from a flushed L2,
    # whichever arm ran before it (timing._timed_rounds)
    slot_start = None if plan.needs_flush else ctx.flusher.flush
    # rounds are the paired observations of the verdicts (results/kernel_verdicts.py): 20 give the
    # median ratio a 95% interval from the 6th to the 15th; each round's median is over `reps` samples
    rounds = max(1, min(MAX_ROUNDS, cfg.repeats))
    reps = max(1, math.ceil(cfg.repeats / rounds))
    # with an L2 flush per sample each set must be read once per replay; otherwise cycle the sets
    k = plan.sets if plan.needs_flush else max(plan.sets, cfg.min_graph_calls)
    base = {"rotation_sets": plan.sets, "rotated_mb": plan.rotated_bytes / 1e6, "l2_flush": plan.needs_flush,
            "l2_flush_per_slot": slot_start is not None, "graph_calls": k}
    fields: dict[str, dict[str, Any]] = {a: dict(base) for a in arms}
    samples: list[dict[str, Any]] = []
    ref0 = oc.run(ops_factory("torch", "all"), clone_tree(first))
    if "graph" in cfg.modes:
        # the PDL mode each arm's tuned launch takes for this case: decided once, on the first set
        pdl_modes = {a: tuned_pdl_mode(lambda a=a: oc.run(ops_factory(a, "all"), clone_tree(first)))
                     for a in arms if a != PEER_ARM}
        timed, held = [], [sets]
        for p in range(cfg.placements):
            if p:   # same values in new buffers: the earlier sets stay held, cached blocks go back
                torch.cuda.empty_cache()
                held.append([make_inputs(case, ctx.device, cfg.seed, i) for i in range(plan.sets)])
            timed.append(_time_graph_placement(case, arms, cfg, ctx, ops_factory, plan, k, rounds, reps,
                                               before, slot_start, pdl_modes, ref0, held[-1]))
        _pool_graph_placements(timed, arms, case, rounds, pdl_modes, fields, samples)
        del held
    # the hot and eager modes read the first placement's sets (the Liger copy only where they run)
    arm_sets = per_arm_sets(sets, arms) if {"hot", "eager"} & set(cfg.modes) else {}
    if "hot" in cfg.modes:
        # one input set and one reused output: every call finds its inputs in L2, as a decode step
        # finds the activations the previous kernel just wrote (the spec's latency table is hot);
        # reported beside the cold figure, never instead of it
        k_hot = cfg.min_graph_calls
        graphs = {}
        for arm in arms:
            ops = ops_factory(arm, cfg.scope)
            with pdl.plain_launches():
                graphs[arm] = timing.GraphCalls(lambda i, ops=ops, s0=arm_sets[arm][0]: oc.run(ops, s0),
                                                k_hot, keep_outputs=1)
        cold = ColdWork(device=ctx.device)
        times = timing.time_interleaved({a: g.replay for a, g in graphs.items()}, calls=k_hot, rounds=rounds,
                                        reps=reps, window=cold)
        for arm, g in graphs.items():
            f = fields[arm]
            f.update(timing.summarize(times[arm]).to_dict("hot_us_"), hot_warm=cold.warm)
            f["hot_kernels_per_call"] = g.kernel_nodes / k_hot if g.kernel_nodes is not None \
                else timing.count_kernels_profiler(g.replay, k_hot)
            samples.append({**case.key, "arm": arm, "mode": "hot", "samples_us": times[arm],
                            "rounds": rounds, "cold_work": cold.counts})
        del graphs
    if "eager" in cfg.modes:
        runners = {}
        for arm in arms:
            ops = ops_factory(arm, cfg.scope)
            runners[arm] = lambda ops=ops, ss=arm_sets[arm]: [oc.run(ops, s) for s in ss]
        cold = ColdWork(device=ctx.device)
        with pdl.plain_launches():  # eager launches choose their mode at every call
            times = timing.time_interleaved(runners, calls=plan.sets, rounds=rounds, reps=reps,
                                            before_sample=before, window=cold, before_slot=slot_start)
        for arm in runners:
            stats = timing.summarize(times[arm])
            fields[arm].update(stats.to_dict("eager_us_"), eager_warm=cold.warm)
            ops, s0 = ops_factory(arm, cfg.scope), arm_sets[arm][0]
            count = timing.count_kernels_profiler(lambda o=ops, s=s0: oc.run(o, s))
            fields[arm]["eager_kernels_per_call"] = count
            samples.append({**case.key, "arm": arm, "mode": "eager", "samples_us": times[arm],
                            "rounds": rounds, "cold_work": cold.counts})
    nbytes = int(oc.bytes_moved(first))
    copy_gbps = ctx.copy.get("gbps", float("nan"))
    for arm in arms:
        f = fields[arm]
        for mode in MODES:
            med = f.get(f"{mode}_us_median", float("nan"))
            bw = timing.gbps(nbytes, med * 1e-6)
            f[f"{mode}_gbps"] = bw
            f[f"{mode}_pct_copy"] = 100.0 * bw / copy_gbps if copy_gbps and math.isfinite(copy_gbps) else None
            torch_med = fields.get("torch", {}).get(f"{mode}_us_median", float("nan"))
            f[f"{mode}_speedup"] = torch_med / med if med and math.isfinite(med) else float("nan")
        med = f.get("graph_pdl_us_median")
        if med is not None:  # PDL beside the plain launch: same bytes, same copy, vs torch's plain figure
            f["graph_pdl_gbps"] = timing.gbps(nbytes, med * 1e-6)
            f["graph_pdl_pct_copy"] = (100.0 * f["graph_pdl_gbps"] / copy_gbps
                                       if copy_gbps and math.isfinite(copy_gbps) else None)
            torch_med = fields.get("torch", {}).get("graph_us_median", float("nan"))
            f["graph_pdl_speedup"] = torch_med / med if med and math.isfinite(med) else float("nan")
        levels = f.get("graph_placement_us")
        if levels and copy_gbps and math.isfinite(copy_gbps):   # each placement's own % copy
            pct = [100.0 * timing.gbps(nbytes, us * 1e-6) / copy_gbps for us in levels]
            f.update(graph_placement_pct_copy=pct, graph_placement_pct_copy_min=min(pct),
                     graph_placement_pct_copy_max=max(pct))
    torch.cuda.empty_cache()
    return fields, samples


TIMING_KEYS = [f"{m}_{k}" for m in MODES for k in (
    "us_median", "us_p10", "us_p90", "us_n", "kernels_per_call", "gbps", "pct_copy", "speedup")] + [
    "graph_size_copy_us", "graph_pct_size_copy"]


def per_arm_sets(sets: list[Any], arms: list[str]) -> dict[str, list[Any]]:
    """The input sets each arm reads. The Liger peer's RoPE writes its inputs in place: it gets its
    own copy, so the project arms (and their graph-output check) keep reading the original inputs."""
    return {a: [clone_tree(s) for s in sets] if a == PEER_ARM else sets for a in arms}


@dataclass
class GraphPlacement:
    """One placement's graph-mode timing: every runner's samples (arms, their PDL graphs, the
    same-size copy), what the timed window did cold, and per arm the graph facts checked after it."""

    times: dict[str, list[float]]
    cold: ColdWork
    kernels_per_call: dict[str, float | None]
    mismatches: dict[str, int]
    pdl_mismatches: dict[str, int]


def _time_graph_placement(case: Case, arms: list[str], cfg: BenchConfig, ctx: TimingContext,
                          ops_factory: Callable[[str, str], Any], plan: timing.RotationPlan, k: int,
                          rounds: int, reps: int, before: Callable[[], Any] | None,
                          slot_start: Callable[[], Any] | None, pdl_modes: dict[str, int], ref0: Any,
                          sets: list[Any]) -> GraphPlacement:
    """Capture every arm (and its PDL graph where tuned), and the same-size copy, on `sets`, time
    them interleaved (`before` each sample, `slot_start` before each slot), check each graph's
    output against `ref0` (torch on the first set)."""
    oc = op_case(case.op)
    arm_sets = per_arm_sets(sets, arms)

    def capture(arm: str) -> timing.GraphCalls:
        ops = ops_factory(arm, cfg.scope)
        return timing.GraphCalls(
            lambda i, ops=ops, ss=arm_sets[arm]: oc.run(ops, ss[i % len(ss)]), k, keep_outputs=plan.sets)

    with pdl.plain_launches():
        graphs = {arm: capture(arm) for arm in arms}
    runners = {a: g.replay for a, g in graphs.items()}
    pdl_graphs = {a: capture(a) for a, m in pdl_modes.items() if m}
    runners.update({f"{a}{PDL_SUFFIX}": g.replay for a, g in pdl_graphs.items()})
    srcs = size_copy_sources(int(oc.bytes_moved(sets[0])), plan.sets, ctx.device)
    with pdl.plain_launches():
        copy_graph = timing.GraphCalls(lambda i, ss=srcs: size_copy(ss[i % len(ss)]), k,
                                       keep_outputs=plan.sets)
    runners[SIZE_COPY] = copy_graph.replay
    cold = ColdWork(device=ctx.device)
    times = timing.time_interleaved(runners, calls=k, rounds=rounds, reps=reps, before_sample=before,
                                    window=cold, before_slot=slot_start)
    del copy_graph, srcs   # before the checks below: their memory goes back first
    out = GraphPlacement(times, cold, {}, {}, {})
    for arm, g in graphs.items():
        out.kernels_per_call[arm] = (g.kernel_nodes / k if g.kernel_nodes is not None  # exact, no profiler
                                     else timing.count_kernels_profiler(g.replay, k))
        if arm != PEER_ARM:  # in-place peers rewrite their inputs; their graph check is moot
            g.replay()
            torch.cuda.synchronize()
            out.mismatches[arm] = compare(g.outputs[0], ref0)["mismatches"]
    for arm, g in pdl_graphs.items():
        g.replay()
        torch.cuda.synchronize()
        out.pdl_mismatches[arm] = compare(g.outputs[0], ref0)["mismatches"]
    return out


def _summed_counts(counts: list[dict[str, int | None]]) -> dict[str, int | None]:
    """Cold-work counts of several timed windows added up (None where any window could not count)."""
    keys = {key for c in counts for key in c}
    return {key: None if any(c.get(key) is None for c in counts) else sum(int(c[key] or 0) for c in counts)
            for key in keys}


def _pool_graph_placements(timed: list[GraphPlacement], arms: list[str], case: Case, rounds: int,
                           pdl_modes: dict[str, int], fields: dict[str, dict[str, Any]],
                           samples: list[dict[str, Any]]) -> None:
    """The graph-mode fields and sample records of a case from its placements: every runner's samples
    pooled round after round (each placement is `rounds` full rounds, so the verdicts pair round i of
    two arms as before), medians over the pool, and each placement's own median beside it."""
    pooled = {name: [t for p in timed for t in p.times[name]] for name in timed[0].times}
    levels = {name: [statistics.median(p.times[name]) for p in timed] for name in pooled}
    cold_work = _summed_counts([p.cold.counts for p in timed])
    warm = all(p.cold.warm for p in timed)
    n_rounds = rounds * len(timed)
    extra = {"placements": len(timed)} if len(timed) > 1 else {}

    def record(arm: str, mode: str, name: str) -> dict[str, Any]:
        rec = {**case.key, "arm": arm, "mode": mode, "samples_us": pooled[name], "rounds": n_rounds,
               "cold_work": cold_work, **extra}
        if extra:
            rec["placement_medians_us"] = levels[name]
        return rec

    copy_med = timing.summarize(pooled[SIZE_COPY]).median
    samples.append(record(SIZE_COPY, "graph", SIZE_COPY))
    for arm in arms:
        stats = timing.summarize(pooled[arm])
        f = fields[arm]
        f.update(stats.to_dict("graph_us_"), graph_warm=warm, graph_size_copy_us=copy_med,
                 graph_pct_size_copy=100.0 * copy_med / stats.median if stats.median > 0 else None,
                 graph_kernels_per_call=timed[0].kernels_per_call[arm])
        if extra:
            f.update(graph_placements=len(timed), graph_placement_us=levels[arm],
                     graph_placement_size_copy_us=levels[SIZE_COPY])
        if arm != PEER_ARM:
            f["graph_mismatches"] = max(p.mismatches[arm] for p in timed)
        samples.append(record(arm, "graph", arm))
    for arm in timed[0].pdl_mismatches:
        name = f"{arm}{PDL_SUFFIX}"
        f = fields[arm]
        f.update(timing.summarize(pooled[name]).to_dict("graph_pdl_us_"))
        f["graph_pdl_mode"] = pdl_modes[arm]
        f["graph_pdl_mismatches"] = max(p.pdl_mismatches[arm] for p in timed)
        samples.append(record(arm, "graph-pdl", name))


def size_copy_sources(nbytes: int, sets: int, device: torch.device) -> list[torch.Tensor]:
    """Sources of the same-size copy, one per rotation set: half the case's bytes moved each (the
    copy reads them and writes as many), random so no byte pattern is special."""
    n = max(1, nbytes // 8)   # int32 elements in nbytes / 2 bytes
    return [torch.empty(n, dtype=torch.int32, device=device).random_(0, 1 << 30) for _ in range(sets)]


def size_copy(src: torch.Tensor) -> torch.Tensor:
    """The same-size copy: torch's vectorized elementwise kernel reading `src` and writing as many
    bytes (a bitwise not: no arithmetic to speak of). Not ``clone()``: a same-dtype contiguous
    copy is a memcpy, which a CUDA graph may hand to a copy engine, a machine with its own
    size-dependent rate, not the streaming kernel the arms are compared with."""
    return torch.bitwise_not(src)


def case_rows(case: Case, arms: list[str], device: torch.device, cfg: BenchConfig,
              ctx: TimingContext | None, ops_factory: Callable[[str, str], Any] = make_arm_ops
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """All rows of one case (one per arm) plus timing samples; errors become rows, never crashes."""
    rows = {a: {**case.key, "arm": a, "device": device.type, "status": "ok", "note": ""} for a in arms}
    for r in rows.values():
        r.update({k: float("nan") for k in TIMING_KEYS})
        r["nbytes"] = None
    samples: list[dict[str, Any]] = []
    try:
        checks = check_case(case, arms, device, cfg.seed, ops_factory)
    except Exception as exc:  # noqa: BLE001 - one broken case must not lose the others
        for r in rows.values():
            r.update(status="error", note=f"correctness check failed: {type(exc).__name__}: {exc}"[:300])
        return list(rows.values()), samples
    for arm, chk in checks.items():
        rows[arm].update(chk)
        r = rows[arm]
        if bitwise_arm(arm, cfg.specs) and r["mismatches"] != 0:
            r["status"] = "MISMATCH"
        elif fused_arm(arm, cfg.specs) and r.get("fused_calls") == 0:
            r["status"] = "fallback"
            why = fallback_reasons(r.get("ops_stats"))
            r["note"] = ("no fused call ran (torch fallback" + (f": {why}" if why else "")
                         + "): the kernel was not exercised")
    if ctx is not None:
        try:
            fields, samples = time_case(case, arms, cfg, ctx, ops_factory)
        except Exception as exc:  # noqa: BLE001
            for r in rows.values():
                if r["status"] == "ok":
                    r["status"] = "error"
                r["note"] = _join_note(r["note"], f"timing failed: {type(exc).__name__}: {exc}")[:300]
            torch.cuda.empty_cache()
            return list(rows.values()), samples
        for arm, f in fields.items():
            rows[arm].update(f)
            failed = (f.get("graph_mismatches") or 0) != 0 and rows[arm]["status"] == "ok"
            if bitwise_arm(arm, cfg.specs) and failed:
                rows[arm]["status"] = "MISMATCH"
                rows[arm]["note"] = "graph-captured outputs differ from torch"
            if arm == "exact" and (f.get("graph_pdl_mismatches") or 0) != 0 and rows[arm]["status"] == "ok":
                rows[arm]["status"] = "MISMATCH"
                rows[arm]["note"] = "graph-captured outputs with PDL differ from torch"
    if ctx is not None and cfg.scope == "graph" and "eager" in cfg.modes:
        for a, r in rows.items():
            if fused_arm(a, cfg.specs):
                r["note"] = _join_note(r["note"], "scope graph: eager timing runs torch")
    return list(rows.values()), samples


def bitwise_arm(arm: str, specs: Mapping[str, ArmSpec] | None = None) -> bool:
    """A project arm that must equal torch bit for bit (exact, cuda): any mismatch fails its row."""
    spec = arm_spec(arm, specs)
    return spec is not None and is_exact(spec)


def fused_arm(arm: str, specs: Mapping[str, ArmSpec] | None = None) -> bool:
    """A project arm that runs kernels (not the torch reference, not the peer)."""
    spec = arm_spec(arm, specs)
    return spec is not None and spec.fused


def _join_note(note: str, more: str) -> str:
    """Row notes are sentences joined with '; ' (the table shows them on one line)."""
    return f"{note}; {more}" if note else more


def fallback_reasons(stats: Any) -> str:
    """'op: reason' of every torch fallback in an Ops.stats dict (why a fused arm ran no kernel)."""
    fb = (stats or {}).get("fallbacks") if isinstance(stats, dict) else None
    if not isinstance(fb, dict):
        return ""
    return ", ".join(f"{op}: {reason}" for op, reasons in sorted(fb.items())
                     for reason in (sorted(reasons) if isinstance(reasons, dict) else [reasons]))


def failing(row: dict[str, Any]) -> bool:
    """Rows that make the exit code 1: an exact mismatch or an error in a project arm."""
    if row.get("arm") == PEER_ARM:
        return False
    return row.get("status") in ("MISMATCH", "error")


def interpreter_active() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"
