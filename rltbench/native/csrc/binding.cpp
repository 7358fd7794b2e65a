// Python binding of the native kernels: tensors in, checks, a launch on torch's current stream.
//
// The Python wrappers (rltbench/kernels/*_native.py) decide whether an input may take a kernel and
// compute torch's reduction plan; the checks here only keep a wrong call from touching memory it
// does not own (a failed check raises RuntimeError, never a silent wrong answer).
#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "native.h"

namespace {

int dtype_code(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return rltb::kFloat32;
    case at::kBFloat16: return rltb::kBFloat16;
    case at::kHalf: return rltb::kFloat16;
    default: TORCH_CHECK(false, "native kernels: dtype ", t.scalar_type(), " is not supported");
  }
  return -1;
}

// A [rows, n] CUDA tensor of x's dtype and device whose last dim is contiguous.
void check_rows(const at::Tensor& t, const at::Tensor& x, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == x.device(), "native kernels: ", name, " must be on ", x.device());
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), "native kernels: ", name, " must be ", x.scalar_type());
  TORCH_CHECK(t.dim() == 2 && t.size(0) == x.size(0) && t.size(1) == x.size(1), "native kernels: ", name,
              " must have shape ", x.sizes());
  TORCH_CHECK(t.size(1) <= 1 || t.stride(1) == 1, "native kernels: ", name, " needs a contiguous last dim");
}

void check_out(const at::Tensor& t, const at::Tensor& x, const char* name) {
  check_rows(t, x, name);
  TORCH_CHECK(t.is_contiguous(), "native kernels: ", name, " must be contiguous");
}

void check_weight(const at::Tensor& w, const at::Tensor& x, const char* name) {
  TORCH_CHECK(w.is_cuda() && w.device() == x.device() && w.scalar_type() == x.scalar_type(),
              "native kernels: ", name, " must be a ", x.scalar_type(), " tensor on ", x.device());
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(1) && (w.size(0) <= 1 || w.stride(0) == 1),
              "native kernels: ", name, " must be a contiguous [", x.size(1), "] vector");
}

// The norm kernel's pointers are __restrict__: an output may share no storage with any input.
void check_no_alias(const at::Tensor& out, std::initializer_list<const at::Tensor*> inputs, const char* name) {
  for (const at::Tensor* t : inputs) {
    TORCH_CHECK(t == nullptr || !out.is_alias_of(*t), "native kernels: ", name, " must not share storage with an input");
  }
}

int64_t row_stride(const at::Tensor& t) { return t.size(0) > 1 ? t.stride(0) : t.size(1); }

int log2_lanes(int64_t lanes) {
  for (int k = 5; k <= 9; ++k) {
    if (lanes == (int64_t{1} << k)) return k;
  }
  TORCH_CHECK(false, "native kernels: lanes must be a power of two in [32, 512], got ", lanes);
  return 0;
}

void check_var(const c10::optional<at::Tensor>& var, const at::Tensor& x, int64_t per_row) {
  if (!var.has_value()) return;
  TORCH_CHECK(var->is_cuda() && var->device() == x.device() && var->scalar_type() == at::kFloat &&
                  var->is_contiguous() && var->numel() == x.size(0) * per_row,
              "native kernels: var_out must be a contiguous fp32 tensor of ", x.size(0) * per_row, " elements");
}

rltb::NormArgs norm_args(const at::Tensor& x, const at::Tensor& w, double eps, double factor, int64_t lanes,
                         bool warp_down) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && (x.size(1) <= 1 || x.stride(1) == 1),
              "native kernels: x must be 2-D CUDA rows with a contiguous last dim");
  check_weight(w, x, "w");
  rltb::NormArgs a;
  a.x = x.data_ptr();
  a.w1 = w.data_ptr();
  a.rows = x.size(0);
  a.n = x.size(1);
  a.sx = row_stride(x);
  a.eps = static_cast<float>(eps);
  a.factor = static_cast<float>(factor);
  a.log_lanes = log2_lanes(lanes);
  a.warp_down = warp_down ? 1 : 0;
  return a;
}

void launch_norm(const rltb::NormArgs& a, const at::Tensor& x, int mode) {
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaError_t err = rltb::launch_rms_norm(a, dtype_code(x), mode, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "native rms_norm launch failed: ", cudaGetErrorString(err));
}

