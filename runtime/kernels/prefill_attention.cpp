// Causal attention of new sequences (no cached prefix) for bfloat16 and float32 prefill on CPUs, every sequence of a
// batch in one call, GQA.
//
// Why a native kernel: torch's CPU flash attention (SDPA) costs the same causal or not at the lengths a prefill
// chunk holds (measured at 256 tokens, 9 heads: causal 0.244 ms, full 0.235 ms) and takes one call per sequence
// (a chunk of 2,048 tokens of 256-token prompts is 8 calls per layer); no torch op attends several variable-length
// sequences at once on CPU. This kernel computes only the key blocks at or left of each query block's diagonal,
// packs each K/V head once for the query heads that share it, and spreads the (sequence, K/V head, query block)
// tasks of the whole batch over the threads. Both matrix products go through ATen's oneDNN micro-kernel
// (`at::native::cpublas::brgemm`: AMX where the CPU has it), the one torch's flash attention calls too; scores and
// the softmax stay float32; in bf16 the probabilities are rounded to bf16 for the second product, as in torch's.
// float32 takes the same path on x86 CPUs with AVX2 (the micro-kernel's float32 B needs no packing: K^T blocks and
// V panels are laid out plainly), where torch's float32 flash attention ran at ~1/3 of the GEMMs' rate.
//
// One task = one query block of one sequence for the G query heads of one K/V head: its scores S = Q K^T over the
// key blocks up to the diagonal (float32, in a per-thread buffer), an exact row softmax (the whole row is there, so
// no running rescale is needed), then O = P V over the same blocks.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_math.h"

