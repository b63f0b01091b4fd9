// cpu/bf16_bits.hpp — element loads and stores over a storage type (f32, or bf16 held as its 16 bits), for the
// kernels that are written once and compute in f32 whichever dtype their tensors hold.
//
// What: ld(p[i]) gives an element as f32 (a bf16 widened exactly: its bits shifted up 16); st(p + i, v) stores an
// f32 value (a bf16 rounded as dew/dtype.hpp's f32_to_bf16: nearest even on the bits, denormals kept, NaN made
// quiet; unlike vcvtneps2bf16, which flushes denormals). Both are branch-free, so an `omp simd` loop over them
// vectorises (vpmovzxwd + shift on the load, an add / shift / blend on the store). f32_row widens a row for a
// reduction; map_chunks runs an elementwise loop's f32 code on widened chunks (below).
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

// Elementwise loops over a storage type through their f32 code: map_chunks(x, o, n, loop) calls loop(xf, of, c) with
// f32 pointers — the caller's own for f32 storage; for bf16, chunks of kMapChunk elements widened into L1 buffers,
// whose results are rounded once into o. So the f32 loop is the one compiled code for both storages (the same bits per
// element), and its arithmetic is not interleaved with the bf16 unpacking: a loop with ld / st inside made GCC
// if-convert GELU-tanh's expression into twice the divisions: 1.7x the f32 loop's time forward, 1.4x backward, for half
// its bytes (Zen 5, [1024, 1024]). An output may be an input (a chunk is widened before it is written). map_chunks2:
// two inputs, one output; map_chunks3_2: three inputs, two outputs.
constexpr int64_t kMapChunk = 512;
[[gnu::always_inline]] inline void widen_into(const uint16_t* p, float* buf, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) buf[i] = widen_bits(p[i]);
}
[[gnu::always_inline]] inline void round_into(const float* buf, uint16_t* p, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) p[i] = round_bits(buf[i]);
}
template <class Loop>
[[gnu::always_inline]] inline void map_chunks(const float* x, float* o, int64_t n, Loop loop) {
  loop(x, o, n);
}
template <class Loop>
[[gnu::always_inline]] inline void map_chunks(const uint16_t* x, uint16_t* o, int64_t n, Loop loop) {
  alignas(64) float xb[kMapChunk], ob[kMapChunk];
  for (int64_t i = 0; i < n; i += kMapChunk) {
    const int64_t c = n - i < kMapChunk ? n - i : kMapChunk;
    widen_into(x + i, xb, c);
    loop(static_cast<const float*>(xb), static_cast<float*>(ob), c);
    round_into(ob, o + i, c);
  }
}
template <class Loop>
[[gnu::always_inline]] inline void map_chunks2(const float* x, const float* y, float* o, int64_t n, Loop loop) {
  loop(x, y, o, n);
}
template <class Loop>
[[gnu::always_inline]] inline void map_chunks2(const uint16_t* x, const uint16_t* y, uint16_t* o, int64_t n,
                                               Loop loop) {
  alignas(64) float xb[kMapChunk], yb[kMapChunk], ob[kMapChunk];
  for (int64_t i = 0; i < n; i += kMapChunk) {
    const int64_t c = n - i < kMapChunk ? n - i : kMapChunk;
    widen_into(x + i, xb, c);
    widen_into(y + i, yb, c);
    loop(static_cast<const float*>(xb), static_cast<const float*>(yb), static_cast<float*>(ob), c);
    round_into(ob, o + i, c);
  }
}
template <class Loop>
[[gnu::always_inline]] inline void map_chunks3_2(const float* a, const float* b, const float* c, float* o1, float* o2,
                                                 int64_t n, Loop loop) {
  loop(a, b, c, o1, o2, n);
}
template <class Loop>
[[gnu::always_inline]] inline void map_chunks3_2(const uint16_t* a, const uint16_t* b, const uint16_t* c, uint16_t* o1,
                                                 uint16_t* o2, int64_t n, Loop loop) {
  alignas(64) float ab[kMapChunk], bb[kMapChunk], cb[kMapChunk], o1b[kMapChunk], o2b[kMapChunk];
  for (int64_t i = 0; i < n; i += kMapChunk) {
    const int64_t m = n - i < kMapChunk ? n - i : kMapChunk;
    widen_into(a + i, ab, m);
    widen_into(b + i, bb, m);
    widen_into(c + i, cb, m);
    loop(static_cast<const float*>(ab), static_cast<const float*>(bb), static_cast<const float*>(cb),
         static_cast<float*>(o1b), static_cast<float*>(o2b), m);
    round_into(o1b, o1 + i, m);
    round_into(o2b, o2 + i, m);
  }
}