// out = rms_norm(x) (branch: of round(x + branch); residual: + residual), one launch.
void rms_norm(const at::Tensor& x, const c10::optional<at::Tensor>& branch,
              const c10::optional<at::Tensor>& residual, const at::Tensor& w, const at::Tensor& out,
              const c10::optional<at::Tensor>& var_out, double eps, double factor, int64_t lanes, bool warp_down) {
  rltb::NormArgs a = norm_args(x, w, eps, factor, lanes, warp_down);
  TORCH_CHECK(!(branch.has_value() && residual.has_value()), "native rms_norm: branch and residual are exclusive");
  check_out(out, x, "out");
  check_no_alias(out, {&x, &w, branch.has_value() ? &*branch : nullptr, residual.has_value() ? &*residual : nullptr},
                 "out");
  check_var(var_out, x, 1);
  a.out = out.data_ptr();
  a.var = var_out.has_value() ? var_out->data_ptr<float>() : nullptr;
  int mode = rltb::kNormX;
  if (branch.has_value()) {
    check_rows(*branch, x, "branch");
    a.b = branch->data_ptr();
    a.sb = row_stride(*branch);
    mode = rltb::kNormAdd;
  }
  if (residual.has_value()) {
    check_rows(*residual, x, "residual");
    a.r = residual->data_ptr();
    a.sr = row_stride(*residual);
  }
  launch_norm(a, x, mode);
}

// h = residual + rms_norm(branch, w1), y = rms_norm(h, w2), one launch.
void rms_norm_norm(const at::Tensor& residual, const at::Tensor& branch, const at::Tensor& w1,
                   const at::Tensor& w2, const at::Tensor& h_out, const at::Tensor& y_out,
                   const c10::optional<at::Tensor>& var_out, double eps, double factor, int64_t lanes,
                   bool warp_down) {
  rltb::NormArgs a = norm_args(branch, w1, eps, factor, lanes, warp_down);
  check_rows(residual, branch, "residual");
  check_weight(w2, branch, "w2");
  check_out(h_out, branch, "h_out");
  check_out(y_out, branch, "y_out");
  check_no_alias(h_out, {&residual, &branch, &w1, &w2}, "h_out");
  check_no_alias(y_out, {&residual, &branch, &w1, &w2, &h_out}, "y_out");
  check_var(var_out, branch, 2);
  a.r = residual.data_ptr();
  a.sr = row_stride(residual);
  a.w2 = w2.data_ptr();
  a.out = h_out.data_ptr();
  a.out2 = y_out.data_ptr();
  a.var = var_out.has_value() ? var_out->data_ptr<float>() : nullptr;
  launch_norm(a, branch, rltb::kNormNormAdd);
}

rltb::SiluMulArgs silu_args(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& out) {
  TORCH_CHECK(gate.is_cuda() && gate.dim() == 2 && (gate.size(1) <= 1 || gate.stride(1) == 1),
              "native silu_mul: gate must be 2-D CUDA rows with a contiguous last dim");
  check_rows(up, gate, "up");
  check_out(out, gate, "out");
  rltb::SiluMulArgs a;
  a.g = gate.data_ptr();
  a.u = up.data_ptr();
  a.out = out.data_ptr();
  a.rows = gate.size(0);
  a.n = gate.size(1);
  a.sg = row_stride(gate);
  a.su = row_stride(up);
  // rows that follow each other in memory are one long row: one vector loop, one tail
  if (a.rows > 1 && a.sg == a.n && a.su == a.n) {
    a.n *= a.rows;
    a.rows = 1;
  }
  return a;
}

void silu_mul(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& out) {
  const rltb::SiluMulArgs a = silu_args(gate, up, out);
  const c10::cuda::CUDAGuard guard(gate.device());
  const cudaError_t err = rltb::launch_silu_mul(a, dtype_code(gate), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "native silu_mul launch failed: ", cudaGetErrorString(err));
}

// Stride of dim `dim`, or the contiguous one where the dim has one entry (any value is valid then,
// and the contiguous one keeps vector accesses possible).
int64_t stride_or_dense(const at::Tensor& t, int dim) {
  if (t.size(dim) > 1) return t.stride(dim);
  int64_t dense = 1;
  for (int d = dim + 1; d < t.dim(); ++d) dense *= t.size(d);
  return dense;
}

