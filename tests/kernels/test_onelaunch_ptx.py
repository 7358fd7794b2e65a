"""Kernels compiled for sm_90 without a GPU (Triton AOT, in a subprocess without the interpreter):
the one-launch norms' PTX has no fused multiply-add (every product is rounded, mul.rn, before it is
added, as torch rounds x*x before summing) and no PDL; the approx norm's PDL launches wait before
reading what earlier kernels wrote; the lowwarp norm's SASS runs torch's reduction tree."""

from __future__ import annotations

import textwrap

from tests.kernels._util import run_sm90_script

SCRIPT = textwrap.dedent('''
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from rltbench.kernels.norm import onelaunch as nol
    target = GPUTarget("cuda", 90, 32)
    ptrs = {n: "*bf16" for n in ("x_ptr", "b_ptr", "r_ptr", "w_ptr", "out_ptr")}
    sig = {**ptrs, "var_ptr": "*fp32", "N": "i32", "sx": "i64", "sb": "i64", "sr": "i64",
           "eps": "fp32", "factor": "fp32", "lanes": "i32"}
    for tile, down, mode, has_r in ((512, True, 0, False), (32, False, 1, False), (32, True, 0, True)):
        consts = {"MODE": mode, "HAS_R": has_r, "STORE_VAR": True, "DT": 1, "INTERPRET": False,
                  "TILE": tile, "WARP_DOWN": down, "BLOCK_C": 1024}
        full = {**sig, **{c: "constexpr" for c in consts}}
        k = triton.compile(ASTSource(fn=nol._general_norm_kernel, signature=full, constexprs=consts),
                           target=target)
        ptx = k.asm["ptx"]
        assert "fma.rn.f32" not in ptx and "fma.f32" not in ptx, (tile, down, mode)
        assert "mul.rn.f32" in ptx and "add.rn.f32" in ptx
    nsig = {**{n: "*bf16" for n in ("a_ptr", "r_ptr", "w1_ptr", "w2_ptr", "h_ptr", "y_ptr")},
            "var_ptr": "*fp32", "N": "i32", "sa": "i32", "sr": "i32", "eps": "fp32", "factor": "fp32"}
    # (warps, torch lanes, vectors per lane): width 2048 at 1, 8 and 32+ rows, 5280 at 4 rows
    plans = ((4, 512, 1, True), (2, 64, 8, False), (1, 32, 16, True), (4, 128, 16, True))
    for (nw, lanes, iters, tl_sum), one_pass in [(p, True) for p in plans] + [(plans[2], False)]:
        r = lanes // (32 * nw)
        consts = {"STORE_VAR": True, "DT": 1, "INTERPRET": False, "R": r, "LOG_R": r.bit_length() - 1,
                  "NW": nw, "LOG_NW": nw.bit_length() - 1, "ITERS": iters, "TL_SUM": tl_sum,
                  "ONE_PASS": one_pass, "OUT_CHUNK": 1024 * nw, "OUT_CHUNKS": 2, "PACKED": True}
        full = {**nsig, **{c: "constexpr" for c in consts}}
        k = triton.compile(ASTSource(fn=nol._lowwarp_norm_norm_kernel, signature=full, constexprs=consts),
                           target=target, options={"num_warps": nw})
        ptx = k.asm["ptx"]
        assert "fma.rn.f32" not in ptx and "fma.f32" not in ptx, (nw, iters, tl_sum)
        assert "mul.rn.f32" in ptx and "add.rn.f32" in ptx
        assert "ld.local" not in ptx, "register spills"
        assert "griddepcontrol" not in ptx    # the exact arm's kernels launch plainly
    from rltbench.kernels.rope import fused as rope
    rsig = {**{n: "*bf16" for n in ("q_ptr", "k_ptr", "qo_ptr", "ko_ptr", "c_ptr", "s_ptr")},
            **{n: "i32" for n in ("T", "HQ", "HK", "sqt", "sqh", "skt", "skh", "sct", "sst", "HALF")}}
    for neox in (True, False):   # the exact RoPE rounds each product before the add, as torch
        consts = {"NEOX": neox, "EXACT": True, "DT": 1, "INTERPRET": False, "BLOCK_T": 4, "BLOCK_H": 64}
        if not neox:
            rsig = {**rsig, "c_ptr": "*fp32", "s_ptr": "*fp32"}
        full = {**rsig, **{c: "constexpr" for c in consts}}
        ptx = triton.compile(ASTSource(fn=rope._rope_kernel, signature=full, constexprs=consts),
                             target=target).asm["ptx"]
        assert "fma" not in ptx and "mul.rn.f32" in ptx, neox
    print("PTX_OK")
''')