namespace {

using c10::BFloat16;

constexpr int64_t kBlockM = 64;  // query rows per task
// Keys (and V's columns) are packed in blocks of this many: the micro-kernel's packed B holds at most 64 columns.
constexpr int64_t kKeyBlock = 64;

struct Sequence {
  int64_t start, length, padded, packed_offset;  // packed_offset: its first element in the packed buffers
};

struct Layout {
  int64_t heads, kv_heads, group, dim;
  int64_t q_row, k_row, v_row, out_row;  // token strides
};

// One sequence's K^T (key blocks of [dim, kKeyBlock], one after another) and V (column panels of [padded, <= 64],
// one after another) for one K/V head in the micro-kernel's VNNI layout. Keys past the sequence's end are zero:
// their scores are masked and their probabilities zero.
void pack_head(const BFloat16* k, const BFloat16* v, int64_t keys, int64_t padded, const Layout& s,
               BFloat16* packed_k, BFloat16* packed_v, std::vector<BFloat16>& scratch) {
  for (int64_t j0 = 0; j0 < padded; j0 += kKeyBlock) {
    scratch.assign(s.dim * kKeyBlock, BFloat16(0.f));
    for (int64_t j = j0; j < std::min(keys, j0 + kKeyBlock); ++j)
      for (int64_t d = 0; d < s.dim; ++d) scratch[d * kKeyBlock + j - j0] = k[j * s.k_row + d];
    at::native::cpublas::pack(s.dim, kKeyBlock, kKeyBlock, kKeyBlock, at::kBFloat16, at::kBFloat16, scratch.data(),
                              packed_k + j0 * s.dim);
  }
  scratch.assign(padded * s.dim, BFloat16(0.f));
  for (int64_t j = 0; j < keys; ++j) std::copy(v + j * s.v_row, v + j * s.v_row + s.dim, scratch.data() + j * s.dim);
  for (int64_t c0 = 0; c0 < s.dim; c0 += kKeyBlock) {
    const int64_t columns = std::min(kKeyBlock, s.dim - c0);
    at::native::cpublas::pack(padded, columns, s.dim, columns, at::kBFloat16, at::kBFloat16, scratch.data() + c0,
                              packed_v + c0 * padded);
  }
}

// The float32 layouts, which brgemm's float32 (non-VNNI) B takes as they are: K^T blocks [dim, kKeyBlock] and V
// column panels [padded, <= 64], row-major; keys past the sequence's end are zero.
void pack_head(const float* k, const float* v, int64_t keys, int64_t padded, const Layout& s, float* packed_k,
               float* packed_v, std::vector<float>&) {
  std::fill(packed_k, packed_k + padded * s.dim, 0.f);
  for (int64_t j = 0; j < keys; ++j) {
    float* block = packed_k + (j / kKeyBlock) * kKeyBlock * s.dim + j % kKeyBlock;
    for (int64_t d = 0; d < s.dim; ++d) block[d * kKeyBlock] = k[j * s.k_row + d];
  }
  for (int64_t c0 = 0; c0 < s.dim; c0 += kKeyBlock) {
    const int64_t columns = std::min(kKeyBlock, s.dim - c0);
    float* panel = packed_v + c0 * padded;
    for (int64_t j = 0; j < keys; ++j) {
      const float* row = v + j * s.v_row + c0;
      std::copy(row, row + columns, panel + j * columns);
    }
    std::fill(panel + keys * columns, panel + padded * columns, 0.f);
  }
}

#if defined(__AVX512F__)
// exp(x) for the softmax's x <= 0: 2^(x log2 e) = 2^n 2^f with n whole and |f| <= 1/2, 2^f by its degree-5 Taylor
// polynomial (relative error < 3e-6, far below the bf16 rounding the probabilities get) and 2^n by vscalefps,
// which also flushes x below float32's range to 0. A third of cpu_math.h's general exp's instructions: this loop
// exponentiates every visible score.
inline __m512 exp_nonpositive(__m512 x) {
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.3333558146e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108665e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650696e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718056e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// Sixteen float32 values stored, rounded to bf16 (to nearest even) for a bf16 output.
inline void store16(BFloat16* out, __m512 x) {
#if defined(__AVX512BF16__)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), (__m256i)_mm512_cvtneps_pbh(x));
#else
  toolkit::Vec16<BFloat16>::store(out, x);
#endif
}

inline void store16(float* out, __m512 x) { _mm512_storeu_ps(out, x); }
#elif defined(__AVX2__) && defined(__FMA__)
#define TOOLKIT_PREFILL_AVX2 1
// Eight float32 values stored (the AVX2 path serves float32: bf16 prefill needs AMX, which comes with AVX-512).
inline void store8(float* out, __m256 x) { _mm256_storeu_ps(out, x); }

inline void store8(BFloat16* out, __m256 x) {
  alignas(32) float values[8];
  _mm256_store_ps(values, x);
  for (int i = 0; i < 8; ++i) out[i] = BFloat16(values[i]);
}
#endif

// Row r of the block holds query position `first + r`: keys 0..first+r are visible. Its scores become unnormalized
// probabilities exp(scale * (score - max)) written as T, zero past the diagonal; inverse[r] = 1 / their sum
// (float32), applied to the row's output (the products stay in [0, 1], where bf16 keeps its relative precision).
template <typename T>
void softmax_rows(const float* scores, int64_t rows, int64_t first, int64_t width, float scale, T* probs,
                  float* inverse) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = scores + r * width;
    T* out = probs + r * width;
    const int64_t visible = first + r + 1;
    int64_t j = 0;
#if defined(__AVX512F__)
    auto lanes_from = [visible](int64_t j) {
      return visible - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (visible - j)) - 1);
    };
    __m512 top_v = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (j = 0; j < visible; j += 16) top_v = _mm512_mask_max_ps(top_v, lanes_from(j), top_v, _mm512_loadu_ps(row + j));
    const __m512 scale_v = _mm512_set1_ps(scale), shift_v = _mm512_set1_ps(_mm512_reduce_max_ps(top_v) * scale);
    __m512 total_v = _mm512_setzero_ps();
    // whole vectors up to the diagonal's: lanes past it are zero, which also pads the row to a multiple of 16
    for (j = 0; j < visible; j += 16) {
      __m512 x = _mm512_fmsub_ps(_mm512_loadu_ps(row + j), scale_v, shift_v);
      x = _mm512_maskz_mov_ps(lanes_from(j), exp_nonpositive(x));
      store16(out + j, x);
      total_v = _mm512_add_ps(total_v, x);
    }
    inverse[r] = 1.f / _mm512_reduce_add_ps(total_v);
