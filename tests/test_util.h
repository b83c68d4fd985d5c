// Shared helpers of the core tests: random caches and an fp64 brute-force attention reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "cisa/core/bf16.h"
#include "cisa/cpu/attention.h"
#include "cisa/cpu/kv_cache.h"

namespace cisa::test {

// n token ids in [0, vocab), from seed.
inline std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return t;
}

inline std::vector<float> random_vec(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Reads one stored key or value element back as f32 (what attention actually sees).
inline float stored(const PagedKvCache& c, bool key, int layer, SeqId seq, int64_t pos, int g,
                    int i) {
  auto table = *c.block_table(seq);
  const int32_t page = table[static_cast<size_t>(pos / c.page_size())];
  const void* p = key ? c.k_page(layer, page, g) : c.v_page(layer, page, g);
  const int64_t off = (pos % c.page_size()) * c.head_dim() + i;
  return c.config().dtype == KvDtype::kF32 ? static_cast<const float*>(p)[off]
                                           : bf16_to_f32(static_cast<const uint16_t*>(p)[off]);
}

// Reads value w of one page's representative (layer, page, KV group) back as f32.
inline float stored_rep(const PagedKvCache& c, int layer, int32_t page, int g, int w) {
  const void* r = c.rep(layer, page, g);
  return c.config().dtype == KvDtype::kF32 ? static_cast<const float*>(r)[w]
                                           : bf16_to_f32(static_cast<const uint16_t*>(r)[w]);
}

// Appends `n` random tokens to `seq` in every layer; returns nothing, asserts success.
inline void append_random(PagedKvCache& c, SeqId seq, int64_t n, std::mt19937& rng,
                          float scale = 1.0f) {
  ASSERT_TRUE(c.reserve(seq, n).ok());
  const size_t row = static_cast<size_t>(c.num_kv_heads() * c.head_dim());
  for (int l = 0; l < c.num_layers(); ++l) {
    auto k = random_vec(rng, static_cast<size_t>(n) * row, scale);
    auto v = random_vec(rng, static_cast<size_t>(n) * row);
    ASSERT_TRUE(c.append(l, seq, n, k.data(), v.data()).ok());
  }
}

// Appends lens[i] random tokens to seqs[i], round-robin in blocks of 1 … max_block tokens, so the
// sequences' physical pages interleave in the pool.
inline void append_interleaved(PagedKvCache& c, const std::vector<SeqId>& seqs,
                               const std::vector<int64_t>& lens, int64_t max_block,
                               std::mt19937& rng) {
  std::vector<int64_t> done(lens.size(), 0);
  for (bool more = true; more;) {
    more = false;
    for (size_t i = 0; i < lens.size(); ++i) {
      if (done[i] == lens[i]) continue;
      const int64_t n =
          std::min<int64_t>(lens[i] - done[i], 1 + static_cast<int64_t>(rng() % max_block));
      append_random(c, seqs[i], n, rng);
      done[i] += n;
      more = true;
    }
  }
}

// fp64 attention of one query head over an explicit set of key positions.
// Returns the output (head_dim values) and writes the log-sum-exp.
inline std::vector<double> reference_attention(const PagedKvCache& c, int layer, SeqId seq, int g,
                                               const float* q,
                                               const std::vector<int64_t>& positions, double scale,
                                               double* lse) {
  const int d = c.head_dim();
  auto table = *c.block_table(seq);
  // One stored row (head_dim values) of K or V, widened to double.
  auto row = [&](bool key, int64_t pos, std::vector<double>& out_row) {
    const int32_t page = table[static_cast<size_t>(pos / c.page_size())];
    const void* p = key ? c.k_page(layer, page, g) : c.v_page(layer, page, g);
    const int64_t off = (pos % c.page_size()) * d;
    for (int i = 0; i < d; ++i)
      out_row[static_cast<size_t>(i)] = c.config().dtype == KvDtype::kF32
                                            ? static_cast<const float*>(p)[off + i]
                                            : bf16_to_f32(static_cast<const uint16_t*>(p)[off + i]);
  };
  std::vector<double> r(static_cast<size_t>(d));
  std::vector<double> s(positions.size());
  double mx = -INFINITY;
  for (size_t i = 0; i < positions.size(); ++i) {
    row(true, positions[i], r);
    double acc = 0;
    for (int k = 0; k < d; ++k) acc += static_cast<double>(q[k]) * r[static_cast<size_t>(k)];
    s[i] = acc * scale;
    mx = std::max(mx, s[i]);
  }
  double sum = 0;
  for (auto& x : s) sum += (x = std::exp(x - mx));
  std::vector<double> out(static_cast<size_t>(d), 0.0);
  for (size_t i = 0; i < positions.size(); ++i) {
    row(false, positions[i], r);
    for (int k = 0; k < d; ++k)
      out[static_cast<size_t>(k)] += s[i] / sum * r[static_cast<size_t>(k)];
  }
  if (lse) *lse = mx + std::log(sum);
  return out;
}

// Key positions a query at t sees through a list of logical chunks (causal, optional window).
inline std::vector<int64_t> visible_positions(std::span<const int32_t> chunks, int page_size,
                                              int64_t t, int64_t window = 0) {
  std::vector<int64_t> pos;
  for (int32_t j : chunks)
    for (int64_t s = static_cast<int64_t>(j) * page_size;
         s < (j + 1) * static_cast<int64_t>(page_size); ++s)
      if (s <= t && (window == 0 || s > t - window)) pos.push_back(s);
  return pos;
}

}  // namespace cisa::test