def test_kernels_compile_for_sm90_without_fma() -> None:
    # the default: fusion on; the kernels must not need it off
    run_sm90_script(SCRIPT, "PTX_OK", {"TRITON_DEFAULT_FP_FUSION": "1"})


PDL_SCRIPT = textwrap.dedent('''
    import re
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from rltbench.kernels.norm import approx
    target = GPUTarget("cuda", 90, 32)

    def ptx_of(fn, sig, consts, nw=4):
        full = {**sig, **{c: "constexpr" for c in consts}}
        return triton.compile(ASTSource(fn=fn, signature=full, constexprs=consts), target=target,
                              options={"num_warps": nw}).asm["ptx"]

    def loads_before_wait(ptx):
        head = ptx.split("griddepcontrol.wait")[0]
        return len(re.findall(r"ld\\.global", head))

    sig = {**{n: "*bf16" for n in ("x_ptr", "b_ptr", "r_ptr", "w_ptr", "out_ptr")}, "R": "i32", "W": "i32",
           "sx": "i32", "sb": "i32", "sr": "i32", "eps": "fp32"}
    for mode in (0, 1, 2):
        for wload in (0, 1):
            consts = {"HAS_B": False, "HAS_R": True, "DT": 1, "INTERPRET": False, "BLOCK_R": 1,
                      "BLOCK_C": 2048, "STREAM": True, "WLOAD": wload, "PDL": mode}
            ptx = ptx_of(approx._rms_norm_approx_kernel, sig, consts)
            assert ("griddepcontrol.wait" in ptx) == (mode >= 1), (mode, wload)
            assert ("griddepcontrol.launch_dependents" in ptx) == (mode == 2), (mode, wload)
            if mode:
                # the weight row (and nothing else) may be read before the wait, where it is loaded first
                n = loads_before_wait(ptx)
                assert (n > 0) if wload == 0 else (n == 0), (mode, wload, n)
    nsig = {**{n: "*bf16" for n in ("x_ptr", "r_ptr", "w1_ptr", "w2_ptr", "h_ptr", "y_ptr")}, "R": "i32",
            "W": "i32", "sx": "i32", "sr": "i32", "eps": "fp32"}
    consts = {"DT": 1, "INTERPRET": False, "BLOCK_R": 1, "BLOCK_C": 2048, "STREAM": False, "PDL": 2}
    ptx = ptx_of(approx._norm_norm_approx_kernel, nsig, consts)
    assert "griddepcontrol.wait" in ptx and loads_before_wait(ptx) > 0
    print("PDL_OK")
''')


def test_pdl_kernels_wait_before_reading_what_earlier_kernels_wrote() -> None:
    """PDL (pdl.py, the approx norm's launches) compiled for sm_90 without a GPU: PDL 0 emits no
    grid-dependency instruction, 1 the wait, 2 the wait and the early trigger; the weights (only)
    are loaded before the wait where they are loaded first, nothing where the row goes first."""
    run_sm90_script(PDL_SCRIPT, "PDL_OK")


# what both SASS checks of the lowwarp single norm need: its signature (pointers and row strides
# 16-divisible, as the launcher promises), a compile for sm_90 and the cubin disassembled
LOWWARP_SASS_PRELUDE = textwrap.dedent(r'''
    import os, re, subprocess, tempfile
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from rltbench.kernels.norm import onelaunch as nol
    target = GPUTarget("cuda", 90, 32)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    sig = {**{n: "*bf16" for n in ("x_ptr", "b_ptr", "r_ptr", "w_ptr", "out_ptr")}, "var_ptr": "*fp32",
           "N": "i32", "sx": "i32", "sb": "i32", "sr": "i32", "eps": "fp32", "factor": "fp32"}

    def compile_lowwarp(consts, nw):
        full = {**sig, **{c: "constexpr" for c in consts}}
        names = list(full)
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
                 if full[n].startswith("*") or n in ("N", "sx", "sb", "sr")}
        return triton.compile(ASTSource(fn=nol._lowwarp_norm_kernel, signature=full, constexprs=consts,
                                        attrs=attrs),
                              target=target, options={"num_warps": nw})

    def sass_of(k):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            return subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
''')

