// cpu/lerp.cpp — lerp_group: every slot's average += weight * (target - average) in one pass (f32), an EMA of a
// model's weights (dew::lerp_towards: Ema::update, JEPA's target encoder).
//
// Each element is the expression of the three kernels lerp_group is defined by (lerp_each, dew/backend.hpp): sub
// rounded to f32, the affine product weight * d + 0 (the + 0 turns a -0 product into +0, as affine's beta does), then
// add. So the pass gives their bits (tests/backends_cuda/test_optim_emulated.cpp) while reading 2 and writing 1
// tensor where they read 5, wrote 3 and allocated the difference. This file is compiled with -ffp-contract=off
// (CMakeLists.txt): a contracted average + weight * d would round once, not as the three kernels do. Threads: the
// slots' elements as one range split over the team (for_blocks), one region for the whole group; an element's value
// does not depend on who computes it. ISA: compiled once per path (isa_clones.hpp); uncontracted single operations: the
// same bits on every path. bf16 and f64 groups take lerp_each through supports() (the core).
#ifndef DEW_CPU_ISA  // ---- first pass: headers, the kernels once per ISA path (isa_clones.hpp), dispatch
#include <vector>

#include "cpu_backend.hpp"

#define DEW_CPU_ISA_SELF "lerp.cpp"
#include "isa_clones.hpp"

namespace dew::cpu {

DEW_CPU_ISA_KERNEL(lerp_group, (std::vector<LerpSlot> & slots, float weight), (slots, weight))

}  // namespace dew::cpu

#else  // ---- the kernels, compiled once per path inside namespace dew::cpu::DEW_CPU_ISA (no #include here)

namespace {

// Elements [lo, hi) of one slot; pointers and the weight by value (see for_blocks in cpu_backend.hpp).
void lerp_range(float* average, const float* target, float weight, int64_t lo, int64_t hi) {
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) {
    const float d = target[i] - average[i];
    const float step = weight * d + 0.0f;  // affine's weight * d + beta, beta 0: +0, not -0, for a zero product
    average[i] = average[i] + step;
  }
}

}  // namespace

void lerp_group(CpuBackend& self, std::vector<LerpSlot>& slots, float weight) {
  check_lerp_group(slots, self.name().c_str());
  std::vector<int64_t> first{0};  // slot s holds elements [first[s], first[s + 1]) of the group's one range
  for (LerpSlot& s : slots) {
    require_f32(s.average, "lerp_group", "average");
    first.push_back(first.back() + s.average.numel());
  }
  const int64_t total = first.back();
  for_blocks(total, parallel_worth(total), [&](int64_t lo, int64_t hi) {
    for (size_t s = 0; s < slots.size(); ++s) {
      const int64_t a = std::max(lo, first[s]), b = std::min(hi, first[s + 1]);
      if (a >= b) continue;
      lerp_range(slots[s].average.data_as<float>(), slots[s].target.data_as<float>(), weight, a - first[s],
                 b - first[s]);
    }
  });
}

#endif  // DEW_CPU_ISA
