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
// past the last whole vector of a row (the tail) go in the same launch, scalar. A call that would
// give the body fewer blocks than SMs takes the few-blocks kernel instead (silu_mul_few_kernel).
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

// One vector of WORDS 32-bit words (16 or 8 bytes): a 16-bit pair or an fp32 value per word.
template <typename T, int WORDS>
__device__ __forceinline__ void silu_mul_words(const uint32_t (&g)[WORDS], const uint32_t (&u)[WORDS], uint32_t (&out)[WORDS]) {
#pragma unroll
  for (int i = 0; i < WORDS; ++i) {
    if constexpr (sizeof(T) == 4) {
      out[i] = __float_as_uint(__fmul_rn(silu(__uint_as_float(g[i])), __uint_as_float(u[i])));
    } else {
      using T2 = typename Traits<T>::Pair;
      const T2 y = silu_mul_two(*reinterpret_cast<const T2*>(&g[i]), *reinterpret_cast<const T2*>(&u[i]));
      out[i] = *reinterpret_cast<const uint32_t*>(&y);
    }
  }
}

// A vector access of VEC_BYTES (16: uint4, 8: uint2) as 32-bit words.
template <int VEC_BYTES>
struct Words {
  static constexpr int kCount = VEC_BYTES / 4;
  uint32_t w[kCount];
};

template <bool STREAM, int VEC_BYTES>
__device__ __forceinline__ Words<VEC_BYTES> load_vec(const Words<VEC_BYTES>* p) {
  Words<VEC_BYTES> v;
  if constexpr (VEC_BYTES == 16) {
    *reinterpret_cast<uint4*>(&v) = STREAM ? __ldcs(reinterpret_cast<const uint4*>(p)) : __ldg(reinterpret_cast<const uint4*>(p));
  } else {
    *reinterpret_cast<uint2*>(&v) = STREAM ? __ldcs(reinterpret_cast<const uint2*>(p)) : __ldg(reinterpret_cast<const uint2*>(p));
  }
  return v;
}

template <bool STREAM, int VEC_BYTES>
__device__ __forceinline__ void store_vec(Words<VEC_BYTES>* p, const Words<VEC_BYTES>& v) {
  if constexpr (VEC_BYTES == 16) {
    const uint4 x = *reinterpret_cast<const uint4*>(&v);
    if constexpr (STREAM) {
      __stcs(reinterpret_cast<uint4*>(p), x);
    } else {
      *reinterpret_cast<uint4*>(p) = x;
    }
  } else {
    const uint2 x = *reinterpret_cast<const uint2*>(&v);
    if constexpr (STREAM) {
      __stcs(reinterpret_cast<uint2*>(p), x);
    } else {
      *reinterpret_cast<uint2*>(p) = x;
    }
  }
}

// VEC: every row 16-byte aligned; the vector body (VEC_BYTES per access), then the row's last
// elements past the whole vectors (the tail) one per thread. Else every element one per thread
// and trip.
template <typename T, bool VEC, int THREADS, int UNROLL, int VEC_BYTES, bool STREAM_LOADS, bool STREAM_STORES>
__global__ void __launch_bounds__(THREADS) silu_mul_kernel(const SiluMulArgs a) {
  using W = Words<VEC_BYTES>;
  constexpr int kElems = VEC_BYTES / sizeof(T);
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * THREADS + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * THREADS;
  for (int64_t row = blockIdx.y; row < a.rows; row += gridDim.y) {
    const T* g = static_cast<const T*>(a.g) + row * a.sg;
    const T* u = static_cast<const T*>(a.u) + row * a.su;
    T* out = static_cast<T*>(a.out) + row * a.n;
    int64_t scalar_from = 0;
    if constexpr (VEC) {
      const int64_t nv = a.n / kElems;
      const W* gw = reinterpret_cast<const W*>(g);
      const W* uw = reinterpret_cast<const W*>(u);
      W* ow = reinterpret_cast<W*>(out);
      const int64_t first = static_cast<int64_t>(blockIdx.x) * (THREADS * UNROLL) + threadIdx.x;
      W gv[UNROLL], uv[UNROLL];
#pragma unroll
      for (int j = 0; j < UNROLL; ++j) {
        const int64_t i = first + j * THREADS;
        if (i < nv) {
          gv[j] = load_vec<STREAM_LOADS, VEC_BYTES>(gw + i);
          uv[j] = load_vec<STREAM_LOADS, VEC_BYTES>(uw + i);
        }
      }
#pragma unroll
      for (int j = 0; j < UNROLL; ++j) {
        const int64_t i = first + j * THREADS;
        if (i < nv) {
          W y;
          silu_mul_words<T, W::kCount>(gv[j].w, uv[j].w, y.w);
          store_vec<STREAM_STORES, VEC_BYTES>(ow + i, y);
        }
      }
      scalar_from = nv * kElems;
    }
    for (int64_t c = scalar_from + tid; c < a.n; c += stride) out[c] = silu_mul_one<T>(g[c], u[c]);
  }
}

