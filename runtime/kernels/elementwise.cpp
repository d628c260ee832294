// The decoder layer's elementwise steps, one pass each, for CPUs: residual add + RMSNorm, RMSNorm, neox rotary
// embedding of q and k in place, and SiLU(gate) * up (vLLM's and SGLang's CPU builds ship the same four ops).
//
// Why native: at decode each of these is a chain of 4-14 small torch ops (casts, pow, mean, rsqrt, mul, chunk,
// cat), ~35 per layer, each its own pass over memory and its own parallel region: ~18 ms of a 73 ms decode step at
// batch 64 on 2 cores, and every region is a barrier that a thread preempted by the front end or a client stalls.
// inductor fuses them too, but recompiles per batch size (measured slower end to end on CPU).
//
// Rounding follows the torch ops they replace, step by step (Hugging Face's order): a bf16/fp16 model rounds the
// residual sum, the normalized row, the product with the weight, SiLU's output and each rotary product to its dtype
// where torch does; everything in between is float32. Rows are split across threads in chunks of
// kMinElementsPerTask elements, so a small batch stays on one thread. With AVX-512, float32 and bf16 rows go
// sixteen values at a time (the compiler leaves a float sum and torch's rounding constructor scalar: the norms ran
// at ~2.4 cycles per element); the results are the scalar loops' but for the order of the sum of squares.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_math.h"

namespace {

constexpr int64_t kMinElementsPerTask = 16384;

using toolkit::to_float;

#if defined(__AVX512F__)
template <typename T>
constexpr bool kVector = toolkit::Vec16<T>::kVectorized;
#endif

// Round to T and back: the value torch holds after an op that outputs T (round to nearest even, as torch does).
inline float round_to(float v, float*) { return v; }
inline float round_to(float v, c10::BFloat16*) { return to_float(c10::BFloat16(v)); }
inline float round_to(float v, c10::Half*) { return static_cast<float>(c10::Half(v)); }

template <typename T>
inline float rounded(float v) {
  return round_to(v, static_cast<T*>(nullptr));
}

inline int64_t rows_per_task(int64_t row_elements) {
  return std::max<int64_t>(1, kMinElementsPerTask / std::max<int64_t>(1, row_elements));
}

template <typename F>
void parallel_rows(int64_t rows, int64_t row_elements, F&& f) {
  at::parallel_for(0, rows, rows_per_task(row_elements), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) f(row);
  });
}

// out = weight * T(rms_norm(float(x))), one row: Hugging Face's LlamaRMSNorm.
template <typename T>
inline void norm_row(const T* x, const T* weight, float eps, int64_t n, T* out) {
  float squares = 0.f;
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (kVector<T>) {
    using V = toolkit::Vec16<T>;
    __m512 sum = _mm512_setzero_ps();
    for (; i + 16 <= n; i += 16) {
      const __m512 v = V::load(x + i);
      sum = _mm512_fmadd_ps(v, v, sum);
    }
    squares = _mm512_reduce_add_ps(sum);
  }
#endif
  for (; i < n; ++i) {
    const float v = to_float(x[i]);
    squares += v * v;
  }
  const float inverse = 1.f / std::sqrt(squares / static_cast<float>(n) + eps);
  i = 0;
#if defined(__AVX512F__)
  if constexpr (kVector<T>) {
    using V = toolkit::Vec16<T>;
    const __m512 scale = _mm512_set1_ps(inverse);
    for (; i + 16 <= n; i += 16)
      V::store(out + i, _mm512_mul_ps(V::load(weight + i), V::round(_mm512_mul_ps(V::load(x + i), scale))));
  }
#endif
  for (; i < n; ++i) out[i] = T(to_float(weight[i]) * rounded<T>(to_float(x[i]) * inverse));
}

// out = T(a + b) elementwise (out may be a).
template <typename T>
inline void add_row(const T* a, const T* b, int64_t n, T* out) {
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (kVector<T>) {
    using V = toolkit::Vec16<T>;
    for (; i + 16 <= n; i += 16) V::store(out + i, _mm512_add_ps(V::load(a + i), V::load(b + i)));
  }
#endif
  for (; i < n; ++i) out[i] = T(to_float(a[i]) + to_float(b[i]));
}

