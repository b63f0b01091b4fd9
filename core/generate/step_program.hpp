// core/generate/step_program.hpp — the DESIGN's step program for decoding: a one-token decode step recorded
// and replayed, so the tokens after the first few run their kernels without the ops, autograd checks, tensor
// bookkeeping and model code around them (≈ 0.08 ms a token, ~1 us a kernel, on the Emerald Rapids Xeon: 9 %
// of a bf16 char-small token there, and a larger share where memory is faster).
//
// How: the one-token step at position P (recording a) and at P + 1 (recording b) are recorded
// (core/ops/step_record.hpp: every kernel call, host upload, read-back and device copy) while they run as
// usual. The two must be the same program: the same calls with the same non-tensor arguments, each tensor
// argument either the same tensor in both (weights, the caches), a fresh view of the same storage whose offset
// and shape move by a fixed step (the cache row a token appends, the cache prefix attention reads), or a
// buffer of the step's own (same offset, shape and dtype, consistently paired, first written inside the step;
// the input ids excepted); attention's q_offset and a strided copy's offsets may move by a fixed step, and an
// i32 upload (the positions) by a fixed step per element. Then step P + i replays recording a's calls on a's
// buffers with every moving part at base + i * step. Anything else — a read back to the host inside the step
// (control flow may depend on data), a copy outside the kernels, a tensor whose size grows, a parameter that
// changes — builds no program, and decoding stays eager. The caller checks the program once against an eager
// step (decoder_start: step P + 2 both ways, bit for bit) before it trusts it. A replay makes the very calls an
// eager step makes, so its results are the eager results, bit for bit.
// Invariants: the logits a replay returns live in the program's buffer, valid until its next replay; a cache
// that a program decodes is not fed eagerly again (its own length no longer counts).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dew/tensor.hpp"
#include "ops/step_record.hpp"

namespace dew::detail {

class DecodeProgram {
 public:
  // The program of two recordings of consecutive one-token steps (`in`: the step's input ids, `out`: its
  // logits), or null with the reason in *why.
  static std::unique_ptr<DecodeProgram> build(StepRecorder& a, const Tensor& a_in, const Tensor& a_out, StepRecorder& b,
                                              const Tensor& b_in, const Tensor& b_out, std::string* why);
  // Step i (i = 0: recording a's position) on `ids` ([1, 1] i32, the input's backend): the logits.
  Tensor run(const Tensor& ids, int64_t i);

 private:
  struct MovingView {
    std::shared_ptr<TensorImpl> impl;  // the program's own view, rebound each step
    int64_t offset0 = 0, doffset = 0;
    Shape shape0, dshape;
  };
  struct MovingFields {
    RecordedCall* call;
    std::vector<int64_t> base, step, now;
  };
  struct MovingUpload {
    UploadCall* call;
    std::vector<int32_t> base, step;
  };
  std::vector<std::unique_ptr<RecordedCall>> calls_;
  Tensor input_, output_;
  std::vector<MovingView> views_;
  std::vector<MovingFields> fields_;
  std::vector<MovingUpload> uploads_;
};

}  // namespace dew::detail