#elif defined(TOOLKIT_PREFILL_AVX2)
    // eight lanes at a time; a lane at or past `visible` is masked (the row is a multiple of 64 wide, so whole
    // vectors never read past it)
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    auto lanes_from = [&](int64_t j) {
      return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(visible - j)), lane));
    };
    const __m256 lowest = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    __m256 top_v = lowest;
    for (j = 0; j < visible; j += 8)
      top_v = _mm256_max_ps(top_v, _mm256_blendv_ps(lowest, _mm256_loadu_ps(row + j), lanes_from(j)));
    const __m256 scale_v = _mm256_set1_ps(scale), shift_v = _mm256_set1_ps(toolkit::reduce_max8(top_v) * scale);
    __m256 total_v = _mm256_setzero_ps();
    for (j = 0; j < visible; j += 8) {
      const __m256 x = _mm256_fmsub_ps(_mm256_loadu_ps(row + j), scale_v, shift_v);
      const __m256 e = _mm256_and_ps(toolkit::exp_avx2(x), lanes_from(j));
      store8(out + j, e);
      total_v = _mm256_add_ps(total_v, e);
    }
    inverse[r] = 1.f / toolkit::reduce_add8(total_v);
#else
    float top = -std::numeric_limits<float>::infinity();
    for (j = 0; j < visible; ++j) top = std::max(top, row[j]);
    float total = 0.f;
    for (j = 0; j < visible; ++j) {
      const float e = std::exp(row[j] * scale - top * scale);
      total += e;
      out[j] = T(e);
    }
    inverse[r] = 1.f / total;
#endif
    std::fill(out + j, out + width, T(0.f));
  }
}

// out rows = acc rows * inverse, as T.
template <typename T>
void store_rows(const float* acc, const float* inverse, int64_t rows, int64_t dim, T* out, int64_t out_row) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = acc + r * dim;
    T* dst = out + r * out_row;
    int64_t d = 0;
#if defined(__AVX512F__)
    const __m512 scale_v = _mm512_set1_ps(inverse[r]);
    for (; d + 16 <= dim; d += 16) store16(dst + d, _mm512_mul_ps(_mm512_loadu_ps(src + d), scale_v));
#elif defined(TOOLKIT_PREFILL_AVX2)
    const __m256 scale_v = _mm256_set1_ps(inverse[r]);
    for (; d + 8 <= dim; d += 8) store8(dst + d, _mm256_mul_ps(_mm256_loadu_ps(src + d), scale_v));
#endif
    for (; d < dim; ++d) dst[d] = T(src[d] * inverse[r]);
  }
}

// Whether the kernel attends this dtype here: bf16 where ATen's oneDNN micro-kernel packs it (AMX), float32 on x86
// with AVX2 or more (elsewhere the micro-kernel's float32 fallback is slower than SDPA). Where not, callers use SDPA.
bool prefill_attention_supported(at::ScalarType dtype) {
  if (dtype == at::kBFloat16) return at::native::cpublas::could_pack(at::kBFloat16);
#if defined(__AVX2__) && defined(__FMA__)
  return dtype == at::kFloat;
#else
  return false;
#endif
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& seq_starts,
                  const at::Tensor& seq_lens, const at::Tensor& out) {
  TORCH_CHECK((q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kFloat) &&
                  k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() &&
                  out.scalar_type() == q.scalar_type(),
              "prefill_attention takes bfloat16 or float32 q, k, v and out, all of one dtype");
  TORCH_CHECK(prefill_attention_supported(q.scalar_type()), "prefill_attention does not attend ", q.scalar_type(),
              " on this CPU (bfloat16 needs oneDNN's packed micro-kernels (AMX), float32 AVX2)");
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.sizes() == k.sizes() && out.sizes() == q.sizes(),
              "q/out must be [tokens, heads, dim] and k/v [tokens, kv_heads, dim]");
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(2) == k.size(2) && q.size(1) % k.size(1) == 0,
              "q and k/v shapes do not match");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1 && out.stride(2) == 1 &&
                  q.stride(1) == q.size(2) && k.stride(1) == k.size(2) && v.stride(1) == v.size(2) &&
                  out.stride(1) == out.size(2),
              "each token's heads must be contiguous");
  TORCH_CHECK(q.size(2) % 16 == 0, "head_dim must be a multiple of 16");
  TORCH_CHECK(seq_starts.scalar_type() == at::kLong && seq_lens.scalar_type() == at::kLong && seq_starts.dim() == 1 &&
                  seq_lens.sizes() == seq_starts.sizes(),
              "seq_starts and seq_lens must be int64 [sequences]");
}

