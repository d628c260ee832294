// Decode attention that reads K/V straight from the paged pool (one new token per request, GQA), for CPUs.
//
// Why a native kernel: torch has no paged attention on CPU. Gathering each request's slots into a dense tensor
// and calling SDPA reads and writes every cached byte once more per layer (measured ~5x slower than attending in
// place), and inductor's fused gather-reduction was slower still. This kernel walks each request's row of the
// request->token table and reads every K/V row exactly once, in the pool's own layout [slot, kv_head, head_dim].
//
// One task per (request, kv_head), handed out dynamically: the G = heads / kv_heads query heads that share a K/V
// head are scored together, so each K/V row is loaded once for all of them. Two passes (scores, then the weighted
// sum of V) with a float32 softmax in between; K/V of any dtype the pool stores (float32, bfloat16, float16, float8
// e4m3/e5m2) are widened to float32 as they are loaded. AVX-512 where the compiler targets it, AVX2 + FMA on the
// x86-64-v3 tier (eight lanes), portable C++ elsewhere.
// Beside it, `store_kv`: the step's new K/V rows into their pool slots, both in one call.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_math.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define TOOLKIT_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define TOOLKIT_AVX2 1
#endif

namespace {

template <typename T>
inline float widen(T value) {
  return static_cast<float>(value);
}

template <>
inline float widen<c10::BFloat16>(c10::BFloat16 value) {
  return toolkit::to_float(value);
}

// Every float8 value widened once: decoding a byte is then a table lookup.
template <typename F8>
const std::array<float, 256>& float8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> values{};
    for (int i = 0; i < 256; ++i) values[i] = static_cast<float>(F8(static_cast<uint8_t>(i), F8::from_bits()));
    return values;
  }();
  return table;
}

template <>
inline float widen<c10::Float8_e4m3fn>(c10::Float8_e4m3fn value) {
  return float8_table<c10::Float8_e4m3fn>()[value.x];
}

template <>
inline float widen<c10::Float8_e5m2>(c10::Float8_e5m2 value) {
  return float8_table<c10::Float8_e5m2>()[value.x];
}

#ifdef TOOLKIT_AVX512
// Sixteen K/V values widened to float32.
template <typename KV>
inline __m512 load16(const KV* p);

template <>
inline __m512 load16<float>(const float* p) { return toolkit::Vec16<float>::load(p); }

template <>
inline __m512 load16<c10::BFloat16>(const c10::BFloat16* p) { return toolkit::Vec16<c10::BFloat16>::load(p); }

template <>
inline __m512 load16<c10::Half>(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <typename F8>
inline __m512 load16_float8(const F8* p) {
  __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm512_i32gather_ps(bytes, float8_table<F8>().data(), 4);
}

template <>
inline __m512 load16<c10::Float8_e4m3fn>(const c10::Float8_e4m3fn* p) { return load16_float8(p); }

template <>
inline __m512 load16<c10::Float8_e5m2>(const c10::Float8_e5m2* p) { return load16_float8(p); }

// Row softmax in place: subtract the max, exponentiate, normalize.
inline void softmax(float* row, int64_t length) {
  // The max sixteen lanes at a time: a scalar max is a dependency chain of ~4 cycles per element, which made this
  // loop a third of the kernel's compute (measured at batch 64 x 320 keys).
  __m512 top_v = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 16 <= length; i += 16) top_v = _mm512_max_ps(top_v, _mm512_loadu_ps(row + i));
  if (i < length) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (length - i)) - 1);
    top_v = _mm512_mask_max_ps(top_v, tail, top_v, _mm512_maskz_loadu_ps(tail, row + i));
  }
  top_v = _mm512_set1_ps(_mm512_reduce_max_ps(top_v));
  __m512 total_v = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= length; j += 16) {
    __m512 e = toolkit::exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(row + j), top_v));
    _mm512_storeu_ps(row + j, e);
    total_v = _mm512_add_ps(total_v, e);
  }
  if (j < length) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (length - j)) - 1);
    __m512 e = toolkit::exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, row + j), top_v));
    e = _mm512_maskz_mov_ps(tail, e);
    _mm512_mask_storeu_ps(row + j, tail, e);
    total_v = _mm512_add_ps(total_v, e);
  }
  const __m512 inverse = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(total_v));
  for (j = 0; j + 16 <= length; j += 16) _mm512_storeu_ps(row + j, _mm512_mul_ps(_mm512_loadu_ps(row + j), inverse));
  for (; j < length; ++j) row[j] *= _mm512_cvtss_f32(inverse);
}
#elif defined(TOOLKIT_AVX2)
// Eight K/V values widened to float32.
template <typename KV>
inline __m256 load8(const KV* p);

