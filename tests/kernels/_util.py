"""Test helpers for the kernel tests: bitwise comparison and adversarial inputs."""

from __future__ import annotations

import torch

_INT = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def assert_bitwise(out: torch.Tensor, ref: torch.Tensor, what: str = "") -> None:
    """Same shape/dtype and identical bits, except that any NaN equals any NaN (payloads differ
    between torch CPU and CUDA conversions). Stricter than torch.equal: -0.0 != +0.0."""
    assert out.shape == ref.shape and out.dtype == ref.dtype, (
        what,
        out.shape,
        ref.shape,
        out.dtype,
        ref.dtype,
    )
    nan = torch.isnan(out)
    assert torch.equal(nan, torch.isnan(ref)), f"{what}: NaN positions differ"
    a = torch.where(nan, torch.zeros_like(out), out).contiguous().view(_INT[out.dtype])
    b = torch.where(nan, torch.zeros_like(ref), ref).contiguous().view(_INT[ref.dtype])
    bad = (a != b).sum().item()
    assert bad == 0, (
        f"{what}: {bad} of {a.numel()} elements differ; first out={out.flatten()[(a != b).flatten()][:4]}"
        f" ref={ref.flatten()[(a != b).flatten()][:4]}"
    )


def randn(shape, dtype, gen, scale=1.0, device="cpu") -> torch.Tensor:
    return (torch.randn(shape, generator=gen) * scale).to(device=device, dtype=dtype)


def strided_rows(t: torch.Tensor, pad: int = 3, offset: int = 1) -> torch.Tensor:
    """A view equal to t whose rows start mid-tensor (offset) with row stride = width + pad."""
    T, W = t.shape
    big = torch.full((T, W + pad), float("nan"), dtype=t.dtype, device=t.device)
    v = big[:, offset : offset + W]
    v.copy_(t)
    return v