// The sequences, checked to lie within the tokens, with their places in the packed K/V buffers.
std::vector<Sequence> place_sequences(const at::Tensor& seq_starts, const at::Tensor& seq_lens, int64_t tokens,
                                      const Layout& s, int64_t& packed_elems) {
  const at::Tensor starts_c = seq_starts.contiguous(), lengths_c = seq_lens.contiguous();
  const int64_t* starts = starts_c.data_ptr<int64_t>();
  const int64_t* lengths = lengths_c.data_ptr<int64_t>();
  std::vector<Sequence> sequences;
  packed_elems = 0;
  for (int64_t i = 0; i < seq_starts.numel(); ++i) {
    TORCH_CHECK(starts[i] >= 0 && lengths[i] >= 0 && starts[i] + lengths[i] <= tokens, "sequence ", i, " (rows ",
                starts[i], " + ", lengths[i], ") is not within the ", tokens, " tokens");
    const int64_t padded = (lengths[i] + kKeyBlock - 1) / kKeyBlock * kKeyBlock;
    sequences.push_back({starts[i], lengths[i], padded, packed_elems});
    packed_elems += padded * s.dim * s.kv_heads;
  }
  return sequences;
}

struct Task {
  int64_t seq, kv_head, row0;
};

// A thread's buffers, grown to the widest task it has taken.
template <typename T>
struct Workspace {
  std::vector<float> scores, acc, inverse;
  std::vector<T> probs;
};

template <typename T>
struct Operands {
  const T *q, *packed_k, *packed_v;
  T* out;
};

// One task: rows row0.. of one sequence against its keys up to the diagonal, for the G query heads of one K/V
// head. Each product runs for all G heads in a row: the micro-kernel keeps its tile configuration between calls.
template <typename T>
void attend_task(const Task& task, const Sequence& seq, const Layout& s, const Operands<T>& x, float scale,
                 Workspace<T>& w) {
  const int64_t rows = std::min(kBlockM, seq.length - task.row0);
  const int64_t width = std::min(seq.padded, (task.row0 + rows + kKeyBlock - 1) / kKeyBlock * kKeyBlock);
  const int64_t offset = seq.packed_offset + task.kv_head * seq.padded * s.dim, plane = rows * width;
  w.scores.resize(s.group * plane);
  w.probs.resize(s.group * plane);
  w.acc.resize(s.group * rows * s.dim);
  w.inverse.resize(s.group * rows);
  auto head_of = [&](int64_t g) { return task.kv_head * s.group + g; };
  for (int64_t g = 0; g < s.group; ++g) {
    const T* q_rows = x.q + (seq.start + task.row0) * s.q_row + head_of(g) * s.dim;
    for (int64_t j0 = 0; j0 < width; j0 += kKeyBlock)
      at::native::cpublas::brgemm(rows, kKeyBlock, s.dim, s.q_row, kKeyBlock, width, false, q_rows,
                                  x.packed_k + offset + j0 * s.dim, w.scores.data() + g * plane + j0);
  }
  for (int64_t g = 0; g < s.group; ++g)
    softmax_rows(w.scores.data() + g * plane, rows, task.row0, width, scale, w.probs.data() + g * plane,
                 w.inverse.data() + g * rows);
  for (int64_t g = 0; g < s.group; ++g)
    for (int64_t c0 = 0; c0 < s.dim; c0 += kKeyBlock) {
      const int64_t columns = std::min(kKeyBlock, s.dim - c0);
      at::native::cpublas::brgemm(rows, columns, width, width, columns, s.dim, false, w.probs.data() + g * plane,
                                  x.packed_v + offset + c0 * seq.padded, w.acc.data() + g * rows * s.dim + c0);
    }
  for (int64_t g = 0; g < s.group; ++g)
    store_rows(w.acc.data() + g * rows * s.dim, w.inverse.data() + g * rows, rows, s.dim,
               x.out + (seq.start + task.row0) * s.out_row + head_of(g) * s.dim, s.out_row);
}

