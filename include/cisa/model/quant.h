// cisa/model/quant.h — quantised tensor types: dequantisation and the fused quantised matrix
// products.
//
// Weights stay in their GGUF block format. A product y = W x first quantises the activations x to
// 8-bit blocks (32 elements with an f16 scale, or 256 with an f32 scale for the K-quants), then
// multiplies integer codes with integer dot products (AVX2, or AVX-512 VNNI where the compiler
// targets it; a portable scalar path otherwise) and applies the weight and activation scales once
// per block. Quantisation, summation order and float operations are llama.cpp's CPU backend's, so
// on AVX2 the results are bit-identical to its (docs/models-runtime.md, "Numerics"). docs/gguf.md
// gives the block layouts; tests/golden/quant_golden_test.cpp checks dequantisation against the
// `gguf` Python package on the real model files.
//
//   cisa::ThreadPool pool(0);
//   CISA_ASSIGN_OR_RETURN(cisa::WeightView w,
//                         cisa::WeightView::of(*file.find_tensor("blk.0.ffn_up.weight")));
//   std::vector<float> y(n_tok * w.n_rows);                 // x: [n_tok][w.n_cols]
//   CISA_RETURN_IF_ERROR(cisa::matmul(w, x.data(), y.data(), n_tok, pool));
//
//   std::vector<float> row(w.n_cols);                       // one row, as floats
//   CISA_RETURN_IF_ERROR(cisa::dequantize_row(w.type, w.row(17), row.data(), w.n_cols));
#pragma once

#include <cstdint>
#include <vector>

#include "cisa/core/status.h"
#include "cisa/core/thread_pool.h"
#include "cisa/model/gguf.h"

namespace cisa {

// IEEE half and bfloat16 conversions (exact; f32_to_f16 rounds to nearest even).
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float bf16_to_f32(uint16_t h);

// Writes n floats decoded from src, which holds n / ggml_block_size(type) blocks of `type`.
// Errors: an unsupported type, or n not a multiple of the block size.
Status dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// A 2-D weight matrix in GGUF layout: n_rows rows of n_cols elements, row r at data + r*row_bytes.
// A GGUF tensor [ne0, ne1] is a matrix of ne1 rows of ne0 (rows are the output features).
struct WeightView {
  GgmlType type = GgmlType::F32;
  int64_t n_rows = 0;  // m: outputs
  int64_t n_cols = 0;  // k: inputs, a multiple of the block size
  uint64_t row_bytes = 0;
  const uint8_t* data = nullptr;

  const uint8_t* row(int64_t r) const { return data + static_cast<uint64_t>(r) * row_bytes; }
  // Views a tensor of 1 to 4 dimensions as [ne1*ne2*ne3] rows of ne0; fails for a type
  // matmul cannot multiply.
  static Result<WeightView> of(const GgufTensor& t);
  // Views rows × cols f32 values, row-major (owned by the caller).
  static WeightView f32(const float* values, int64_t rows, int64_t cols) {
    return {.type = GgmlType::F32,
            .n_rows = rows,
            .n_cols = cols,
            .row_bytes = static_cast<uint64_t>(cols) * sizeof(float),
            .data = reinterpret_cast<const uint8_t*>(values)};
  }
};

// Reusable buffers for matmul (the quantised activations); keeping one per caller avoids a
// large allocation per call during prefill. Contents are private to matmul.
struct MatmulScratch {
  std::vector<uint8_t> bytes;
};

// y[t * ldy + r] = sum_c W[r][c] * x[t * ldx + c]  for t < n_tok, r < w.n_rows.
// ldx defaults to w.n_cols and ldy to w.n_rows when passed as 0. Threads over rows and tokens.
Status matmul(const WeightView& w, const float* x, float* y, int64_t n_tok, ThreadPool& pool,
              MatmulScratch* scratch = nullptr, int64_t ldx = 0, int64_t ldy = 0);
Status matmul(const GgufTensor& w, const float* x, float* y, int64_t n_tok, ThreadPool& pool,
              MatmulScratch* scratch = nullptr);

// The name of the kernel family matmul uses in this build: "avx512-vnni", "avx2" or "scalar".
const char* matmul_isa();

}  // namespace cisa
