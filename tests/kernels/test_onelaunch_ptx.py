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
                  "TREE_SUM": tree, "PDL": 0, "PIN": False}
        full = {**fsig, **{c: "constexpr" for c in consts}}
        k = triton.compile(ASTSource(fn=fast._fast_norm_norm_kernel, signature=full, constexprs=consts),
                           target=target, options={"num_warps": nw})
        ptx = k.asm["ptx"]
        assert "fma.rn.f32" not in ptx and "fma.f32" not in ptx, (g, iters, tree)
        assert "mul.rn.f32" in ptx and "add.rn.f32" in ptx
        assert "ld.local" not in ptx, "register spills"
        assert "griddepcontrol" not in ptx
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


PDL_SCRIPT = textwrap.dedent('''
    import re
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from rltbench.kernels import norm_onelaunch_fast as fast
    from rltbench.kernels.act_exact import _silu_mul_kernel
    from rltbench.kernels.rope_exact import _rope_neox_store_kernel
    target = GPUTarget("cuda", 90, 32)

    def ptx_of(fn, sig, consts, nw=4):
        full = {**sig, **{c: "constexpr" for c in consts}}
        return triton.compile(ASTSource(fn=fn, signature=full, constexprs=consts), target=target,
                              options={"num_warps": nw}).asm["ptx"]

    def loads_before_wait(ptx):
        head = ptx.split("griddepcontrol.wait")[0]
        return len(re.findall(r"ld\\.global", head))

    fsig = {**{n: "*bf16" for n in ("a_ptr", "r_ptr", "w1_ptr", "w2_ptr", "h_ptr", "y_ptr")},
            "var_ptr": "*fp32", "N": "i32", "sa": "i32", "sr": "i32", "eps": "fp32", "factor": "fp32"}
    for iters in (1, 3):
        for mode in (0, 1, 2):
            consts = {"STORE_VAR": True, "DT": 1, "INTERPRET": False, "G": 16, "ITERS": iters,
                      "WARP_DOWN": True, "TREE_SUM": False, "PDL": mode, "PIN": False}
            ptx = ptx_of(fast._fast_norm_norm_kernel, fsig, consts)
            assert ("griddepcontrol.wait" in ptx) == (mode >= 1), (iters, mode)
            assert ("griddepcontrol.launch_dependents" in ptx) == (mode == 2), (iters, mode)
            if mode:
                # one-pass rows read the two weight rows (and nothing else) before the wait
                n = loads_before_wait(ptx)
                assert (n > 0) if iters == 1 else (n == 0), (iters, mode, n)
    nsig = {**{n: "*bf16" for n in ("x_ptr", "b_ptr", "r_ptr", "w_ptr", "out_ptr")}, "var_ptr": "*fp32",
            "N": "i32", "sx": "i32", "sb": "i32", "sr": "i32", "eps": "fp32", "factor": "fp32"}
    consts = {"MODE": 0, "HAS_R": True, "STORE_VAR": True, "DT": 1, "INTERPRET": False, "G": 16, "ITERS": 1,
              "WARP_DOWN": True, "TREE_SUM": False, "PDL": 1, "PIN": False}
    ptx = ptx_of(fast._fast_norm_kernel, nsig, consts)
    assert "griddepcontrol.wait" in ptx and loads_before_wait(ptx) > 0
    ssig = {"g_ptr": "*bf16", "u_ptr": "*bf16", "out_ptr": "*bf16", "R": "i32", "W": "i32", "sg": "i32",
            "su": "i32"}
    ptx = ptx_of(_silu_mul_kernel, ssig,
                 {"DT": 1, "INTERPRET": False, "BLOCK_R": 1, "BLOCK_C": 512, "PDL": 1})
    assert "griddepcontrol.wait" in ptx and loads_before_wait(ptx) == 0
    ptrs = ("q_ptr", "k_ptr", "v_ptr", "qo_ptr", "kc_ptr", "vc_ptr", "c_ptr", "s_ptr")
    ints = ("T", "HQ", "sqt", "sqh", "skt", "skh", "svt", "svh", "sct", "sst", "s_slot", "skcb", "skct",
            "skch", "svcb", "svct", "svch", "HALF")
    rsig = {**{n: "*bf16" for n in ptrs}, "slot_ptr": "*i64", **{n: "i32" for n in ints}}
    ptx = ptx_of(_rope_neox_store_kernel, rsig, {"BLOCK_SIZE": 16, "DT": 1, "INTERPRET": False, "BLOCK_T": 1,
                                                 "BLOCK_H": 64, "PDL": 2})
    assert "griddepcontrol.wait" in ptx and loads_before_wait(ptx) == 0
    assert "griddepcontrol.launch_dependents" in ptx
    print("PDL_OK")
''')