template <typename T>
void attend_all(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& seq_starts,
                const at::Tensor& seq_lens, double scale, at::Tensor& out) {
  constexpr bool kVnni = std::is_same_v<T, BFloat16>;
  const Layout s{q.size(1), k.size(1), q.size(1) / k.size(1), q.size(2),
                 q.stride(0), k.stride(0), v.stride(0), out.stride(0)};
  int64_t packed_elems = 0;
  const std::vector<Sequence> sequences = place_sequences(seq_starts, seq_lens, q.size(0), s, packed_elems);
  const int64_t count = static_cast<int64_t>(sequences.size());

  // Every (sequence, K/V head) packed once, for all its query heads and blocks.
  const at::Tensor packed_k = at::empty({packed_elems}, q.options()), packed_v = at::empty_like(packed_k);
  const T* k_ptr = k.data_ptr<T>();
  const T* v_ptr = v.data_ptr<T>();
  at::parallel_for(0, count * s.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> scratch;
    for (int64_t t = begin; t < end; ++t) {
      const Sequence& seq = sequences[t / s.kv_heads];
      const int64_t h = t % s.kv_heads, offset = seq.packed_offset + h * seq.padded * s.dim;
      if (seq.length == 0) continue;
      pack_head(k_ptr + seq.start * s.k_row + h * s.dim, v_ptr + seq.start * s.v_row + h * s.dim, seq.length,
                seq.padded, s, packed_k.data_ptr<T>() + offset, packed_v.data_ptr<T>() + offset,
                scratch);
    }
  });

  // The tasks, the costliest (the last query blocks) first, handed out dynamically.
  std::vector<Task> tasks;
  for (int64_t i = 0; i < count; ++i)
    for (int64_t r = 0; r < sequences[i].length; r += kBlockM)
      for (int64_t h = 0; h < s.kv_heads; ++h) tasks.push_back({i, h, r});
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.row0 > b.row0; });
  const Operands<T> operands{q.data_ptr<T>(), packed_k.data_ptr<T>(), packed_v.data_ptr<T>(), out.data_ptr<T>()};
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    Workspace<T> workspace;
    for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < static_cast<int64_t>(tasks.size());)
      attend_task(tasks[t], sequences[tasks[t].seq], s, operands, static_cast<float>(scale), workspace);
    at::native::cpublas::brgemm_release(kVnni);
  });
}

void prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& seq_starts,
                       const at::Tensor& seq_lens, double scale, at::Tensor out) {
  check_inputs(q, k, v, seq_starts, seq_lens, out);
  if (q.scalar_type() == at::kFloat) {
    attend_all<float>(q, k, v, seq_starts, seq_lens, scale, out);
  } else {
    attend_all<BFloat16>(q, k, v, seq_starts, seq_lens, scale, out);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(toolkit_cpu, m) {
  m.def("prefill_attention_supported(ScalarType dtype) -> bool", &prefill_attention_supported);
  m.def("prefill_attention(Tensor q, Tensor k, Tensor v, Tensor seq_starts, Tensor seq_lens, float scale, "
        "Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(toolkit_cpu, CPU, m) { m.impl("prefill_attention", &prefill_attention); }
