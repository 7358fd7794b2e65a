// RMSNorm of aligned rows in torch's CUDA reduction order: the shared arithmetic of both norm
// kernels and the vector kernel, a template over its thread layout (norm.cu picks the layout per
// lane count; a header so that a benchmark can instantiate other layouts of the same code).
//
// torch's order (rltbench/kernels/norm/torch_order.py is the specification): `lanes` = 2^k threads
// per row, lane l owns the 4-element vectors l, l + lanes, ... with one accumulator per vector
// element, combines ((a0 + a1) + a2) + a3, and the lanes are added as a balanced tree that reduces
// the lane bits in a fixed sequence: the highest bit first, down to bit 5 (shared-memory levels),
// then bits 4..0 (warp shuffles 16..1, torch >= 2.10) or 0..4 (shuffles 1..16, older torch).
//
// Layout of the vector kernel. A row gets NW = 2^LOG_NW warps; thread (warp w, hardware lane h)
// plays R = 2^LOG_R torch lanes, lanes = R * 32 * NW. The tree's first LOG_R steps (always the top
// lane bits) are reduced in registers, the next five by a warp butterfly (xor 16..1, h's bit 4
// first), the last LOG_NW through one shared-memory exchange over w, halving from w's top bit.
// Which lane bit each of h's and w's bits is follows from the step it is reduced at (torch_lane).
// Under torch >= 2.10 that is lane = r * 32 NW + h * NW + w, the Triton exact kernel's layout.
// Since r is the lane's top bits, the thread's torch lanes are base + r * 32 NW (base = its r = 0
// lane) and its vectors are base + s * 32 NW for slots s = it * R + r: slot s feeds accumulator
// s % R, in increasing s, so each lane adds its vectors in torch's order.
//
// Every multiply and add is __fmul_rn / __fadd_rn (never contracted into an FMA); rsqrtf is
// rsqrt.approx.f32 without FTZ, what torch.rsqrt's CUDA kernel calls; each torch op's result is
// rounded to the dtype where torch rounds it (see rltbench/kernels/reference.py).
#pragma once

#include "common.cuh"
#include "native.h"

