#!/usr/bin/env python3
"""Run every fused kernel once per layout at small sizes: the workload for compute-sanitizer.

    compute-sanitizer --tool memcheck --error-exitcode 1 python scripts/memcheck_kernels.py

Covers the exact and approx arm of every op (row offsets, strided rows, odd widths, T = 1, 3
and 130; the approx norm's PDL launch at 1030 rows), the approx norm-add-norm, the one-launch exact
norm kernels, the engine's paged attention kernels (padding rows with length 0 included) and both
arms' rope with the KV write fused in (a padding slot -1), and every native (CUDA C++) kernel variant
(check_native; GPU only). Each output is also compared with torch, so a
sanitizer-clean run is a correct one too. Without a GPU
it runs the same calls through the Triton interpreter (a smoke test of this script; memcheck
needs CUDA).
"""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from rltbench.kernels import OPS, Ops, OpSelection, make_ops, op_case  # noqa: E402
from rltbench.kernels import reference as ref  # noqa: E402

WIDTHS = {"rope_neox": (256, 384), "rope_interleaved": (96, 288)}


def check_ops(device: torch.device, tokens: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> int:
    """Every op, both fused arms, plain and offset/strided inputs; returns the number of calls."""
    calls = 0
    gen = torch.Generator(device=device).manual_seed(0)
    torch_ops = make_ops(OpSelection.torch())
    for arm in ("exact", "approx"):
        # the one-launch norm is checked on its own below: its start-up validation sweeps 1e8+
        # elements, far too slow under memcheck
        ops = Ops(OpSelection(norm=arm, rope=arm, act=arm, scope="all"), onelaunch_norm=False)
        for name in OPS:
            case = op_case(name)
            for width in WIDTHS.get(name, (64, 517)):
                for dtype in dtypes:
                    for t in tokens:
                        inputs = case.make_inputs(t, width, dtype, device, gen)
                        got = case.run(ops, inputs)
                        want = case.run(torch_ops, inputs)
                        if arm == "exact":
                            for g, w in zip(got, want, strict=True):
                                if not torch.equal(g, w):
                                    raise SystemExit(f"exact {name} {dtype} T={t} W={width}: differs")
                        calls += 1
    # row offsets and strided rows (views into a wider buffer)
    for arm in ("exact", "approx"):
        ops = Ops(OpSelection(norm=arm, rope="off", act=arm, scope="all"), onelaunch_norm=False)
        base = torch.randn(7, 1100, device=device, generator=gen).to(torch.bfloat16)
        x, r, w = base[2:, 3:520], base[1:6, 530:1047], torch.randn(517, device=device, generator=gen)
        w = w.to(torch.bfloat16)
        out = ops.residual_rms_norm(r, x, w, 1e-6)
        if arm == "exact" and not torch.equal(out, ref.residual_rms_norm(r, x, w, 1e-6)):
            raise SystemExit("exact residual norm on strided rows differs")
        g, u = base[:, :517], base[:, 517:1034]
        ops.silu_mul(g, u)
        calls += 2
    return calls


def check_onelaunch(device: torch.device) -> int:
    """The one-launch exact norm kernels (GPU only: CPU torch sums in another order), called
    directly at small sizes in the order expected for this torch version, without validation."""
    if device.type != "cuda":
        return 0
    from rltbench.kernels.norm import onelaunch as one

    gen = torch.Generator(device=device).manual_seed(2)
    calls = 0
    for t in (1, 3):
        x, r = (torch.randn(t, 2048, device=device, generator=gen).to(torch.bfloat16) for _ in range(2))
        w1, w2 = (torch.randn(2048, device=device, generator=gen).to(torch.bfloat16) for _ in range(2))
        out = torch.empty_like(x)
        one.rms_norm_onelaunch_rows(x, w1, 1e-6, out, residual=r)
        h, y = torch.empty_like(x), torch.empty_like(x)
        one.residual_rms_norm_norm_onelaunch_rows(r, x, w1, w2, 1e-6, h, y)
        calls += 2
    return calls


def check_attention(device: torch.device) -> int:
    from rltbench.engine import attention as attn

    gen = torch.Generator(device=device).manual_seed(1)
    nb, bs, h, d = 40, 16, 4, 96
    kc = torch.randn(nb, bs, h, d, device=device, generator=gen).to(torch.bfloat16)
    vc = torch.randn(nb, bs, h, d, device=device, generator=gen).to(torch.bfloat16)
    bt = torch.randperm(nb, device=device, generator=gen)[:24].view(3, 8).to(torch.int32)
    lens = torch.tensor([100, 0, 17], dtype=torch.int32, device=device)  # a padding row
    q = torch.randn(3, h, d, device=device, generator=gen).to(torch.bfloat16)
    attn.paged_decode_attention(q, kc, vc, bt, lens, d**-0.5)
    k = torch.randn(3, h, d, device=device, generator=gen).to(torch.bfloat16)
    slots = torch.tensor([5, -1, 40], dtype=torch.int64, device=device)
    attn.write_kv(kc, vc, k, k, slots)
    return 2


def check_rope_kv_store(device: torch.device, arm: str = "exact") -> int:
    """The arm's NeoX RoPE with the KV write fused in (merged-qkv views, a padding row with slot -1),
    against the arm's rope followed by the engine's write_kv."""
    from rltbench.engine import attention as attn
    from rltbench.kernels import rope

    gen = torch.Generator(device=device).manual_seed(3)
    nb, bs, hq, hkv, d = 8, 16, 4, 2, 128
    qkv = torch.randn(3, (hq + 2 * hkv) * d, device=device, generator=gen).to(torch.bfloat16)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k, v = q.view(3, hq, d), k.view(3, hkv, d), v.view(3, hkv, d)
    cos, sin = (torch.randn(3, d, device=device, generator=gen).to(torch.bfloat16) for _ in range(2))
    slots = torch.tensor([nb * bs - 1, -1, 17], dtype=torch.int64, device=device)
    kc, vc = (torch.randn(nb, bs, hkv, d, device=device, generator=gen).to(torch.bfloat16) for _ in range(2))
    kr, vr = kc.clone(), vc.clone()
    qo = torch.empty_like(q, memory_format=torch.contiguous_format)
    rope.STORE[arm](q, k, v, cos, sin, qo, kc, vc, slots)
    q_ref, k_ref = make_ops(OpSelection(rope=arm, scope="all")).rope_neox(q, k, cos, sin)
    attn.write_kv(kr, vr, k_ref, v, slots)
    if not (torch.equal(qo, q_ref) and torch.equal(kc, kr) and torch.equal(vc, vr)):
        raise SystemExit(f"{arm} fused rope + KV store differs from rope then write_kv")
    return 2


def check_approx_norm_norm(device: torch.device) -> int:
    """The approx arm's one-launch norm-add-norm on strided rows (3, 130 and 1030 rows: the last
    with the tuned PDL launch where the device has one), against the composed approx ops within the
    approx tolerance."""
    from rltbench.kernels.norm.approx import residual_rms_norm_norm_approx_rows

    gen = torch.Generator(device=device).manual_seed(6)
    ops = make_ops(OpSelection(norm="approx", scope="all"))
    n = 0
    for rows in (3, 130, 1030):
        big = torch.randn(rows, 2 * 2049, device=device, generator=gen).to(torch.bfloat16)
        r, x = big[:, :2049], big[:, 2049:]
        w1, w2 = ((1 + 0.1 * torch.randn(2049, device=device, generator=gen)).to(torch.bfloat16)
                  for _ in range(2))
        h, y = torch.empty_like(x), torch.empty_like(x)
        residual_rms_norm_norm_approx_rows(r, x, w1, w2, 1e-6, h, y)
        h2 = ops.residual_rms_norm(r, x, w1, 1e-6)
        y2 = ops.rms_norm(h2, w2, 1e-6)
        for got, want in ((h, h2), (y, y2)):
            if (got.float() - want.float()).abs().max() > want.float().abs().max() * 2**-7:
                raise SystemExit(f"approx norm-add-norm differs from the composed approx ops at {rows} rows")
        n += 3
    return n


def check_approx_norm_pdl(device: torch.device) -> int:
    """The approx norm's PDL launch (from 1024 rows; the ops above stay below that): 1030 rows, an
    odd width and 2048, with a residual, PDL 2 against PDL 0, same bits. On CPU (interpreter) both
    are plain launches."""
    from rltbench.kernels.norm.approx import rms_norm_approx_rows
    from rltbench.kernels.norm.config import ApproxNormLaunch

    gen = torch.Generator(device=device).manual_seed(5)
    n = 0
    for width in (2048, 2049):
        x, r = (torch.randn(1030, width, device=device, generator=gen).to(torch.bfloat16) for _ in range(2))
        w = (1 + 0.1 * torch.randn(width, device=device, generator=gen)).to(torch.bfloat16)
        outs = []
        for mode in (2, 0):
            out = torch.empty_like(x)
            launch = ApproxNormLaunch(pdl=mode, pdl_min_rows=1024)
            rms_norm_approx_rows(x, w, 1e-6, out, residual=r, config=launch)
            outs.append(out)
            n += 1
        if not torch.equal(outs[0], outs[1]):
            raise SystemExit(f"approx norm with PDL differs from the plain launch at width {width}")
    return n


def check_native(device: torch.device) -> int:
    """Every native (CUDA C++) kernel variant called directly: the norm's forms at every lane count
    (T = 1..128 at width 2048: vector kernels, straight-line and guarded; T = 1027: the rows kernel
    with a partial last block; width 517 and strided rows: scalar kernel) with the variances,
    SiLU*up (each block shape, vector body and tail, aligned strided rows, misaligned), both RoPEs
    (vector and scalar), each compared with torch. Skipped where the native arm is unavailable (CPU)."""
    from rltbench import native

    if device.type != "cuda":
        return 0
    native.load()   # the GPU suite builds it first (native-build); a failure here is a failure
    from rltbench.kernels.norm import native as nn

    gen = torch.Generator(device=device).manual_seed(7)
    n = 0

    def rnd(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.randn(*shape, device=device, generator=gen).to(dtype)

    def same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
        if not torch.equal(got, want):
            raise SystemExit(f"native {what}: differs from torch")

    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for width, tokens in ((2048, (1, 2, 4, 8, 16, 33, 128, 1027)), (517, (1, 3, 40))):
            w1, w2 = rnd(width, dtype=dtype), rnd(width, dtype=dtype)
            for t in tokens:
                for strided in (False, True):
                    x, r, b = (rnd(t, width, dtype=dtype) for _ in range(3))
                    if strided:   # rows start mid-buffer, row stride width + 3: the scalar kernel
                        x = torch.empty(t, width + 3, dtype=dtype, device=device)[:, 1:width + 1].copy_(x)
                    out, var = torch.empty_like(r), torch.empty(t, device=device)
                    nn.rms_norm_native_rows(x, w1, 1e-6, out, var_out=var)
                    same(out, ref.rms_norm(x, w1, 1e-6), f"rms_norm {dtype} {t}x{width}")
                    nn.rms_norm_native_rows(x, w1, 1e-6, out, residual=r)
                    same(out, ref.residual_rms_norm(r, x, w1, 1e-6), f"residual norm {dtype} {t}x{width}")
                    nn.rms_norm_native_rows(x, w1, 1e-6, out, branch=b)
                    same(out, ref.add_rms_norm_huginn(x, b, w1, 1e-6), f"add norm {dtype} {t}x{width}")
                    h, y, var2 = torch.empty_like(r), torch.empty_like(r), torch.empty(t, 2, device=device)
                    nn.residual_rms_norm_norm_native_rows(r, x, w1, w2, 1e-6, h, y, var_out=var2)
                    rh, ry = ref.residual_rms_norm_norm(r, x, w1, w2, 1e-6)
                    same(h, rh, f"norm-add-norm h {dtype} {t}x{width}")
                    same(y, ry, f"norm-add-norm y {dtype} {t}x{width}")
                    n += 4
        ops = make_ops(OpSelection(act="cuda", rope="cuda", scope="all"))
        for t, width in ((3, 517), (5, 5632), (200, 5632)):   # few-blocks kernel (+ tail), 256 x 16 B body
            big = rnd(t, 2 * width, dtype=dtype)
            pairs = ((rnd(t, width, dtype=dtype), rnd(t, width, dtype=dtype)),   # contiguous: one row + tail
                     (big[:, :width], big[:, width:]),                              # strided rows
                     (big[:, 1:width + 1], big[:, width:2 * width]))                # misaligned
            for g, u in pairs:
                same(ops.silu_mul(g, u), ref.silu_mul(g, u), f"silu_mul {dtype} {t}x{width}")
                n += 1
        for t, hq, hk, d in ((3, 4, 2, 128), (2, 3, 3, 96)):
            qkv = rnd(t, (hq + 2 * hk) * d + 1, dtype=dtype)
            for off in (0, 1):   # vector accesses, then misaligned views (scalar)
                q = qkv[:, off:off + hq * d].view(t, hq, d)
                k = qkv[:, off + hq * d:off + (hq + hk) * d].view(t, hk, d)
                c, sn = rnd(t, d, dtype=dtype), rnd(t, d, dtype=dtype)
                for a, bb in zip(ops.rope_neox(q, k, c, sn), ref.rope_neox(q, k, c, sn), strict=True):
                    same(a, bb, f"rope_neox {dtype} off={off}")
                cf, sf = rnd(t, d // 2, dtype=torch.float32), rnd(t, d // 2, dtype=torch.float32)
                want = ref.rope_interleaved(q, k, cf, sf)
                for a, bb in zip(ops.rope_interleaved(q, k, cf, sf), want, strict=True):
                    same(a, bb, f"rope_interleaved {dtype} off={off}")
                n += 2
        if ops.stats.fallback_count():
            raise SystemExit(f"native ops fell back to torch: {ops.stats.to_dict()['fallbacks']}")
    return n


def main() -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.type == "cuda"
    tokens = (1, 3, 130) if on_gpu else (1, 3)
    dtypes = (torch.bfloat16, torch.float16, torch.float32) if on_gpu else (torch.bfloat16,)
    with torch.inference_mode():
        n = check_ops(device, tokens, dtypes) + check_onelaunch(device) + check_attention(device)
        n += check_rope_kv_store(device) + check_rope_kv_store(device, "approx")
        n += check_approx_norm_pdl(device) + check_approx_norm_norm(device) + check_native(device)
    if on_gpu:
        torch.cuda.synchronize()
    print(f"memcheck workload: {n} kernel calls on {device}, exact outputs equal to torch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
