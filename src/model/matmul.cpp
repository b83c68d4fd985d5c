// matmul.cpp — y = W x over a thread pool, for quantised and float weight matrices.
//
// Quantised weights: the activations are quantised once per call (quant::quantize_activations),
// then the (rows x tokens) output is cut into tiles of row_chunk rows by tok_chunk tokens, one task
// each. Inside a tile the kernel walks each weight row once per group of 4 tokens, so a
// row chunk (a few KB to tens of KB) stays in L1/L2 while every token of the tile passes over it.
// Float weights (F32/F16/BF16) are converted a row at a time and multiplied in fp32.
#include <algorithm>
#include <cstring>

#include "cisa/model/quant.h"
#include "quant_kernels.h"

namespace cisa {
namespace {

quant::TileKernel pick_kernel(GgmlType type) {
  if (quant::TileKernel k = quant::tile_kernel_avx2_k(type)) return k;
  if (quant::TileKernel k = quant::tile_kernel_avx2(type)) return k;
  return quant::tile_kernel_scalar(type);
}

bool is_float_type(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

float dot_f32(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums so the compiler can keep a vector accumulator per lane.
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float s = 0.0f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int l = 0; l < 8; ++l) s += acc[l];
  return s;
}

struct Tiling {
  int64_t row_chunk, tok_chunk, n_row_chunks, n_tok_chunks;
};

Tiling plan(int64_t m, int64_t n_tok, int threads) {
  Tiling p{};
  p.tok_chunk = std::min<int64_t>(n_tok, 64);
  p.n_tok_chunks = (n_tok + p.tok_chunk - 1) / p.tok_chunk;
  // Enough row chunks for every thread to get several tasks (load balance), but not so small
  // that the per-task overhead shows.
  const int64_t want_tasks = 8 * static_cast<int64_t>(threads);
  const int64_t row_tasks = std::max<int64_t>(1, want_tasks / p.n_tok_chunks);
  p.row_chunk = std::clamp<int64_t>((m + row_tasks - 1) / row_tasks, 16, 256);
  p.n_row_chunks = (m + p.row_chunk - 1) / p.row_chunk;
  return p;
}

}  // namespace

Result<WeightView> WeightView::of(const GgufTensor& t) {
  if (!ggml_type_is_supported(t.type))
    return unimplemented("tensor '" + std::string(t.name) + "' has type " + ggml_type_name(t.type) +
                         ", which matmul does not support");
  WeightView w;
  w.type = t.type;
  w.n_cols = t.ne[0];
  w.n_rows = t.n_rows();
  w.row_bytes = t.row_bytes();
  w.data = t.data;
  return w;
}

const char* matmul_isa() {
#if defined(__AVX2__) && defined(__FMA__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return "avx512-vnni";
#elif defined(__AVX2__) && defined(__FMA__)
  return "avx2";
#else
  return "scalar";
#endif
}

Status matmul(const WeightView& w, const float* x, float* y, int64_t n_tok, ThreadPool& pool,
              MatmulScratch* scratch, int64_t ldx, int64_t ldy) {
  if (ldx == 0) ldx = w.n_cols;
  if (ldy == 0) ldy = w.n_rows;
  if (n_tok < 0) return invalid_argument("matmul: negative token count " + std::to_string(n_tok));
  if (n_tok == 0 || w.n_rows == 0) return Status::Ok();
  if (!w.data || !x || !y) return invalid_argument("matmul: null weight, input or output pointer");
  if (ldx < w.n_cols || ldy < w.n_rows)
    return invalid_argument("matmul: leading dimensions (" + std::to_string(ldx) + ", " +
                            std::to_string(ldy) + ") smaller than the matrix (" +
                            std::to_string(w.n_cols) + " cols, " + std::to_string(w.n_rows) +
                            " rows)");
  auto rb = ggml_row_bytes(w.type, w.n_cols);
  if (!rb.ok()) return rb.status();
  if (*rb != w.row_bytes)
    return invalid_argument("matmul: row_bytes " + std::to_string(w.row_bytes) +
                            " does not match " + std::to_string(w.n_cols) + " " +
                            ggml_type_name(w.type) + " elements");
  const Tiling p = plan(w.n_rows, n_tok, pool.num_threads());
  const int64_t n_tasks = p.n_row_chunks * p.n_tok_chunks;

  if (is_float_type(w.type)) {
    std::vector<std::vector<float>> rowbuf(static_cast<size_t>(pool.num_threads()));
    pool.parallel_for(n_tasks, [&](int64_t task, int thread) {
      const int64_t rc = task % p.n_row_chunks, tc = task / p.n_row_chunks;
      const int64_t r0 = rc * p.row_chunk, r1 = std::min(w.n_rows, r0 + p.row_chunk);
      const int64_t t0 = tc * p.tok_chunk, t1 = std::min(n_tok, t0 + p.tok_chunk);
      std::vector<float>& buf = rowbuf[static_cast<size_t>(thread)];
      buf.resize(static_cast<size_t>(w.n_cols));
      for (int64_t r = r0; r < r1; ++r) {
        const float* wr;
        if (w.type == GgmlType::F32) {
          wr = reinterpret_cast<const float*>(w.row(r));
          if (reinterpret_cast<uintptr_t>(wr) % alignof(float) != 0) {
            std::memcpy(buf.data(), w.row(r), w.n_cols * sizeof(float));
            wr = buf.data();
          }
        } else {
          (void)dequantize_row(w.type, w.row(r), buf.data(), w.n_cols);  // type checked above
          wr = buf.data();
        }
        for (int64_t t = t0; t < t1; ++t) y[t * ldy + r] = dot_f32(wr, x + t * ldx, w.n_cols);
      }
    });
    return Status::Ok();
  }

  // llama.cpp multiplies K-quants by batches of 8 or more tokens in another float order
  // (quant_kernels.h); follow it so that results stay bit-identical to its.
  quant::TileKernel kernel =
      n_tok >= quant::kBatchTokens ? quant::tile_kernel_avx2_k_batch(w.type) : nullptr;
  if (!kernel) kernel = pick_kernel(w.type);
  if (!kernel) return unimplemented(std::string("matmul: no kernel for ") + ggml_type_name(w.type));
  // Activations: blocks of 32 (BlockX) or, for the K-quants, of 256 (BlockXK); see quant_kernels.h.
  const int64_t nb = quant::activation_blocks(w.type, w.n_cols);
  const size_t tok_bytes = quant::activation_bytes(w.type, w.n_cols);
  MatmulScratch local;
  MatmulScratch& s = scratch ? *scratch : local;
  const size_t need = static_cast<size_t>(n_tok) * tok_bytes;
  if (s.bytes.size() < need) s.bytes.resize(need);
  uint8_t* xq = s.bytes.data();
  // Quantise the activations, in parallel when there is enough of them to pay for the wake-up.
  auto quantize_token = [&](int64_t t) {
    quant::quantize_activations(w.type, x + t * ldx, xq + t * tok_bytes, w.n_cols);
  };
  if (n_tok * w.n_cols >= (1 << 16)) {
    pool.parallel_for(n_tok, [&](int64_t t, int) { quantize_token(t); });
  } else {
    for (int64_t t = 0; t < n_tok; ++t) quantize_token(t);
  }
  pool.parallel_for(n_tasks, [&](int64_t task, int) {
    const int64_t rc = task % p.n_row_chunks, tc = task / p.n_row_chunks;
    const int64_t r0 = rc * p.row_chunk, r1 = std::min(w.n_rows, r0 + p.row_chunk);
    const int64_t t0 = tc * p.tok_chunk, t1 = std::min(n_tok, t0 + p.tok_chunk);
    kernel(w.row(r0), w.row_bytes, r1 - r0, xq + t0 * tok_bytes, nb, t1 - t0, y + t0 * ldy + r0,
           ldy);
  });
  return Status::Ok();
}

Status matmul(const GgufTensor& t, const float* x, float* y, int64_t n_tok, ThreadPool& pool,
              MatmulScratch* scratch) {
  CISA_ASSIGN_OR_RETURN(WeightView w, WeightView::of(t));
  return matmul(w, x, y, n_tok, pool, scratch);
}

}  // namespace cisa