template <typename T>
void rms_norm_impl(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& out) {
  const int64_t n = x.size(1);
  const T* x_ptr = x.data_ptr<T>();
  const T* w_ptr = weight.data_ptr<T>();
  T* out_ptr = out.data_ptr<T>();
  parallel_rows(x.size(0), n, [&](int64_t row) {
    norm_row(x_ptr + row * x.stride(0), w_ptr, static_cast<float>(eps), n, out_ptr + row * out.stride(0));
  });
}

// residual = T(residual + x), then x = weight * T(rms_norm(residual)): both in place.
template <typename T>
void fused_add_rms_norm_impl(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  const int64_t n = x.size(1);
  T* x_ptr = x.data_ptr<T>();
  T* r_ptr = residual.data_ptr<T>();
  const T* w_ptr = weight.data_ptr<T>();
  parallel_rows(x.size(0), n, [&](int64_t row) {
    T* xs = x_ptr + row * x.stride(0);
    T* rs = r_ptr + row * residual.stride(0);
    add_row(rs, xs, n, rs);
    norm_row(rs, w_ptr, static_cast<float>(eps), n, xs);
  });
}

// Neox rotary of one head in place: (a, b) -> (a cos - b sin, b cos + a sin), a and b its two halves.
template <typename T>
inline void rotate_head(T* x, const T* cos, const T* sin, int64_t half) {
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (kVector<T>) {
    using V = toolkit::Vec16<T>;
    for (; i + 16 <= half; i += 16) {
      const __m512 a = V::load(x + i), b = V::load(x + i + half), c = V::load(cos + i), s = V::load(sin + i);
      V::store(x + i, _mm512_sub_ps(V::round(_mm512_mul_ps(a, c)), V::round(_mm512_mul_ps(b, s))));
      V::store(x + i + half, _mm512_add_ps(V::round(_mm512_mul_ps(b, c)), V::round(_mm512_mul_ps(a, s))));
    }
  }
#endif
  for (; i < half; ++i) {
    const float a = to_float(x[i]), b = to_float(x[i + half]), c = to_float(cos[i]), s = to_float(sin[i]);
    x[i] = T(rounded<T>(a * c) - rounded<T>(b * s));
    x[i + half] = T(rounded<T>(b * c) + rounded<T>(a * s));
  }
}

template <typename T>
void rotary_impl(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = q.size(2) / 2, q_heads = q.size(1), k_heads = k.size(1);
  T* q_ptr = q.data_ptr<T>();
  T* k_ptr = k.data_ptr<T>();
  const T* cos_ptr = cos.data_ptr<T>();
  const T* sin_ptr = sin.data_ptr<T>();
  parallel_rows(q.size(0), (q_heads + k_heads) * 2 * half, [&](int64_t token) {
    const T* c = cos_ptr + token * cos.stride(0);
    const T* s = sin_ptr + token * sin.stride(0);
    for (int64_t h = 0; h < q_heads; ++h) rotate_head(q_ptr + token * q.stride(0) + h * q.stride(1), c, s, half);
    for (int64_t h = 0; h < k_heads; ++h) rotate_head(k_ptr + token * k.stride(0) + h * k.stride(1), c, s, half);
  });
}

// In place over float32: x / (1 + exp(-x)).
inline void silu_inplace(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m512 e = toolkit::exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), v));
    const __m512 denominator = _mm512_add_ps(_mm512_set1_ps(1.f), e);
    _mm512_storeu_ps(x + i, _mm512_div_ps(v, denominator));
  }
#endif
  for (; i < n; ++i) x[i] = x[i] / (1.f + std::exp(-x[i]));
}

// out[i] = float(x[i]).
template <typename T>
inline void widen_row(const T* x, int64_t n, float* out) {
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (kVector<T>) {
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, toolkit::Vec16<T>::load(x + i));
  }
#endif
  for (; i < n; ++i) out[i] = to_float(x[i]);
}

// out = T(T(a) * b): a float32 value rounded to T (an op's output), times b.
template <typename T>
inline void multiply_rounded_row(const float* a, const T* b, int64_t n, T* out) {
  int64_t i = 0;
#if defined(__AVX512F__)
  if constexpr (kVector<T>) {
    using V = toolkit::Vec16<T>;
    for (; i + 16 <= n; i += 16) V::store(out + i, _mm512_mul_ps(V::round(_mm512_loadu_ps(a + i)), V::load(b + i)));
  }
#endif
  for (; i < n; ++i) out[i] = T(rounded<T>(a[i]) * to_float(b[i]));
}

