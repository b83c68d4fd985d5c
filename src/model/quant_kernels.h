// quant_kernels.h — internal interface between matmul (matmul.cpp) and the per-ISA kernels of
// the quantised dot products (quant_dot_scalar.cpp, quant_dot_avx2.cpp). Tests include it to
// compare the kernels with each other and with an fp64 reference.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cisa/model/gguf.h"

namespace cisa::quant {

// Activations quantised to blocks of 32 the way llama.cpp's CPU backend does it (its Q8_0 and
// Q8_1 activation blocks), so that our products see the same 8-bit inputs as its:
//   id = 127 / max|x|,  q[i] = round_half_even(x[i] * id),  d = fp16(max|x| / 127),
// i.e. the codes come from the f32 ratio but the stored scale is rounded to half precision
// (x[i] ~= d * q[i] with that fp16 d). s carries the weights' additive terms (the min of
// Q4_1/Q5_1, the code offset of Q4_0/Q5_0) without touching the codes again:
//   Q8_1 (for Q4_1, Q5_1 weights):        s = fp16(max|x|/127 * sum q), as llama.cpp stores it;
//   Q8_0 (for Q4_0, Q5_0, Q8_0 weights):   s = d * sum q (exact: 11 x 13 significant bits).
struct BlockX {
  float d;
  float s;
  int8_t q[32];
};
constexpr int64_t kBlockX = 32;

// Which sum a weight type's products need (above).
enum class XSum { kQ8_0, kQ8_1 };
XSum activation_sum_kind(GgmlType type);

// Quantises k floats (k a multiple of 32) into k/32 blocks as described above.
void quantize_x(const float* x, BlockX* out, int64_t k, XSum sum);

// For weight types whose codes carry an offset c (Q4_0's 8, Q5_0's 16; activation_code_offset
// gives c, 0 for the others): a Q8_0 block plus off[k] = -c (q[4k] + ... + q[4k+3]). Added to lane
// k of the unsigned codes' integer dot, it gives the lane of the signed codes' dot, which is what
// llama.cpp converts to float. A separate type keeps BlockX at 40 bytes for the other types.
struct BlockXO {
  BlockX x;
  int32_t off[8];
};
int activation_code_offset(GgmlType type);
void quantize_xo(const float* x, BlockXO* out, int64_t k, int code_offset);

// Activations for the K-quant weights (Q4_K, Q6_K): blocks of 256 with one f32 scale, so that a
// whole weight super-block is summed in integers (its 6-/8-bit sub-block scales applied with
// integer multiplies) and converted to float once. As llama.cpp's Q8_K:
//   id = 127 / max|x|,  q[i] = round_half_even(x[i] * id),  d = 1 / id
// (llama.cpp divides by the signed extreme value, which flips the signs of both d and q and
// leaves every product d * q bit-identical). bsum[g] = sum of q over elements 16g..16g+15
// carries the mins and code offsets.
struct BlockXK {
  float d;
  int16_t bsum[16];
  int8_t q[256];
};
constexpr int64_t kBlockXK = 256;
void quantize_xk(const float* x, BlockXK* out, int64_t k);

// The same quantisations with AVX2 (bit-identical results: the same float operations, and
// conversion rounds to nearest even like nearbyint); the scalar ones where AVX2 is absent.
void quantize_x_fast(const float* x, BlockX* out, int64_t k, XSum sum);
void quantize_xo_fast(const float* x, BlockXO* out, int64_t k, int code_offset);
void quantize_xk_fast(const float* x, BlockXK* out, int64_t k);

// Which activation blocks a weight type is multiplied with (BlockX, BlockXO or BlockXK), and
// their size for k inputs.
bool uses_block256(GgmlType type);
int64_t activation_blocks(GgmlType type, int64_t k);  // blocks per token
size_t activation_bytes(GgmlType type, int64_t k);    // bytes per token
void quantize_activations(GgmlType type, const float* x, void* out, int64_t k);
// Element i of a token's quantised activations as a float (d * q), for tests.
float activation_value(GgmlType type, const void* xq, int64_t i);

// Computes y[t * ldy + r] = dot(W row r, x_t) for r < n_rows and t < n_tok, where W row r is at
// w + r * row_bytes and x_t is the nb activation blocks (BlockX, BlockXO, BlockXK by type) at
// xq + t * nb blocks. The float order may depend on a token's place in the call: the AVX2 Q4_K
// kernel treats its last n_tok % 4 tokens as llama.cpp treats a batch's last n % 4 (matmul hands
// it tiles of a multiple of 4 tokens except the last, so that is the whole product's last n % 4).
using TileKernel = void (*)(const uint8_t* w, uint64_t row_bytes, int64_t n_rows, const void* xq,
                            int64_t nb, int64_t n_tok, float* y, int64_t ldy);

// The portable kernels (always built) and the AVX2 ones (nullptr when not compiled in or when
// the type has none). Both return nullptr for a type without a quantised kernel.
TileKernel tile_kernel_scalar(GgmlType type);
TileKernel tile_kernel_avx2(GgmlType type);
TileKernel tile_kernel_avx2_k(GgmlType type);  // Q4_K and Q6_K (quant_dot_avx2_k.cpp)
// The same products in the float order llama.cpp uses for products of >= kBatchTokens tokens
// (its "tiled" kernels; Q6_K here: our other types' batch order does not change), else nullptr.
TileKernel tile_kernel_avx2_k_batch(GgmlType type);
constexpr int64_t kBatchTokens = 8;

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
