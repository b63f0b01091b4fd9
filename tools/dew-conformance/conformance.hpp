// tools/dew-conformance/conformance.hpp — the case model of the conformance driver.
//
// A Case is one call of one kernel of the kernel algebra (dew/backend.hpp) with fixed shapes, params
// and dtype. The driver builds the case's inputs once (Philox, on the oracle backend), runs the kernel
// on the oracle (`--against`, default ref) and on the tested backend with every tensor placed in the
// middle of a larger, sentinel-filled buffer, and compares each output by its Check.
//
// Conventions:
//  * Case ids are unique, made of [a-z0-9_/=.,x-] only, "<kernel>/<what>/<dtype>", so that a repro
//    line can anchor them in a --filter regex;
//  * inputs[i] may be undefined (an optional bias/weight); outputs likewise (OutSpec::defined = false);
//  * an output with init_from >= 0 starts as a copy of that input (in-place kernels: optimizer states,
//    beta = 1 matmul, scatter_add_rows, strided_copy into a bigger dst); otherwise it starts as poison,
//    so an element a backend forgets to write is caught;
//  * Case::call receives the backend and the two vectors; it must only call the one kernel under test.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dew/backend.hpp"
#include "dew/tensor.hpp"

namespace dew::conformance {

// How an output is compared with the oracle's.
struct Check {
  enum Kind : uint8_t { tol, exact } kind = tol;
  // tol: |got - ref| <= atol + rtol * |ref| for every element, with
  //   rtol = k_store * eps(out dtype) + k * eps(accumulation dtype) * sqrt(max(1, K))
  // (k_store: the final rounding to the stored dtype; k, K: the error of an accumulation of K terms,
  // accumulation in f32 for f32/bf16/f16 outputs, f64 for f64), unless rtol_override >= 0;
  //   atol = rtol * rms(ref) (the scale of the whole output: absorbs cancellation near zero);
  // plus, for the whole tensor, NMSE = sum (got - ref)^2 / sum ref^2 <= rtol^2.
  double k = 8;
  double K = 1;
  double k_store = 2;
  double rtol_override = -1;
  // The oracle's output may be more than half zeros (relu, causal masks, ignored rows, ...). Otherwise
  // such an output is "degenerate" and the case is reported MISTRUSTED (it proves little).
  bool zeros_ok = false;
  // tol only: the positions of exact zeros must agree exactly (dropout masks).
  bool zero_pattern = false;
};

inline Check tol(double k, double K = 1) {
  Check c;
  c.k = k;
  c.K = K;
  return c;
}
inline Check exact() {
  Check c;
  c.kind = Check::exact;
  return c;
}
inline Check zeros_ok(Check c) {
  c.zeros_ok = true;
  return c;
}

struct OutSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  Check check;
  int init_from = -1;  // index of the input this output starts as a copy of; -1: poison
  bool defined = true;
};

// Deterministic inputs: everything drawn from Philox with the case's seed, one stream per tensor.
class Gen {
 public:
  Gen(BackendPtr backend, uint64_t seed) : be_(std::move(backend)), seed_(seed) {}
  const BackendPtr& backend() const { return be_; }
  Tensor uniform(const Shape& s, float lo, float hi, DType dt = DType::f32);
  Tensor normal(const Shape& s, float mean, float std, DType dt = DType::f32);
  // i32 values uniform in [lo, hi).
  Tensor ints(const Shape& s, int32_t lo, int32_t hi);
  // uniform in [lo, hi) rounded to multiples of `step` (makes ties for comparisons, argmax, eq).
  Tensor quantized(const Shape& s, float lo, float hi, float step, DType dt = DType::f32);
  Tensor from_floats(const std::vector<float>& v, const Shape& s, DType dt = DType::f32);
  Tensor from_ints(const std::vector<int32_t>& v, const Shape& s);
  std::vector<float> uniform_host(int64_t n, float lo, float hi);

 private:
  uint64_t next_stream() { return ++stream_; }
  BackendPtr be_;
  uint64_t seed_;
  uint64_t stream_ = 0;
};

struct Case {
  std::string id;
  Kernel kernel = Kernel::fill;
  std::vector<DType> dtypes;  // asked of supports(); every one must be supported
  std::function<std::vector<Tensor>(Gen&)> inputs;
  std::vector<OutSpec> outs;
  std::function<void(Backend&, std::vector<Tensor>& in, std::vector<Tensor>& out)> call;
};

// The table (cases.cpp).
std::vector<Case> all_cases();

// Names used in ids.
inline const char* dt_tag(DType t) { return dtype_name(t); }

}  // namespace dew::conformance
