"""A step-by-step model of the order in which torch's CUDA reduction sums each row of
``t.mean(-1)`` for a contiguous fp32 ``[T, N]`` tensor (the variance of every RMSNorm).

Why this exists: the one-launch exact RMSNorm (onelaunch.py) and the native norm (native.py) must
add the fp32 squares in *exactly* torch's order to be bitwise equal to
``x.float().pow(2).mean(-1, keepdim=True)``. This module is the specification of that order,
written from ``aten/src/ATen/native/cuda/Reduce.cuh``
(``setReduceConfig``, ``ReduceConfig``, ``ReduceOp::run``, ``input_vectorized_thread_reduce_impl``,
``block_y_reduce``, ``block_x_reduce``), ``ReduceMomentKernel.cu`` (``mean_kernel_impl``: float
mean = ``gpu_reduce_kernel<float, float>`` with the defaults vt0 = 4, input_vec_size = vt0 = 4) and
``SharedReduceOps.h`` (``MeanOps``: reduce/combine = ``a + b``, project = ``a * factor``). See
docs/onelaunch_norm.md for the versions read and what depends on the GPU.

It simulates the CUDA threads literally (lane arrays, the head/tail special cases, the shared
memory halving loops, ``__shfl_down_sync`` returning the caller's own value past the warp) in numpy
fp32, where every add is rounded once as on the GPU. It is deliberately written independently of
the Triton kernel (which uses reshapes/splits), so "kernel == model" under the interpreter is a
real check that the kernel implements this order. It does NOT claim torch CPU uses this order
(CPU torch sums differently); whether torch CUDA does is checked on the GPU (validate.py).
`plan_for` gives the plan for a device (its SM count and threads per SM).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Reduce.cuh / ReduceMomentKernel.cu constants for a float32 mean on a non-ROCm build.
MAX_NUM_THREADS = 512          # mnt_wrapper<float>::MAX_NUM_THREADS
VT0 = 4                        # gpu_reduce_kernel default vt0
INPUT_VEC_SIZE = 4             # default input_vec_size = vt0 (16-byte loads of fp32)
ALIGN_ELEMENTS = 4             # alignof(aligned_vector<float, 4>) / sizeof(float)
MIN_VALUES_PER_THREAD = 16
MAX_VALUES_PER_THREAD = 256
INT32_MAX = 2**31 - 1

# block_x_reduce's intra-warp shuffle order. pytorch/pytorch#164790 (Oct 2025, first release 2.10)
# switched CUDA builds from offsets 1, 2, 4, 8, 16 ("up": lane 0 adds adjacent pairs first) to
# 16, 8, 4, 2, 1 ("down": the same halving as the shared-memory levels). ROCm and fbcode keep "up".
WARP_UP = "up"
WARP_DOWN = "down"
WARP_ORDERS = (WARP_DOWN, WARP_UP)


def default_warp_order(torch_version: str) -> str:
    """The shuffle order a CUDA wheel of this torch version uses (validation has the last word)."""
    parts = torch_version.split("+")[0].split(".")
    try:
        major, minor = int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        return WARP_DOWN
    return WARP_DOWN if (major, minor) >= (2, 10) else WARP_UP


@dataclass(frozen=True)
class GpuProps:
    """The device properties setReduceConfig reads (SM count and max threads/SM matter only for the
    global-memory split, which needs >= 256 values per thread after the warp split)."""

    sm_count: int = 132               # H100/H200 SXM
    max_threads_per_sm: int = 2048
    warp_size: int = 32


@dataclass(frozen=True)
class ReducePlan:
    """setReduceConfig's result for a row reduction (reduction on the fastest-striding dim)."""

    num_outputs: int        # T (rows)
    num_inputs: int         # N (elements per row)
    vectorized: bool        # config.vectorize_input
    block_width: int        # blockDim.x
    block_height: int       # blockDim.y
    split_y: bool           # input_mult[1] != 0: a row is split across the warps of a block
    ctas_per_output: int    # > 1: split across blocks (global-memory reduce)
    step_input: int         # stride (in 4-element vectors) between one thread's loads
    step_output: int        # rows per block
    warp_size: int

    @property
    def lanes(self) -> int:
        """Threads that share one row: the lanes of the kernel's per-row accumulator tile."""
        return self.block_width * (self.block_height if self.split_y else 1)

    @property
    def unsupported_reason(self) -> str | None:
        """Why the one-launch kernel cannot reproduce this plan (None when it can)."""
        if not self.vectorized:
            return f"width {self.num_inputs} <= 128: torch uses the non-vectorized thread_reduce"
        if self.split_y and self.block_height > 1:
            return (f"torch splits each row across {self.block_height} warps (width >= 8192, T >= 2); the "
                    "x/y block-reduce order differs between torch releases and is not reproduced")
        if self.ctas_per_output > 1:
            return f"torch splits each row across {self.ctas_per_output} blocks (global reduce)"
        if self.num_outputs * self.num_inputs * 4 > INT32_MAX:
            return "tensor needs 64-bit indexing: torch splits it into sub-iterators"
        if self.warp_size != 32 or self.block_width < self.warp_size:
            return f"warp size {self.warp_size} / block width {self.block_width} not modelled"
        return None

    @property
    def key(self) -> tuple[int, int, bool]:
        """What the summation order depends on besides N and the row's alignment shift."""
        return (self.block_width, self.block_height, self.split_y)


