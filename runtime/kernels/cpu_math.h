// Scalar and vector math shared by the CPU kernels: widening a half-precision value to float32, sixteen values
// of a dtype loaded as float32 and stored back rounded as torch rounds (AVX-512), exp over sixteen floats, and on
// the AVX2 tier (x86-64-v3: AVX2, FMA, F16C) exp and horizontal reductions over eight.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace toolkit {

inline float to_float(float v) { return v; }

// bf16 is float32's top half: widening is a shift, exact.
inline float to_float(c10::BFloat16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

inline float to_float(c10::Half v) { return static_cast<float>(v); }

#if defined(__AVX512F__)
// Sixteen values of T as float32: `load` widens, `store` rounds to T, `round` gives the float32 value T would hold.
// Rounding is torch's (c10): to nearest even, a NaN becomes bf16's quiet NaN 0x7fc0. Half has no vector form here
// (its kernels take the scalar loops).
template <typename T>
struct Vec16 {
  static constexpr bool kVectorized = false;
};

template <>
struct Vec16<float> {
  static constexpr bool kVectorized = true;
  static __m512 load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
  static __m512 round(__m512 v) { return v; }
};

template <>
struct Vec16<c10::BFloat16> {
  static constexpr bool kVectorized = true;
  static __m512 widen(__m256i bits) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  }
  static __m256i narrow(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i top = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    top = _mm512_mask_mov_epi32(top, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
    return _mm512_cvtepi32_epi16(top);
  }
  static __m512 load(const c10::BFloat16* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static void store(c10::BFloat16* p, __m512 v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow(v)); }
  static __m512 round(__m512 v) { return widen(narrow(v)); }
};

// exp(x) over float32's range: Cody-Waite range reduction and a degree-6 polynomial, about 2 ulp; 0 below -87.3
// and +inf above 88.7.
inline __m512 exp_avx512(__m512 x) {
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  // 2^n as two exact factors, so that n = 128 (x near 88.7) does not overflow the exponent field
  const __m512i whole = _mm512_cvtps_epi32(n);
  const __m512i half_n = _mm512_srai_epi32(whole, 1);
  auto pow2 = [](__m512i e) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(127)), 23));
  };
  return _mm512_mul_ps(_mm512_mul_ps(p, pow2(half_n)), pow2(_mm512_sub_epi32(whole, half_n)));
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
inline float reduce_add8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline float reduce_max8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

// exp_avx512's range reduction and polynomial over eight lanes (same constants, same ~2 ulp).
inline __m256 exp_avx2(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.7f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i whole = _mm256_cvtps_epi32(n);
  const __m256i half_n = _mm256_srai_epi32(whole, 1);
  auto pow2 = [](__m256i e) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
  };
  return _mm256_mul_ps(_mm256_mul_ps(p, pow2(half_n)), pow2(_mm256_sub_epi32(whole, half_n)));
}
#endif

}  // namespace toolkit
