// cisa/cpu/attention.h — exact attention over page lists (SPEC §5), the same code for dense and
// CISA.
//
// For each query group and KV group, every query head of that group attends, with its own query,
// to the tokens of the listed physical pages, read in place (no gather), under the causal mask by
// absolute position (s ≤ t) and, with sliding_window > 0, t − window < s. Online softmax in f32;
// bf16 K/V are widened page by page as they are read.
//
//   cisa::AttentionWorkspace ws;                      // reused across calls: no per-step
//   allocation cisa::AttentionParams ap{.scale = 1.0f / std::sqrt(128.0f)};
//   CISA_RETURN_IF_ERROR(cisa::attend(*cache, layer, batch, lists, q, num_q_heads, ap,
//                                     out, lse, pool, &ws));
//   // q, out: [rows][num_q_heads][head_dim] f32; lse: [rows][num_q_heads] (natural log of the
//   //         softmax denominator of the scaled scores) or nullptr.
//
// Query head h belongs to KV group h / (num_q_heads / num_kv_heads).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cisa/core/batch.h"
#include "cisa/core/status.h"
#include "cisa/core/thread_pool.h"
#include "cisa/cpu/kv_cache.h"

namespace cisa {

struct AttentionParams {
  float scale = 0.0f;          // multiplies q·k; 0 means 1/√head_dim
  int64_t sliding_window = 0;  // 0: none
};

namespace detail {
// One unit of attention work: a row tile of one page list over a range of its pages, or of
// `groups` consecutive lists (every KV group of one query group) that hold the same pages, walked
// together so that each page's blocks of all KV groups, adjacent in the pool, are read in order.
struct AttentionTask {
  int64_t list;          // query group · num_kv_heads + kv group (the first, when groups > 1)
  int32_t row0, rows;    // rows [row0, row0 + rows) of each list (row = position · h_g + head)
  int64_t page0, page1;  // pages [page0, page1) of the list(s)
  int64_t partial;       // −1: writes the output; else first row of its split-KV partial slot
  int32_t groups = 1;    // lists covered; its rows are list-major: groups × rows in all
};
}  // namespace detail

// Per-thread scratch and split-KV partial results. Grows on first use and is then reused.
class AttentionWorkspace {
 public:
  AttentionWorkspace() = default;
  // Bytes currently held (for memory accounting).
  int64_t bytes() const;

 private:
  friend struct AttentionRunner;
  std::vector<std::vector<float>> thread_scratch_;
  std::vector<float> partial_out_;  // [tasks][rows][head_dim]
  std::vector<float> partial_lse_;  // [tasks][rows]
  std::vector<detail::AttentionTask> tasks_;
  std::vector<size_t> merge_heads_;
  std::vector<uint8_t> grouped_;  // per query group: one task walks all its KV groups' lists
  std::vector<int64_t> row_offsets_, row_group_;  // validation scratch
};

Status attend(const PagedKvCache& cache, int layer, std::span<const BatchEntry> batch,
              const PageLists& lists, const float* q, int num_q_heads, const AttentionParams& p,
              float* out, float* lse, ThreadPool& pool, AttentionWorkspace* ws);

}  // namespace cisa