// out = T(silu(gate)) * up, gate and up the two halves of each row of gate_up. The gate row is widened into a float
// buffer first: loops of plain conversions vectorize, a conversion inside the exp loop does not.
template <typename T>
void silu_and_mul_impl(const at::Tensor& gate_up, at::Tensor& out) {
  const int64_t n = out.size(1);
  const T* in_ptr = gate_up.data_ptr<T>();
  T* out_ptr = out.data_ptr<T>();
  at::parallel_for(0, out.size(0), rows_per_task(n), [&](int64_t begin, int64_t end) {
    std::vector<float> activated(n);
    for (int64_t row = begin; row < end; ++row) {
      const T* gate = in_ptr + row * gate_up.stride(0);
      const T* up = gate + n;
      T* dst = out_ptr + row * out.stride(0);
      widen_row(gate, n, activated.data());
      silu_inplace(activated.data(), n);
      multiply_rounded_row(activated.data(), up, n, dst);
    }
  });
}

template <typename F>
void dispatch(const at::Tensor& t, const char* op, F&& f) {
  switch (t.scalar_type()) {
    case at::kFloat: return f(float{});
    case at::kBFloat16: return f(c10::BFloat16{});
    case at::kHalf: return f(c10::Half{});
    default: TORCH_CHECK(false, op, ": unsupported dtype ", t.scalar_type());
  }
}

void check_rows(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1, what, " must be [rows, features] with contiguous features");
}

void rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor out) {
  check_rows(x, "x");
  check_rows(out, "out");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == x.size(1) && weight.scalar_type() == x.scalar_type() &&
                  out.sizes() == x.sizes() && out.scalar_type() == x.scalar_type(),
              "rms_norm: weight [features] and out like x, of x's dtype");
  dispatch(x, "rms_norm", [&](auto t) { rms_norm_impl<decltype(t)>(x, weight, eps, out); });
}

void fused_add_rms_norm(at::Tensor x, at::Tensor residual, const at::Tensor& weight, double eps) {
  check_rows(x, "x");
  check_rows(residual, "residual");
  TORCH_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type() && weight.is_contiguous() &&
                  weight.numel() == x.size(1) && weight.scalar_type() == x.scalar_type(),
              "fused_add_rms_norm: residual like x, weight [features] of x's dtype");
  dispatch(x, "fused_add_rms_norm", [&](auto t) { fused_add_rms_norm_impl<decltype(t)>(x, residual, weight, eps); });
}

void rotary_neox(at::Tensor q, at::Tensor k, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(0) == k.size(0) && q.size(2) == k.size(2) &&
                  q.size(2) % 2 == 0 && q.stride(2) == 1 && k.stride(2) == 1,
              "rotary_neox: q and k must be [tokens, heads, head_dim] with an even, contiguous head_dim");
  TORCH_CHECK(cos.dim() == 2 && cos.sizes() == sin.sizes() && cos.size(0) == q.size(0) &&
                  cos.size(1) == q.size(2) / 2 && cos.stride(1) == 1 && sin.stride(1) == 1 &&
                  cos.scalar_type() == q.scalar_type() && sin.scalar_type() == q.scalar_type() &&
                  k.scalar_type() == q.scalar_type(),
              "rotary_neox: cos and sin must be [tokens, head_dim / 2] of q's dtype");
  dispatch(q, "rotary_neox", [&](auto t) { rotary_impl<decltype(t)>(q, k, cos, sin); });
}

void silu_and_mul(const at::Tensor& gate_up, at::Tensor out) {
  check_rows(gate_up, "gate_up");
  check_rows(out, "out");
  TORCH_CHECK(gate_up.size(1) == 2 * out.size(1) && gate_up.size(0) == out.size(0) &&
                  gate_up.scalar_type() == out.scalar_type(),
              "silu_and_mul: gate_up must be [rows, 2 * n] and out [rows, n] of one dtype");
  dispatch(out, "silu_and_mul", [&](auto t) { silu_and_mul_impl<decltype(t)>(gate_up, out); });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(toolkit_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps, Tensor(a!) out) -> ()");
  m.def("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
  m.def("rotary_neox(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin) -> ()");
  m.def("silu_and_mul(Tensor gate_up, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(toolkit_cpu, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("fused_add_rms_norm", &fused_add_rms_norm);
  m.impl("rotary_neox", &rotary_neox);
  m.impl("silu_and_mul", &silu_and_mul);
}
