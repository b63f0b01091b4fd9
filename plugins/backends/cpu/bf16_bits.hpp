// cpu/bf16_bits.hpp — element loads and stores over a storage type (f32, or bf16 held as its 16 bits), for the
// kernels that are written once and compute in f32 whichever dtype their tensors hold.
//
// What: ld(p[i]) gives an element as f32 (a bf16 widened exactly: its bits shifted up 16); st(p + i, v) stores an
// f32 value (a bf16 rounded as dew/dtype.hpp's f32_to_bf16: nearest even on the bits, denormals kept, NaN made
// quiet; unlike vcvtneps2bf16, which flushes denormals). Both are branch-free, so an `omp simd` loop over them
// vectorises (vpmovzxwd + shift on the load, an add / shift / blend on the store).
// Invariant: a kernel instantiated for uint16_t computes, element for element, what its f32 instantiation computes
// on the widened inputs, then rounds each output once: "widen, run the f32 kernel, round", without the f32 copies.
// Included by a family's kernels (the #if defined(DEW_CPU_ISA) part), like vec16.hpp: once per path, inside that
// path's namespace and target region, always-inline functions only, no includes.
#ifndef DEW_CPU_ISA
#error "bf16_bits.hpp is included by a family's kernels, once per path (isa_clones.hpp)"
#endif

[[gnu::always_inline]] inline float widen_bits(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
[[gnu::always_inline]] inline uint16_t round_bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
}

[[gnu::always_inline]] inline float ld(float v) { return v; }
[[gnu::always_inline]] inline float ld(uint16_t h) { return widen_bits(h); }
[[gnu::always_inline]] inline void st(float* p, float v) { *p = v; }
[[gnu::always_inline]] inline void st(uint16_t* p, float v) { *p = round_bits(v); }

// A row as f32: an f32 row itself, a bf16 row widened into buf (n floats). For kernels whose reductions must run the
// very loops of the f32 instantiation (a loop that loads bf16 may be vectorised with other lanes, i.e. another
// summation order): the bf16 instantiation widens the row once (in L1) and reduces over the same f32 code.
[[gnu::always_inline]] inline const float* f32_row(const float* p, int64_t, float*) { return p; }
[[gnu::always_inline]] inline const float* f32_row(const uint16_t* p, int64_t n, float* buf) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) buf[i] = widen_bits(p[i]);
  return buf;
}
