// core/tensor/tensor.cpp — Tensor creation, host access, views and the default backend.
// Invariant: every Tensor's storage was allocated by its backend and is freed by it (Storage dtor).
#include "dew/tensor.hpp"

#include <cstring>
#include <sstream>

#include "dew/autograd.hpp"
#include "dew/backend.hpp"
#include "dew/error.hpp"
#include "ops/kernel_call.hpp"

namespace dew {

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

Storage::Storage(BackendPtr b, size_t n) : backend(std::move(b)), bytes(n) {
  DEW_INTERNAL_ASSERT(backend != nullptr);
  data = backend->allocate(bytes == 0 ? 1 : bytes);
}
Storage::~Storage() {
  if (data) backend->deallocate(data, bytes == 0 ? 1 : bytes);
}

// ---------------------------------------------------------------- creation

Tensor Tensor::empty(const Shape& shape, DType dtype, const BackendPtr& backend) {
  DEW_CHECK(backend != nullptr, "no backend given and no default backend set");
  for (int64_t d : shape) DEW_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(backend, size_t(numel_of(shape)) * dtype_size(dtype));
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, const BackendPtr& backend) {
  return full(shape, 0.0, dtype, backend);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, const BackendPtr& backend) {
  Tensor t = empty(shape, dtype, backend);
  if (t.numel() > 0) detail::kernels(*backend).fill(t, value);
  return t;
}

Tensor Tensor::from_host(const void* data, const Shape& shape, DType dtype, const BackendPtr& backend) {
  Tensor t = empty(shape, dtype, backend);
  if (t.nbytes() == 0) return t;
  backend->copy_from_host(t.data(), data, t.nbytes());
  detail::record_step_upload(t, data, t.nbytes());
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape, const BackendPtr& backend, DType dtype) {
  DEW_CHECK(int64_t(v.size()) == numel_of(shape), "from_vector: ", v.size(), " values for shape ", shape_str(shape));
  Tensor f = from_host(v.data(), shape, DType::f32, backend);
  if (dtype == DType::f32) return f;
  Tensor t = empty(shape, dtype, backend);
  detail::kernels(*backend).cast(f, t);
  return t;
}

Tensor Tensor::from_ints(const std::vector<int32_t>& v, const Shape& shape, const BackendPtr& backend) {
  DEW_CHECK(int64_t(v.size()) == numel_of(shape), "from_ints: ", v.size(), " values for shape ", shape_str(shape));
  return from_host(v.data(), shape, DType::i32, backend);
}

static Tensor random_tensor(const Shape& shape, const RandomParams& p, const BackendPtr& backend, DType dtype) {
  Tensor f = Tensor::empty(shape, DType::f32, backend);
  if (f.numel() > 0) detail::kernels(*backend).random(f, p);
  if (dtype == DType::f32) return f;
  Tensor t = Tensor::empty(shape, dtype, backend);
  detail::kernels(*backend).cast(f, t);
  return t;
}

Tensor Tensor::uniform(const Shape& shape, float lo, float hi, uint64_t seed, uint64_t stream,
                       const BackendPtr& backend, DType dtype) {
  RandomParams p;
  p.dist = Distribution::uniform;
  p.seed = seed;
  p.stream = stream;
  p.a = lo;
  p.b = hi;
  return random_tensor(shape, p, backend, dtype);
}

Tensor Tensor::normal(const Shape& shape, float mean, float std, uint64_t seed, uint64_t stream,
                      const BackendPtr& backend, DType dtype) {
  RandomParams p;
  p.dist = Distribution::normal;
  p.seed = seed;
  p.stream = stream;
  p.a = mean;
  p.b = std;
  return random_tensor(shape, p, backend, dtype);
}

// ---------------------------------------------------------------- metadata

const Shape& Tensor::shape() const {
  DEW_CHECK(impl_, "use of an undefined tensor");
  return impl_->shape;
}
DType Tensor::dtype() const {
  DEW_CHECK(impl_, "use of an undefined tensor");
  return impl_->dtype;
}
Backend& Tensor::backend() const { return *backend_ptr(); }
const BackendPtr& Tensor::backend_ptr() const {
  DEW_CHECK(impl_, "use of an undefined tensor");
  return impl_->storage->backend;
}
int64_t Tensor::size(int axis) const {
  const int n = ndim();
  const int a = axis < 0 ? axis + n : axis;
  DEW_CHECK(a >= 0 && a < n, "axis ", axis, " out of range for shape ", shape_str(shape()));
  return shape()[size_t(a)];
}

namespace {
// The first element's address in the backend's space, whatever the layout.
void* storage_at(const TensorImpl& t) { return static_cast<char*>(t.storage->data) + t.offset * dtype_size(t.dtype); }

// Row-major bytes `rows_major` <-> the panel layout `panels` of a [n, k] tensor in panels of P rows, `es` bytes an
// element (dew/tensor.hpp): element (r, c) at ((r / P) * k + c) * P + r % P.
void panels_to_rows(const unsigned char* panels, unsigned char* rows, int64_t n, int64_t k, int64_t P, size_t es) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      std::memcpy(rows + size_t(r * k + c) * es, panels + size_t(((r / P) * k + c) * P + r % P) * es, es);
}
void rows_to_panels(const unsigned char* rows, unsigned char* panels, int64_t n, int64_t k, int64_t P, size_t es) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      std::memcpy(panels + size_t(((r / P) * k + c) * P + r % P) * es, rows + size_t(r * k + c) * es, es);
}
}  // namespace