namespace rltb {
namespace norm {

// The i-th torch lane bit that the tree reduces, for log2(lanes) = k.
__device__ __forceinline__ int reduced_bit(int i, int k, bool down) {
  return (down || i < k - 5) ? k - 1 - i : i - (k - 5);
}

// The torch lane played by register slot 0 of hardware lane h of warp w (nw = 2^(k - 5 - log_r)
// warps): h's bit j is reduced at step log_r + 4 - j (shuffle offset 2^j), w's bit j at step
// k - 1 - j (the warps' tree halves from its top bit); register r adds r << (k - log_r).
__device__ __forceinline__ int torch_lane(int h, int w, int k, int log_r, bool down) {
  int lane = 0;
#pragma unroll
  for (int j = 0; j < 5; ++j) lane |= ((h >> j) & 1) << reduced_bit(log_r + 4 - j, k, down);
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // at most 16 warps; a fixed trip count unrolls where k is constant
    if (j < k - 5 - log_r) lane |= ((w >> j) & 1) << reduced_bit(k - 1 - j, k, down);
  }
  return lane;
}

__device__ __forceinline__ void add_square(float& acc, float v) { acc = __fadd_rn(acc, __fmul_rn(v, v)); }

// ((a0 + a1) + a2) + a3: how a torch lane combines its four accumulators.
__device__ __forceinline__ float combine(const float (&acc)[4]) {
  return __fadd_rn(__fadd_rn(__fadd_rn(acc[0], acc[1]), acc[2]), acc[3]);
}

// (mean, rsqrt(mean + eps)) as torch: mean = sum * factor (MeanOps::project), then add, then rsqrt.
__device__ __forceinline__ float inv_rms(float total, float factor, float eps, float* var) {
  *var = __fmul_rn(total, factor);
  return rsqrtf(__fadd_rn(*var, eps));
}

// round(w * round(v * rstd)): `(h * rsqrt(...)).to(dtype)` then `w * that` in the dtype.
template <typename T>
__device__ __forceinline__ float scaled(float v, float w, float rstd) {
  return round_to<T>(__fmul_rn(w, round_to<T>(__fmul_rn(v, rstd))));
}

// The value whose square the first sum adds: x, or round(x + b) in the add form.
template <typename T, int MODE>
__device__ __forceinline__ float first_value(T x, T b) {
  if constexpr (MODE == kNormAdd) {
    return round_to<T>(__fadd_rn(Traits<T>::to_float(x), Traits<T>::to_float(b)));
  } else {
    return Traits<T>::to_float(x);
  }
}

// h of norm-add-norm: round(r + round(w1 * round(x * rstd1))).
template <typename T>
__device__ __forceinline__ float h_value(T x, T r, T w1, float rstd1) {
  return round_to<T>(__fadd_rn(Traits<T>::to_float(r), scaled<T>(Traits<T>::to_float(x), Traits<T>::to_float(w1), rstd1)));
}

// Output of one element of the single-norm forms: round(w * round(v * rstd)) (+ round(r + y)).
template <typename T, bool HAS_R>
__device__ __forceinline__ T single_out(float v, T w, T r, float rstd) {
  float y = scaled<T>(v, Traits<T>::to_float(w), rstd);
  if constexpr (HAS_R) y = __fadd_rn(Traits<T>::to_float(r), y);
  return Traits<T>::from_float(y);
}

// How a thread loads its cached slots (load_cached). Where a load is issued decides how much of its
// latency the row hides, and ptxas decides that: in the sm_90 SASS of the 1-row kernel it issues
// the weights' loads (.ca or read-only .nc) only after the squares of x, so the sum waits for x and
// the epilogue then waits for the weights.
// kLoadCached:     ld.global.ca, as ptxas schedules it (many rows: L1 reuse and occupancy matter).
// kLoadVolatile:   ld.volatile, which ptxas keeps in source order: every load of the thread before
//                  the first square, but as LDG.STRONG.SYS, which skips L1 (slower from 128 rows).
// kLoadPredicated: a weak ld.global guarded by the row's activity predicate, the form Triton emits
//                  for a masked load. In the straight-line plain kernel (FULL, no residual) ptxas
//                  issues all of them first, as plain LDG.E.64 like the exact Triton kernel's, and
//                  the 1-row kernel was faster than with kLoadVolatile beyond the spread of an A/A
//                  copy in an H200 side comparison. With per-slot guards (the other kernels) the
//                  same loads measured slower than either alternative, and with a residual row ptxas
//                  again issues the weights and the residual after the squares: those keep
//                  kLoadVolatile.
// An inactive row (the last block's rows past the end) loads nothing and stores nothing.
enum LoadKind { kLoadCached = 0, kLoadVolatile = 1, kLoadPredicated = 2 };

template <int LOAD, typename T>
__device__ __forceinline__ Vec4<T> load_cached(const Vec4<T>* p, int active) {
  Vec4<T> v;
  if constexpr (LOAD == kLoadVolatile && sizeof(T) == 4) {
    uint4 u;
    asm volatile("ld.volatile.global.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
    *reinterpret_cast<uint4*>(&v) = u;
  } else if constexpr (LOAD == kLoadVolatile) {
    uint2 u;
    asm volatile("ld.volatile.global.v2.b32 {%0, %1}, [%2];" : "=r"(u.x), "=r"(u.y) : "l"(p));
    *reinterpret_cast<uint2*>(&v) = u;
  } else if constexpr (LOAD == kLoadPredicated && sizeof(T) == 4) {
    uint4 u;
    asm volatile("{.reg .pred q; setp.ne.b32 q, %5, 0; mov.b32 %0, 0; mov.b32 %1, 0; mov.b32 %2, 0;\n"
                 "mov.b32 %3, 0; @q ld.global.v4.b32 {%0, %1, %2, %3}, [%4];}"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p), "r"(active));
    *reinterpret_cast<uint4*>(&v) = u;
  } else if constexpr (LOAD == kLoadPredicated) {
    uint2 u;
    asm volatile("{.reg .pred q; setp.ne.b32 q, %3, 0; mov.b32 %0, 0; mov.b32 %1, 0;\n"
                 "@q ld.global.v2.b32 {%0, %1}, [%2];}" : "=r"(u.x), "=r"(u.y) : "l"(p), "r"(active));
    *reinterpret_cast<uint2*>(&v) = u;
  } else if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float4*>(&v) = __ldca(reinterpret_cast<const float4*>(p));
  } else {
    *reinterpret_cast<uint2*>(&v) = __ldca(reinterpret_cast<const uint2*>(p));
  }
  return v;
}

// Below this many rows the guarded kernels of the single-norm forms (plain and residual) pin their
// cached-slot loads (kLoadVolatile): measured faster at 1 and 8 rows, slower from 128, where L1
// reuse and occupancy decide instead. The straight-line kernels pin theirs at every row count
// (launch_vec).
constexpr int64_t kPinnedMaxRows = 128;

// One vector's output of the single-norm forms (x, its other row o: branch or residual, weights
// w). 16-bit types: v * rstd rounded two at a time, then w * that (+ r) as packed multiplies and
// adds, each the exact result rounded once, which is torch's fp32 op rounded to the dtype (the
// product of two 16-bit values is exact in fp32; for the add fp32 has >= 2p + 2 bits, so rounding
// twice gives the same value): half the epilogue's instructions.
template <typename T, bool HAS_R>
__device__ __forceinline__ typename Traits<T>::Pair pair_out(typename Traits<T>::Pair w, typename Traits<T>::Pair r,
                                                            float v0, float v1, float rstd) {
  typename Traits<T>::Pair y = __hmul2_rn(w, Traits<T>::pack_rn(__fmul_rn(v0, rstd), __fmul_rn(v1, rstd)));
  if constexpr (HAS_R) y = __hadd2_rn(r, y);
  return y;
}

template <typename T, int MODE, bool HAS_R>
__device__ __forceinline__ Vec4<T> single_out_vec(const Vec4<T>& x, const Vec4<T>& o, const Vec4<T>& w, float rstd) {
  Vec4<T> y;
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) y.v[i] = single_out<T, HAS_R>(first_value<T, MODE>(x.v[i], o.v[i]), w.v[i], o.v[i], rstd);
  } else {
    using T2 = typename Traits<T>::Pair;
    const T2* w2 = reinterpret_cast<const T2*>(&w);
    const T2* r2 = reinterpret_cast<const T2*>(&o);
    T2* y2 = reinterpret_cast<T2*>(&y);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float v0 = first_value<T, MODE>(x.v[2 * j], o.v[2 * j]);
      const float v1 = first_value<T, MODE>(x.v[2 * j + 1], o.v[2 * j + 1]);
      y2[j] = pair_out<T, HAS_R>(w2[j], r2[j], v0, v1, rstd);
    }
  }
  return y;
}