def with_specials(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Copy of t with +-inf, nan, +-0, denormals and huge/tiny magnitudes at random positions."""
    fi = torch.finfo(t.dtype)
    vals = (
        torch.tensor(
            [
                float("inf"),
                -float("inf"),
                float("nan"),
                0.0,
                -0.0,
                fi.tiny / 4,
                -fi.tiny / 2,
                fi.max / 2,
                -fi.max / 3,
                fi.tiny,
                1e30,
                -1e-30,
            ],
            dtype=torch.float32,
        )
        .to(t.dtype)
        .to(t.device)
    )
    out = t.clone().flatten()
    idx = torch.randint(0, out.numel(), (min(out.numel(), 3 * len(vals)),), generator=gen)
    out[idx.to(t.device)] = vals[(torch.arange(len(idx)) % len(vals)).to(t.device)]
    return out.view(t.shape)


def bulk_bitwise(ops, reference_ops, big: dict, dtype: torch.dtype, gen: torch.Generator,  # noqa: ANN001
                 gen_cpu: torch.Generator) -> int:
    """Every op of `big` ({op: [(tokens, width), ...]}) through `ops`, bitwise against
    `reference_ops`, on CUDA inputs with special values in x / q / gate (with_specials); returns the
    number of output elements compared. Shared by the exact and the native arm's GPU tests."""
    from rltbench.kernels import OPS, op_case

    total = 0
    for name in OPS:
        case = op_case(name)
        for T, W in big[name]:
            d = case.make_inputs(T, W, dtype, "cuda", gen)
            for key in ("x", "q", "gate"):
                if key in d:
                    d[key] = with_specials(d[key], gen_cpu)
            for a, b in zip(case.run(ops, d), case.run(reference_ops, d), strict=True):
                assert_bitwise(a, b, f"{name} {dtype} T={T} W={W}")
                total += a.numel()
    return total


# (op, tokens, width) for the GPU tests' big batches (>= 1e8 elements per dtype over all ops):
# model widths and odd ones, shared by the exact and the native arm's tests
BIG = {
    "rmsnorm": [(8192, 2048), (2000, 5633)],
    "rmsnorm_huginn": [(4096, 5280), (999, 4097)],
    "rmsnorm_residual": [(8192, 2048), (1024, 5633)],
    "add_rmsnorm_huginn": [(4096, 5280), (777, 3001)],
    "rope_neox": [(8192, 2048)],
    "rope_interleaved": [(8192, 5280)],
    "silu_mul": [(4096, 5632), (2000, 17920), (333, 5635)],
}


def offset_copy(t: torch.Tensor, by: int = 1) -> torch.Tensor:
    """A copy of t that starts `by` elements into its storage (breaks 16-byte alignment)."""
    buf = torch.empty(t.numel() + by, dtype=t.dtype, device=t.device)
    v = buf[by:].view(t.shape)
    v.copy_(t)
    return v


def arm_bitwise_cuda(ops, big: dict, dtype: torch.dtype, layouts: tuple[str, ...]) -> int:  # noqa: ANN001
    """An arm's every op bitwise against torch on CUDA: bulk_bitwise over `big`, then decode shapes
    (T = 1 and 3) and a prefill size (T = 4100) with each layout of the 2-D inputs: "strided" rows
    and "offset" storage (RoPE's q and k are offset in both). Returns the elements compared by
    bulk_bitwise."""
    from rltbench.kernels import OPS, OpSelection, make_ops, op_case

    rf = make_ops(OpSelection.torch())
    g = torch.Generator(device="cuda").manual_seed(1)
    with torch.inference_mode():
        total = bulk_bitwise(ops, rf, big, dtype, g, torch.Generator().manual_seed(1))
        for name in OPS:
            case = op_case(name)
            for T in (1, 3, 4100):
                for layout in layouts:
                    d = case.make_inputs(T, big[name][0][1], dtype, "cuda", g)
                    move = strided_rows if layout == "strided" else offset_copy
                    if name.startswith("rope"):
                        d["q"], d["k"] = offset_copy(d["q"]), offset_copy(d["k"])
                        d["cos"], d["sin"] = move(d["cos"]), move(d["sin"])
                    else:
                        d = {k: (move(v) if v.dim() == 2 else v) for k, v in d.items()}
                    for a, b in zip(case.run(ops, d), case.run(rf, d), strict=True):
                        assert_bitwise(a, b, f"{name} {dtype} T={T} {layout}")
    return total


def graph_replay_bitwise(ops, reference_ops, gen: torch.Generator, dtype: torch.dtype = torch.bfloat16,  # noqa: ANN001
                         tokens: int = 5) -> None:
    """Every op captured once through `ops` (scope graph: eager runs and the side-stream warm-up run
    torch) into one CUDA graph, then replayed twice with new input contents, each output bitwise
    against `reference_ops`. Asserts one fused call per op and no fallback. Shared by the exact
    and the native arm's GPU tests."""
    from rltbench.kernels import OPS, op_case

    cases = {name: op_case(name) for name in OPS}
    widths = {name: (960 if name == "rope_interleaved" else 2048) for name in OPS}
    static = {name: c.make_inputs(tokens, widths[name], dtype, "cuda", gen) for name, c in cases.items()}
    with torch.inference_mode():
        for name, c in cases.items():  # eager under scope graph: torch, not fused
            c.run(ops, static[name])
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for name, c in cases.items():
                c.run(ops, static[name])
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = {name: c.run(ops, static[name]) for name, c in cases.items()}
        assert sum(ops.stats.fused.values()) == len(OPS), ops.stats.to_dict()
        assert ops.stats.fallback_count() == 0, ops.stats.to_dict()
        for _ in range(2):
            for name, c in cases.items():
                for k, v in c.make_inputs(tokens, widths[name], dtype, "cuda", gen).items():
                    static[name][k].copy_(v)
            graph.replay()
            torch.cuda.synchronize()
            for name, c in cases.items():
                for a, b in zip(outs[name], c.run(reference_ops, static[name]), strict=True):
                    assert_bitwise(a, b, f"graph replay {name}")


def run_sm90_script(script: str, marker: str, env_extra: dict[str, str] | None = None) -> None:
    """Run a Triton ahead-of-time compile script for sm_90 in a subprocess without the interpreter
    (no GPU needed); skip where Triton has no NVIDIA backend or its ptxas/cuobjdump is missing, else
    require exit 0 and `marker` on stdout."""
    import os
    import subprocess
    import sys

    import pytest

    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        pytest.skip("Triton without the NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_extra or {})
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    missing = "not found" in proc.stderr and ("ptxas" in proc.stderr or "cuobjdump" in proc.stderr)
    if proc.returncode != 0 and missing:
        pytest.skip("ptxas/cuobjdump unavailable")
    assert proc.returncode == 0 and marker in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
