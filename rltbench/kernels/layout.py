"""Shape helpers shared by the kernel wrappers: flatten leading dims into rows without copying,
pick block sizes (a big tile under the interpreter, where each program costs Python time; small,
latency-friendly tiles on the GPU), and a program's tile of an elementwise op (row_col_tile)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def rows_view(t: torch.Tensor) -> torch.Tensor | None:
    """[..., W] -> 2-D view [R, W] sharing storage (row stride may exceed W), or None when the
    leading dims cannot be merged into one stride or the last dim is not contiguous."""
    if t.dim() == 0 or (t.shape[-1] > 1 and t.stride(-1) != 1):
        return None
    try:
        v = t.view(-1, t.shape[-1])
    except RuntimeError:
        return None
    return v


def row_stride(v: torch.Tensor) -> int:
    """Row stride of a 2-D view (any value when there is at most one row)."""
    return v.stride(0) if v.shape[0] > 1 else v.shape[1]


def col_block(width: int, interpret: bool, gpu_cap: int = 1024) -> int:
    """Column tile: the whole (power-of-two padded) row under the interpreter, <= gpu_cap on GPU."""
    full = triton.next_power_of_2(max(width, 1))
    return min(full, 16384) if interpret else min(full, gpu_cap)


def row_block(rows: int, block_c: int, interpret: bool) -> int:
    """Rows per program: many under the interpreter (numpy does the work), one on the GPU."""
    if not interpret:
        return 1
    return max(1, min(triton.next_power_of_2(max(rows, 1)), max(1, 16384 // block_c)))


@triton.jit
def row_col_tile(R, W, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's rows ([BLOCK_R, 1], int64: no offset overflow), columns ([1, BLOCK_C]) and
    their in-bounds mask, on a (row blocks, column blocks) grid of an [R, W] elementwise op."""
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R))[:, None].to(tl.int64)
    cols = (tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C))[None, :]
    return rows, cols, (rows < R) & (cols < W)


def warps_for(block_elems: int) -> int:
    """num_warps for an elementwise/row tile of block_elems elements (about 8 elements/thread)."""
    return max(1, min(16, block_elems // 256))