// The variance(s) the row used, when asked for (validation compares them with torch's mean).
template <bool NN>
__device__ __forceinline__ void store_var(const NormArgs& a, int64_t row, float var1, float var2) {
  if (a.var == nullptr) return;
  if constexpr (NN) {
    a.var[2 * row] = var1;
    a.var[2 * row + 1] = var2;
  } else {
    a.var[row] = var1;
  }
}

template <typename T>
__device__ __forceinline__ const T* row_ptr(const void* base, int64_t row, int64_t stride) {
  return static_cast<const T*>(base) + row * stride;
}

constexpr int kMaxRowsPerBlock = 4;  // narrow layouts put up to 4 rows in a block (blockDim.y)

// Vector slots a thread keeps in registers from the sum to the output: 128 bytes of x per thread
// (all of a width-2048 bf16 row at every layout), the residual form included: its residual row is
// read only by the epilogue, so holding it costs registers, not a second read of x, and with half
// the slots a width-2048 row at 32 lanes read x twice and ran its epilogue's second half as
// load-after-store round trips (2.7x the exact kernel's time at 128 rows on an H200). Half where
// the sum itself needs a second row (the add form's branch) or h (norm-add-norm), so that no form
// needs more than ~176 registers. Many 32-lane rows take the rows kernel instead (norm.cu).
template <typename T, int MODE, bool HAS_R>
constexpr int cached_slots() {
  return (sizeof(T) == 4 ? 8 : 16) / (MODE != kNormX ? 2 : 1);
}

// The row's total from a thread's R per-lane sums: the register levels (pairs r, r + R/2, ...),
// the warp butterfly, then the warps' partials through shared memory halving from the top. Every
// thread of the row gets the same bits. `part`: NW slots not read since the last barrier.
template <int LOG_R, int LOG_NW>
__device__ __forceinline__ float layout_total(float (&c)[1 << LOG_R], float* part, int warp, int h) {
#pragma unroll
  for (int half = (1 << LOG_R) / 2; half >= 1; half /= 2) {
#pragma unroll
    for (int r = 0; r < half; ++r) c[r] = __fadd_rn(c[r], c[r + half]);
  }
  float s = c[0];
#pragma unroll
  for (int offset = 16; offset >= 1; offset >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, offset));
  if constexpr (LOG_NW == 0) {
    return s;
  } else {
    constexpr int kNW = 1 << LOG_NW;
    if (h == 0) part[warp] = s;
    __syncthreads();
    float q[kNW];
#pragma unroll
    for (int i = 0; i < kNW; ++i) q[i] = part[i];
#pragma unroll
    for (int half = kNW / 2; half >= 1; half /= 2) {
#pragma unroll
      for (int i = 0; i < half; ++i) q[i] = __fadd_rn(q[i], q[i + half]);
    }
    return q[0];
  }
}

// ((a0 + a1) + a2) + a3 of each of the thread's R lanes, then the row total.
template <int LOG_R, int LOG_NW>
__device__ __forceinline__ float lanes_total(const float (&acc)[1 << LOG_R][4], float* part, int warp, int h) {
  float c[1 << LOG_R];
#pragma unroll
  for (int r = 0; r < (1 << LOG_R); ++r) c[r] = combine(acc[r]);
  return layout_total<LOG_R, LOG_NW>(c, part, warp, h);
}