LOWWARP_SASS_SCRIPT = LOWWARP_SASS_PRELUDE + textwrap.dedent(r'''
    for nw in (4, 8, 16):
        r = 512 // (32 * nw)
        consts = {"MODE": 0, "HAS_R": False, "STORE_VAR": True, "DT": 1, "INTERPRET": False, "R": r,
                  "LOG_R": r.bit_length() - 1, "NW": nw, "LOG_NW": nw.bit_length() - 1, "ITERS": 1,
                  "TL_SUM": True, "ONE_PASS": True, "OUT_CHUNK": 2048, "OUT_CHUNKS": 1, "PACKED": True,
                  "STREAM": False}
        k = compile_lowwarp(consts, nw)
        assert "fma.rn.f32" not in k.asm["ptx"] and "fma.f32" not in k.asm["ptx"]
        sass = sass_of(k)
        steps = re.findall(r"SHFL\.BFLY PT, R\d+, R\d+, (0x[0-9a-f]+)|(BAR\.SYNC)|(STS)|(LDS)", sass)
        seq = [s[0] or s[1] or s[2] or s[3] for s in steps]
        print(nw, seq)
        # torch's h levels as a warp butterfly (xor 16 .. 1), one exchange, the w levels (xor NW/2 .. 1)
        cross = [hex(nw >> j) for j in range(1, nw.bit_length())]
        want = ["0x10", "0x8", "0x4", "0x2", "0x1", "STS", "BAR.SYNC", "LDS", *cross]
        # after the tree at most a broadcast of the result through shared memory (Triton 3.6 does)
        assert seq[:len(want)] == want and set(seq[len(want):]) <= {"STS", "BAR.SYNC", "LDS"}, (nw, seq)
    print("SASS_OK")
''')


def test_lowwarp_tl_sum_lowers_to_torch_tree_with_one_exchange() -> None:
    """sm_90 SASS, with the installed Triton, of the 512-lane lowwarp single norm with Triton's
    reduction (tree "tl_sum") at 4, 8 and 16 warps: the (h, w) levels are the warp butterfly xor
    16 .. 1 (torch's offsets 16 NW .. NW), one shared-memory exchange, then xor NW/2 .. 1 over the
    warps (offsets NW/2 .. 1): torch's order. Checked by hand with Triton 3.6 and 3.9; a 4-D lane
    tile was laid out differently by 3.6 (r and w on lanes) and failed the GPU validation
    (docs/onelaunch_norm.md). A Triton that lowers the reduction differently fails here before any
    GPU sees it."""
    run_sm90_script(LOWWARP_SASS_SCRIPT, "SASS_OK")