def test_pdl_kernels_wait_before_reading_what_earlier_kernels_wrote() -> None:
    """PDL (pdl.py) compiled for sm_90 without a GPU: PDL 0 emits no grid-dependency instruction,
    1 the wait, 2 the wait and the early trigger; the one-pass norm rows load their weights (only)
    before the wait, every other kernel loads nothing before it."""
    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        pytest.skip("Triton without the NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", PDL_SCRIPT], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr:
        pytest.skip("ptxas unavailable")
    assert proc.returncode == 0 and "PDL_OK" in proc.stdout, proc.stderr[-3000:]


PIN_SCRIPT = textwrap.dedent('''
    import os, re, subprocess, tempfile
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from rltbench.kernels import norm_onelaunch_fast as fast
    target = GPUTarget("cuda", 90, 32)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")

    def sass_ops(fn, sig, consts, nw):
        full = {**sig, **{c: "constexpr" for c in consts}}
        names = list(full)
        # as a real launch specializes them: 16-byte aligned pointers, width and strides % 16 == 0
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
                 if full[n].startswith("*") or n in ("N", "sx", "sb", "sr", "sa")}
        k = triton.compile(ASTSource(fn=fn, signature=full, constexprs=consts, attrs=attrs), target=target,
                           options={"num_warps": nw})
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            out = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        return re.findall(r"\\b(LDG|STS|SHFL|BAR)\\.", out)

    nsig = {**{n: "*bf16" for n in ("x_ptr", "b_ptr", "r_ptr", "w_ptr", "out_ptr")}, "var_ptr": "*fp32",
            "N": "i32", "sx": "i32", "sb": "i32", "sr": "i32", "eps": "fp32", "factor": "fp32"}
    fsig = {**{n: "*bf16" for n in ("a_ptr", "r_ptr", "w1_ptr", "w2_ptr", "h_ptr", "y_ptr")},
            "var_ptr": "*fp32", "N": "i32", "sa": "i32", "sr": "i32", "eps": "fp32", "factor": "fp32"}
    base = {"STORE_VAR": False, "DT": 1, "INTERPRET": False, "G": 16, "ITERS": 1, "WARP_DOWN": True,
            "TREE_SUM": False, "PDL": 0, "PIN": True}
    for nw in (2, 4, 8):   # one warp: .reqntid 32 makes bar.sync free to cross, nothing to pin
        for name, fn, sig, consts, loads in (
                ("norm", fast._fast_norm_kernel, nsig, {**base, "MODE": 0, "HAS_R": False}, 2),
                ("norm+r", fast._fast_norm_kernel, nsig, {**base, "MODE": 0, "HAS_R": True}, 3),
                ("norm_norm", fast._fast_norm_norm_kernel, fsig, base, 4)):
            ops = sass_ops(fn, sig, consts, nw)
            ldg = [i for i, o in enumerate(ops) if o == "LDG"]
            first_reduce = min(i for i, o in enumerate(ops) if o in ("STS", "SHFL"))
            # every row load (w, x[, r] / w1, w2, a, r) is issued before the reduction's first exchange
            assert len(ldg) >= loads, (name, nw, ops)
            assert max(ldg) < first_reduce, (name, nw, ops)
            print(name, nw, "loads", len(ldg), "first exchange at", first_reduce)
    print("PIN_OK")
''')


def test_pinned_rows_issue_every_load_before_the_reduction() -> None:
    """With PIN (norm_onelaunch_fast.pin_loads) the sm_90 SASS of the one-pass rows issues every
    global load (weights, inputs, residual) before the first shared-memory store or shuffle of the
    sum of squares, for 2..8 warps: no load latency is paid after the reduction. Without the barriers
    ptxas (Triton 3.9's) sinks the weight and residual loads below the squares."""
    try:
        import triton.backends.nvidia  # noqa: F401
    except ImportError:
        pytest.skip("Triton without the NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", PIN_SCRIPT], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    tool_missing = "not found" in proc.stderr and ("ptxas" in proc.stderr or "cuobjdump" in proc.stderr)
    if proc.returncode != 0 and tool_missing:
        pytest.skip("ptxas/cuobjdump unavailable")
    assert proc.returncode == 0 and "PIN_OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