// Adds the squares of a thread's slots past the register cache (SLOTS.., a multiple of R) into
// acc: slot s into lane s % R, in increasing s; values(offset, v) fills the vector's four values.
template <int R, int SLOTS, int STRIDE, typename F>
__device__ __forceinline__ void add_uncached(float (&acc)[R][4], int slots, F&& values) {
  constexpr int kTailUnroll = R >= 4 ? 1 : 4 / R;  // loads in flight
#pragma unroll kTailUnroll
  for (int s0 = SLOTS; s0 < slots; s0 += R) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (s0 + r < slots) {
        float v[4];
        values(static_cast<int64_t>(s0 + r) * STRIDE, v);
#pragma unroll
        for (int i = 0; i < 4; ++i) add_square(acc[r][i], v[i]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Aligned rows (n % 4 == 0, every row 4-element aligned): no head or tail, one vector access per
// torch vector. Block (32 NW, rows per block), one row per blockIdx.x * blockDim.y + threadIdx.y,
// a grid that covers the rows once. A thread's first kSlots vectors (and their weights) are loaded
// together up front and stay in registers from the sum to the output; longer rows read the rest
// twice. Inputs and outputs are __restrict__ (the binding refuses an output that shares storage
// with an input), so loads are issued ahead of the stores before them. FULL: every thread of the
// row has exactly SLOTS vectors (n = 4 * SLOTS * 32 NW * R / R: width 2048 at 512 lanes), so the
// kernel is straight-line, without a guard per slot. WARP_DOWN: torch's warp order as a constant
// (0 up, 1 down: the thread's torch lane is then one shift and add ahead of its first load); -1
// reads it from the arguments.
// ---------------------------------------------------------------------------------------------
template <typename T, int MODE, bool HAS_R, int LOG_R, int LOG_NW, int SLOTS, bool FULL = false,
          int WARP_DOWN = -1, int LOAD = kLoadCached>
__global__ void __launch_bounds__(LOG_NW >= 2 ? 32 << LOG_NW : 128) norm_vec_kernel(const NormArgs a) {
  using V = Vec4<T>;
  constexpr bool kNN = MODE == kNormNormAdd;
  constexpr bool kOther = HAS_R || MODE != kNormX;  // a second input row: r or b
  constexpr int kR = 1 << LOG_R;
  constexpr int kStride = 32 << LOG_NW;                        // vectors between a thread's slots
  constexpr int kSlots = (SLOTS + kR - 1) / kR * kR;           // a multiple of R
  const int k = LOG_R + LOG_NW + 5;
  const int h = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // torch >= 2.10's order: slot 0 of (h, w) is lane h * NW + w (torch_lane computes it bit by bit)
  const int base = WARP_DOWN == 1 ? (h << LOG_NW) + warp
                                  : torch_lane(h, warp, k, LOG_R, WARP_DOWN < 0 ? a.warp_down != 0 : false);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool active = row < a.rows;
  const int64_t rrow = active ? row : 0;
  const int64_t nvec = a.n >> 2;
  // slots s with base + s * kStride < nvec (inactive rows of the last block: none)
  const int slots = FULL ? kSlots
                   : (active && base < nvec) ? static_cast<int>((nvec - 1 - base) >> (LOG_NW + 5)) + 1 : 0;
  const V* __restrict__ w1 = static_cast<const V*>(a.w1) + base;
  const V* __restrict__ w2 = static_cast<const V*>(a.w2) + base;
  const V* __restrict__ xr = reinterpret_cast<const V*>(row_ptr<T>(a.x, rrow, a.sx)) + base;
  const V* __restrict__ orow = reinterpret_cast<const V*>(
      MODE == kNormAdd ? row_ptr<T>(a.b, rrow, a.sb) : row_ptr<T>(kOther ? a.r : a.x, rrow, a.sr)) + base;
  V w1c[kSlots], w2c[kSlots], xc[kSlots], oc[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    if (s < slots) {
      w1c[s] = load_cached<LOAD>(w1 + s * kStride, active);
      if constexpr (kNN) w2c[s] = load_cached<LOAD>(w2 + s * kStride, active);
      xc[s] = load_cached<LOAD>(xr + s * kStride, active);
      if constexpr (kOther) {
        oc[s] = load_cached<LOAD>(orow + s * kStride, active);
      } else {
        oc[s] = xc[s];  // unused by this form; keeps every value defined
      }
    }
  }
  float acc[kR][4] = {};
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    if (s < slots) {
#pragma unroll
      for (int i = 0; i < 4; ++i) add_square(acc[s % kR][i], first_value<T, MODE>(xc[s].v[i], oc[s].v[i]));
    }
  }
  add_uncached<kR, kSlots, kStride>(acc, slots, [&](int64_t idx, float (&v)[4]) {
    const V xv = xr[idx];
    V ov = xv;
    if constexpr (MODE == kNormAdd) ov = orow[idx];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = first_value<T, MODE>(xv.v[i], ov.v[i]);
  });
  __shared__ float part[2][kMaxRowsPerBlock][1 << LOG_NW];
  float var1, var2 = 0.f;
  const float rstd1 = inv_rms(lanes_total<LOG_R, LOG_NW>(acc, part[0][threadIdx.y], warp, h), a.factor, a.eps, &var1);
  V* __restrict__ out = static_cast<V*>(a.out) + rrow * nvec + base;
  if constexpr (kNN) {
    V* __restrict__ out2 = static_cast<V*>(a.out2) + rrow * nvec + base;
    float hc[kSlots][4];
    float acc2[kR][4] = {};
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (s < slots) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          hc[s][i] = h_value<T>(xc[s].v[i], oc[s].v[i], w1c[s].v[i], rstd1);
          add_square(acc2[s % kR][i], hc[s][i]);
        }
      }
    }
    add_uncached<kR, kSlots, kStride>(acc2, slots, [&](int64_t idx, float (&v)[4]) {
      const V xv = xr[idx], rv = orow[idx], wv = w1[idx];
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = h_value<T>(xv.v[i], rv.v[i], wv.v[i], rstd1);
    });
    const float rstd2 = inv_rms(lanes_total<LOG_R, LOG_NW>(acc2, part[1][threadIdx.y], warp, h), a.factor, a.eps, &var2);
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (s < slots) {
        V hv, yv;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          hv.v[i] = Traits<T>::from_float(hc[s][i]);
          yv.v[i] = Traits<T>::from_float(scaled<T>(hc[s][i], Traits<T>::to_float(w2c[s].v[i]), rstd2));
        }
        out[s * kStride] = hv;
        out2[s * kStride] = yv;
      }
    }
#pragma unroll 4
    for (int s = kSlots; s < slots; ++s) {
      const int64_t idx = static_cast<int64_t>(s) * kStride;
      const V xv = xr[idx], rv = orow[idx], wv = w1[idx], w2v = w2[idx];
      V hv, yv;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float hh = h_value<T>(xv.v[i], rv.v[i], wv.v[i], rstd1);
        hv.v[i] = Traits<T>::from_float(hh);
        yv.v[i] = Traits<T>::from_float(scaled<T>(hh, Traits<T>::to_float(w2v.v[i]), rstd2));
      }
      out[idx] = hv;
      out2[idx] = yv;
    }
  } else {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (s < slots && active) out[s * kStride] = single_out_vec<T, MODE, HAS_R>(xc[s], oc[s], w1c[s], rstd1);
    }
