// Shared device helpers of the native arm: dtype traits that round exactly where torch rounds.
//
// torch computes every bf16/fp16 elementwise op in fp32 ("opmath") and rounds the result to the
// dtype once per op (round to nearest even). The helpers here do the same with intrinsics the
// compiler never contracts or reassociates (__fmul_rn, __fadd_rn: no FMA is formed from them).
// The packed 16-bit ops (__hmul2_rn, __hadd2_rn) round the exact result once; for bf16 and fp16
// operands that equals rounding the fp32 result to the dtype, because fp32 holds at least
// 2p + 2 significand bits for p = 8 (bf16) and p = 11 (fp16), so the double rounding through fp32
// is innocuous (Figueroa 1995), and bf16's subnormal products need at most 16 bits (docs/native.md).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "native.h"

namespace rltb {

template <typename T>
struct Traits;

template <>
struct Traits<float> {
  __device__ __forceinline__ static float to_float(float v) { return v; }
  __device__ __forceinline__ static float from_float(float v) { return v; }
};

// 16-bit types also name their two-element type (Pair: the operand of the packed __hmul2_rn /
// __hadd2_rn) and round two fp32 values into one (pack_rn: one packed convert).
template <>
struct Traits<__nv_bfloat16> {
  using Pair = __nv_bfloat162;
  __device__ __forceinline__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ __forceinline__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
  __device__ __forceinline__ static Pair pack_rn(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

template <>
struct Traits<__half> {
  using Pair = __half2;
  __device__ __forceinline__ static float to_float(__half v) { return __half2float(v); }
  __device__ __forceinline__ static __half from_float(float v) { return __float2half_rn(v); }
  __device__ __forceinline__ static Pair pack_rn(float a, float b) { return __floats2half2_rn(a, b); }
};

// fp32 -> nearest dtype value (RNE), kept in fp32: torch's `.to(dtype)` after an fp32 op.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return Traits<T>::to_float(Traits<T>::from_float(v));
}

template <typename T>
__device__ __forceinline__ float load_float(const T* p) {
  return Traits<T>::to_float(*p);
}

// Four consecutive elements loaded or stored as one access (8 bytes for 16-bit types, 16 for fp32).
template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

// Dispatch a dtype code to a C++ type: body is a generic lambda taking a value of that type.
template <typename F>
inline void dispatch_dtype(int dtype, F&& body) {
  switch (dtype) {
    case kFloat32: body(float{}); break;
    case kBFloat16: body(__nv_bfloat16{}); break;
    default: body(__half{}); break;
  }
}

inline int elem_size(int dtype) { return dtype == kFloat32 ? 4 : 2; }

// SM count of the current device, cached per device (grids sized to the GPU).
int sm_count();

// Resident blocks per SM of `kernel` at `threads` threads per block on the current device
// (cached: the occupancy query is a host call, too slow for every launch).
int blocks_per_sm(const void* kernel, int threads);

// Ask for the largest shared-memory carveout for `kernel` (once per kernel and device): a kernel
// whose blocks hold shared buffers should not lose resident blocks to a default L1 split.
void prefer_shared_memory(const void* kernel);

}  // namespace rltb