template <>
inline __m256 load8<float>(const float* p) { return _mm256_loadu_ps(p); }

template <>
inline __m256 load8<c10::BFloat16>(const c10::BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

template <>
inline __m256 load8<c10::Half>(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <typename F8>
inline __m256 load8_float8(const F8* p) {
  const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_i32gather_ps(float8_table<F8>().data(), bytes, 4);
}

template <>
inline __m256 load8<c10::Float8_e4m3fn>(const c10::Float8_e4m3fn* p) { return load8_float8(p); }

template <>
inline __m256 load8<c10::Float8_e5m2>(const c10::Float8_e5m2* p) { return load8_float8(p); }

// Row softmax in place, eight lanes at a time; the tail (fewer than eight) is scalar.
inline void softmax(float* row, int64_t length) {
  __m256 top_v = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 8 <= length; i += 8) top_v = _mm256_max_ps(top_v, _mm256_loadu_ps(row + i));
  float top = toolkit::reduce_max8(top_v);
  for (; i < length; ++i) top = std::max(top, row[i]);
  top_v = _mm256_set1_ps(top);
  __m256 total_v = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= length; j += 8) {
    const __m256 e = toolkit::exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(row + j), top_v));
    _mm256_storeu_ps(row + j, e);
    total_v = _mm256_add_ps(total_v, e);
  }
  float total = toolkit::reduce_add8(total_v);
  for (; j < length; ++j) {
    row[j] = std::exp(row[j] - top);
    total += row[j];
  }
  const float inverse = 1.f / total;
  const __m256 inverse_v = _mm256_set1_ps(inverse);
  for (j = 0; j + 8 <= length; j += 8) _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), inverse_v));
  for (; j < length; ++j) row[j] *= inverse;
}
#else
inline void softmax(float* row, int64_t length) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < length; ++j) top = std::max(top, row[j]);
  float total = 0.f;
  for (int64_t j = 0; j < length; ++j) {
    row[j] = std::exp(row[j] - top);
    total += row[j];
  }
  const float inverse = 1.f / total;
  for (int64_t j = 0; j < length; ++j) row[j] *= inverse;
}
#endif

struct Shapes {
  int64_t group, dim, kv_stride_s, kv_stride_h;
  // Set for the first of a request's K/V heads that a thread attends: the bytes from this head's row back to its
  // slot's start, and the slot's size, so that its passes pull the whole slot (every head) into L2 for the next.
  int64_t slot_offset_bytes = 0, slot_prefetch_bytes = 0;
};

#if defined(TOOLKIT_AVX512) || defined(TOOLKIT_AVX2)

// Rows this many keys ahead are prefetched, far enough ahead to hide DRAM latency: decode attention waits on memory
// (the same work over a pool that fits in L2 runs 3x faster). Measured at batch 64 x 320 keys, 30 layers:
// 8 ahead 37.7 ms, 16 ahead 32.8 ms, 32 ahead 30.4 ms, 64 ahead 34.0 ms.
constexpr int64_t kPrefetchDistance = 32;

// Every cache line of a K/V row into L1, and (when the task asks) the rest of its slot into L2.
template <typename KV>
inline void prefetch_row(const KV* row, int64_t row_elements, const Shapes& s) {
  const char* bytes = reinterpret_cast<const char*>(row);
  const int64_t row_bytes = row_elements * static_cast<int64_t>(sizeof(KV));
  for (int64_t offset = 0; offset < row_bytes; offset += 64) _mm_prefetch(bytes + offset, _MM_HINT_T0);
  for (int64_t offset = 0; offset < s.slot_prefetch_bytes; offset += 64)
    _mm_prefetch(bytes - s.slot_offset_bytes + offset, _MM_HINT_T1);
}