#pragma unroll 4
    for (int s = kSlots; s < slots; ++s) {
      const int64_t idx = static_cast<int64_t>(s) * kStride;
      const V xv = xr[idx], wv = w1[idx];
      V ov = xv;
      if constexpr (kOther) ov = orow[idx];
      out[idx] = single_out_vec<T, MODE, HAS_R>(xv, ov, wv, rstd1);
    }
  }
  if (active && threadIdx.x == 0) store_var<kNN>(a, row, var1, var2);
}

// Launch the vector kernel: layout (LOG_R, LOG_NW), SLOTS cached vectors per thread,
// `rows_per_block` rows per block (at most kMaxRowsPerBlock, and 4 warps when NW < 4: the kernel's
// launch bounds).
template <typename T, int MODE, bool HAS_R, int LOG_R, int LOG_NW, int SLOTS = cached_slots<T, MODE, HAS_R>(),
          bool FULL = false, int WARP_DOWN = -1>
cudaError_t launch_vec(const NormArgs& a, int rows_per_block, cudaStream_t stream) {
  const int64_t grid = (a.rows + rows_per_block - 1) / rows_per_block;
  const dim3 block(32 << LOG_NW, rows_per_block);
  if constexpr (MODE == kNormX && FULL) {
    // straight-line kernels pin their loads at every row count: the 4-slot plain one (512 lanes)
    // with kLoadPredicated, which ptxas issues all ahead of the sum; the 8- and 16-slot ones (64
    // and 32 lanes, from 8 rows) and the residual form with kLoadVolatile, since ptxas issues only
    // some of their predicated (or .ca) loads ahead of the first square and the rest one round trip
    // later (sm_90 SASS; the CPU SASS test checks both). Their x and residual rows are read once,
    // so skipping L1 costs them nothing; many rows at 32 lanes take the rows kernel (norm.cu).
    constexpr int kLoad = SLOTS <= 4 && !HAS_R ? kLoadPredicated : kLoadVolatile;
    norm_vec_kernel<T, MODE, HAS_R, LOG_R, LOG_NW, SLOTS, FULL, WARP_DOWN, kLoad>
        <<<static_cast<unsigned>(grid), block, 0, stream>>>(a);
  } else {
    if constexpr (MODE == kNormX) {
      if (a.rows < kPinnedMaxRows) {
        norm_vec_kernel<T, MODE, HAS_R, LOG_R, LOG_NW, SLOTS, FULL, WARP_DOWN, kLoadVolatile>
            <<<static_cast<unsigned>(grid), block, 0, stream>>>(a);
        return cudaGetLastError();
      }
    }
    norm_vec_kernel<T, MODE, HAS_R, LOG_R, LOG_NW, SLOTS, FULL, WARP_DOWN>
        <<<static_cast<unsigned>(grid), block, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------
// Many rows of torch's 32-lane plan (width > 128 from 16 rows up), plain and residual forms, rows
// and weights 16-byte aligned in whole 16-byte groups: the exact Triton kernel's several-rows form
// (_lowwarp_rows_norm_kernel). A block of kRowsPerBlock warps takes as many rows. First pass: warp
// j sums row j in torch's order (hardware lane h is torch lane h: its vectors h, h + 32, ..., four
// accumulators, ((a0 + a1) + a2) + a3, the butterfly xor 16..1), its loads issued kBatch at a
// time and marked L1::evict_first, as Triton's evict_first loads; its rstd goes through shared
// memory. Second pass: the block writes its rows, thread t taking the 16-byte groups t, t + 32 *
// kRowsPerBlock, ... of every row, so each weight group is loaded once for all the block's rows and
// every access is 16 bytes; each batch's loads (OUT_BATCH groups of every row, their weights, the
// residual) are issued before its first store, the output stored streaming (st.global.cs). Only
// the sum's order is torch's concern; the output is elementwise.
//
// Why: at 4096 x 2048 the vector kernel held whole rows and weights in registers (about 90 per
// thread, two waves of blocks) and ran at 62% of the device copy against the Triton kernel's 80%
// cold (results/gpu/kernels-verdicts, H200), the residual form at 54% against 85%; this form keeps
// every block resident at once, as the Triton kernel does.
// ---------------------------------------------------------------------------------------------
constexpr int kRowsPerBlock = 4;
// first-pass loads in flight per lane: 128 bytes (a width-2048 16-bit row: all 16 vectors)
template <typename T>
constexpr int sum_batch() {
  return 128 / (4 * sizeof(T));
}
constexpr int64_t kRowsKernelMinRows = 1024;   // the exact Triton kernel's two-pass threshold
// The second pass re-reads a block's rows while they are still in L1/L2: 4 rows of 2048 16-bit
// values are 16 KB a block. Wider rows (Huginn's 5280, 42 KB, 84 KB with the branch) would stream
// the whole tensor through L2 before the second passes ran (1024 resident blocks) and re-read it
// from DRAM; the Triton kernel's several-rows form has the same bound (ROWS_MAX_WIDTH) and holds
// wider rows in registers instead, which this arm does not (yet).
constexpr int64_t kRowsKernelMaxWidth = 2048;
// 8 blocks of 128 threads per SM (at most 64 registers): 1056 resident blocks on 132 SMs, so
// 4096 rows (1024 blocks) run in one wave, as the Triton kernel's 64-register programs do
constexpr int kRowsMinBlocks = 8;

template <typename T>
__device__ __forceinline__ Vec4<T> load_evict_first(const Vec4<T>* p) {
  Vec4<T> v;
  if constexpr (sizeof(T) == 4) {
    uint4 u;
    asm("ld.global.L1::evict_first.v4.b32 {%0, %1, %2, %3}, [%4];"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w) : "l"(p));
    *reinterpret_cast<uint4*>(&v) = u;
  } else {
    uint2 u;
    asm("ld.global.L1::evict_first.v2.b32 {%0, %1}, [%2];" : "=r"(u.x), "=r"(u.y) : "l"(p));
    *reinterpret_cast<uint2*>(&v) = u;
  }
  return v;
}

// Element i of a vector as fp32; bf16 widened by a shift or a mask of its 32-bit word (exact, and
// without splitting the word into 16-bit registers first, which cost the rows kernel spills).
template <typename T>
__device__ __forceinline__ float element_float(const Vec4<T>& v, int i) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const uint32_t word = reinterpret_cast<const uint32_t*>(&v)[i >> 1];
    return __uint_as_float((i & 1) ? (word & 0xffff0000u) : (word << 16));
  } else {
    return Traits<T>::to_float(v.v[i]);
  }
}