// Grid: blocks of THREADS * UNROLL vectors (VEC) or THREADS elements covering a row once, times
// the rows. Blocks finish at different times, so one block's loads overlap another's stores (a
// grid capped at the resident blocks walked the row in lockstep: 84% of the device copy).
template <typename T, bool VEC, int THREADS, int UNROLL, int VEC_BYTES, bool STREAM_LOADS, bool STREAM_STORES>
cudaError_t launch_shape(const SiluMulArgs& a, cudaStream_t stream) {
  const int64_t per_block = (VEC ? static_cast<int64_t>(VEC_BYTES / sizeof(T)) * UNROLL : 1) * THREADS;
  const int64_t grid_y = a.rows < 65535 ? a.rows : 65535;
  const int64_t grid_x = (a.n + per_block - 1) / per_block;
  silu_mul_kernel<T, VEC, THREADS, UNROLL, VEC_BYTES, STREAM_LOADS, STREAM_STORES>
      <<<dim3(static_cast<unsigned>(grid_x > 0 ? grid_x : 1), static_cast<unsigned>(grid_y)), THREADS, 0, stream>>>(a);
  return cudaGetLastError();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool vector_ok(const SiluMulArgs& a, int64_t elem) {
  const int64_t e = 16 / elem;
  if (!aligned16(a.g) || !aligned16(a.u) || !aligned16(a.out)) return false;
  return a.rows == 1 || (a.n % e == 0 && a.sg % e == 0 && a.su % e == 0);
}

// Few blocks: where the 256-thread body would have fewer blocks than SMs (a row of 5632 is three
// blocks, so three SMs would run every exp and IEEE division of the call) the call is latency: a
// few loads, the exp and division chains, a store. So the grid takes 128-thread blocks of 8-byte
// vectors (four 16-bit elements a thread: more threads share the chains than with 16-byte ones)
// and a leaner kernel: one vector of one row per thread, 32-bit indices, no loops (in sm_90 SASS
// its first vector load is the 31st instruction on its path, the body kernel's the 50th), the threads
// past a row's last whole vector taking its tail elements. In an H100 side sweep (not a committed
// run) of 32 / 64 / 128 threads x 8 / 16 bytes, in this kernel and in the body kernel, at 1, 2, 4
// and 8 rows of 5632 and 17920, this shape was the fastest in 15 of the 16 cells L2-hot (0.7% off
// in the other) and in all 16 cold, and the only one at or under the exact arm's time in every
// cell; results/gpu/kernels-verdicts-few has it against exact. The grid is (column blocks, rows):
// fewer body blocks than SMs bound the rows below the SM count and a row below SMs x 2048
// elements, so every index fits 32 bits.
template <typename T, int THREADS, int VEC_BYTES>
__global__ void __launch_bounds__(THREADS) silu_mul_few_kernel(const SiluMulArgs a) {
  using W = Words<VEC_BYTES>;
  constexpr int kElems = VEC_BYTES / sizeof(T);
  const int64_t row = blockIdx.y;
  const T* g = static_cast<const T*>(a.g) + row * a.sg;
  const T* u = static_cast<const T*>(a.u) + row * a.su;
  T* out = static_cast<T*>(a.out) + row * a.n;
  const int i = static_cast<int>(blockIdx.x) * THREADS + static_cast<int>(threadIdx.x);
  const int n = static_cast<int>(a.n);
  const int nv = n / kElems;
  if (i < nv) {
    const W gv = load_vec<false, VEC_BYTES>(reinterpret_cast<const W*>(g) + i);
    const W uv = load_vec<false, VEC_BYTES>(reinterpret_cast<const W*>(u) + i);
    W y;
    silu_mul_words<T, W::kCount>(gv.w, uv.w, y.w);
    store_vec<false, VEC_BYTES>(reinterpret_cast<W*>(out) + i, y);
  } else {
    const int c = nv * kElems + (i - nv);
    if (c < n) out[c] = silu_mul_one<T>(g[c], u[c]);
  }
}

template <typename T, int THREADS, int VEC_BYTES>
cudaError_t launch_few(const SiluMulArgs& a, cudaStream_t stream) {
  constexpr int64_t kElems = VEC_BYTES / sizeof(T);
  const int64_t nv = a.n / kElems;
  const int64_t items = nv + (a.n - nv * kElems);   // whole vectors, then the tail's elements
  const int64_t grid_x = (items + THREADS - 1) / THREADS;
  silu_mul_few_kernel<T, THREADS, VEC_BYTES>
      <<<dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(a.rows)), THREADS, 0, stream>>>(a);
  return cudaGetLastError();
}

constexpr int64_t kMinBlocksPerSm = 1;   // below this many body blocks per SM: the few-blocks kernel
constexpr int kFewThreads = 128;
constexpr int kFewVecBytes = 8;

template <typename T>
cudaError_t launch_typed(const SiluMulArgs& a, bool vec, cudaStream_t stream) {
  if (!vec) return launch_shape<T, false, kThreads, kUnroll, 16, kStreamLoads, kStreamStores>(a, stream);
  const int64_t per_block = static_cast<int64_t>(16 / sizeof(T)) * kUnroll * kThreads;
  const int64_t blocks = a.rows * ((a.n + per_block - 1) / per_block);
  if (blocks >= kMinBlocksPerSm * sm_count()) {
    return launch_shape<T, true, kThreads, kUnroll, 16, kStreamLoads, kStreamStores>(a, stream);
  }
  return launch_few<T, kFewThreads, kFewVecBytes>(a, stream);
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