// Calls f(Group, Blocks) with both as compile-time constants (Blocks = head_dim / Lanes) for head_dim 64 or 128 and
// up to 8 query heads per K/V head (every Llama/Qwen/Mistral shape); false for other shapes, which take the
// portable path.
template <int64_t Lanes, typename F>
bool with_static_shape(const Shapes& s, F&& f) {
  auto for_group = [&](auto blocks) -> bool {
    switch (s.group) {
#define TOOLKIT_GROUP(G) \
  case G: f(std::integral_constant<int64_t, G>{}, blocks); return true;
      TOOLKIT_GROUP(1) TOOLKIT_GROUP(2) TOOLKIT_GROUP(3) TOOLKIT_GROUP(4)
      TOOLKIT_GROUP(5) TOOLKIT_GROUP(6) TOOLKIT_GROUP(7) TOOLKIT_GROUP(8)
#undef TOOLKIT_GROUP
      default: return false;
    }
  };
  if (s.dim == 64) return for_group(std::integral_constant<int64_t, 64 / Lanes>{});
  if (s.dim == 128) return for_group(std::integral_constant<int64_t, 128 / Lanes>{});
  return false;
}
#endif

#ifdef TOOLKIT_AVX512

// scores[g * length + j] = <query_g, K[slot_j]>: each K row is widened once for all G query heads.
template <int64_t Blocks, typename KV, typename Index>
void score_keys_avx512(const float* query, const KV* keys, const Index* slots, int64_t length, const Shapes& s,
                       float* scores) {
  for (int64_t j = 0; j < length; ++j) {
    if (j + kPrefetchDistance < length) {
      prefetch_row(keys + static_cast<int64_t>(slots[j + kPrefetchDistance]) * s.kv_stride_s, s.dim, s);
    }
    const KV* key = keys + static_cast<int64_t>(slots[j]) * s.kv_stride_s;
    __m512 k[Blocks];
    for (int64_t b = 0; b < Blocks; ++b) k[b] = load16(key + 16 * b);
    for (int64_t g = 0; g < s.group; ++g) {
      const float* q = query + g * s.dim;
      __m512 sum = _mm512_mul_ps(_mm512_loadu_ps(q), k[0]);
      for (int64_t b = 1; b < Blocks; ++b) sum = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * b), k[b], sum);
      scores[g * length + j] = _mm512_reduce_add_ps(sum);
    }
  }
}

// acc[g] = sum_j weights[g * length + j] * V[slot_j]: each V row is widened once for all G query heads, whose
// G x Blocks accumulators stay in registers (G and Blocks are compile-time constants).
template <int64_t Group, int64_t Blocks, typename KV, typename Index>
void weigh_values_avx512(const float* weights, const KV* values, const Index* slots, int64_t length,
                         const Shapes& s, float* acc) {
  __m512 sum[Group][Blocks];
  for (int64_t g = 0; g < Group; ++g)
    for (int64_t b = 0; b < Blocks; ++b) sum[g][b] = _mm512_setzero_ps();
  for (int64_t j = 0; j < length; ++j) {
    if (j + kPrefetchDistance < length) {
      prefetch_row(values + static_cast<int64_t>(slots[j + kPrefetchDistance]) * s.kv_stride_s, s.dim, s);
    }
    const KV* value = values + static_cast<int64_t>(slots[j]) * s.kv_stride_s;
    for (int64_t b = 0; b < Blocks; ++b) {
      const __m512 v = load16(value + 16 * b);
      for (int64_t g = 0; g < Group; ++g)
        sum[g][b] = _mm512_fmadd_ps(_mm512_set1_ps(weights[g * length + j]), v, sum[g][b]);
    }
  }
  for (int64_t g = 0; g < Group; ++g)
    for (int64_t b = 0; b < Blocks; ++b) _mm512_storeu_ps(acc + g * s.dim + 16 * b, sum[g][b]);
}

