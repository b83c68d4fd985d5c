// cisa/model/sampling.h — choosing the next token from a row of logits: greedy, or a seeded draw
// after temperature, top-k and top-p (nucleus) filtering.
//
//   CISA_ASSIGN_OR_RETURN(cisa::Sampler s, cisa::Sampler::create({.temperature = 0.8f, .top_k = 40,
//                                                                 .top_p = 0.95f, .seed = 7}));
//   int32_t next = s.sample(logits_row);          // std::span<const float> of n_vocab values
//
// The filters apply in Hugging Face's order: logits / T, keep the k largest (ties to the smaller
// id), softmax, keep the smallest prefix (by descending probability) whose mass reaches p,
// renormalise, draw. Greedy (or T = 0) is the argmax, ties to the smaller id. The generator is
// a fixed 64-bit PCG-style sequence, so one seed gives the same tokens on every platform.
//
// A draw walks the distribution in descending order and nearly always stops within its first
// tokens, so Sampler::sample() first finds the 64 best tokens in one pass and walks those; it
// builds the whole sorted distribution only when the walk goes past them (or a logit is not
// finite). With top-k <= 64 the arithmetic is sampling_distribution's exactly; without a top-k
// the softmax's normaliser is summed in token order rather than sorted order, which can move a
// draw only when u falls within rounding (~1e-16) of a boundary.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "cisa/core/status.h"

namespace cisa {

struct SamplingParams {
  bool greedy = false;
  float temperature = 1.0f;  // > 0; 0 means greedy
  int32_t top_k = 0;         // 0: no limit
  float top_p = 1.0f;        // in (0, 1]; 1: no limit
  uint64_t seed = 0;
};

Status validate_sampling_params(const SamplingParams& p);

// Index of the largest value (the smaller index on ties; NaN never wins). -1 for an empty span.
int32_t argmax(std::span<const float> logits);

// The distribution a non-greedy draw uses: (token, probability) pairs in descending probability
// (ties by smaller id), probabilities summing to 1. Probabilities are computed in double.
Status sampling_distribution(std::span<const float> logits, const SamplingParams& p,
                             std::vector<std::pair<int32_t, double>>* out);

class Sampler {
 public:
  static Result<Sampler> create(const SamplingParams& p);
  // The next token; -1 only for empty logits.
  int32_t sample(std::span<const float> logits);
  const SamplingParams& params() const { return p_; }
  // A uniform double in [0, 1) from the sampler's generator (exposed for tests).
  double next_uniform();

 private:
  explicit Sampler(const SamplingParams& p);
  // The draw u from the best kSampleHead tokens alone, or -1 when it needs more (sample.cpp).
  int32_t sample_head(std::span<const float> logits, double u);
  SamplingParams p_;
  uint64_t state_;
  std::vector<std::pair<int32_t, double>> dist_;
  std::vector<int32_t> head_;
  std::vector<double> head_e_;
};

}  // namespace cisa