// 16 bytes: two 4-element vectors of a 16-bit type, one of fp32.
template <typename T>
struct alignas(16) Group16 {
  static constexpr int kVecs = 16 / (4 * sizeof(T));
  Vec4<T> q[kVecs];
};

template <typename T>
__device__ __forceinline__ Group16<T> load_group(const Group16<T>* p) {
  Group16<T> g;
  *reinterpret_cast<uint4*>(&g) = *reinterpret_cast<const uint4*>(p);
  return g;
}

template <typename T, int MODE, bool HAS_R, int OUT_BATCH>
__global__ void __launch_bounds__(32 * kRowsPerBlock, kRowsMinBlocks) norm_rows_kernel(const NormArgs a) {
  using V = Vec4<T>;
  using G = Group16<T>;
  constexpr int kThreads = 32 * kRowsPerBlock;
  constexpr bool kAdd = MODE == kNormAdd;
  constexpr bool kOther = HAS_R || kAdd;   // a second row: the residual (output) or the branch (sum)
  // the add form loads x and the branch: half the vectors per batch, the same bytes in flight
  constexpr int kBatch = sum_batch<T>() / (kAdd ? 2 : 1);
  const int h = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t first_row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int nvec = static_cast<int>(a.n >> 2);
  __shared__ float rstd_of[kRowsPerBlock];
  {
    // a row past the end (the last block's) sums row rows - 1 and stores nothing
    const int64_t row = first_row + warp < a.rows ? first_row + warp : a.rows - 1;
    // torch >= 2.10: lane h; older torch's shuffles 1..16 reduce h's bits in reverse
    const int lane = torch_lane(h, 0, 5, 0, a.warp_down != 0);
    const V* __restrict__ xr = reinterpret_cast<const V*>(row_ptr<T>(a.x, row, a.sx)) + lane;
    const V* __restrict__ br = reinterpret_cast<const V*>(row_ptr<T>(kAdd ? a.b : a.x, row, kAdd ? a.sb : a.sx)) + lane;
    const int slots = lane < nvec ? (nvec - 1 - lane) / 32 + 1 : 0;
    float acc[1][4] = {};
    for (int s0 = 0; s0 < slots; s0 += kBatch) {
      // one address and immediate offsets (a 64-bit address per load would take 2 * kBatch registers)
      const V* __restrict__ p = xr + s0 * 32;
      const V* __restrict__ pb = br + s0 * 32;
      const int left = slots - s0;
      // vectors past the row are zeros: +0 added to a sum of squares (>= +0) leaves it unchanged,
      // and unconditional squares keep the batch in registers (guarded ones spilled it)
      V v[kBatch], vb[kAdd ? kBatch : 1];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        v[j] = j < left ? load_evict_first<T>(p + j * 32) : V{};
        if constexpr (kAdd) vb[j] = j < left ? load_evict_first<T>(pb + j * 32) : V{};
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          // the add form squares round(x + b): +0 + +0 is +0, so the zero padding still adds nothing
          float value = element_float<T>(v[j], i);
          if constexpr (kAdd) value = round_to<T>(__fadd_rn(value, element_float<T>(vb[j], i)));
          add_square(acc[0][i], value);
        }
      }
    }
    float var;
    const float rstd = inv_rms(lanes_total<0, 0>(acc, nullptr, warp, h), a.factor, a.eps, &var);
    if (h == 0) {
      rstd_of[warp] = rstd;
      if (first_row + warp < a.rows && a.var != nullptr) a.var[row] = var;
    }
  }
  __syncthreads();
  // group offsets are 32-bit within a row (torch's plan needs 32-bit indexing: rows * n * 4 < 2^31)
  const int ngroups = static_cast<int>(a.n / (4 * G::kVecs));
  const int64_t last = a.rows - 1;
  const G* __restrict__ w = static_cast<const G*>(a.w1) + threadIdx.x;
  for (int g0 = 0; g0 + static_cast<int>(threadIdx.x) < ngroups; g0 += kThreads * OUT_BATCH) {
    G wv[OUT_BATCH], xv[kRowsPerBlock][OUT_BATCH], rv[kOther ? kRowsPerBlock : 1][OUT_BATCH];
#pragma unroll
    for (int b = 0; b < OUT_BATCH; ++b) {
      const int g = g0 + b * kThreads;
      if (g + static_cast<int>(threadIdx.x) < ngroups) {
        wv[b] = load_group<T>(w + g);
#pragma unroll
        for (int j = 0; j < kRowsPerBlock; ++j) {
          const int64_t row = first_row + j < a.rows ? first_row + j : last;
          xv[j][b] = load_group<T>(reinterpret_cast<const G*>(row_ptr<T>(a.x, row, a.sx)) + threadIdx.x + g);
          if constexpr (kOther) {
            const void* other = kAdd ? a.b : a.r;
            rv[j][b] = load_group<T>(reinterpret_cast<const G*>(row_ptr<T>(other, row, kAdd ? a.sb : a.sr)) + threadIdx.x + g);
          }
        }
      }
    }
#pragma unroll
    for (int b = 0; b < OUT_BATCH; ++b) {
      const int g = g0 + b * kThreads;
      if (g + static_cast<int>(threadIdx.x) < ngroups) {
#pragma unroll
        for (int j = 0; j < kRowsPerBlock; ++j) {
          if (first_row + j < a.rows) {
            const G& o = rv[kOther ? j : 0][b];   // the residual or the branch (not read by the plain form)
            G y;
#pragma unroll
            for (int q = 0; q < G::kVecs; ++q) y.q[q] = single_out_vec<T, MODE, HAS_R>(xv[j][b].q[q], o.q[q], wv[b].q[q], rstd_of[j]);
            G* out = reinterpret_cast<G*>(static_cast<T*>(a.out) + (first_row + j) * a.n) + threadIdx.x + g;
            __stcs(reinterpret_cast<uint4*>(out), *reinterpret_cast<const uint4*>(&y));
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The rows kernel's held form: bf16 rows of the plain and residual forms, whose whole row (at
// most kRowsKernelMaxWidth values: sum_batch vectors per lane) the first pass already holds in
// registers. Warp j sums row j as norm_rows_kernel does and writes it from those registers, each
// lane its own vectors (8-byte stores, a warp's 256 bytes contiguous), the weights streamed from
// L1 kHeldOutBatch vectors at a time. The residual row travels into shared memory by cp.async,
// issued before the first x load, so it is in flight while the row is summed instead of waiting for
// the sum (each warp reads back only its own row).
//
// Why: the two-pass form reads x twice (the second time from L2), issues its residual loads only
// after the sum, and its residual form needed 64 registers and 20 bytes of spills; it ran at 1.14x
// (plain) and 1.20x (residual) of the exact Triton kernel's time at 4096 x 2048, cold L2
// (results/gpu/kernels-native-rows, H100).
// ---------------------------------------------------------------------------------------------
constexpr int kHeldOutBatch = 4;   // weight vectors per lane in flight in the output loop

__device__ __forceinline__ void copy_async_16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem) : "memory");
#else
  *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
#endif
}

__device__ __forceinline__ void copy_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// The held form works on the raw 32-bit words of its bf16 vectors (uint2: four values): loaded,
// selected and zero-filled as 16-bit elements (Vec4<T>), a row was split into 16-bit registers, and
// spilled at 64 registers.
__device__ __forceinline__ uint2 load_words_evict_first(const uint2* p) {
  uint2 u;
  asm("ld.global.L1::evict_first.v2.b32 {%0, %1}, [%2];" : "=r"(u.x), "=r"(u.y) : "l"(p));
  return u;
}

// Value i (0..3) of four bf16 values as fp32, exact. AGAIN (the output's): a shift and a mask
// against the sum's byte permute, which ptxas does not merge: merged, the row stayed in registers
// as 64 fp32 values from the sum to the output, and spilled. (fp16's converts were merged whatever
// their form, so fp16 rows keep the two-pass kernel.)
template <bool AGAIN>
__device__ __forceinline__ float bf16_word_float(const uint2& v, int i) {
  const uint32_t word = (i >> 1) ? v.y : v.x;
  uint32_t bits;
  if constexpr (AGAIN) {
    if (i & 1) {
      asm volatile("and.b32 %0, %1, 0xffff0000;" : "=r"(bits) : "r"(word));
    } else {
      asm volatile("shl.b32 %0, %1, 16;" : "=r"(bits) : "r"(word));
    }
  } else {
    bits = __byte_perm(word, 0u, (i & 1) ? 0x3244 : 0x1044);   // the high or low half, then 16 zero bits
  }
  return __uint_as_float(bits);
}

template <bool HAS_R>
__global__ void __launch_bounds__(32 * kRowsPerBlock, kRowsMinBlocks) norm_rows_held_kernel(const NormArgs a) {
  using T = __nv_bfloat16;
  using T2 = __nv_bfloat162;
  constexpr int kSlots = sum_batch<T>();                 // vectors per lane: a whole row
  constexpr int kRowVecs = 32 * kSlots;                  // kRowsKernelMaxWidth / 4
  const int h = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp;
  const bool active = first < a.rows;
  const int64_t row = active ? first : a.rows - 1;       // a row past the end sums row rows - 1
  const int nvec = static_cast<int>(a.n >> 2);
  // the block's residual rows (16 KB): cp.async writes 16-byte aligned groups
  __shared__ __align__(16) uint2 r_rows[HAS_R ? kRowsPerBlock : 1][HAS_R ? kRowVecs : 1];
  if constexpr (HAS_R) {
    // 16-byte groups of the row, lane h copying groups h + 32 k; read back below as 8-byte vectors
    // by other lanes of this warp, hence the warp barrier after the wait
    const char* src = reinterpret_cast<const char*>(row_ptr<T>(a.r, row, a.sr));
    char* dst = reinterpret_cast<char*>(r_rows[warp]);
    const int ngroups = nvec >> 1;
#pragma unroll
    for (int k = 0; k < kSlots / 2; ++k) {
      const int g = h + 32 * k;
      if (g < ngroups) copy_async_16(dst + 16 * g, src + 16 * g);
    }
  }
  const int lane = torch_lane(h, 0, 5, 0, a.warp_down != 0);
  const uint2* __restrict__ xr = reinterpret_cast<const uint2*>(row_ptr<T>(a.x, row, a.sx)) + lane;
  const int slots = lane < nvec ? (nvec - 1 - lane) / 32 + 1 : 0;
  uint2 v[kSlots];
#pragma unroll
  for (int j = 0; j < kSlots; ++j) v[j] = j < slots ? load_words_evict_first(xr + j * 32) : make_uint2(0u, 0u);
  float acc[1][4] = {};
#pragma unroll
  for (int j = 0; j < kSlots; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) add_square(acc[0][i], bf16_word_float<false>(v[j], i));   // +0 past the row
  }
  float var;
  const float rstd = inv_rms(lanes_total<0, 0>(acc, nullptr, warp, h), a.factor, a.eps, &var);
  if (h == 0 && active && a.var != nullptr) a.var[row] = var;
  if constexpr (HAS_R) {
    copy_async_wait_all();
    __syncwarp();
  }
  if (!active) return;
  const uint2* __restrict__ w = static_cast<const uint2*>(a.w1) + lane;
  uint2* out = reinterpret_cast<uint2*>(static_cast<T*>(a.out) + row * a.n) + lane;
#pragma unroll
  for (int j0 = 0; j0 < kSlots; j0 += kHeldOutBatch) {
    uint2 wv[kHeldOutBatch];
#pragma unroll
    for (int b = 0; b < kHeldOutBatch; ++b) wv[b] = j0 + b < slots ? w[(j0 + b) * 32] : make_uint2(0u, 0u);
#pragma unroll
    for (int b = 0; b < kHeldOutBatch; ++b) {
      const int j = j0 + b;
      if (j < slots) {
        // single_out_vec's 16-bit epilogue (pair_out) on x's words
        const uint2 o = HAS_R ? r_rows[HAS_R ? warp : 0][HAS_R ? j * 32 + lane : 0] : wv[b];
        const T2* w2 = reinterpret_cast<const T2*>(&wv[b]);
        const T2* r2 = reinterpret_cast<const T2*>(&o);
        uint2 y;
        T2* y2 = reinterpret_cast<T2*>(&y);
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const float v0 = bf16_word_float<true>(v[j], 2 * q), v1 = bf16_word_float<true>(v[j], 2 * q + 1);
          y2[q] = pair_out<T, HAS_R>(w2[q], r2[q], v0, v1, rstd);
        }
        __stcs(out + j * 32, y);
      }
    }
  }
}