template <int64_t Group, int64_t Blocks, typename KV, typename Index>
void attend_avx512(const float* query, const KV* keys, const KV* values, const Index* slots, int64_t length,
                   const Shapes& s, float* scores, float* acc) {
  score_keys_avx512<Blocks>(query, keys, slots, length, s, scores);
  for (int64_t g = 0; g < Group; ++g) softmax(scores + g * length, length);
  weigh_values_avx512<Group, Blocks>(scores, values, slots, length, s, acc);
}

#if defined(__AVX512BF16__)
// Sixteen 16-lane vectors to the 16 sums of their lanes, out[j] = sum(rows[j]): a transposing add tree (pairs of
// rows, then of 64-bit halves, then of 128-bit lanes), ~3 instructions per row where one horizontal sum takes ~8.
inline __m512 sum_rows16(const float* rows) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; ++i) {
    const __m512 a = _mm512_load_ps(rows + 32 * i), b = _mm512_load_ps(rows + 32 * i + 16);
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  }
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // u[i]'s 128-bit lane L holds lane L's share of rows 4i..4i+3, in order: add the four lanes
  const __m512 x0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 x1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x88), _mm512_shuffle_f32x4(x0, x1, 0xDD));
}

// scores[g * length + j] = scale * <query_g, K[slot_j]> for a bf16 query and pool: bf16 pairs multiplied exactly and
// summed in float32 (AVX512-BF16), sixteen keys at a time whose lane sums one add tree finishes. The query is
// the model's own bf16 values (unscaled, so nothing is rounded); the scale is applied to the sums.
template <int64_t Group, int64_t Pairs, typename Index>
void score_keys_bf16(const c10::BFloat16* const* query, const c10::BFloat16* keys, const Index* slots,
                     int64_t length, const Shapes& s, float scale, float* scores) {
  __m512bh q[Group][Pairs];
  for (int64_t g = 0; g < Group; ++g)
    for (int64_t b = 0; b < Pairs; ++b)
      q[g][b] = (__m512bh)_mm512_loadu_si512(reinterpret_cast<const void*>(query[g] + 32 * b));
  alignas(64) float part[Group][16 * 16];
  const __m512 scale_v = _mm512_set1_ps(scale);
  for (int64_t j0 = 0; j0 < length; j0 += 16) {
    const int64_t n = std::min<int64_t>(16, length - j0);
    for (int64_t jj = 0; jj < n; ++jj) {
      const int64_t j = j0 + jj;
      if (j + kPrefetchDistance < length) {
        prefetch_row(keys + static_cast<int64_t>(slots[j + kPrefetchDistance]) * s.kv_stride_s, s.dim, s);
      }
      const c10::BFloat16* key = keys + static_cast<int64_t>(slots[j]) * s.kv_stride_s;
      __m512bh k[Pairs];
      for (int64_t b = 0; b < Pairs; ++b)
        k[b] = (__m512bh)_mm512_loadu_si512(reinterpret_cast<const void*>(key + 32 * b));
      for (int64_t g = 0; g < Group; ++g) {
        __m512 sum = _mm512_dpbf16_ps(_mm512_setzero_ps(), q[g][0], k[0]);
        for (int64_t b = 1; b < Pairs; ++b) sum = _mm512_dpbf16_ps(sum, q[g][b], k[b]);
        _mm512_store_ps(part[g] + 16 * jj, sum);
      }
    }
    for (int64_t g = 0; g < Group; ++g) {
      for (int64_t jj = n; jj < 16; ++jj) _mm512_store_ps(part[g] + 16 * jj, _mm512_setzero_ps());
      const __m512 sums = _mm512_mul_ps(sum_rows16(part[g]), scale_v);
      _mm512_mask_storeu_ps(scores + g * length + j0, static_cast<__mmask16>((1u << n) - 1), sums);
    }
  }
}

// The bf16 x bf16 path: the shapes with_static_shape takes; false sends others on.
template <typename Index>
bool attend_bf16(const c10::BFloat16* const* query, const c10::BFloat16* keys, const c10::BFloat16* values,
                 const Index* slots, int64_t length, const Shapes& s, float scale, float* scores, float* acc) {
  return with_static_shape<16>(s, [&](auto group, auto blocks) {
    constexpr int64_t G = decltype(group)::value, B = decltype(blocks)::value;
    score_keys_bf16<G, B / 2>(query, keys, slots, length, s, scale, scores);
    for (int64_t g = 0; g < G; ++g) softmax(scores + g * length, length);
    weigh_values_avx512<G, B>(scores, values, slots, length, s, acc);
  });
}
#endif