ROW_FORMS_SASS_SCRIPT = LOWWARP_SASS_PRELUDE + textwrap.dedent(r'''
    for one_pass in (True, False):
        for has_r in (False, True):
            # torch's plan from 32 rows up at width 2048: 32 lanes, 16 vectors per lane, one warp
            consts = {"MODE": 0, "HAS_R": has_r, "STORE_VAR": False, "DT": 1, "INTERPRET": False, "R": 1,
                      "LOG_R": 0, "NW": 1, "LOG_NW": 0, "ITERS": 16, "TL_SUM": True, "ONE_PASS": one_pass,
                      "OUT_CHUNK": 1024, "OUT_CHUNKS": 2, "PACKED": True, "STREAM": False}
            k = compile_lowwarp(consts, 1)
            assert "ld.local" not in k.asm["ptx"], "register spills"
            sass = sass_of(k)
            mem = re.findall(r"\b(LDG|STG)\.", sass)
            turns = sum(1 for a, b in zip(mem, mem[1:]) if (a, b) == ("STG", "LDG"))
            print(one_pass, has_r, turns, mem.count("LDG"), mem.count("STG"))
            if one_pass:
                # the lane's 16 vectors in its registers: the fold is in-thread, the only shuffles
                # are the five butterfly levels (a tile with its vectors on the lanes: thousands)
                assert len(re.findall(r"\bSHFL\.", sass)) == 5 and "STL" not in sass, has_r
                # x, w (and r): 16 vectors each, loaded once; the 16 stores after every load
                assert mem.count("LDG") == 16 * (3 if has_r else 2) and mem.count("STG") == 16, mem
                assert turns == 0, (has_r, mem)
                # the packed epilogue: dtype multiplies (and residual adds) two per instruction
                assert re.search(r"\bH(MUL2|FMA2)[.\w]*BF16", sass), "packed multiply"
                assert not has_r or re.search(r"\bHADD2[.\w]*BF16", sass), "packed add"
            else:
                assert turns <= consts["OUT_CHUNKS"] - 1, (has_r, turns)
    # Huginn's add form at width 5280 from 16 rows: 42 vectors per lane, two passes, six chunks;
    # from ADD_OUT_CHUNK_MIN_ROWS rows two chunks of ADD_OUT_CHUNK_PER_WARP columns, still unspilled
    for chunk in (nol.OUT_CHUNK_PER_WARP, nol.ADD_OUT_CHUNK_PER_WARP):
        consts = {"MODE": 1, "HAS_R": False, "STORE_VAR": False, "DT": 1, "INTERPRET": False, "R": 1,
                  "LOG_R": 0, "NW": 1, "LOG_NW": 0, "ITERS": 42, "TL_SUM": True, "ONE_PASS": False,
                  "OUT_CHUNK": chunk, "OUT_CHUNKS": -(-5280 // chunk), "PACKED": True, "STREAM": False}
        k = compile_lowwarp(consts, 1)
        mem = re.findall(r"\b(LDG|STG)\.", sass_of(k))
        turns = sum(1 for a, b in zip(mem, mem[1:]) if (a, b) == ("STG", "LDG"))
        assert "ld.local" not in k.asm["ptx"] and turns <= consts["OUT_CHUNKS"] - 1, (chunk, turns)
    print("ROW_FORMS_OK")
''')


def test_lowwarp_row_forms_load_before_they_store() -> None:
    """sm_90 SASS of the lowwarp norm at torch's 32-lane plan (16 vectors per lane). A load that
    follows a store waits for it (the compiler cannot rule out that ``out`` aliases an input): an
    output pass that re-read the row per vector made 16 dependent round trips per row (8.1 us for
    128 rows on an H200, against 2.4 us for Liger's norm). The single pass (below
    two_pass_min_rows rows) loads the row once into registers and stores after every load, with
    nothing spilled; the two-pass form stores a flat chunk only after loading all of it, at most one
    store-to-load turn per extra chunk."""
    run_sm90_script(ROW_FORMS_SASS_SCRIPT, "ROW_FORMS_OK")


ROWS_KERNEL_SASS_SCRIPT = LOWWARP_SASS_PRELUDE + textwrap.dedent(r'''
    rsig = {**{n: "*bf16" for n in ("x_ptr", "w_ptr", "out_ptr")}, "var_ptr": "*fp32", "T": "i32", "N": "i32",
            "sx": "i32", "eps": "fp32", "factor": "fp32"}
    for rows in (2, 4, 8):
        consts = {"STORE_VAR": True, "DT": 1, "INTERPRET": False, "ROWS": rows, "ITERS": 16, "TL_SUM": True,
                  "OUT_CHUNK": 1024, "TWO_CHUNKS": True, "PACKED": True, "STREAM": True}
        full = {**rsig, **{c: "constexpr" for c in consts}}
        names = list(full)
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
                 if full[n].startswith("*") or n in ("N", "sx")}
        k = triton.compile(ASTSource(fn=nol._lowwarp_rows_norm_kernel, signature=full, constexprs=consts,
                                     attrs=attrs), target=target, options={"num_warps": rows})
        ptx = k.asm["ptx"]
        assert "ld.local" not in ptx, "register spills"
        assert "fma.rn.f32" not in ptx and "fma.f32" not in ptx
        sass = sass_of(k)
        # each warp sums its own row: torch's five warp levels, nothing across warps
        levels = re.findall(r"SHFL\.BFLY PT, R\d+, R\d+, (0x[0-9a-f]+)", sass)
        assert levels == ["0x10", "0x8", "0x4", "0x2", "0x1"], (rows, levels)
        mem = re.findall(r"\b(LDG|STG)\.", sass)
        turns = sum(1 for a, b in zip(mem, mem[1:]) if (a, b) == ("STG", "LDG"))
        first_store = mem.index("STG")
        # the first pass (16 vectors per lane), both output chunks of x (ROWS x 2048 values over
        # 32 ROWS threads, 16 bytes a load) and both chunks' weights (a load or more each) are in
        # flight before the first store, and no load follows a store
        print(rows, first_store, turns, mem.count("LDG"), mem.count("STG"))
        assert first_store >= 16 + 2048 * 2 // 16 // 32 + 2 and turns == 0, (rows, mem)
        assert re.search(r"\bH(MUL2|FMA2)[.\w]*BF16", sass), "packed multiply"
    print("ROWS_OK")
''')


