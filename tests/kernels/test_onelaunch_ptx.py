"""The one-launch norm kernels compile for sm_90 without a GPU (Triton AOT, in a subprocess
without the interpreter) and their PTX has no fused multiply-add: every product is rounded
(mul.rn) before it is added, as torch rounds x*x before summing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from rltbench.kernels import norm_onelaunch as nol
    target = GPUTarget("cuda", 90, 32)
    ptrs = {n: "*bf16" for n in ("x_ptr", "b_ptr", "r_ptr", "w_ptr", "out_ptr")}
    sig = {**ptrs, "var_ptr": "*fp32", "N": "i32", "sx": "i64", "sb": "i64", "sr": "i64",
           "eps": "fp32", "factor": "fp32", "lanes": "i32"}
    for tile, down, mode, has_r in ((512, True, 0, False), (32, False, 1, False), (32, True, 0, True)):
        consts = {"MODE": mode, "HAS_R": has_r, "STORE_VAR": True, "DT": 1, "INTERPRET": False,
                  "TILE": tile, "WARP_DOWN": down, "BLOCK_C": 1024}
        full = {**sig, **{c: "constexpr" for c in consts}}
        k = triton.compile(ASTSource(fn=nol._norm_kernel, signature=full, constexprs=consts), target=target)
        ptx = k.asm["ptx"]
        assert "fma.rn.f32" not in ptx and "fma.f32" not in ptx, (tile, down, mode)
        assert "mul.rn.f32" in ptx and "add.rn.f32" in ptx
    from rltbench.kernels import norm_onelaunch_fast as fast
    fsig = {**{n: "*bf16" for n in ("a_ptr", "r_ptr", "w1_ptr", "w2_ptr", "h_ptr", "y_ptr")},
            "var_ptr": "*fp32", "N": "i32", "sa": "i32", "sr": "i32", "eps": "fp32", "factor": "fp32"}
    for g, iters, tree, nw in ((16, 1, True, 4), (16, 3, False, 1), (1, 16, True, 1)):
        consts = {"STORE_VAR": True, "DT": 1, "INTERPRET": False, "G": g, "ITERS": iters, "WARP_DOWN": True,
                  "TREE_SUM": tree}
        full = {**fsig, **{c: "constexpr" for c in consts}}
        k = triton.compile(ASTSource(fn=fast._fast_norm_norm_kernel, signature=full, constexprs=consts),
                           target=target, options={"num_warps": nw})
        ptx = k.asm["ptx"]
        assert "fma.rn.f32" not in ptx and "fma.f32" not in ptx, (g, iters, tree)
        assert "mul.rn.f32" in ptx and "add.rn.f32" in ptx
        assert "ld.local" not in ptx, "register spills"
    print("PTX_OK")
''')


def test_kernels_compile_for_sm90_without_fma() -> None:
    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        pytest.skip("Triton without the NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"   # the default: fusion on; the kernels must not need it off
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr:
        pytest.skip("ptxas unavailable")
    assert proc.returncode == 0 and "PTX_OK" in proc.stdout, proc.stderr[-3000:]