// The float32-query vector path: the shapes with_static_shape takes; false sends others to the portable path.
template <typename KV, typename Index>
bool attend_vectorized(const float* query, const KV* keys, const KV* values, const Index* slots, int64_t length,
                       const Shapes& s, float* scores, float* acc) {
  return with_static_shape<16>(s, [&](auto group, auto blocks) {
    attend_avx512<decltype(group)::value, decltype(blocks)::value>(query, keys, values, slots, length, s, scores,
                                                                   acc);
  });
}
#endif

#ifdef TOOLKIT_AVX2
// scores[g * length + j] = <query_g, K[slot_j]>: each K row is widened once for all G query heads.
template <int64_t Blocks, typename KV, typename Index>
void score_keys_avx2(const float* query, const KV* keys, const Index* slots, int64_t length, const Shapes& s,
                     float* scores) {
  for (int64_t j = 0; j < length; ++j) {
    if (j + kPrefetchDistance < length) {
      prefetch_row(keys + static_cast<int64_t>(slots[j + kPrefetchDistance]) * s.kv_stride_s, s.dim, s);
    }
    const KV* key = keys + static_cast<int64_t>(slots[j]) * s.kv_stride_s;
    __m256 k[Blocks];
    for (int64_t b = 0; b < Blocks; ++b) k[b] = load8(key + 8 * b);
    for (int64_t g = 0; g < s.group; ++g) {
      const float* q = query + g * s.dim;
      __m256 sum = _mm256_mul_ps(_mm256_loadu_ps(q), k[0]);
      for (int64_t b = 1; b < Blocks; ++b) sum = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * b), k[b], sum);
      scores[g * length + j] = toolkit::reduce_add8(sum);
    }
  }
}

// acc[g] = sum_j weights[g * length + j] * V[slot_j], one query head and at most eight 8-lane blocks at a time: AVX2
// has sixteen vector registers, too few for G x Blocks accumulators, so V rows are read once per head and block
// group (the first read prefetches; the others hit the cache).
template <int64_t Group, int64_t Blocks, typename KV, typename Index>
void weigh_values_avx2(const float* weights, const KV* values, const Index* slots, int64_t length,
                       const Shapes& s, float* acc) {
  constexpr int64_t kChunk = Blocks < 8 ? Blocks : 8;
  for (int64_t g = 0; g < Group; ++g) {
    for (int64_t first = 0; first < Blocks; first += kChunk) {
      __m256 sum[kChunk];
      for (int64_t b = 0; b < kChunk; ++b) sum[b] = _mm256_setzero_ps();
      const bool prefetch = g == 0 && first == 0;
      for (int64_t j = 0; j < length; ++j) {
        if (prefetch && j + kPrefetchDistance < length) {
          prefetch_row(values + static_cast<int64_t>(slots[j + kPrefetchDistance]) * s.kv_stride_s, s.dim, s);
        }
        const KV* value = values + static_cast<int64_t>(slots[j]) * s.kv_stride_s + 8 * first;
        const __m256 w = _mm256_set1_ps(weights[g * length + j]);
        for (int64_t b = 0; b < kChunk; ++b) sum[b] = _mm256_fmadd_ps(w, load8(value + 8 * b), sum[b]);
      }
      for (int64_t b = 0; b < kChunk; ++b) _mm256_storeu_ps(acc + g * s.dim + 8 * (first + b), sum[b]);
    }
  }
}

// The float32-query vector path: the shapes with_static_shape takes; false sends others to the portable path.
template <typename KV, typename Index>
bool attend_vectorized(const float* query, const KV* keys, const KV* values, const Index* slots, int64_t length,
                       const Shapes& s, float* scores, float* acc) {
  return with_static_shape<8>(s, [&](auto group, auto blocks) {
    constexpr int64_t G = decltype(group)::value, B = decltype(blocks)::value;
    score_keys_avx2<B>(query, keys, slots, length, s, scores);
    for (int64_t g = 0; g < G; ++g) softmax(scores + g * length, length);
    weigh_values_avx2<G, B>(scores, values, slots, length, s, acc);
  });
}
#endif