void* Tensor::data() const {
  DEW_CHECK(impl_, "use of an undefined tensor");
  DEW_CHECK(impl_->panel == 0, "a ", dtype_name(impl_->dtype), " ", shape_str(impl_->shape), " weight in panels of ",
            impl_->panel, " rows (decode storage, dew/generate.hpp) is read by linear() only");
  return storage_at(*impl_);
}

void* Tensor::panel_data() const {
  DEW_CHECK(impl_, "use of an undefined tensor");
  DEW_CHECK(impl_->panel > 0, "panel_data() on a row-major tensor");
  return storage_at(*impl_);
}

// ---------------------------------------------------------------- host access

void Tensor::copy_to_host(void* dst) const {
  if (nbytes() == 0) return;
  detail::mark_step_opaque();
  if (panel_rows() == 0) return backend().copy_to_host(dst, data(), nbytes());
  std::vector<unsigned char> packed(nbytes());
  backend().copy_to_host(packed.data(), panel_data(), nbytes());
  panels_to_rows(packed.data(), static_cast<unsigned char*>(dst), size(0), size(1), panel_rows(), dtype_size(dtype()));
}
void Tensor::copy_from_host(const void* src) {
  if (nbytes() == 0) return;
  if (panel_rows() == 0) {
    backend().copy_from_host(data(), src, nbytes());
    detail::record_step_upload(*this, src, nbytes());
    return;
  }
  detail::mark_step_opaque();
  std::vector<unsigned char> packed(nbytes());
  rows_to_panels(static_cast<const unsigned char*>(src), packed.data(), size(0), size(1), panel_rows(),
                 dtype_size(dtype()));
  backend().copy_from_host(panel_data(), packed.data(), nbytes());
}

std::vector<double> Tensor::to_doubles() const {
  const int64_t n = numel();
  std::vector<double> out(static_cast<size_t>(n));
  std::vector<unsigned char> raw(nbytes());
  copy_to_host(raw.data());
  for (int64_t i = 0; i < n; ++i) {
    const unsigned char* p = raw.data() + size_t(i) * dtype_size(dtype());
    switch (dtype()) {
      case DType::f32: {
        float v;
        std::memcpy(&v, p, 4);
        out[size_t(i)] = v;
        break;
      }
      case DType::f64: {
        double v;
        std::memcpy(&v, p, 8);
        out[size_t(i)] = v;
        break;
      }
      case DType::bf16: {
        bf16_t v;
        std::memcpy(&v, p, 2);
        out[size_t(i)] = bf16_to_f32(v);
        break;
      }
      case DType::f16: {
        f16_t v;
        std::memcpy(&v, p, 2);
        out[size_t(i)] = f16_to_f32(v);
        break;
      }
      case DType::i32: {
        int32_t v;
        std::memcpy(&v, p, 4);
        out[size_t(i)] = v;
        break;
      }
      case DType::i64: {
        int64_t v;
        std::memcpy(&v, p, 8);
        out[size_t(i)] = double(v);
        break;
      }
      case DType::u8:
        out[size_t(i)] = *p;
        break;
      case DType::i8:
        out[size_t(i)] = double(int8_t(*p));
        break;
    }
  }
  if (quantized()) {  // q * scales[row, group] in f32, as dequantize() computes them (tensor.hpp)
    const std::vector<double> s = scales().to_doubles();
    const int64_t k = ndim() == 0 ? 1 : shape().back(), groups = scales().shape().back(), per = k / groups;
    for (int64_t i = 0; i < n; ++i)
      out[size_t(i)] = double(float(out[size_t(i)]) * float(s[size_t(i / k * groups + i % k / per)]));
  }
  return out;
}

