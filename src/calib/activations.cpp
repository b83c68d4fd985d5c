#include "activations.h"

#include <algorithm>
#include <cmath>

namespace cisa::calib {

QueryRecorder::QueryRecorder(const ModelHparams& hp, std::span<const int64_t> q_positions,
                             std::span<const int64_t> index_positions)
    : n_head_(hp.n_head), n_kv_(hp.n_head_kv), d_(hp.head_dim) {
  for (int64_t t : q_positions) q_slot_.emplace(t, q_slot_.size());
  for (int64_t t : index_positions) iq_slot_.emplace(t, iq_slot_.size());
  q_.resize(static_cast<size_t>(hp.n_layer));
  iq_.resize(static_cast<size_t>(hp.n_layer));
  for (int l = 0; l < hp.n_layer; ++l) {
    if (!hp.is_global(l)) continue;
    q_[static_cast<size_t>(l)].assign(q_slot_.size() * static_cast<size_t>(n_head_ * d_), 0.0f);
    iq_[static_cast<size_t>(l)].assign(iq_slot_.size() * static_cast<size_t>(n_kv_ * d_), 0.0f);
  }
}

AttentionTap QueryRecorder::tap() {
  return [this](const AttentionTapData& a) -> Status {
    const size_t l = static_cast<size_t>(a.layer);
    if (l >= q_.size() || (q_[l].empty() && !q_slot_.empty()) ||
        (iq_[l].empty() && !iq_slot_.empty()))
      return internal_error("attention tap called for layer " + std::to_string(a.layer) +
                            ", not a global layer");
    const size_t qw = static_cast<size_t>(n_head_ * d_), iw = static_cast<size_t>(n_kv_ * d_);
    for (size_t r = 0; r < a.positions.size(); ++r) {
      const int64_t t = a.positions[r];
      if (auto it = q_slot_.find(t); it != q_slot_.end())
        std::copy(a.q + r * qw, a.q + (r + 1) * qw,
                  q_[l].begin() + static_cast<std::ptrdiff_t>(it->second * qw));
      if (auto it = iq_slot_.find(t); it != iq_slot_.end())
        std::copy(a.index_q + r * iw, a.index_q + (r + 1) * iw,
                  iq_[l].begin() + static_cast<std::ptrdiff_t>(it->second * iw));
    }
    return Status::Ok();
  };
}

const float* QueryRecorder::q(int layer, int64_t t) const {
  auto it = q_slot_.find(t);
  if (it == q_slot_.end() || q_[static_cast<size_t>(layer)].empty()) return nullptr;
  return q_[static_cast<size_t>(layer)].data() + it->second * static_cast<size_t>(n_head_ * d_);
}

const float* QueryRecorder::index_q(int layer, int64_t t) const {
  auto it = iq_slot_.find(t);
  if (it == iq_slot_.end() || iq_[static_cast<size_t>(layer)].empty()) return nullptr;
  return iq_[static_cast<size_t>(layer)].data() + it->second * static_cast<size_t>(n_kv_ * d_);
}

std::vector<float> chunk_representatives(const PagedKvCache& cache, int layer,
                                         std::span<const int32_t> block_table, int kv_group,
                                         int64_t n_chunks) {
  const int d = cache.head_dim(), B = cache.page_size();
  std::vector<float> reps(static_cast<size_t>(n_chunks) * static_cast<size_t>(d));
  std::vector<double> acc(static_cast<size_t>(d));
  for (int64_t j = 0; j < n_chunks; ++j) {
    const auto* k = static_cast<const float*>(
        cache.k_page(layer, block_table[static_cast<size_t>(j)], kv_group));
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int s = 0; s < B; ++s)
      for (int i = 0; i < d; ++i) acc[static_cast<size_t>(i)] += k[s * d + i];
    for (int i = 0; i < d; ++i)
      reps[static_cast<size_t>(j * d + i)] = static_cast<float>(acc[static_cast<size_t>(i)] / B);
  }
  return reps;
}

std::vector<double> dense_chunk_mass(const PagedKvCache& cache, int layer,
                                     std::span<const int32_t> block_table, int kv_group,
                                     const float* q_heads, int n_heads, int64_t t, double scale) {
  const int d = cache.head_dim(), B = cache.page_size();
  const int64_t n = t + 1;
  std::vector<double> mass(static_cast<size_t>(t / B + 1), 0.0), logit(static_cast<size_t>(n));
  for (int h = 0; h < n_heads; ++h) {
    const float* q = q_heads + static_cast<size_t>(h) * static_cast<size_t>(d);
    double mx = -INFINITY;
    for (int64_t s = 0; s < n; ++s) {
      const auto* page = static_cast<const float*>(
          cache.k_page(layer, block_table[static_cast<size_t>(s / B)], kv_group));
      const float* k = page + (s % B) * d;
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += static_cast<double>(q[i]) * k[i];
      logit[static_cast<size_t>(s)] = scale * dot;
      mx = std::max(mx, logit[static_cast<size_t>(s)]);
    }
    double z = 0;
    for (int64_t s = 0; s < n; ++s) z += std::exp(logit[static_cast<size_t>(s)] - mx);
    for (int64_t s = 0; s < n; ++s)
      mass[static_cast<size_t>(s / B)] += std::exp(logit[static_cast<size_t>(s)] - mx) / z;
  }
  return mass;
}

}  // namespace cisa::calib