// The portable path: any head_dim, any ISA.
template <typename KV, typename Index>
void attend_scalar(const float* query, const KV* keys, const KV* values, const Index* slots, int64_t length,
                   const Shapes& s, float* scores, float* acc) {
  for (int64_t j = 0; j < length; ++j) {
    const KV* key = keys + static_cast<int64_t>(slots[j]) * s.kv_stride_s;
    for (int64_t g = 0; g < s.group; ++g) {
      float sum = 0.f;
      for (int64_t d = 0; d < s.dim; ++d) sum += query[g * s.dim + d] * widen(key[d]);
      scores[g * length + j] = sum;
    }
  }
  for (int64_t g = 0; g < s.group; ++g) softmax(scores + g * length, length);
  std::fill(acc, acc + s.group * s.dim, 0.f);
  for (int64_t j = 0; j < length; ++j) {
    const KV* value = values + static_cast<int64_t>(slots[j]) * s.kv_stride_s;
    for (int64_t g = 0; g < s.group; ++g) {
      const float w = scores[g * length + j];
      for (int64_t d = 0; d < s.dim; ++d) acc[g * s.dim + d] += w * widen(value[d]);
    }
  }
}

template <typename Q, typename KV, typename Index>
void decode_kernel(const at::Tensor& q, const at::Tensor& k_buffer, const at::Tensor& v_buffer,
                   const at::Tensor& req_to_token, const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                   double scale, at::Tensor& out) {
  const int64_t batch = q.size(0), heads = q.size(1), kv_heads = k_buffer.size(1);
  const Shapes base_shapes{heads / kv_heads, q.size(2), k_buffer.stride(0), k_buffer.stride(1)};
  const Q* q_ptr = q.data_ptr<Q>();
  Q* out_ptr = out.data_ptr<Q>();
  const KV* k_ptr = k_buffer.data_ptr<KV>();
  const KV* v_ptr = v_buffer.data_ptr<KV>();
  const Index* table = req_to_token.data_ptr<Index>();
  const int64_t* rows = req_pool_indices.data_ptr<int64_t>();
  const int64_t* lengths = seq_lens.data_ptr<int64_t>();
  const int64_t group = base_shapes.group, dim = base_shapes.dim;

  // One task per (request, K/V head), handed out dynamically: one request's heads at a time when there are enough
  // requests to keep every thread busy, else one head at a time. A thread the OS preempts (the front end and the
  // clients share these cores) then delays one task, not a static share that the other threads wait for at the
  // barrier (measured: a background load of 25% of one core slowed a statically split decode step by 35%).
  const int64_t tasks = batch * kv_heads, threads = at::get_num_threads();
  const int64_t chunk = batch >= 4 * threads ? kv_heads : 1;
  std::atomic<int64_t> next_task{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    std::vector<float> query(group * dim), acc(group * dim), scores;
    auto store_heads = [&](int64_t b, int64_t h) {
      for (int64_t g = 0; g < group; ++g) {
        Q* dst = out_ptr + b * out.stride(0) + (h * group + g) * out.stride(1);
        for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<Q>(acc[g * dim + d]);
      }
    };
    // pull_slot: this thread attends the request's other heads next, so the first pulls whole slots into L2
    auto attend_task = [&](int64_t task, bool pull_slot) {
      const int64_t b = task / kv_heads, h = task % kv_heads, length = lengths[b];
      const Index* slots = table + rows[b] * req_to_token.stride(0);
      auto query_head = [&](int64_t g) { return q_ptr + b * q.stride(0) + (h * group + g) * q.stride(1); };
      scores.resize(group * length);
      Shapes shapes = base_shapes;
      if (pull_slot) {
        shapes.slot_offset_bytes = h * shapes.kv_stride_h * static_cast<int64_t>(sizeof(KV));
        shapes.slot_prefetch_bytes = shapes.kv_stride_s * static_cast<int64_t>(sizeof(KV));
      }
      const KV* keys = k_ptr + h * shapes.kv_stride_h;
      const KV* values = v_ptr + h * shapes.kv_stride_h;
#if defined(TOOLKIT_AVX512) && defined(__AVX512BF16__)
      if constexpr (std::is_same_v<Q, c10::BFloat16> && std::is_same_v<KV, c10::BFloat16>) {
        const Q* heads_q[8];
        for (int64_t g = 0; g < std::min<int64_t>(group, 8); ++g) heads_q[g] = query_head(g);
        if (attend_bf16(heads_q, keys, values, slots, length, shapes, static_cast<float>(scale), scores.data(),
                        acc.data())) {
          store_heads(b, h);
          return;
        }
      }
#endif
      for (int64_t g = 0; g < group; ++g) {
        const Q* src = query_head(g);
        for (int64_t d = 0; d < dim; ++d) query[g * dim + d] = widen(src[d]) * static_cast<float>(scale);
      }
#if defined(TOOLKIT_AVX512) || defined(TOOLKIT_AVX2)
      if (!attend_vectorized(query.data(), keys, values, slots, length, shapes, scores.data(), acc.data()))
#endif
        attend_scalar(query.data(), keys, values, slots, length, shapes, scores.data(), acc.data());
      store_heads(b, h);
    };
    for (int64_t first; (first = next_task.fetch_add(chunk, std::memory_order_relaxed)) < tasks;) {
      for (int64_t task = first; task < std::min(first + chunk, tasks); ++task)
        attend_task(task, chunk > 1 && task == first);
    }
  });
}

