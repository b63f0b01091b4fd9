// tests/backends_cuda/emulation/fake_cublaslt.cpp — the cuBLASLt calls of the cuda backend (matmul.cpp,
// backend.cpp, probe.cpp, cuda_backend.hpp's check macro) on the CPU, for the emulated plugin (dew_cuda_emulated);
// tested by test_fake_cublaslt.cpp.
// What it models: D = epilogue(alpha op(A) op(B) + beta C) per batch, op N or T, on column- or row-order layouts
// with leading dimensions and strided batch offsets (elements; 0 broadcasts); f32 A, B, C, D, or bf16 A, B with bf16
// or f32 C, D; CUBLAS_COMPUTE_32F, and 32F_FAST_TF32 / 32F_FAST_16BF, which round f32 operands to TF32 / bf16 first
// (nearest even); host f32 alpha and beta (C not read when beta == 0; C may be D); epilogues DEFAULT, RELU, BIAS,
// RELU_BIAS, the bias (D's type, optional batch stride) added per row of D, relu taking NaN to 0 as max(x, 0) does.
// Products are summed in double, scaled, offset, rounded once to f32, then to bf16 (nearest even, NaN kept quiet).
// The heuristic offers one algorithm needing no workspace, chosen for the alignments it could see: the preference's
// minimums for A to D and the bias pointer set at the time (NULL: any), each capped at 16 bytes; cublasLtMatmul
// refuses a pointer of any batch aligned less, as a GPU kernel chosen for more could fault.
// Checked as cuBLASLt checks: attribute sizes, shapes and leading dimensions (CUBLAS_STATUS_INVALID_VALUE).
// Not modelled: streams (a call has run when it returns), the workspace (accepted, unused), and every other type,
// order, pointer mode, epilogue or attribute: refused with CUBLAS_STATUS_NOT_SUPPORTED and one line on stderr.
#include <cublasLt.h>

#include <algorithm>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

struct cublasLtContext {
  int unused = 0;  // a handle holds nothing: every call runs at once
};

namespace {

struct Layout {
  uint32_t type = CUDA_R_32F;  // cudaDataType
  int32_t order = CUBLASLT_ORDER_COL;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0, stride = 0;  // stride: elements between batches
  int32_t batch = 1;
};
struct Desc {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int64_t bias_stride = 0;
  int32_t bias_type = -1;  // -1: D's type
};
struct Pref {
  uint64_t workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};

constexpr uint64_t kAlgoMagic = 0x64657746616b654cull;  // the one algorithm; data[1..5]: alignments A, B, C, D, bias
constexpr uint64_t kMaxAlign = 16;

cublasStatus_t refuse(cublasStatus_t status, const char* format, ...) {
  char line[400];
  va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  std::fprintf(stderr, "fake cublasLt: %s\n", line);
  return status;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t to_bf16(float f) {
  const uint32_t u = bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x0040u);  // NaN: keep it, quiet
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);                    // nearest even
}
// f32 rounded to `drop` fewer mantissa bits (13: TF32, 16: bf16), nearest even; infinities and NaN unchanged.
float round_mantissa(float f, int drop) {
  const uint32_t u = bits(f), half = (1u << (drop - 1)) - 1u;
  if ((u & 0x7F800000u) == 0x7F800000u) return f;
  return from_bits((u + half + ((u >> drop) & 1u)) & ~((1u << drop) - 1u));
}

size_t element_size(int64_t t) { return t == CUDA_R_16BF ? 2 : 4; }
bool data_type_ok(int64_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }
double load(const void* base, int64_t t, int64_t i) {
  if (t == CUDA_R_16BF) return from_bits(uint32_t(static_cast<const uint16_t*>(base)[i]) << 16);
  return static_cast<const float*>(base)[i];
}
// Element (r, c) of batch q, in elements from the layout's base pointer.
int64_t at(const Layout& l, int64_t q, int64_t r, int64_t c) {
  return q * l.stride + (l.order == CUBLASLT_ORDER_COL ? r + c * l.ld : r * l.ld + c);
}
uint64_t alignment_of(uintptr_t address) {
  const uint64_t a = uint64_t(address) | kMaxAlign;
  return a & (~a + 1);
}

