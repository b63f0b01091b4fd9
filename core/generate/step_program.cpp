// core/generate/step_program.cpp — DecodeProgram (step_program.hpp): two recordings of a one-token decode step
// compared into one program, and its replay.
#include "step_program.hpp"

#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "dew/error.hpp"

namespace dew::detail {

StepRecorder*& active_step_recorder() {
  thread_local StepRecorder* recorder = nullptr;
  return recorder;
}

namespace {

std::string call_name(const RecordedCall& c) { return c.upload ? "a host upload" : kernel_name(c.kernel); }

}  // namespace

std::unique_ptr<DecodeProgram> DecodeProgram::build(StepRecorder& a, const Tensor& a_in, const Tensor& a_out,
                                                    StepRecorder& b, const Tensor& b_in, const Tensor& b_out,
                                                    std::string* why) {
  auto fail = [&](const std::string& reason) {
    if (why) *why = reason;
    return std::unique_ptr<DecodeProgram>();
  };
  if (a.opaque || b.opaque) return fail("the step reads back to the host or copies outside the kernels");
  if (a.calls.empty() || a.calls.size() != b.calls.size())
    return fail("the two steps made " + std::to_string(a.calls.size()) + " and " + std::to_string(b.calls.size()) +
                " calls");
  if (!a_in.defined() || !b_in.defined() || !a_out.defined() || !b_out.defined())
    return fail("a step without input or output");
  std::unique_ptr<DecodeProgram> prog(new DecodeProgram);

  // The step's own buffers, paired a <-> b one to one; those written so far in a.
  std::unordered_map<const Storage*, const Storage*> a_to_b, b_to_a;
  std::unordered_set<const Storage*> written;
  auto pair_buffers = [&](const Storage* sa, const Storage* sb) {
    const auto [ia, new_a] = a_to_b.emplace(sa, sb);
    const auto [ib, new_b] = b_to_a.emplace(sb, sa);
    return ia->second == sb && ib->second == sa;
  };
  if (!pair_buffers(a_in.impl()->storage.get(), b_in.impl()->storage.get()))
    return fail("the input ids share a buffer with the step");
  written.insert(a_in.impl()->storage.get());            // filled before the step
  std::unordered_map<const TensorImpl*, size_t> moving;  // a's moving views -> views_

  for (size_t i = 0; i < a.calls.size(); ++i) {
    RecordedCall& ca = *a.calls[i];
    RecordedCall& cb = *b.calls[i];
    const std::string where = "call " + std::to_string(i) + " (" + call_name(ca) + ")";
    if (ca.upload != cb.upload || ca.kernel != cb.kernel || !ca.same_params(cb))
      return fail(where + " differs between the two steps");
    const std::vector<Tensor*> ta = ca.tensors(), tb = cb.tensors();
    const std::vector<bool> w = ca.written();
    for (size_t j = 0; j < ta.size(); ++j) {
      Tensor& x = *ta[j];
      const Tensor& y = *tb[j];
      if (!x.defined() || !y.defined()) {
        if (x.defined() != y.defined()) return fail(where + ": an argument is present in one step only");
        continue;
      }
      const TensorImpl* xi = x.impl();
      const TensorImpl* yi = y.impl();
      if (xi == yi) continue;  // the same tensor in both: a weight, a cache
      if (x.dtype() != y.dtype() || xi->panel != yi->panel || x.ndim() != y.ndim() || !xi->scales != !yi->scales)
        return fail(where + ": an argument changes its dtype or layout");
      const Storage* sx = xi->storage.get();
      const Storage* sy = yi->storage.get();
      if (sx == sy) {  // a fresh view of a buffer that outlives the step (a cache): fixed, or moving by a step
        const int64_t doffset = int64_t(yi->offset) - int64_t(xi->offset);
        Shape dshape(x.shape().size());
        bool moves = doffset != 0;
        for (size_t d = 0; d < dshape.size(); ++d) moves |= (dshape[d] = y.shape()[d] - x.shape()[d]) != 0;
        if (!moves) {  // a's view stands for both (a quantized weight's view keeps its scales' view)
          if (xi->scales && (xi->scales->storage != yi->scales->storage || xi->scales->offset != yi->scales->offset ||
                             xi->scales->shape != yi->scales->shape))
            return fail(where + ": a quantized view's scales move");
          continue;
        }
        if (xi->scales) return fail(where + ": a quantized view moves");
        auto it = moving.find(xi);
        if (it == moving.end()) {
          MovingView v;
          v.impl = std::make_shared<TensorImpl>(*xi);  // the program's own view of the same storage
          v.offset0 = int64_t(xi->offset);
          v.doffset = doffset;
          v.shape0 = x.shape();
          v.dshape = dshape;
          it = moving.emplace(xi, prog->views_.size()).first;
          prog->views_.push_back(std::move(v));
        } else if (prog->views_[it->second].doffset != doffset || prog->views_[it->second].dshape != dshape) {
          return fail(where + ": a view moves by two different steps");
        }
        x = Tensor(prog->views_[it->second].impl);
        continue;
      }
      // A buffer of the step's own: the same place in both, paired consistently, written before it is read.
      if (xi->scales) return fail(where + ": a quantized tensor made inside the step");
      if (x.shape() != y.shape() || xi->offset != yi->offset)
        return fail(where + ": a buffer of the step changes its shape (" + shape_str(x.shape()) + " -> " +
                    shape_str(y.shape()) + ")");
      if (!pair_buffers(sx, sy)) return fail(where + ": the step's buffers pair differently in the two steps");
      if (w[j])
        written.insert(sx);
      else if (!written.count(sx))
        return fail(where + " reads a tensor made outside the step (not the input ids)");
    }
    const std::vector<int64_t> fa = ca.moving_fields(), fb = cb.moving_fields();
    if (fa != fb) {
      MovingFields f{&ca, fa, fa, fa};
      for (size_t k = 0; k < fa.size(); ++k) f.step[k] = fb[k] - fa[k];
      prog->fields_.push_back(std::move(f));
    }
    if (ca.upload) {
      auto& ua = static_cast<UploadCall&>(ca);
      const auto& ub = static_cast<const UploadCall&>(cb);
      if (ua.bytes != ub.bytes) {  // moving values: i32 (positions), a fixed step per element
        if (ua.dst.dtype() != DType::i32) return fail(where + ": uploaded values change and are not i32");
        MovingUpload u{&ua, std::vector<int32_t>(ua.bytes.size() / 4), std::vector<int32_t>(ua.bytes.size() / 4)};
        std::vector<int32_t> next(u.base.size());
        std::memcpy(u.base.data(), ua.bytes.data(), ua.bytes.size());
        std::memcpy(next.data(), ub.bytes.data(), ub.bytes.size());
        for (size_t k = 0; k < next.size(); ++k) u.step[k] = next[k] - u.base[k];
        prog->uploads_.push_back(std::move(u));
      }
    }
  }
  // The logits: a buffer of the step's, at the same place in both.
  const TensorImpl* oa = a_out.impl();
  const TensorImpl* ob = b_out.impl();
  const auto it = a_to_b.find(oa->storage.get());
  if (it == a_to_b.end() || it->second != ob->storage.get() || oa->offset != ob->offset ||
      a_out.shape() != b_out.shape() || a_out.dtype() != b_out.dtype())
    return fail("the logits are not a buffer of the step");
  prog->calls_ = std::move(a.calls);
  prog->input_ = a_in;
  prog->output_ = a_out;
  return prog;
}

Tensor DecodeProgram::run(const Tensor& ids, int64_t i) {
  input_.copy_(ids);
  for (MovingView& v : views_) {
    const int64_t offset = v.offset0 + i * v.doffset;
    for (size_t d = 0; d < v.shape0.size(); ++d) v.impl->shape[d] = v.shape0[d] + i * v.dshape[d];
    const int64_t end = offset + numel_of(v.impl->shape);
    DEW_CHECK(offset >= 0 && size_t(end) * dtype_size(v.impl->dtype) <= v.impl->storage->bytes, "decode program: step ",
              i, " runs past its cache (", shape_str(v.impl->shape), " at ", offset, ")");
    v.impl->offset = size_t(offset);
  }
  for (MovingFields& f : fields_) {
    for (size_t k = 0; k < f.base.size(); ++k) f.now[k] = f.base[k] + i * f.step[k];
    f.call->set_moving_fields(f.now);
  }
  for (MovingUpload& u : uploads_) {
    int32_t* values = reinterpret_cast<int32_t*>(u.call->bytes.data());
    for (size_t k = 0; k < u.base.size(); ++k) values[k] = int32_t(u.base[k] + i * u.step[k]);
  }
  for (const auto& c : calls_) c->invoke();
  return output_;
}

}  // namespace dew::detail
