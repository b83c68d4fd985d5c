// activations.h — what calibration and diagnostics read from a dense forward pass: the queries
// of chosen positions (recorded by an attention tap during forward()) and, from the KV cache once
// the pass is over, chunk representatives and the dense attention mass per chunk. Not public.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "cisa/cpu/kv_cache.h"
#include "cisa/model/model.h"

namespace cisa::calib {

// Copies, for every global layer, the queries (all heads, after post-processing) at `q_positions`
// and the index queries (all KV groups) at `index_positions` of one sequence.
class QueryRecorder {
 public:
  QueryRecorder(const ModelHparams& hp, std::span<const int64_t> q_positions,
                std::span<const int64_t> index_positions);
  AttentionTap tap();
  // [n_head][head_dim] / [n_head_kv][head_dim], or nullptr when that position was not recorded.
  const float* q(int layer, int64_t t) const;
  const float* index_q(int layer, int64_t t) const;

 private:
  int n_head_, n_kv_, d_;
  std::unordered_map<int64_t, size_t> q_slot_, iq_slot_;
  std::vector<std::vector<float>> q_, iq_;  // [layer][slot · width]
};

// r_{g,j} = mean of chunk j's stored keys (f32 cache), j < n_chunks: [n_chunks][head_dim].
std::vector<float> chunk_representatives(const PagedKvCache& cache, int layer,
                                         std::span<const int32_t> block_table, int kv_group,
                                         int64_t n_chunks);

// Dense attention of the query heads q_heads ([n_heads][head_dim]) at position t over keys
// 0 … t of one KV group, softmax(scale · q·k) in double per head, summed over the heads per chunk:
// [c(t) + 1] values (the last chunk may be partial), total = n_heads.
std::vector<double> dense_chunk_mass(const PagedKvCache& cache, int layer,
                                     std::span<const int32_t> block_table, int kv_group,
                                     const float* q_heads, int n_heads, int64_t t, double scale);

}  // namespace cisa::calib
