// quant_kernels.h — internal interface between matmul (matmul.cpp) and the per-ISA kernels of
// the quantised dot products (quant_dot_scalar.cpp, quant_dot_avx2.cpp). Tests include it to
// compare the kernels with each other and with an fp64 reference.
#pragma once

#include <cstdint>

#include "cisa/gguf.h"

namespace cisa::quant {

// Activations quantised to blocks of 32: x[i] ~= d * q[i]. s0 and s1 are d * sum(q) over the
// first and second 16 elements and s = s0 + s1; they carry the weights' additive terms (the min
// of Q4_1/Q4_K, the code offset of Q4_0/Q5_0/Q6_K) without touching the codes again.
struct BlockX {
  float d;
  float s0, s1, s;
  int8_t q[32];
};
constexpr int64_t kBlockX = 32;

// Quantises k floats (k a multiple of 32) into k/32 blocks: d = max|x| / 127, q = round(x / d).
void quantize_x(const float* x, BlockX* out, int64_t k);

// Computes y[t * ldy + r] = dot(W row r, x_t) for r < n_rows and t < n_tok, where W row r is at
// w + r * row_bytes and x_t is the nb blocks at xq + t * nb (nb = n_cols / 32).
using TileKernel = void (*)(const uint8_t* w, uint64_t row_bytes, int64_t n_rows, const BlockX* xq,
                            int64_t nb, int64_t n_tok, float* y, int64_t ldy);

// The portable kernels (always built) and the AVX2 ones (nullptr when not compiled in or when
// the type has none). Both return nullptr for a type without a quantised kernel.
TileKernel tile_kernel_scalar(GgmlType type);
TileKernel tile_kernel_avx2(GgmlType type);

// Decodes 32-element sub-block j of a quantised block into signed integer codes and scales so
// that element i equals scale[i / 16] * w[i] + add. Shared by the scalar kernel and the tests.
struct SubBlock {
  int8_t w[32];
  float scale[2];
  float add;  // an additive term per element (the min of Q4_1/Q5_1/Q4_K), often 0
};
// Sub-blocks per block: 1 for 32-element types, 8 for the 256-element K-quants.
int sub_blocks_per_block(GgmlType type);
void decode_sub_block(GgmlType type, const uint8_t* block, int j, SubBlock* out);

}  // namespace cisa::quant
