// cisa/cpu/attention_llamacpp.h — attention over page lists with llama.cpp's CPU numerics
// (conformance).
//
// The same function as attend() (attention.h): every query head attends to the tokens of its
// list's pages, read in place, under the causal mask by absolute position and an optional sliding
// window. The arithmetic instead follows llama.cpp's CPU build with an f16 KV cache and no flash
// attention, step by step, so that a model run through it can reproduce llama.cpp's logits to the
// last bit (tests/golden):
//  - K, V and the query are rounded to IEEE half; with `scale_queries` the query is multiplied by
//    the scale in f32 before its rounding (llama.cpp's Gemma graphs), else the f16 dot product is;
//  - q·k and p·v are accumulated in 16 fused multiply-add lanes (lane = dimension mod 16 for q·k,
//    absolute key position mod 16 for p·v), then the lanes are added in a fixed tree (llama.cpp's
//    matrix kernel, used for batches of two or more rows); when the whole batch is one row (a
//    decode step), in 4 × 16 lanes instead (index mod 64), added pairwise, then the same tree
//    (llama.cpp's one-column dot product, ggml_vec_dot_f16);
//  - the softmax spans the whole row: one max, exp by llama.cpp's polynomial, the denominator
//  summed
//    in fp64 over aligned 16-position blocks (each block's lanes added by the same tree), and the
//    probabilities multiplied by the f32 reciprocal of the sum and rounded to half.
// It is scalar code the compiler vectorises, a few times slower than attend(); use it for checks.
//
//   cisa::LlamaCppAttentionParams lp{.scale = 1.0f / 16, .sliding_window = 512,
//                                    .scale_queries = true};
//   CISA_RETURN_IF_ERROR(cisa::attend_llamacpp(*cache, layer, batch, lists, q, num_q_heads, lp,
//                                              out, pool));   // q, out: [rows][heads][head_dim]
#pragma once

#include <cstdint>
#include <span>

#include "cisa/core/batch.h"
#include "cisa/core/status.h"
#include "cisa/core/thread_pool.h"
#include "cisa/cpu/kv_cache.h"

namespace cisa {

struct LlamaCppAttentionParams {
  float scale = 0.0f;          // multiplies q·k; 0 means 1/√head_dim
  int64_t sliding_window = 0;  // 0: none
  bool scale_queries =
      false;  // scale the f32 query before rounding it (instead of the dot product)
};

// Errors: validate_batch's for the batch; kInvalidArgument when the head counts do not match the
// cache, or the lists are malformed, name a page the query's sequence does not own, or do not
// cover every query row exactly once.
Status attend_llamacpp(const PagedKvCache& cache, int layer, std::span<const BatchEntry> batch,
                       const PageLists& lists, const float* q, int num_q_heads,
                       const LlamaCppAttentionParams& p, float* out, ThreadPool& pool);

namespace llamacpp {
// The building blocks, exposed for the unit tests.
float round_f16(float x);              // nearest IEEE half (ties to even), as a float
float exp(float x);                    // llama.cpp's vectorised expf, one lane
float tree_sum16(const float* lanes);  // the fixed addition tree over 16 lanes
float dot16(const float* a, const float* b,
            int n);  // 16 fma lanes (lane = i mod 16), then the tree
// 4 accumulators of 16 fma lanes (element i: accumulator i / 16 mod 4, lane i mod 16) over the
// whole 64-element chunks, (s0 + s2) + (s1 + s3), the tree; the n mod 64 tail added in fp64.
float dot64x4(const float* a, const float* b, int n);
}  // namespace llamacpp

}  // namespace cisa
