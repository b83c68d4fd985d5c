// Token sampling (see cisa/sampling.h for the order of the filters).
#include "cisa/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace cisa {
namespace {

bool greedy(const SamplingParams& p) {
  return p.greedy || p.temperature == 0.0f;
}

// Larger logit first, then the smaller id; NaN last.
struct ByLogit {
  std::span<const float> l;
  bool operator()(int32_t a, int32_t b) const {
    const float x = l[static_cast<size_t>(a)], y = l[static_cast<size_t>(b)];
    const bool nx = std::isnan(x), ny = std::isnan(y);
    if (nx != ny) return ny;
    if (!nx && x != y) return x > y;
    return a < b;
  }
};

}  // namespace

Status validate_sampling_params(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    return invalid_argument("temperature must be a finite number >= 0 (got " +
                            std::to_string(p.temperature) + ")");
  if (p.top_k < 0)
    return invalid_argument("top-k must be >= 0 (got " + std::to_string(p.top_k) + ")");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    return invalid_argument("top-p must be in (0, 1] (got " + std::to_string(p.top_p) + ")");
  return Status::Ok();
}

int32_t argmax(std::span<const float> logits) {
  int32_t best = -1;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    if (std::isnan(v)) continue;
    if (best < 0 || v > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  }
  if (best < 0 && !logits.empty()) best = 0;  // all NaN
  return best;
}

Status sampling_distribution(std::span<const float> logits, const SamplingParams& p,
                             std::vector<std::pair<int32_t, double>>* out) {
  CISA_RETURN_IF_ERROR(validate_sampling_params(p));
  out->clear();
  const int64_t n = static_cast<int64_t>(logits.size());
  if (n == 0) return invalid_argument("sampling: empty logits");
  if (greedy(p)) {
    out->push_back({argmax(logits), 1.0});
    return Status::Ok();
  }
  // Top-k (or every finite logit) in descending order.
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t k = p.top_k > 0 ? std::min<int64_t>(p.top_k, n) : n;
  ByLogit by{logits};
  if (k < n) {
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by);
    idx.resize(static_cast<size_t>(k));
  } else {
    std::sort(idx.begin(), idx.end(), by);
  }
  while (!idx.empty() && !std::isfinite(logits[static_cast<size_t>(idx.back())])) idx.pop_back();
  if (idx.empty()) {
    out->push_back({argmax(logits), 1.0});
    return Status::Ok();
  }
  // Softmax of logits / T, in double.
  const double inv_t = 1.0 / static_cast<double>(p.temperature);
  const double mx = static_cast<double>(logits[static_cast<size_t>(idx[0])]) * inv_t;
  double z = 0.0;
  out->reserve(idx.size());
  for (int32_t i : idx) {
    const double e = std::exp(static_cast<double>(logits[static_cast<size_t>(i)]) * inv_t - mx);
    out->push_back({i, e});
    z += e;
  }
  for (auto& pr : *out) pr.second /= z;
  // Top-p: the shortest prefix whose mass reaches p.
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    size_t keep = out->size();
    for (size_t i = 0; i < out->size(); ++i) {
      cum += (*out)[i].second;
      if (cum >= static_cast<double>(p.top_p)) {
        keep = i + 1;
        break;
      }
    }
    out->resize(keep);
    double s = 0.0;
    for (auto& pr : *out) s += pr.second;
    for (auto& pr : *out) pr.second /= s;
  }
  return Status::Ok();
}

Sampler::Sampler(const SamplingParams& p)
    : p_(p), state_(p.seed * 6364136223846793005ULL + 1442695040888963407ULL) {}

Result<Sampler> Sampler::create(const SamplingParams& p) {
  CISA_RETURN_IF_ERROR(validate_sampling_params(p));
  return Sampler(p);
}

double Sampler::next_uniform() {
  // SplitMix64: a fixed, platform-independent sequence; the top 53 bits make the double.
  state_ += 0x9E3779B97F4A7C15ULL;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);
}

// Sorting the whole vocabulary for every draw took 3-15 ms per row at 49K-152K logits, longer than
// a whole decode step of a small model on the GPU (16 sampled requests made a server step ~10x
// slower than greedy ones). The head: the best m tokens by one pass over a heap of m.
int32_t Sampler::sample_head(std::span<const float> logits, double u) {
  constexpr int64_t kSampleHead = 64;
  const auto n = static_cast<int64_t>(logits.size());
  const int64_t k = p_.top_k > 0 ? std::min<int64_t>(p_.top_k, n) : n;
  if (k > kSampleHead && k < n) return -1;  // a top-k past the head: the whole distribution
  const int64_t m = std::min(k, kSampleHead);
  const ByLogit by{logits};
  head_.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(logits[static_cast<size_t>(i)])) return -1;
    const auto t = static_cast<int32_t>(i);
    if (static_cast<int64_t>(head_.size()) < m) {
      head_.push_back(t);
      std::push_heap(head_.begin(), head_.end(), by);  // front: the head's last in order
    } else if (by(t, head_.front())) {
      std::pop_heap(head_.begin(), head_.end(), by);
      head_.back() = t;
      std::push_heap(head_.begin(), head_.end(), by);
    }
  }
  std::sort_heap(head_.begin(), head_.end(), by);  // descending logit, ties to the smaller id
  // Softmax of logits / T in double, as sampling_distribution computes it.
  const double inv_t = 1.0 / static_cast<double>(p_.temperature);
  const double mx = static_cast<double>(logits[static_cast<size_t>(head_[0])]) * inv_t;
  const auto e = [&](int32_t i) {
    return std::exp(static_cast<double>(logits[static_cast<size_t>(i)]) * inv_t - mx);
  };
  head_e_.clear();
  double z = 0.0;
  for (int32_t i : head_) {
    head_e_.push_back(e(i));
    if (k == m) z += head_e_.back();  // the kept tokens are the head: the same sum, same order
  }
  if (k > m)
    for (int64_t i = 0; i < n; ++i) z += e(static_cast<int32_t>(i));
  for (double& v : head_e_) v /= z;
  size_t keep = head_.size();
  if (p_.top_p < 1.0f) {
    size_t j = 0;
    for (double cum = 0.0; j < head_e_.size(); ++j) {
      cum += head_e_[j];
      if (cum >= static_cast<double>(p_.top_p)) break;
    }
    if (j == head_e_.size() && k > m) return -1;  // the top-p prefix is longer than the head
    keep = std::min(j + 1, head_e_.size());
    double s = 0.0;
    for (size_t i = 0; i < keep; ++i) s += head_e_[i];
    for (size_t i = 0; i < keep; ++i) head_e_[i] /= s;
  }
  double cum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cum += head_e_[i];
    if (u < cum) return head_[i];
  }
  return k > m && keep == head_.size() && p_.top_p >= 1.0f ? -1 : head_[keep - 1];
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (logits.empty()) return -1;
  if (greedy(p_)) return argmax(logits);
  const double u = next_uniform();
  if (const int32_t t = sample_head(logits, u); t >= 0) return t;
  if (!sampling_distribution(logits, p_, &dist_).ok() || dist_.empty()) return argmax(logits);
  double cum = 0.0;
  for (const auto& pr : dist_) {
    cum += pr.second;
    if (u < cum) return pr.first;
  }
  return dist_.back().first;
}

}  // namespace cisa