def last_pow2(n: int) -> int:
    """Reduce.cuh last_pow2: floor power of two, at least 1."""
    return max(1, 1 << (max(n, 1).bit_length() - 1))


def div_up(a: int, b: int) -> int:
    return -(-a // b)


def reduce_plan(num_outputs: int, num_inputs: int, props: GpuProps = GpuProps()) -> ReducePlan:
    """setReduceConfig<float, float, vt0=4, input_vec_size=4> for ``[T, N].mean(-1)``, contiguous.

    The reduced dim is the innermost (stride 4 bytes = sizeof(float)), so
    reduction_on_fastest_striding_dimension holds (also for T = 1, where TensorIterator drops the
    size-1 dim and num_reduce_dims == ndim), dim0 = N, dim1 = T, and the input is vectorized when
    N > 128 (non-ROCm condition ``dim0 > 128 && num_reduce_dims == 1 && vt0 >= input_vec_size``).
    """
    if num_outputs < 1 or num_inputs < 1:
        raise ValueError("num_outputs and num_inputs must be >= 1")
    dim0, dim1 = num_inputs, num_outputs
    vectorized = dim0 > 128
    if vectorized:
        dim0 //= INPUT_VEC_SIZE
    # ReduceConfig::set_block_dimension<float> (output_vec_size = 1)
    mnt = MAX_NUM_THREADS
    dim0_pow2 = last_pow2(dim0) if dim0 < mnt else mnt
    dim1_pow2 = last_pow2(dim1) if dim1 < mnt else mnt
    block_width = min(dim0_pow2, props.warp_size)
    block_height = min(dim1_pow2, mnt // block_width)
    block_width = min(dim0_pow2, mnt // block_height)
    num_threads = block_width * block_height
    step_input, step_output = 1, 1
    step_input *= block_width                       # input_mult[0] = split_input(block_width)
    values_per_thread = div_up(num_inputs, step_input)   # note: elements, not vectors (torch's own)
    warp_split_threshold = min(block_height * 16, MAX_VALUES_PER_THREAD)
    split_y = values_per_thread >= warp_split_threshold
    if split_y:
        step_input *= block_height                  # input_mult[1] = split_input(block_height)
    else:
        step_output *= block_height                 # output_mult[1] = split_output(block_height)
    ctas = 1
    blocks_per_sm = props.max_threads_per_sm // num_threads
    target_grid_size = props.sm_count * blocks_per_sm
    grid = div_up(num_outputs, step_output)
    values_per_thread = div_up(num_inputs, step_input)
    if split_y and values_per_thread >= MAX_VALUES_PER_THREAD and grid <= target_grid_size:
        c1 = div_up(target_grid_size, grid)
        c2 = div_up(values_per_thread, MIN_VALUES_PER_THREAD)
        c3 = div_up(values_per_thread, MAX_VALUES_PER_THREAD)
        ctas = max(min(c1, c2), c3)
        if ctas > 1:
            step_input *= ctas                      # input_mult[2] = split_input(ctas_per_output)
    return ReducePlan(num_outputs, num_inputs, vectorized, block_width, block_height, split_y,
                      ctas, step_input, step_output, props.warp_size)


_PROPS: dict[int, GpuProps] = {}


def device_props(device: torch.device) -> GpuProps:
    """setReduceConfig's inputs for this device (the H100/H200 defaults for the CPU/interpreter)."""
    if device.type != "cuda":
        return GpuProps()
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _PROPS:
        p = torch.cuda.get_device_properties(idx)
        _PROPS[idx] = GpuProps(int(p.multi_processor_count), int(p.max_threads_per_multi_processor),
                               int(getattr(p, "warp_size", 32)))
    return _PROPS[idx]


def plan_for(rows: int, width: int, device: torch.device) -> ReducePlan:
    """torch's reduction plan for the variance of `rows` rows of `width` on `device`."""
    return reduce_plan(rows, width, device_props(device))


def mean_factor(num_outputs: int, num_inputs: int) -> np.float32:
    """mean_kernel_impl: ``float(num_output_elements) / numel`` (int64 numel converted to float)."""
    return np.float32(num_outputs) / np.float32(num_outputs * num_inputs)


# ----------------------------------------------------------------------------------------------
# the threads, simulated
# ----------------------------------------------------------------------------------------------
def _thread_values(row: np.ndarray, plan: ReducePlan, shift: int) -> np.ndarray:
    """input_vectorized_thread_reduce_impl for every thread of one row: [block_h, block_w] fp32
    (block_h = block_height when the row is split across warps, else 1: the other warps of the
    block own other rows). ``shift`` = (row start address % 16) / 4."""
    f32 = np.float32
    bw = plan.block_width
    bh = plan.block_height if plan.split_y else 1
    x = np.tile(np.arange(bw), (bh, 1))
    y = np.repeat(np.arange(bh)[:, None], bw, axis=1)
    tail_ok = (y == 0) if plan.split_y else np.ones_like(x, dtype=bool)   # should_reduce_tail()
    end = plan.num_inputs
    data = 0                       # element offset of torch's `data` pointer inside the row
    value = np.zeros((bh, bw), f32)
    if shift > 0:
        data -= shift
        end += shift
        head = tail_ok & (x >= shift) & (x < ALIGN_ELEMENTS)
        value[head] = f32(0) + row[data + x[head]]
        end -= ALIGN_ELEMENTS
        data += ALIGN_ELEMENTS
    acc = [value] + [np.zeros((bh, bw), f32) for _ in range(1, INPUT_VEC_SIZE)]
    idx = x + (y * bw if plan.split_y else 0)      # config.input_idx() (no CTA split)
    stride = plan.step_input
    while True:                                     # while (idx * 4 + 3 < end) per thread
        active = idx * INPUT_VEC_SIZE + INPUT_VEC_SIZE - 1 < end
        if not active.any():
            break
        for i in range(INPUT_VEC_SIZE):
            a = acc[i]
            a[active] = a[active] + row[data + idx[active] * INPUT_VEC_SIZE + i]
        idx = np.where(active, idx + stride, idx)
    tail_start = end - end % INPUT_VEC_SIZE
    t_idx = tail_start + x
    tail = tail_ok & (t_idx < end)
    acc[0][tail] = acc[0][tail] + row[data + t_idx[tail]]
    out = acc[0]
    for i in range(1, INPUT_VEC_SIZE):              # combine accumulators left to right
        out = out + acc[i]
    return out


def _block_x_reduce(v: np.ndarray, warp: int, warp_order: str) -> np.float32:
    """block_x_reduce for one row of lanes: shared-memory halving (v[x] += v[x + offset], offset =
    width/2 .. warp) down to one warp, then ``value += __shfl_down_sync(value, offset)`` with the
    offsets in `warp_order`; returns lane 0's value. shfl_down past the warp returns the caller's
    own value (only lanes other than 0 see that)."""
    sh = v.copy()
    dim_x = sh.shape[0]
    if dim_x > warp:
        offset = dim_x // 2
        while offset >= warp:
            sh[:offset] = sh[:offset] + sh[offset:2 * offset]
            offset //= 2
        dim_x = warp
    lanes = sh[:dim_x].copy()
    offsets = []
    o = 1
    while o < dim_x:
        offsets.append(o)
        o *= 2
    if warp_order == WARP_DOWN:
        offsets.reverse()
    elif warp_order != WARP_UP:
        raise ValueError(f"warp_order must be one of {WARP_ORDERS}")
    for offset in offsets:
        src = np.arange(dim_x) + offset
        other = np.where(src < dim_x, lanes[np.minimum(src, dim_x - 1)], lanes)  # __shfl_down_sync
        lanes = lanes + other
    return lanes[0]


def row_sum(row: np.ndarray, plan: ReducePlan, shift: int, warp_order: str = WARP_DOWN) -> np.float32:
    """torch CUDA's fp32 sum of one row (before MeanOps::project), in its order."""
    if plan.unsupported_reason is not None:
        raise ValueError(plan.unsupported_reason)
    if row.dtype != np.float32 or row.shape != (plan.num_inputs,):
        raise ValueError("row must be a float32 vector of num_inputs elements")
    v = _thread_values(row, plan, shift)    # [1, block_width]: one warp-row of lanes
    return _block_x_reduce(v[0], plan.warp_size, warp_order)


def row_shift(row_index: int, width: int, base_elems: int = 0) -> int:
    """Alignment shift of a row of the contiguous fp32 temporary: (address % 16) / 4. The caching
    allocator returns 512-byte aligned blocks, so base_elems = 0 for torch's fresh temporaries."""
    return (base_elems + row_index * width) % ALIGN_ELEMENTS


def mean_rows(sq: np.ndarray, props: GpuProps = GpuProps(), base_elems: int = 0,
              warp_order: str = WARP_DOWN) -> np.ndarray:
    """Model of ``torch.from_numpy(sq).cuda().mean(-1)`` for a C-contiguous fp32 [T, N] array."""
    if sq.ndim != 2 or sq.dtype != np.float32:
        raise ValueError("sq must be a 2-D float32 array")
    T, N = sq.shape
    plan = reduce_plan(T, N, props)
    factor = mean_factor(T, N)
    out = np.empty(T, np.float32)
    for t in range(T):
        out[t] = row_sum(sq[t], plan, row_shift(t, N, base_elems), warp_order) * factor
    return out


def sequential_mean_rows(sq: np.ndarray) -> np.ndarray:
    """A naive left-to-right fp32 sum times 1/N: the order torch does NOT use (used by tests to
    show the data is order-sensitive, so that "kernel == model" is a test that can fail)."""
    T, N = sq.shape
    out = np.empty(T, np.float32)
    for t in range(T):
        s = np.float32(0)
        for v in sq[t]:
            s = np.float32(s + v)
        out[t] = s * mean_factor(T, N)
    return out
