// SiLU·up: out = silu(g) * u with torch's roundings, one launch.
//
// torch runs two kernels: silu in fp32 opmath, `x / (1 + exp(-x))` (::expf, IEEE division),
// rounded to the dtype; then the dtype multiply, the fp32 product rounded to the dtype. Here the
// silu is the same fp32 expression (expf and __fdiv_rn compile to what torch's kernel runs: this
// file is built without fast math), rounded to the dtype, and the multiply is a packed bf16x2 /
// half2 multiply, which rounds the exact product once: equal to rounding the fp32 product (see
// common.cuh). fp32 multiplies in fp32.
//
// Body: 16-byte vectors; a block covers kThreads * kUnroll consecutive vectors of a row (thread t
// takes vectors t, t + kThreads, ...: every access instruction is coalesced) and the grid covers
// every row once (one row of rows * n elements when the inputs are contiguous). The few elements
// past the last whole vector of a row (the tail) go in the same launch, scalar.
#include "common.cuh"
#include "native.h"

namespace rltb {
namespace {

// The body's shape: 256 threads with one 16-byte vector per thread and operand and plain cached
// loads, the fastest of 128 / 256 / 512 / 1024 threads x 1 / 2 / 4 vectors with and without
// evict-first (ld.global.cs) loads and stores in an H200 side benchmark at 4096 x 5632 bf16 (not a
// committed run). results/gpu/kernels-rows has this shape at 98.4% of the device copy; evict-first
// loads, the previous choice, 91.4% at commit 9e3770e (docs/native.md).
constexpr int kThreads = 256;
constexpr int kUnroll = 1;             // vectors per thread and operand
constexpr bool kStreamLoads = false;   // ld.global.cs (evict first) measured slower
constexpr bool kStreamStores = false;  // the output is read by the next matmul: plain stores

// torch's silu in fp32 (ActivationSiluKernel.cu: x / (1 + exp(-x)) in opmath).
__device__ __forceinline__ float silu(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }

template <typename T>
__device__ __forceinline__ T silu_mul_one(T g, T u) {
  const float s = round_to<T>(silu(Traits<T>::to_float(g)));
  return Traits<T>::from_float(__fmul_rn(s, Traits<T>::to_float(u)));
}

// Two 16-bit elements: silu in fp32, both rounded by one packed convert, then one packed multiply.
__device__ __forceinline__ __nv_bfloat162 silu_mul_two(__nv_bfloat162 g, __nv_bfloat162 u) {
  const float2 gf = __bfloat1622float2(g);
  return __hmul2_rn(__floats2bfloat162_rn(silu(gf.x), silu(gf.y)), u);
}

__device__ __forceinline__ __half2 silu_mul_two(__half2 g, __half2 u) {
  const float2 gf = __half22float2(g);
  return __hmul2_rn(__floats2half2_rn(silu(gf.x), silu(gf.y)), u);
}

// One 16-byte vector.
template <typename T>
__device__ __forceinline__ uint4 silu_mul_vec(uint4 g, uint4 u) {
  uint4 out;
  if constexpr (sizeof(T) == 4) {
    const float* gf = reinterpret_cast<const float*>(&g);
    const float* uf = reinterpret_cast<const float*>(&u);
    float* of = reinterpret_cast<float*>(&out);
#pragma unroll
    for (int i = 0; i < 4; ++i) of[i] = __fmul_rn(silu(gf[i]), uf[i]);
  } else {
    using T2 = typename Traits<T>::Pair;
    const T2* g2 = reinterpret_cast<const T2*>(&g);
    const T2* u2 = reinterpret_cast<const T2*>(&u);
    T2* o2 = reinterpret_cast<T2*>(&out);
#pragma unroll
    for (int i = 0; i < 4; ++i) o2[i] = silu_mul_two(g2[i], u2[i]);
  }
  return out;
}

template <bool STREAM>
__device__ __forceinline__ uint4 load16(const uint4* p) {
  if constexpr (STREAM) {
    return __ldcs(p);
  } else {
    return __ldg(p);
  }
}

template <bool STREAM>
__device__ __forceinline__ void store16(uint4* p, uint4 v) {
  if constexpr (STREAM) {
    __stcs(p, v);
  } else {
    *p = v;
  }
}

// VEC: every row 16-byte aligned; the vector body, then the row's last n % (16 / sizeof(T))
// elements (the tail) one per thread. Else every element one per thread and trip.
template <typename T, bool VEC, int THREADS, int UNROLL, bool STREAM_LOADS, bool STREAM_STORES>
__global__ void __launch_bounds__(THREADS) silu_mul_kernel(const SiluMulArgs a) {
  constexpr int kElems = 16 / sizeof(T);
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * THREADS + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * THREADS;
  for (int64_t row = blockIdx.y; row < a.rows; row += gridDim.y) {
    const T* g = static_cast<const T*>(a.g) + row * a.sg;
    const T* u = static_cast<const T*>(a.u) + row * a.su;
    T* out = static_cast<T*>(a.out) + row * a.n;
    int64_t scalar_from = 0;
    if constexpr (VEC) {
      const int64_t nv = a.n / kElems;
      const uint4* g4 = reinterpret_cast<const uint4*>(g);
      const uint4* u4 = reinterpret_cast<const uint4*>(u);
      uint4* o4 = reinterpret_cast<uint4*>(out);
      const int64_t first = static_cast<int64_t>(blockIdx.x) * (THREADS * UNROLL) + threadIdx.x;
      uint4 gv[UNROLL], uv[UNROLL];
#pragma unroll
      for (int j = 0; j < UNROLL; ++j) {
        const int64_t i = first + j * THREADS;
        if (i < nv) {
          gv[j] = load16<STREAM_LOADS>(g4 + i);
          uv[j] = load16<STREAM_LOADS>(u4 + i);
        }
      }
#pragma unroll
      for (int j = 0; j < UNROLL; ++j) {
        const int64_t i = first + j * THREADS;
        if (i < nv) store16<STREAM_STORES>(o4 + i, silu_mul_vec<T>(gv[j], uv[j]));
      }
      scalar_from = nv * kElems;
    }
    for (int64_t c = scalar_from + tid; c < a.n; c += stride) out[c] = silu_mul_one<T>(g[c], u[c]);
  }
}

// Grid: blocks of THREADS * UNROLL vectors (VEC) or THREADS elements covering a row once, times
// the rows. Blocks finish at different times, so one block's loads overlap another's stores (a
// grid capped at the resident blocks walked the row in lockstep: 84% of the device copy).
template <typename T, bool VEC, int THREADS, int UNROLL, bool STREAM_LOADS, bool STREAM_STORES>
cudaError_t launch_shape(const SiluMulArgs& a, cudaStream_t stream) {
  const int64_t per_block = (VEC ? static_cast<int64_t>(16 / sizeof(T)) * UNROLL : 1) * THREADS;
  const int64_t grid_y = a.rows < 65535 ? a.rows : 65535;
  const int64_t grid_x = (a.n + per_block - 1) / per_block;
  silu_mul_kernel<T, VEC, THREADS, UNROLL, STREAM_LOADS, STREAM_STORES>
      <<<dim3(static_cast<unsigned>(grid_x > 0 ? grid_x : 1), static_cast<unsigned>(grid_y)), THREADS, 0, stream>>>(a);
  return cudaGetLastError();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool vector_ok(const SiluMulArgs& a, int64_t elem) {
  const int64_t e = 16 / elem;
  if (!aligned16(a.g) || !aligned16(a.u) || !aligned16(a.out)) return false;
  return a.rows == 1 || (a.n % e == 0 && a.sg % e == 0 && a.su % e == 0);
}

template <typename T>
cudaError_t launch_typed(const SiluMulArgs& a, bool vec, cudaStream_t stream) {
  return vec ? launch_shape<T, true, kThreads, kUnroll, kStreamLoads, kStreamStores>(a, stream)
             : launch_shape<T, false, kThreads, kUnroll, kStreamLoads, kStreamStores>(a, stream);
}

}  // namespace

const char* silu_mul_variant(const SiluMulArgs& args, int dtype) {
  return vector_ok(args, elem_size(dtype)) ? "vec" : "scalar";
}

cudaError_t launch_silu_mul(const SiluMulArgs& args, int dtype, cudaStream_t stream) {
  if (args.rows <= 0 || args.n <= 0) return cudaSuccess;
  const bool vec = vector_ok(args, elem_size(dtype));
  cudaError_t err = cudaSuccess;
  dispatch_dtype(dtype, [&](auto tag) { err = launch_typed<decltype(tag)>(args, vec, stream); });
  return err;
}

}  // namespace rltb
