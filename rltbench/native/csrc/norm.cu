// RMSNorm in torch's CUDA reduction order, every form in one launch.
//
// torch computes the variance as `x.float().pow(2).mean(-1)`: a fresh fp32 temporary of squares,
// summed by Reduce.cuh with `lanes` threads per row (rltbench/kernels/torch_reduce_model.py is the
// specification): lane l owns the 4-element vectors l, l + lanes, ... with one accumulator per
// vector element, a misaligned head and a tail go to accumulator 0 of the first lanes, each lane
// combines ((a0 + a1) + a2) + a3, and the lanes are added as a balanced tree. The tree halves by
// the highest lane bit first (shared-memory levels, then the warp shuffles 16..1 in torch >= 2.10;
// older torch shuffles 1..16, i.e. bits 0..4 last but in increasing order).
//
// Layout. Thread (warp w, hardware lane h) of a row plays torch lane torch_lane(h, w): the five
// lane bits reduced first sit on h (a warp butterfly, xor 16..1, reduces them in that order) and
// the rest on w (one shared-memory exchange, then every thread adds the warps' partials in torch's
// order). So one barrier per reduction, whatever the lane count. Adding a zero never changes a
// sum of squares (it is >= +0), so idle lanes and the padded warp slots add exact zeros.
//
// Every multiply and add is __fmul_rn / __fadd_rn (never contracted into an FMA); rsqrtf is
// rsqrt.approx.f32 without FTZ, what torch.rsqrt's CUDA kernel calls; each torch op's result is
// rounded to the dtype where torch rounds it (see rltbench/kernels/reference.py).
#include "common.cuh"
#include "native.h"