def test_rows_kernel_sums_per_warp_and_loads_its_chunks_before_storing() -> None:
    """sm_90 SASS of the several-rows plain kernel (2, 4, 8 rows and warps per program, width
    2048): each warp reduces its row with torch's five butterfly levels and no cross-warp step, no
    spills, no FMA, and every load of the output pass (both chunks of the rows and of the weights)
    is issued before the first store: no store-to-load turn. The bits are checked against torch
    by the GPU tests and the start-up validation; the order on CPU by the interpreter tests."""
    run_sm90_script(ROWS_KERNEL_SASS_SCRIPT, "ROWS_OK")


HELD_KERNEL_SASS_SCRIPT = LOWWARP_SASS_PRELUDE + textwrap.dedent(r'''
    hsig = {**{n: "*bf16" for n in ("x_ptr", "b_ptr", "w_ptr", "out_ptr")}, "var_ptr": "*fp32",
            "N": "constexpr", "sx": "i32", "sb": "i32", "eps": "fp32", "factor": "fp32"}
    parts = nol.held_parts(42)          # Huginn's width 5280 at torch's 32 lanes
    for mode in (0, 1):
        consts = {"N": 5280, "MODE": mode, "STORE_VAR": True, "DT": 1, "INTERPRET": False, "PACKED": True,
                  "TL_SUM": True, **{f"I{j}": p for j, p in enumerate(parts)}}
        full = {**hsig, **{c: "constexpr" for c in consts}}
        names = list(full)
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
                 if full[n].startswith("*") or n in ("sx", "sb")}
        k = triton.compile(ASTSource(fn=nol._lowwarp_held_norm_kernel, signature=full, constexprs=consts,
                                     attrs=attrs), target=target, options={"num_warps": 1})
        ptx = k.asm["ptx"]
        assert "ld.local" not in ptx, "register spills"
        assert "fma.rn.f32" not in ptx and "fma.f32" not in ptx
        assert "mul.rn.bf16x2" in ptx and ("add.rn.bf16x2" in ptx) == (mode == 1)
        sass = sass_of(k)
        levels = re.findall(r"SHFL\.BFLY PT, R\d+, R\d+, (0x[0-9a-f]+)", sass)
        assert levels == ["0x10", "0x8", "0x4", "0x2", "0x1"], (mode, levels)
        mem = re.findall(r"\b(LDG|STG)\.", sass)
        inputs = 42 * (1 + mode)        # one 8-byte load per vector of x (and of the branch)
        first_store = mem.index("STG")
        print(mode, first_store, mem.count("LDG"), mem.count("STG"))
        # the row is read once: every input load comes before the first store, then only the weights
        assert first_store >= inputs and mem.count("LDG") == inputs + 42, (mode, mem)
    print("HELD_OK")
''')


def test_held_kernel_reads_the_row_once_and_keeps_it_in_registers() -> None:
    """sm_90 SASS of the held kernel at Huginn's width 5280 (42 vectors per lane in register tiles of
    32, 8 and 2), plain and add forms: one load per vector of each input, all of them before the
    first store, then only the weights; torch's five butterfly levels; no spill, no FMA; the add
    form's sum and the output's multiply as packed bf16 instructions."""
    run_sm90_script(HELD_KERNEL_SASS_SCRIPT, "HELD_OK")