rltb::RopeArgs rope_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                         const at::Tensor& qo, const at::Tensor& ko, bool interleaved) {
  TORCH_CHECK(q.is_cuda() && q.dim() == 3 && k.dim() == 3 && k.device() == q.device() &&
                  k.scalar_type() == q.scalar_type() && k.size(0) == q.size(0) && k.size(2) == q.size(2),
              "native rope: q [T, Hq, D] and k [T, Hk, D] CUDA tensors of one dtype");
  const int64_t d = q.size(2);
  TORCH_CHECK(d % 2 == 0 && (d <= 1 || (q.stride(2) == 1 && k.stride(2) == 1)),
              "native rope: even head dim with a contiguous last dim");
  const int64_t tw = interleaved ? d / 2 : d;
  for (const at::Tensor* t : {&cos, &sin}) {
    TORCH_CHECK(t->device() == q.device() && t->dim() == 2 && t->size(0) == q.size(0) && t->size(1) == tw &&
                    (tw <= 1 || t->stride(1) == 1) && t->scalar_type() == (interleaved ? at::kFloat : q.scalar_type()),
                "native rope: cos/sin must be [T, ", tw, "] ", interleaved ? "fp32" : "in q's dtype",
                " with a contiguous last dim");
  }
  TORCH_CHECK(qo.is_contiguous() && qo.sizes() == q.sizes() && qo.scalar_type() == q.scalar_type() &&
                  qo.device() == q.device() && ko.is_contiguous() && ko.sizes() == k.sizes() &&
                  ko.scalar_type() == q.scalar_type() && ko.device() == q.device(),
              "native rope: qo/ko must be contiguous tensors shaped like q/k");
  TORCH_CHECK(q.size(0) * (q.size(1) + k.size(1)) * d < (int64_t{1} << 31), "native rope: too many elements");
  rltb::RopeArgs a;
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.cos = cos.data_ptr();
  a.sin = sin.data_ptr();
  a.qo = qo.data_ptr();
  a.ko = ko.data_ptr();
  a.tokens = q.size(0);
  a.hq = static_cast<int>(q.size(1));
  a.hk = static_cast<int>(k.size(1));
  a.d = static_cast<int>(d);
  a.sqt = stride_or_dense(q, 0);
  a.sqh = stride_or_dense(q, 1);
  a.skt = stride_or_dense(k, 0);
  a.skh = stride_or_dense(k, 1);
  a.sct = stride_or_dense(cos, 0);
  a.sst = stride_or_dense(sin, 0);
  a.interleaved = interleaved ? 1 : 0;
  return a;
}

void rope(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
          const at::Tensor& qo, const at::Tensor& ko, bool interleaved) {
  const rltb::RopeArgs a = rope_args(q, k, cos, sin, qo, ko, interleaved);
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaError_t err = rltb::launch_rope(a, dtype_code(q), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "native rope launch failed: ", cudaGetErrorString(err));
}

// Which kernel variant ("rows" / "vec" / "scalar"; the norm at 32 lanes) the same call would take:
// tests check each is covered.
std::string norm_variant(const at::Tensor& x, const c10::optional<at::Tensor>& other, const at::Tensor& w,
                         const at::Tensor& out) {
  rltb::NormArgs a = norm_args(x, w, 1e-6, 1.0, 32, true);
  a.out = out.data_ptr();
  if (other.has_value()) {
    a.r = other->data_ptr();
    a.sr = row_stride(*other);
  }
  return rltb::norm_variant(a, dtype_code(x), rltb::kNormX);
}

std::string rope_variant(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
                         const at::Tensor& qo, const at::Tensor& ko, bool interleaved) {
  return rltb::rope_variant(rope_args(q, k, cos, sin, qo, ko, interleaved), dtype_code(q));
}

std::string silu_mul_variant(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& out) {
  return rltb::silu_mul_variant(silu_args(gate, up, out), dtype_code(gate));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rltbench native CUDA kernels (bitwise equal to the torch reference expressions)";
  m.def("rms_norm", &rms_norm, "RMSNorm forms in torch's reduction order", py::arg("x"), py::arg("branch"),
        py::arg("residual"), py::arg("w"), py::arg("out"), py::arg("var_out"), py::arg("eps"), py::arg("factor"),
        py::arg("lanes"), py::arg("warp_down"));
  m.def("rms_norm_norm", &rms_norm_norm, "Ouro's norm-add-norm in one launch", py::arg("residual"),
        py::arg("branch"), py::arg("w1"), py::arg("w2"), py::arg("h_out"), py::arg("y_out"), py::arg("var_out"),
        py::arg("eps"), py::arg("factor"), py::arg("lanes"), py::arg("warp_down"));
  m.def("silu_mul", &silu_mul, "silu(gate) * up", py::arg("gate"), py::arg("up"), py::arg("out"));
  m.def("norm_variant", &norm_variant, "rows, vec or scalar", py::arg("x"), py::arg("other"), py::arg("w"),
        py::arg("out"));
  m.def("rope", &rope, "RoPE of q and k (NeoX or interleaved)", py::arg("q"), py::arg("k"), py::arg("cos"),
        py::arg("sin"), py::arg("qo"), py::arg("ko"), py::arg("interleaved"));
  m.def("rope_variant", &rope_variant, "vec or scalar", py::arg("q"), py::arg("k"), py::arg("cos"), py::arg("sin"),
        py::arg("qo"), py::arg("ko"), py::arg("interleaved"));
  m.def("silu_mul_variant", &silu_mul_variant, "vec or scalar", py::arg("gate"), py::arg("up"), py::arg("out"));
}