namespace rltb {
namespace {

constexpr int kMaxWarps = 16;        // torch's widest row plan: 512 lanes
constexpr int kMaxRowsPerBlock = 4;  // narrow plans (32/64 lanes) put 4/2 rows in a block
constexpr int kCache = 4;            // vectors per lane kept in registers from the sum to the output

// The i-th torch lane bit that the tree reduces, for log2(lanes) = k.
__device__ __forceinline__ int reduced_bit(int i, int k, bool down) {
  return (down || i < k - 5) ? k - 1 - i : i - (k - 5);
}

// The torch lane of hardware lane h of warp w: h's bit j is reduced at shuffle offset 2^j, i.e.
// as the (4 - j)-th level; w's bit j as level k - 1 - j (the warps' tree halves from its top bit).
__device__ __forceinline__ int torch_lane(int h, int w, int k, bool down) {
  int lane = 0;
#pragma unroll
  for (int j = 0; j < 5; ++j) lane |= ((h >> j) & 1) << reduced_bit(4 - j, k, down);
  for (int j = 0; j < k - 5; ++j) lane |= ((w >> j) & 1) << reduced_bit(k - 1 - j, k, down);
  return lane;
}

// The row's total: the five hardware-lane levels, then (several warps) the warps' partials through
// shared memory, halving from the top as torch's shared-memory levels do. Every thread of the row
// gets the same bits. `part`: this row's kMaxWarps slots of a buffer not read since the last barrier.
__device__ __forceinline__ float row_total(float s, float* part, int nw, int warp, int h) {
#pragma unroll
  for (int offset = 16; offset >= 1; offset >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, offset));
  if (nw == 1) return s;
  if (h == 0) part[warp] = s;
  __syncthreads();
  float q[kMaxWarps];
#pragma unroll
  for (int i = 0; i < kMaxWarps; ++i) q[i] = i < nw ? part[i] : 0.f;
  // written out level by level so q stays in registers (a rolled loop would index it dynamically)
  if (nw > 8) {
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = __fadd_rn(q[i], q[i + 8]);
  }
  if (nw > 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) q[i] = __fadd_rn(q[i], q[i + 4]);
  }
  if (nw > 2) {
    q[0] = __fadd_rn(q[0], q[2]);
    q[1] = __fadd_rn(q[1], q[3]);
  }
  return __fadd_rn(q[0], q[1]);
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

// ---------------------------------------------------------------------------------------------
// Aligned rows (n % 4 == 0, every row 4-element aligned): no head or tail, one vector access per
// torch vector; the first kCache vectors of a lane stay in registers from the sum to the output
// and the weights' stay there across the rows a block walks through. Inputs and outputs are
// __restrict__ (the binding refuses an output that shares storage with an input) and the loops past the cache are
// unrolled, so loads are issued ahead of the stores before them: a load after a store that may
// alias it waits for the store, one dependent round trip per vector.
// ---------------------------------------------------------------------------------------------
template <typename T, int MODE, bool HAS_R>
__global__ void __launch_bounds__(512) norm_vec_kernel(const NormArgs a) {
  using V = Vec4<T>;
  constexpr bool kNN = MODE == kNormNormAdd;
  constexpr bool kOther = HAS_R || MODE != kNormX;  // a second input row: r or b
  const int k = a.log_lanes, nw = 1 << (k - 5), lanes = 1 << k;
  const int h = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lane = torch_lane(h, warp, k, a.warp_down != 0);
  const int64_t nvec = a.n >> 2;
  const int iters = lane < nvec ? static_cast<int>((nvec - 1 - lane) >> k) + 1 : 0;  // lanes = 2^k
  const V* __restrict__ w1 = static_cast<const V*>(a.w1);
  const V* __restrict__ w2 = static_cast<const V*>(a.w2);
  V w1c[kCache], w2c[kCache];
#pragma unroll
  for (int c = 0; c < kCache; ++c) {
    if (c < iters) {
      w1c[c] = w1[lane + c * lanes];
      if constexpr (kNN) w2c[c] = w2[lane + c * lanes];
    }
  }
  __shared__ float part[2][kMaxRowsPerBlock][kMaxWarps];
  int buf = 0;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.y; base < a.rows; base += step) {
    const int64_t row = base + threadIdx.y;
    const bool active = row < a.rows;
    const int64_t rrow = active ? row : 0;
    const int its = active ? iters : 0;
    const V* __restrict__ xr = reinterpret_cast<const V*>(row_ptr<T>(a.x, rrow, a.sx));
    const V* __restrict__ orow = reinterpret_cast<const V*>(MODE == kNormAdd ? row_ptr<T>(a.b, rrow, a.sb)
                                                                : row_ptr<T>(kOther ? a.r : a.x, rrow, a.sr));
    V xc[kCache], oc[kCache];
#pragma unroll
    for (int c = 0; c < kCache; ++c) {
      if (c < its) {
        xc[c] = xr[lane + c * lanes];
        if constexpr (kOther) {
          oc[c] = orow[lane + c * lanes];
        } else {
          oc[c] = xc[c];  // unused by this form; keeps every value defined
        }
      }
    }
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int c = 0; c < kCache; ++c) {
      if (c < its) {
#pragma unroll
        for (int i = 0; i < 4; ++i) add_square(acc[i], first_value<T, MODE>(xc[c].v[i], oc[c].v[i]));
      }
    }
#pragma unroll 4
    for (int it = kCache; it < its; ++it) {
      const V xv = xr[lane + it * lanes];
      V ov = xv;
      if constexpr (MODE == kNormAdd) ov = orow[lane + it * lanes];
#pragma unroll
      for (int i = 0; i < 4; ++i) add_square(acc[i], first_value<T, MODE>(xv.v[i], ov.v[i]));
    }
    float var1, var2 = 0.f;
    const float rstd1 = inv_rms(row_total(combine(acc), part[buf][threadIdx.y], nw, warp, h), a.factor, a.eps, &var1);
    buf ^= 1;
    const int64_t out_base = rrow * (a.n >> 2);
    V* __restrict__ out = static_cast<V*>(a.out) + out_base;
    if constexpr (kNN) {
      V* __restrict__ out2 = static_cast<V*>(a.out2) + out_base;
      float hc[kCache][4];
      float acc2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        if (c < its) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            hc[c][i] = h_value<T>(xc[c].v[i], oc[c].v[i], w1c[c].v[i], rstd1);
            add_square(acc2[i], hc[c][i]);
          }
        }
      }
  #pragma unroll 4
    for (int it = kCache; it < its; ++it) {
        const int64_t idx = lane + it * lanes;
        const V xv = xr[idx], rv = orow[idx], wv = w1[idx];
#pragma unroll
        for (int i = 0; i < 4; ++i) add_square(acc2[i], h_value<T>(xv.v[i], rv.v[i], wv.v[i], rstd1));
      }
      const float rstd2 = inv_rms(row_total(combine(acc2), part[buf][threadIdx.y], nw, warp, h), a.factor, a.eps, &var2);
      buf ^= 1;