// A setter's value: INVALID_VALUE for a wrong size (as cuBLASLt), NOT_SUPPORTED for a value not modelled.
template <class T, class Ok>
cublasStatus_t put(const char* call, const char* name, T& field, const void* buf, size_t size, Ok ok) {
  if (!buf || size != sizeof(T))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s(%s): %zu bytes given, it takes %zu", call, name, size, sizeof(T));
  T v;
  std::memcpy(static_cast<void*>(&v), buf, sizeof v);
  if (!ok(v)) return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s(%s): value %lld not modelled", call, name, (long long)v);
  field = v;
  return CUBLAS_STATUS_SUCCESS;
}
constexpr auto any = [](auto) { return true; };
#define FAKE_ATTR(name, field, ok) \
  case name:                       \
    return put(call, #name, field, buf, size, ok)

bool compute_ok(int64_t c) {
  return c == CUBLAS_COMPUTE_32F || c == CUBLAS_COMPUTE_32F_FAST_TF32 || c == CUBLAS_COMPUTE_32F_FAST_16BF;
}

// What cublasLtMatmul and the heuristic check; sets m, n, k.
cublasStatus_t check(const char* call, const Desc* d, const Layout* a, const Layout* b, const Layout* c,
                     const Layout* dl, int64_t& m, int64_t& n, int64_t& k) {
  if (!d || !a || !b || !c || !dl) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: a null descriptor", call);
  if (a->type != b->type || c->type != dl->type || (a->type == CUDA_R_32F && c->type != CUDA_R_32F))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: types A %d, B %d, C %d, D %d not modelled", call, int(a->type),
                  int(b->type), int(c->type), int(dl->type));
  if (a->type == CUDA_R_16BF && d->compute != CUBLAS_COMPUTE_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: bf16 A and B with compute type %d", call, int(d->compute));
  const bool bias = d->epilogue & CUBLASLT_EPILOGUE_BIAS;
  if (bias && d->bias_type != -1 && d->bias_type != int64_t(dl->type))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: bias type %d with D of type %d", call, int(d->bias_type),
                  int(dl->type));
  const bool ta = d->trans_a == CUBLAS_OP_T, tb = d->trans_b == CUBLAS_OP_T;
  m = int64_t(ta ? a->cols : a->rows);
  k = int64_t(ta ? a->rows : a->cols);
  n = int64_t(tb ? b->rows : b->cols);
  const int64_t kb = int64_t(tb ? b->cols : b->rows);
  if (kb != k || int64_t(c->rows) != m || int64_t(c->cols) != n || int64_t(dl->rows) != m || int64_t(dl->cols) != n)
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  "%s: op(A) is %lld x %lld, op(B) %lld x %lld, C %llu x %llu, D %llu x %llu: they do not fit", call,
                  (long long)m, (long long)k, (long long)kb, (long long)n, (unsigned long long)c->rows,
                  (unsigned long long)c->cols, (unsigned long long)dl->rows, (unsigned long long)dl->cols);
  for (const Layout* l : {a, b, c, dl}) {
    const uint64_t need = l->order == CUBLASLT_ORDER_COL ? l->rows : l->cols;
    if (l->ld < 0 || (need > 0 && uint64_t(l->ld) < need))
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: leading dimension %lld below %llu", call, (long long)l->ld,
                    (unsigned long long)need);
    if (l->batch != dl->batch)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: batch counts %d and %d differ", call, l->batch, dl->batch);
  }
  return CUBLAS_STATUS_SUCCESS;
}

// The handles are our own objects behind cuBLASLt's opaque pointer types.
template <class T>
T* own(void* opaque) {
  return reinterpret_cast<T*>(opaque);
}
template <class Opaque, class T>
cublasStatus_t make(Opaque** out, const T& value) {
  if (!out) return refuse(CUBLAS_STATUS_INVALID_VALUE, "a Create call without a result pointer");
  *out = reinterpret_cast<Opaque*>(new T(value));
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) { return make(handle, cublasLtContext{}); }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