std::vector<float> Tensor::to_floats() const {
  std::vector<double> d = to_doubles();
  return std::vector<float>(d.begin(), d.end());
}

std::vector<int32_t> Tensor::to_ints() const {
  DEW_CHECK(!is_floating(dtype()), "to_ints on a ", dtype_name(dtype()), " tensor");
  std::vector<double> d = to_doubles();
  std::vector<int32_t> out(d.size());
  for (size_t i = 0; i < d.size(); ++i) out[i] = int32_t(d[i]);
  return out;
}

double Tensor::item() const {
  DEW_CHECK(numel() == 1, "item() on a tensor of shape ", shape_str(shape()));
  return to_doubles()[0];
}

// ---------------------------------------------------------------- views and copies

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset;
  impl->shape = impl_->shape;
  impl->dtype = impl_->dtype;
  impl->scales = impl_->scales;
  impl->panel = impl_->panel;
  return Tensor(std::move(impl));
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape(), dtype(), backend_ptr());
  t.impl()->panel = panel_rows();  // the same bytes, the same layout
  detail::mark_step_opaque();
  if (nbytes() > 0) backend().copy_device(storage_at(*t.impl()), storage_at(*impl_), nbytes());
  if (quantized()) t.impl()->scales = scales().clone().impl_ptr();
  return t;
}

Tensor Tensor::to(const BackendPtr& target) const {
  if (target == backend_ptr()) return clone();
  Tensor t = empty(shape(), dtype(), target);
  if (quantized()) t.impl()->scales = scales().to(target).impl_ptr();
  if (nbytes() == 0) return t;
  std::vector<unsigned char> raw(nbytes());
  copy_to_host(raw.data());
  t.copy_from_host(raw.data());
  return t;
}

void Tensor::copy_(const Tensor& src) {
  DEW_CHECK(src.shape() == shape() && src.dtype() == dtype(), "copy_: shape/dtype mismatch ", shape_str(src.shape()),
            " ", dtype_name(src.dtype()), " -> ", shape_str(shape()), " ", dtype_name(dtype()));
  DEW_CHECK(!src.quantized() && !quantized(), "copy_: a quantized tensor's values need its scales; clone() it");
  DEW_CHECK(src.panel_rows() == 0 && panel_rows() == 0,
            "copy_: a weight in panels (decode storage) is not copied in place; clone() it");
  if (nbytes() == 0) return;
  detail::mark_step_opaque();
  if (src.backend_ptr() == backend_ptr()) {
    backend().copy_device(data(), src.data(), nbytes());
  } else {
    std::vector<unsigned char> raw(nbytes());
    src.copy_to_host(raw.data());
    copy_from_host(raw.data());
  }
}

// ---------------------------------------------------------------- autograd accessors

bool Tensor::requires_grad() const { return impl_ && impl_->requires_grad; }
Tensor& Tensor::set_requires_grad(bool on) {
  DEW_CHECK(impl_, "use of an undefined tensor");
  DEW_CHECK(!on || is_floating(impl_->dtype), "only floating tensors can require gradients");
  impl_->requires_grad = on;
  return *this;
}
Tensor Tensor::grad() const { return impl_ && impl_->grad ? Tensor(impl_->grad) : Tensor(); }
void Tensor::zero_grad() {
  if (impl_) impl_->grad.reset();
}
void Tensor::set_grad(const Tensor& g) {
  DEW_CHECK(impl_, "use of an undefined tensor");
  impl_->grad = g.impl_ptr();
}

// ---------------------------------------------------------------- default backend

namespace {
BackendPtr& default_backend_slot() {
  static BackendPtr b;
  return b;
}
}  // namespace
void set_default_backend(BackendPtr backend) { default_backend_slot() = std::move(backend); }
bool has_default_backend() { return default_backend_slot() != nullptr; }
const BackendPtr& default_backend() {
  const BackendPtr& b = default_backend_slot();
  DEW_CHECK_HINT(b != nullptr, "load a backend with dew::create_backend(\"cpu\") and set_default_backend()",
                 "no default backend is set");
  return b;
}

}  // namespace dew