#pragma unroll
      for (int c = 0; c < kCache; ++c) {
        if (c < its) {
          V hv, yv;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            hv.v[i] = Traits<T>::from_float(hc[c][i]);
            yv.v[i] = Traits<T>::from_float(scaled<T>(hc[c][i], Traits<T>::to_float(w2c[c].v[i]), rstd2));
          }
          out[lane + c * lanes] = hv;
          out2[lane + c * lanes] = yv;
        }
      }
  #pragma unroll 4
    for (int it = kCache; it < its; ++it) {
        const int64_t idx = lane + it * lanes;
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
      for (int c = 0; c < kCache; ++c) {
        if (c < its) {
          V o;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            o.v[i] = single_out<T, HAS_R>(first_value<T, MODE>(xc[c].v[i], oc[c].v[i]), w1c[c].v[i], oc[c].v[i], rstd1);
          }
          out[lane + c * lanes] = o;
        }
      }
  #pragma unroll 4
    for (int it = kCache; it < its; ++it) {
        const int64_t idx = lane + it * lanes;
        const V xv = xr[idx], wv = w1[idx];
        V ov = xv, o;
        if constexpr (kOther) ov = orow[idx];
#pragma unroll
        for (int i = 0; i < 4; ++i) o.v[i] = single_out<T, HAS_R>(first_value<T, MODE>(xv.v[i], ov.v[i]), wv.v[i], ov.v[i], rstd1);
        out[idx] = o;
      }
    }
    if (active && threadIdx.x == 0) store_var<kNN>(a, row, var1, var2);
  }
}

// ---------------------------------------------------------------------------------------------
// Any row layout (odd widths, offsets, strides): scalar accesses, torch's head/tail handling for
// a row whose fp32 temporary starts off a 16-byte boundary, the output in a separate coalesced pass.
// ---------------------------------------------------------------------------------------------
template <typename T, int MODE, bool HAS_R>
__global__ void __launch_bounds__(512) norm_scalar_kernel(const NormArgs a) {
  constexpr bool kNN = MODE == kNormNormAdd;
  const int k = a.log_lanes, nw = 1 << (k - 5), lanes = 1 << k;
  const int h = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lane = torch_lane(h, warp, k, a.warp_down != 0);
  const T* w1 = static_cast<const T*>(a.w1);
  const T* w2 = static_cast<const T*>(a.w2);
  __shared__ float part[2][kMaxRowsPerBlock][kMaxWarps];
  int buf = 0;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.y; base < a.rows; base += step) {
    const int64_t row = base + threadIdx.y;
    const bool active = row < a.rows;
    const int64_t rrow = active ? row : 0;
    const T* x = row_ptr<T>(a.x, rrow, a.sx);
    const T* b = row_ptr<T>(MODE == kNormAdd ? a.b : a.x, rrow, MODE == kNormAdd ? a.sb : a.sx);
    const T* r = row_ptr<T>((HAS_R || kNN) ? a.r : a.x, rrow, (HAS_R || kNN) ? a.sr : a.sx);
    // torch's temporary is a fresh contiguous [rows, n] fp32 tensor: row `row` starts at element row * n
    const int shift = static_cast<int>((rrow * a.n) & 3);
    const int64_t first = (4 - shift) & 3;
    const int64_t nvec = (a.n - first) >> 2;
    const int rem = static_cast<int>((a.n - first) & 3);
    auto sum_squares = [&](auto value) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      if (!active) return 0.f;
      if (shift > 0 && lane >= shift && lane < 4 && lane - shift < a.n) {
        const float v = value(lane - shift);
        acc[0] = __fmul_rn(v, v);
      }
      for (int64_t kv = lane; kv < nvec; kv += lanes) {
#pragma unroll
        for (int i = 0; i < 4; ++i) add_square(acc[i], value(first + 4 * kv + i));
      }
      if (lane < rem) add_square(acc[0], value(first + 4 * nvec + lane));
      return combine(acc);
    };
    auto first_at = [&](int64_t c) { return first_value<T, MODE>(x[c], b[c]); };
    float var1, var2 = 0.f;
    const float rstd1 = inv_rms(row_total(sum_squares(first_at), part[buf][threadIdx.y], nw, warp, h), a.factor, a.eps, &var1);
    buf ^= 1;
    T* out = static_cast<T*>(a.out) + rrow * a.n;
    if constexpr (kNN) {
      auto h_at = [&](int64_t c) { return h_value<T>(x[c], r[c], w1[c], rstd1); };
      const float rstd2 = inv_rms(row_total(sum_squares(h_at), part[buf][threadIdx.y], nw, warp, h), a.factor, a.eps, &var2);
      buf ^= 1;
      T* out2 = static_cast<T*>(a.out2) + rrow * a.n;
      for (int64_t c = threadIdx.x; active && c < a.n; c += blockDim.x) {
        const float hh = h_at(c);
        out[c] = Traits<T>::from_float(hh);
        out2[c] = Traits<T>::from_float(scaled<T>(hh, Traits<T>::to_float(w2[c]), rstd2));
      }
    } else {
      for (int64_t c = threadIdx.x; active && c < a.n; c += blockDim.x) {
        out[c] = single_out<T, HAS_R>(first_at(c), w1[c], r[c], rstd1);
      }
    }
    if (active && threadIdx.x == 0) store_var<kNN>(a, row, var1, var2);
  }
}