template <typename Q, typename KV>
void dispatch_index(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                    const at::Tensor& rows, const at::Tensor& lengths, double scale, at::Tensor& out) {
  if (table.scalar_type() == at::kInt) {
    decode_kernel<Q, KV, int32_t>(q, k, v, table, rows, lengths, scale, out);
  } else {
    decode_kernel<Q, KV, int64_t>(q, k, v, table, rows, lengths, scale, out);
  }
}

template <typename Q>
void dispatch_kv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
                 const at::Tensor& rows, const at::Tensor& lengths, double scale, at::Tensor& out) {
  switch (k.scalar_type()) {
    case at::kFloat: return dispatch_index<Q, float>(q, k, v, table, rows, lengths, scale, out);
    case at::kBFloat16: return dispatch_index<Q, c10::BFloat16>(q, k, v, table, rows, lengths, scale, out);
    case at::kHalf: return dispatch_index<Q, c10::Half>(q, k, v, table, rows, lengths, scale, out);
    case at::kFloat8_e4m3fn: return dispatch_index<Q, c10::Float8_e4m3fn>(q, k, v, table, rows, lengths, scale, out);
    case at::kFloat8_e5m2: return dispatch_index<Q, c10::Float8_e5m2>(q, k, v, table, rows, lengths, scale, out);
    default: TORCH_CHECK(false, "paged_decode_attention: unsupported KV dtype ", k.scalar_type());
  }
}

void paged_decode_attention(const at::Tensor& q, const at::Tensor& k_buffer, const at::Tensor& v_buffer,
                            const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                            const at::Tensor& seq_lens, double scale, at::Tensor out) {
  TORCH_CHECK(q.dim() == 3 && out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type(),
              "q and out must be [batch, heads, head_dim] of one dtype");
  TORCH_CHECK(k_buffer.dim() == 3 && k_buffer.sizes() == v_buffer.sizes() &&
                  k_buffer.scalar_type() == v_buffer.scalar_type(), "K/V pools must be [slots, kv_heads, dim]");
  TORCH_CHECK(q.size(2) == k_buffer.size(2) && q.size(1) % k_buffer.size(1) == 0, "head shapes do not match");
  TORCH_CHECK(q.stride(2) == 1 && out.stride(2) == 1 && k_buffer.stride(2) == 1 &&
                  k_buffer.strides() == v_buffer.strides(), "head_dim must be contiguous");
  TORCH_CHECK(req_pool_indices.scalar_type() == at::kLong && seq_lens.scalar_type() == at::kLong,
              "req_pool_indices and seq_lens must be int64");
  TORCH_CHECK(req_pool_indices.numel() == q.size(0) && seq_lens.numel() == q.size(0),
              "req_pool_indices and seq_lens need one entry per query row (", q.size(0), ")");
  TORCH_CHECK(req_to_token.dim() == 2 && req_to_token.stride(1) == 1, "req_to_token rows must be contiguous");
  const at::Tensor rows = req_pool_indices.contiguous(), lengths = seq_lens.contiguous();
  switch (q.scalar_type()) {
    case at::kFloat: return dispatch_kv<float>(q, k_buffer, v_buffer, req_to_token, rows, lengths, scale, out);
    case at::kBFloat16:
      return dispatch_kv<c10::BFloat16>(q, k_buffer, v_buffer, req_to_token, rows, lengths, scale, out);
    case at::kHalf: return dispatch_kv<c10::Half>(q, k_buffer, v_buffer, req_to_token, rows, lengths, scale, out);
    default: TORCH_CHECK(false, "paged_decode_attention: unsupported query dtype ", q.scalar_type());
  }
}

