// RMSNorm in torch's CUDA reduction order, every form in one launch (norm_rows.cuh has the order,
// the shared arithmetic, the vector kernel for aligned rows and the rows kernel for many 32-lane
// rows; this file the scalar kernel for any row layout and the dispatch).
//
// Scalar kernel layout: thread (warp w, hardware lane h) of a row plays one torch lane,
// norm::torch_lane(h, w): the five lane bits reduced first sit on h (a warp butterfly, xor 16..1,
// reduces them in that order) and the rest on w (one shared-memory exchange, then every thread adds
// the warps' partials in torch's order). Adding a zero never changes a sum of squares (it is >= +0),
// so idle lanes and the padded warp slots add exact zeros.
#include "norm_rows.cuh"

namespace rltb {
namespace {

using namespace norm;

constexpr int kMaxWarps = 16;  // torch's widest row plan: 512 lanes, one per thread

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

// ---------------------------------------------------------------------------------------------
// Any row layout (odd widths, offsets, strides): scalar accesses, torch's head/tail handling for
// a row whose fp32 temporary starts off a 16-byte boundary, the output in a separate coalesced pass.
// ---------------------------------------------------------------------------------------------
template <typename T, int MODE, bool HAS_R>
__global__ void __launch_bounds__(512) norm_scalar_kernel(const NormArgs a) {
  constexpr bool kNN = MODE == kNormNormAdd;
  const int k = a.log_lanes, nw = 1 << (k - 5), lanes = 1 << k;
  const int h = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lane = torch_lane(h, warp, k, 0, a.warp_down != 0);
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

// Vector-kernel layout: at most 2^kMaxLogWarps warps per row, the rest of torch's lanes in
// registers (512 lanes: 4 warps of 4 lanes per thread). Narrow layouts stack rows up to 4 warps
// per block, but only while the grid still has a block for every SM (T=128 at 32 lanes: one row
// per block, 128 blocks; T=4096: 4 rows per block).
constexpr int kMaxLogWarps = 2;

// A row whose vectors split evenly over the row's threads, P = nvec / (32 NW) per thread with P a
// multiple of R that the register cache holds, takes the straight-line kernel with exactly P slots
// (FULL): no guard per slot, each address a constant offset from the thread's first, every load
// issued ahead of the first square. Width 2048 at every lane count is such a row (P = 4 at 512
// lanes, 8 at 64, 16 at 32). The guarded kernel carries a branch, a predicate and a 64-bit address
// per slot through the sum and the epilogue (about 1100 sm_90 instructions at 32 lanes against
// the straight-line kernel's fraction of that), which is what held the 8- and 128-row norms behind
// the exact Triton kernel of the same layout, L2-hot as well as cold.
template <typename T, int MODE, bool HAS_R, int LOG_R, int LOG_NW>
cudaError_t launch_full_or_guarded(const NormArgs& a, int rpb, cudaStream_t stream) {
  constexpr int kCache = cached_slots<T, MODE, HAS_R>();
  const int64_t nvec = a.n >> 2;
  const int64_t threads = 32 << LOG_NW;
  if (nvec % threads == 0) {
    const int64_t per_thread = nvec / threads;
    if constexpr ((1 << LOG_R) <= 8 && 8 <= kCache) {
      if (per_thread == 8) return launch_vec<T, MODE, HAS_R, LOG_R, LOG_NW, 8, true>(a, rpb, stream);
    }
    if constexpr ((1 << LOG_R) <= 16 && 16 <= kCache) {
      if (per_thread == 16) return launch_vec<T, MODE, HAS_R, LOG_R, LOG_NW, 16, true>(a, rpb, stream);
    }
  }
  return launch_vec<T, MODE, HAS_R, LOG_R, LOG_NW>(a, rpb, stream);
}

template <typename T, int MODE, bool HAS_R, int LOG_LANES>
cudaError_t launch_vec_lanes(const NormArgs& a, cudaStream_t stream) {
  constexpr int kLogNW = LOG_LANES - 5 < kMaxLogWarps ? LOG_LANES - 5 : kMaxLogWarps;
  constexpr int kMaxRows = (4 >> kLogNW) > 0 ? 4 >> kLogNW : 1;
  constexpr int kLogR = LOG_LANES - 5 - kLogNW;
  int rpb = 1;
  while (rpb < kMaxRows && a.rows >= static_cast<int64_t>(2 * rpb) * sm_count()) rpb *= 2;
  if constexpr (kLogNW == kMaxLogWarps) {
    // a row that fits 4 vectors per thread (width 2048 at 128..512 lanes: 1 to 4 rows) gets a
    // kernel with exactly 4 slots: the 16-slot one carries 12 dead guarded slots through the
    // epilogue and was slower at T=1 on an H200; a row of exactly 4 per thread (2048 at 512
    // lanes) the straight-line one
    const int64_t per_thread = ((a.n >> 2) + (32 << kLogNW) - 1) / (32 << kLogNW);
    if ((a.n >> 2) == 4 * (32 << kLogNW)) {
      return a.warp_down ? launch_vec<T, MODE, HAS_R, kLogR, kLogNW, 4, true, 1>(a, rpb, stream)
                         : launch_vec<T, MODE, HAS_R, kLogR, kLogNW, 4, true, 0>(a, rpb, stream);
    }
    if (per_thread <= 4) return launch_vec<T, MODE, HAS_R, kLogR, kLogNW, 4>(a, rpb, stream);
  }
  return launch_full_or_guarded<T, MODE, HAS_R, kLogR, kLogNW>(a, rpb, stream);
}

template <typename T, int MODE, bool HAS_R>
cudaError_t launch_typed(const NormArgs& a, bool vec, cudaStream_t stream) {
  if constexpr (MODE != kNormNormAdd) {
    if (rows_kernel_takes(a, MODE, sizeof(T))) return launch_rows<T, MODE, HAS_R>(a, stream);
  }
  if (vec) {
    switch (a.log_lanes) {
      case 5: return launch_vec_lanes<T, MODE, HAS_R, 5>(a, stream);
      case 6: return launch_vec_lanes<T, MODE, HAS_R, 6>(a, stream);
      case 7: return launch_vec_lanes<T, MODE, HAS_R, 7>(a, stream);
      case 8: return launch_vec_lanes<T, MODE, HAS_R, 8>(a, stream);
      default: return launch_vec_lanes<T, MODE, HAS_R, 9>(a, stream);
    }
  }
  const int nw = 1 << (a.log_lanes - 5);
  const int rpb = nw >= kMaxRowsPerBlock ? 1 : kMaxRowsPerBlock / nw;
  const dim3 block(32 * nw, rpb);
  void (*kernel)(NormArgs) = norm_scalar_kernel<T, MODE, HAS_R>;
  const int64_t groups = (a.rows + rpb - 1) / rpb;
  const int64_t resident = static_cast<int64_t>(blocks_per_sm(reinterpret_cast<const void*>(kernel), 32 * nw * rpb)) * sm_count();
  const int64_t grid = groups < resident ? groups : resident;
  kernel<<<static_cast<unsigned>(grid), block, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

const char* norm_variant(const NormArgs& args, int dtype, int mode) {
  if (rows_kernel_takes(args, mode, elem_size(dtype))) return "rows";
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
