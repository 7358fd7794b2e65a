// Host entry points of the native kernels: plain C++ types only, so the CUDA sources compile
// without torch headers (binding.cpp converts tensors; the kernels never see ATen).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace rltb {

// The dtype codes of rltbench/kernels/rounding.py (DTYPE_CODES).
enum DtypeCode : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// Row forms of the norm kernel (rltbench/kernels/norm_native.py picks one per op).
enum NormMode : int {
  kNormX = 0,         // normalise x (Ouro rms_norm, Huginn rms_norm_huginn; + residual when r is set)
  kNormAdd = 1,       // normalise round(x + b) (Huginn add_rms_norm_huginn)
  kNormNormAdd = 2,   // h = r + rms_norm(x, w1), y = rms_norm(h, w2) (Ouro's norm-add-norm)
};

// One norm launch over `rows` rows of `n` elements. Strides are in elements (row stride; the last
// dim is contiguous); out/out2 are contiguous [rows, n]. var (optional, fp32): the variance of
// each row ([rows], or [rows, 2] for kNormNormAdd). log_lanes = log2 of the threads torch's
// reduction gives a row (5..9); warp_down selects the shuffle order of torch >= 2.10.
struct NormArgs {
  const void* x = nullptr;
  const void* b = nullptr;
  const void* r = nullptr;
  const void* w1 = nullptr;
  const void* w2 = nullptr;
  void* out = nullptr;
  void* out2 = nullptr;
  float* var = nullptr;
  int64_t rows = 0, n = 0, sx = 0, sb = 0, sr = 0;
  float eps = 0.f, factor = 0.f;
  int log_lanes = 5;
  int warp_down = 1;
};

cudaError_t launch_rms_norm(const NormArgs& args, int dtype, int mode, cudaStream_t stream);

// out = silu(g) * u over `rows` rows of `n` elements (row strides sg, su; out contiguous).
struct SiluMulArgs {
  const void* g = nullptr;
  const void* u = nullptr;
  void* out = nullptr;
  int64_t rows = 0, n = 0, sg = 0, su = 0;
};

cudaError_t launch_silu_mul(const SiluMulArgs& args, int dtype, cudaStream_t stream);

// RoPE of q [tokens, hq, d] and k [tokens, hk, d] (token/head strides in elements, last dim
// contiguous) into contiguous qo/ko. NeoX: cos/sin [tokens, d] in the dtype; interleaved: fp32
// [tokens, d / 2]. sct/sst: the tables' token strides.
struct RopeArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* cos = nullptr;
  const void* sin = nullptr;
  void* qo = nullptr;
  void* ko = nullptr;
  int64_t tokens = 0;
  int hq = 0, hk = 0, d = 0;
  int64_t sqt = 0, sqh = 0, skt = 0, skh = 0, sct = 0, sst = 0;
  int interleaved = 0;
};

cudaError_t launch_rope(const RopeArgs& args, int dtype, cudaStream_t stream);

// Which kernel variant a launch takes ("vec" or "scalar"), for tests and reports.
const char* norm_variant(const NormArgs& args, int dtype, int mode);
const char* silu_mul_variant(const SiluMulArgs& args, int dtype);
const char* rope_variant(const RopeArgs& args, int dtype);

}  // namespace rltb
