// RoPE of q and k in one launch, rounded where torch's reference expressions round.
//
// NeoX / rotate_half (Ouro, HF Llama): cos/sin [T, D] in the activation dtype, every torch op
// rounded to the dtype:
//   out[j]     = round(round(x1 * c[j])     + round(-x2 * s[j]))          (x1 = x[j], x2 = x[j + D/2])
//   out[j + h] = round(round(x2 * c[j + h]) + round( x1 * s[j + h]))
// Interleaved (Huginn): pairs (x0, x1) = (x[2j], x[2j+1]) in fp32, cos/sin [T, D/2] fp32, each fp32
// op rounded, one cast back: out[2j] = round(x0*c - x1*s), out[2j+1] = round(x1*c + x0*s).
//
// One thread per (token, head, group of E positions); heads >= Hq rotate k. Aligned inputs take
// vector accesses (E = 4 NeoX positions / 2 interleaved pairs), anything else E = 1.
#include "common.cuh"
#include "native.h"

namespace rltb {
namespace {

constexpr int kThreads = 128;

template <typename T, int E>
struct alignas(E * sizeof(T)) Pack {
  T v[E];
};

template <typename T, int E>
__device__ __forceinline__ Pack<T, E> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, E>*>(p);
}

template <typename T, int E>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, E>& v) {
  *reinterpret_cast<Pack<T, E>*>(p) = v;
}

// round(x * y) for two dtype values (torch's dtype multiply)
template <typename T>
__device__ __forceinline__ float mul_d(float x, float y) {
  return round_to<T>(__fmul_rn(x, y));
}

template <typename T, bool INTERLEAVED, int E>
__global__ void __launch_bounds__(kThreads) rope_kernel(const RopeArgs a) {
  const int heads = a.hq + a.hk;
  const int groups = a.d / (2 * E);  // NeoX: positions of a half; interleaved: pairs
  const uint32_t items = static_cast<uint32_t>(a.tokens) * heads * groups;
  for (uint32_t idx = blockIdx.x * blockDim.x + threadIdx.x; idx < items; idx += gridDim.x * blockDim.x) {
    const uint32_t g = idx % groups;
    const uint32_t th = idx / groups;
    const int head = static_cast<int>(th % heads);
    const int64_t t = th / heads;
    const bool is_q = head < a.hq;
    const int hh = is_q ? head : head - a.hq;
    const T* x = static_cast<const T*>(is_q ? a.q : a.k) + t * (is_q ? a.sqt : a.skt) + hh * (is_q ? a.sqh : a.skh);
    T* o = static_cast<T*>(is_q ? a.qo : a.ko) + (t * (is_q ? a.hq : a.hk) + hh) * a.d;
    if constexpr (INTERLEAVED) {
      const float* c = static_cast<const float*>(a.cos) + t * a.sct + g * E;
      const float* s = static_cast<const float*>(a.sin) + t * a.sst + g * E;
      // E == 1 serves any layout: its pair is read element by element (a pair need not start on a
      // 2-element boundary when q or k sits at an odd storage offset)
      Pack<T, 2 * E> xv;
      if constexpr (E == 1) {
        xv.v[0] = x[2 * g];
        xv.v[1] = x[2 * g + 1];
      } else {
        xv = load_pack<T, 2 * E>(x + 2 * E * g);
      }
      const Pack<float, E> cv = load_pack<float, E>(c), sv = load_pack<float, E>(s);
      Pack<T, 2 * E> ov;
#pragma unroll
      for (int i = 0; i < E; ++i) {
        const float x0 = Traits<T>::to_float(xv.v[2 * i]), x1 = Traits<T>::to_float(xv.v[2 * i + 1]);
        ov.v[2 * i] = Traits<T>::from_float(__fsub_rn(__fmul_rn(x0, cv.v[i]), __fmul_rn(x1, sv.v[i])));
        ov.v[2 * i + 1] = Traits<T>::from_float(__fadd_rn(__fmul_rn(x1, cv.v[i]), __fmul_rn(x0, sv.v[i])));
      }
      if constexpr (E == 1) {
        o[2 * g] = ov.v[0];
        o[2 * g + 1] = ov.v[1];
      } else {
        store_pack<T, 2 * E>(o + 2 * E * g, ov);
      }
    } else {
      const int half = a.d / 2;
      const int j = static_cast<int>(g) * E;
      const T* c = static_cast<const T*>(a.cos) + t * a.sct;
      const T* s = static_cast<const T*>(a.sin) + t * a.sst;
      const Pack<T, E> x1 = load_pack<T, E>(x + j), x2 = load_pack<T, E>(x + j + half);
      const Pack<T, E> c1 = load_pack<T, E>(c + j), c2 = load_pack<T, E>(c + j + half);
      const Pack<T, E> s1 = load_pack<T, E>(s + j), s2 = load_pack<T, E>(s + j + half);
      Pack<T, E> o1, o2;
#pragma unroll
      for (int i = 0; i < E; ++i) {
        const float a1 = Traits<T>::to_float(x1.v[i]), a2 = Traits<T>::to_float(x2.v[i]);
        const float lo = __fadd_rn(mul_d<T>(a1, Traits<T>::to_float(c1.v[i])), mul_d<T>(-a2, Traits<T>::to_float(s1.v[i])));
        const float hi = __fadd_rn(mul_d<T>(a2, Traits<T>::to_float(c2.v[i])), mul_d<T>(a1, Traits<T>::to_float(s2.v[i])));
        o1.v[i] = Traits<T>::from_float(lo);
        o2.v[i] = Traits<T>::from_float(hi);
      }
      store_pack<T, E>(o + j, o1);
      store_pack<T, E>(o + j + half, o2);
    }
  }
}

bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Every row of q, k, cos, sin and the outputs starts on a vector boundary, the vectors are whole:
// x in 4-element accesses (4 NeoX positions of each half, or 2 interleaved pairs), the tables in
// 4 dtype values (NeoX) or 2 fp32 values (interleaved).
bool vector_ok(const RopeArgs& a, int64_t elem) {
  if (a.interleaved ? a.d % 4 != 0 : a.d % 8 != 0) return false;
  const int64_t table_elems = a.interleaved ? 2 : 4;
  const int64_t table_bytes = a.interleaved ? 8 : 4 * elem;
  for (const void* p : {a.q, a.k, static_cast<const void*>(a.qo), static_cast<const void*>(a.ko)}) {
    if (!aligned(p, 4 * elem)) return false;
  }
  if (!aligned(a.cos, table_bytes) || !aligned(a.sin, table_bytes)) return false;
  return a.sqt % 4 == 0 && a.sqh % 4 == 0 && a.skt % 4 == 0 && a.skh % 4 == 0 && a.sct % table_elems == 0 &&
         a.sst % table_elems == 0;
}

template <typename T, bool INTERLEAVED, int E>
cudaError_t launch_typed(const RopeArgs& a, cudaStream_t stream) {
  void (*kernel)(RopeArgs) = rope_kernel<T, INTERLEAVED, E>;
  const int64_t items = a.tokens * (a.hq + a.hk) * (a.d / (2 * E));
  const int64_t want = (items + kThreads - 1) / kThreads;
  const int64_t cap = static_cast<int64_t>(blocks_per_sm(reinterpret_cast<const void*>(kernel), kThreads)) * sm_count();
  const int64_t grid = want < cap ? want : cap;
  kernel<<<static_cast<unsigned>(grid > 0 ? grid : 1), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

const char* rope_variant(const RopeArgs& args, int dtype) {
  return vector_ok(args, elem_size(dtype)) ? "vec" : "scalar";
}

cudaError_t launch_rope(const RopeArgs& args, int dtype, cudaStream_t stream) {
  if (args.tokens <= 0 || args.hq + args.hk <= 0 || args.d <= 0) return cudaSuccess;
  if (args.d % 2 != 0 || args.tokens * (args.hq + args.hk) * args.d >= (int64_t{1} << 32)) return cudaErrorInvalidValue;
  const bool vec = vector_ok(args, elem_size(dtype));
  cudaError_t err = cudaSuccess;
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if (args.interleaved) {
      err = vec ? launch_typed<T, true, 2>(args, stream) : launch_typed<T, true, 1>(args, stream);
    } else {
      err = vec ? launch_typed<T, false, 4>(args, stream) : launch_typed<T, false, 1>(args, stream);
    }
  });
  return err;
}

}  // namespace rltb