const char* cublasLtGetStatusName(cublasStatus_t status) {
  static const struct {
    cublasStatus_t status;
    const char* name;
  } names[] = {{CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS"},
               {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED"},
               {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED"},
               {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE"},
               {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH"},
               {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR"},
               {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED"},
               {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR"},
               {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED"},
               {CUBLAS_STATUS_LICENSE_ERROR, "CUBLAS_STATUS_LICENSE_ERROR"}};
  for (const auto& n : names)
    if (n.status == status) return n.name;
  return "CUBLAS_STATUS_UNKNOWN";
}
const char* cublasLtGetStatusString(cublasStatus_t status) { return cublasLtGetStatusName(status); }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  if (!compute_ok(compute) || scale != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescCreate: compute type %d, scale type %d not modelled",
                  int(compute), int(scale));
  return make(desc, Desc{.compute = compute});
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete own<Desc>(desc);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t size) {
  const char* call = "cublasLtMatmulDescSetAttribute";
  if (!desc) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: null descriptor", call);
  Desc& d = *own<Desc>(desc);
  const auto op = [](int32_t v) { return v == CUBLAS_OP_N || v == CUBLAS_OP_T; };
  switch (attr) {
    FAKE_ATTR(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, d.compute, compute_ok);
    FAKE_ATTR(CUBLASLT_MATMUL_DESC_TRANSA, d.trans_a, op);
    FAKE_ATTR(CUBLASLT_MATMUL_DESC_TRANSB, d.trans_b, op);
    FAKE_ATTR(CUBLASLT_MATMUL_DESC_EPILOGUE, d.epilogue, [](uint32_t v) {
      return v == CUBLASLT_EPILOGUE_DEFAULT || v == CUBLASLT_EPILOGUE_RELU || v == CUBLASLT_EPILOGUE_BIAS ||
             v == CUBLASLT_EPILOGUE_RELU_BIAS;
    });
    FAKE_ATTR(CUBLASLT_MATMUL_DESC_BIAS_POINTER, d.bias, any);
    FAKE_ATTR(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, d.bias_stride, any);
    FAKE_ATTR(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, d.bias_type, [](int32_t v) { return v == -1 || data_type_ok(v); });
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: attribute %d not modelled", call, int(attr));
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (!data_type_ok(type))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatrixLayoutCreate: data type %d not modelled", int(type));
  return make(layout, Layout{.type = type, .rows = rows, .cols = cols, .ld = ld});
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete own<Layout>(layout);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  const char* call = "cublasLtMatrixLayoutSetAttribute";
  if (!layout) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: null layout", call);
  Layout& l = *own<Layout>(layout);
  switch (attr) {
    FAKE_ATTR(CUBLASLT_MATRIX_LAYOUT_TYPE, l.type, data_type_ok);
    FAKE_ATTR(CUBLASLT_MATRIX_LAYOUT_ORDER, l.order,
              [](int32_t v) { return v == CUBLASLT_ORDER_COL || v == CUBLASLT_ORDER_ROW; });
    FAKE_ATTR(CUBLASLT_MATRIX_LAYOUT_ROWS, l.rows, any);
    FAKE_ATTR(CUBLASLT_MATRIX_LAYOUT_COLS, l.cols, any);
    FAKE_ATTR(CUBLASLT_MATRIX_LAYOUT_LD, l.ld, any);
    FAKE_ATTR(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, l.batch, [](int32_t v) { return v >= 1; });
    FAKE_ATTR(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, l.stride, any);
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: attribute %d not modelled", call, int(attr));
  }
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) { return make(pref, Pref{}); }
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete own<Pref>(pref);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t size) {
  const char* call = "cublasLtMatmulPreferenceSetAttribute";
  if (!pref) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: null preference", call);
  Pref& p = *own<Pref>(pref);
  const auto power_of_two = [](uint32_t v) { return v != 0 && (v & (v - 1)) == 0; };
  switch (attr) {
    FAKE_ATTR(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, p.workspace, any);
    FAKE_ATTR(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p.align[0], power_of_two);
    FAKE_ATTR(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p.align[1], power_of_two);
    FAKE_ATTR(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p.align[2], power_of_two);
    FAKE_ATTR(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p.align[3], power_of_two);
    default:
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: attribute %d not modelled", call, int(attr));
  }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  const char* call = "cublasLtMatmulAlgoGetHeuristic";
  if (!handle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "%s: null handle", call);
  if (!pref || !results || !returned || requested <= 0)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: null preference or results, or %d requested", call, requested);
  *returned = 0;
  int64_t m = 0, n = 0, k = 0;
  const Desc* dd = own<Desc>(desc);
  const cublasStatus_t s = check(call, dd, own<Layout>(a), own<Layout>(b), own<Layout>(c), own<Layout>(d), m, n, k);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const Pref& p = *own<Pref>(pref);
  const Layout& dl = *own<Layout>(d);
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].algo.data[0] = kAlgoMagic;
  for (int i = 0; i < 4; ++i) results[0].algo.data[1 + i] = std::min<uint64_t>(p.align[i], kMaxAlign);
  const int64_t bias_stride_bytes = dl.batch > 1 ? dd->bias_stride * int64_t(element_size(dl.type)) : 0;
  results[0].algo.data[5] = alignment_of(reinterpret_cast<uintptr_t>(dd->bias) | uintptr_t(bias_stride_bytes));
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha_p, const void* A,
                              cublasLtMatrixLayout_t a_desc, const void* B, cublasLtMatrixLayout_t b_desc,
                              const void* beta_p, const void* C, cublasLtMatrixLayout_t c_desc, void* D,
                              cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  (void)workspace, (void)workspace_bytes, (void)stream;
  const char* call = "cublasLtMatmul";
  if (!handle) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "%s: null handle", call);
  int64_t m = 0, n = 0, k = 0;
  const Desc* dd = own<Desc>(desc);
  const Layout *la = own<Layout>(a_desc), *lb = own<Layout>(b_desc), *lc = own<Layout>(c_desc),
               *ld = own<Layout>(d_desc);
  const cublasStatus_t s = check(call, dd, la, lb, lc, ld, m, n, k);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const bool with_bias = dd->epilogue & CUBLASLT_EPILOGUE_BIAS, relu = dd->epilogue & CUBLASLT_EPILOGUE_RELU;
  if (!alpha_p || !beta_p || !A || !B || !D || (with_bias && !dd->bias))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: a null alpha, beta, A, B, D or bias pointer", call);
  const float alpha = *static_cast<const float*>(alpha_p), beta = *static_cast<const float*>(beta_p);
  if (beta != 0.0f && !C) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: beta != 0 with a null C", call);
  if (C == D && (lc->type != ld->type || lc->order != ld->order || lc->ld != ld->ld || lc->stride != ld->stride))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: in place (C == D) with layouts that differ", call);
  if (algo && algo->data[0] != kAlgoMagic)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: an algorithm the heuristic did not give", call);
  const int32_t batch = ld->batch;
  const Layout* ls[5] = {la, lb, lc, ld, ld};
  const void* ps[5] = {A, B, beta != 0.0f ? C : nullptr, D, with_bias ? dd->bias : nullptr};
  const int64_t strides[5] = {la->stride, lb->stride, lc->stride, ld->stride, dd->bias_stride};
  static const char* const names[5] = {"A", "B", "C", "D", "bias"};
  for (int i = 0; algo && i < 5; ++i)
    for (int32_t q = 0; ps[i] && q < batch; ++q) {
      const uintptr_t p = reinterpret_cast<uintptr_t>(ps[i]) + uintptr_t(q * strides[i]) * element_size(ls[i]->type);
      if (alignment_of(p) < algo->data[1 + i])
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                      "%s: %s of batch %d at %p is %llu-byte aligned; the algorithm was chosen for %llu (%s)", call,
                      names[i], int(q), reinterpret_cast<const void*>(p), (unsigned long long)alignment_of(p),
                      (unsigned long long)algo->data[1 + i],
                      i == 4 ? "the bias pointer when the heuristic ran" : "the preference's minimum alignment");
    }

  // op(A) as rows of k, op(B)^T as rows of k: each output is one contiguous dot product, summed in double.
  int round_drop = 0;  // mantissa bits the compute type drops from f32 operands
  if (dd->compute == CUBLAS_COMPUTE_32F_FAST_TF32) round_drop = 13;
  if (dd->compute == CUBLAS_COMPUTE_32F_FAST_16BF) round_drop = 16;
  const auto operand = [&](const Layout& l, const void* base, int64_t q, int64_t r, int64_t c) {
    const double v = load(base, l.type, at(l, q, r, c));
    return round_drop ? double(round_mantissa(float(v), round_drop)) : v;
  };
  const bool ta = dd->trans_a == CUBLAS_OP_T, tb = dd->trans_b == CUBLAS_OP_T;
  const int64_t bias_type = dd->bias_type == -1 ? int64_t(ld->type) : dd->bias_type;
  std::vector<double> ap(size_t(m * k)), bp(size_t(n * k));
  for (int64_t q = 0; q < batch; ++q) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t l = 0; l < k; ++l) ap[size_t(i * k + l)] = ta ? operand(*la, A, q, l, i) : operand(*la, A, q, i, l);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t l = 0; l < k; ++l) bp[size_t(j * k + l)] = tb ? operand(*lb, B, q, j, l) : operand(*lb, B, q, l, j);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        const double* x = &ap[size_t(i * k)];
        const double* y = &bp[size_t(j * k)];
        double acc[4] = {0.0, 0.0, 0.0, 0.0};  // four chains run 3x faster than one; double either way
        int64_t l = 0;
        for (; l + 4 <= k; l += 4)
          for (int u = 0; u < 4; ++u) acc[u] += x[l + u] * y[l + u];
        for (; l < k; ++l) acc[0] += x[l] * y[l];
        double v = double(alpha) * ((acc[0] + acc[1]) + (acc[2] + acc[3]));
        if (beta != 0.0f) v += double(beta) * load(C, lc->type, at(*lc, q, i, j));
        if (with_bias) v += load(dd->bias, bias_type, q * dd->bias_stride + i);
        if (relu) v = v > 0.0 ? v : 0.0;  // NaN -> 0
        const int64_t o = at(*ld, q, i, j);
        if (ld->type == CUDA_R_16BF)
          static_cast<uint16_t*>(D)[o] = to_bf16(float(v));
        else
          static_cast<float*>(D)[o] = float(v);
      }
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