// ---------------------------------------------------------------------------------------------
// host side
// ---------------------------------------------------------------------------------------------
bool aligned(const void* p, int64_t bytes) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Every row of every input and output starts on a 4-element boundary and has whole vectors.
bool vector_ok(const NormArgs& a, int64_t elem) {
  const int64_t vb = 4 * elem;
  if (a.n % 4 != 0) return false;
  for (const void* p : {a.x, a.b, a.r, a.w1, a.w2, static_cast<const void*>(a.out), static_cast<const void*>(a.out2)}) {
    if (!aligned(p, vb)) return false;
  }
  if (a.rows > 1) {
    if (a.sx % 4 != 0 || (a.b != nullptr && a.sb % 4 != 0) || (a.r != nullptr && a.sr % 4 != 0)) return false;
  }
  return true;
}

template <typename T, int MODE, bool HAS_R>
cudaError_t launch_typed(const NormArgs& a, bool vec, cudaStream_t stream) {
  const int nw = 1 << (a.log_lanes - 5);
  const int rpb = nw >= kMaxRowsPerBlock ? 1 : kMaxRowsPerBlock / nw;
  const dim3 block(32 * nw, rpb);
  void (*kernel)(NormArgs) = vec ? norm_vec_kernel<T, MODE, HAS_R> : norm_scalar_kernel<T, MODE, HAS_R>;
  const int64_t groups = (a.rows + rpb - 1) / rpb;
  const int64_t resident = static_cast<int64_t>(blocks_per_sm(reinterpret_cast<const void*>(kernel), 32 * nw * rpb)) * sm_count();
  const int64_t grid = groups < resident ? groups : resident;
  kernel<<<static_cast<unsigned>(grid), block, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

const char* norm_variant(const NormArgs& args, int dtype, int mode) {
  (void)mode;
  return vector_ok(args, elem_size(dtype)) ? "vec" : "scalar";
}

cudaError_t launch_rms_norm(const NormArgs& args, int dtype, int mode, cudaStream_t stream) {
  if (args.rows <= 0 || args.n <= 0) return cudaSuccess;
  if (args.log_lanes < 5 || args.log_lanes > 9) return cudaErrorInvalidValue;
  const bool vec = vector_ok(args, elem_size(dtype));
  cudaError_t err = cudaSuccess;
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (mode == kNormAdd) {
      err = launch_typed<T, kNormAdd, false>(args, vec, stream);
    } else if (mode == kNormNormAdd) {
      err = launch_typed<T, kNormNormAdd, false>(args, vec, stream);
    } else if (args.r != nullptr) {
      err = launch_typed<T, kNormX, true>(args, vec, stream);
    } else {
      err = launch_typed<T, kNormX, false>(args, vec, stream);
    }
  });
  return err;
}

}  // namespace rltb