// Whether the rows kernel takes the call: torch's 32-lane plan, many rows of at most
// kRowsKernelMaxWidth, the plain, residual and add forms (not norm-add-norm), and every row, the
// weights and the output 16-byte aligned in whole 16-byte groups.
inline bool rows_kernel_takes(const NormArgs& a, int mode, int64_t elem) {
  const int64_t group = 16 / elem;
  if (a.log_lanes != 5 || a.rows < kRowsKernelMinRows || a.n > kRowsKernelMaxWidth || mode == kNormNormAdd
      || a.n % group != 0) {
    return false;
  }
  const void* other = mode == kNormAdd ? a.b : a.r;
  const int64_t other_stride = mode == kNormAdd ? a.sb : a.sr;
  for (const void* p : {a.x, other, a.w1, static_cast<const void*>(a.out)}) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return a.sx % group == 0 && (other == nullptr || other_stride % group == 0);
}

template <typename T, int MODE, bool HAS_R>
cudaError_t launch_rows(const NormArgs& a, cudaStream_t stream) {
  const int64_t grid = (a.rows + kRowsPerBlock - 1) / kRowsPerBlock;
  if constexpr (std::is_same_v<T, __nv_bfloat16> && MODE == kNormX) {
    // a bf16 row of at most kRowsKernelMaxWidth is one first-pass batch: the held form (its
    // residual form holds 16 KB of shared memory a block: 8 resident blocks need 128 KB of it)
    if constexpr (HAS_R) prefer_shared_memory(reinterpret_cast<const void*>(norm_rows_held_kernel<HAS_R>));
    norm_rows_held_kernel<HAS_R><<<static_cast<unsigned>(grid), 32 * kRowsPerBlock, 0, stream>>>(a);
    return cudaGetLastError();
  }
  // one group of every row per batch: two (the Triton kernel's whole width-2048 row ahead of its
  // first store) need more than 64 registers for 16-bit rows and spilled in the sm_90 SASS
  norm_rows_kernel<T, MODE, HAS_R, 1><<<static_cast<unsigned>(grid), 32 * kRowsPerBlock, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace norm
}  // namespace rltb