// The step's new K/V rows into their pool slots, both in one call: k_buffer[loc[i]] = k[i], v_buffer[loc[i]] = v[i]
// (same dtype: an fp8 pool's quantization stays in Python). Two `index_put` ops per layer cost ~16 us at batch 64,
// most of it their setup, for 48 KB of rows.
void store_kv(at::Tensor k_buffer, at::Tensor v_buffer, const at::Tensor& loc, const at::Tensor& k,
              const at::Tensor& v) {
  TORCH_CHECK(k_buffer.dim() == 3 && k_buffer.sizes() == v_buffer.sizes() && k_buffer.is_contiguous() &&
                  v_buffer.is_contiguous(), "store_kv: K/V pools must be contiguous [slots, kv_heads, dim]");
  TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes() && k.size(1) == k_buffer.size(1) &&
                  k.size(2) == k_buffer.size(2), "store_kv: k/v must be [rows, kv_heads, dim] like the pool's");
  TORCH_CHECK(k.scalar_type() == k_buffer.scalar_type() && v.scalar_type() == k_buffer.scalar_type() &&
                  v_buffer.scalar_type() == k_buffer.scalar_type(), "store_kv: k/v must have the pool's dtype");
  TORCH_CHECK(k.stride(2) == 1 && k.stride(1) == k.size(2) && v.stride(2) == 1 && v.stride(1) == v.size(2),
              "store_kv: each row's heads must be contiguous");
  TORCH_CHECK(loc.scalar_type() == at::kLong && loc.dim() == 1 && loc.numel() == k.size(0),
              "store_kv: loc must be int64 [rows]");
  const at::Tensor slots = loc.contiguous();
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t rows = k.size(0), capacity = k_buffer.size(0);
  for (int64_t i = 0; i < rows; ++i)
    TORCH_CHECK(slot[i] >= 0 && slot[i] < capacity, "store_kv: slot ", slot[i], " is outside the pool of ", capacity);
  const int64_t row_bytes = k.size(1) * k.size(2) * k.element_size();
  auto* k_dst = static_cast<char*>(k_buffer.data_ptr());
  auto* v_dst = static_cast<char*>(v_buffer.data_ptr());
  const auto* k_src = static_cast<const char*>(k.data_ptr());
  const auto* v_src = static_cast<const char*>(v.data_ptr());
  const int64_t k_stride = k.stride(0) * k.element_size(), v_stride = v.stride(0) * v.element_size();
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(k_dst + slot[i] * row_bytes, k_src + i * k_stride, row_bytes);
    std::memcpy(v_dst + slot[i] * row_bytes, v_src + i * v_stride, row_bytes);
  }
}

}  // namespace

TORCH_LIBRARY(toolkit_cpu, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_buffer, Tensor v_buffer, Tensor req_to_token, "
        "Tensor req_pool_indices, Tensor seq_lens, float scale, Tensor(a!) out) -> ()");
  m.def("store_kv(Tensor(a!) k_buffer, Tensor(b!) v_buffer, Tensor loc, Tensor k, Tensor v) -> ()");
}

TORCH_LIBRARY_IMPL(toolkit_cpu, CPU, m) {
  m.impl("paged_decode_attention", &paged_decode_attention);
  m.impl("store_kv", &store_kv);
}
