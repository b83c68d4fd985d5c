// Two engines' next-token distributions compared row by row: top-1 agreement and KL(ref ‖ got)
// over the whole vocabulary, in double, the CISA settings those comparisons run, and a model's
// logits at a fixture prompt's positions. Shared by the GPU golden test and
// bench/reference_spread.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>

#include "cisa/core/plan.h"
#include "cisa/model/model.h"
#include "cisa/model/sampling.h"
#include "golden/logits_fixture.h"

namespace cisa {

struct LogitsCompare {
  int64_t n = 0, top1_same = 0;
  double kl_sum = 0, kl_max = 0;

  double top1() const { return n ? static_cast<double>(top1_same) / n : 0; }
  double kl_mean() const { return n ? kl_sum / n : 0; }
  void add(const LogitsCompare& o) {
    n += o.n;
    top1_same += o.top1_same;
    kl_sum += o.kl_sum;
    kl_max = std::max(kl_max, o.kl_max);
  }
};

// The CISA selection of the golden comparisons for a model trained at n_ctx_train tokens: the
// CLI's defaults (README: k = n/256, W = n/1024, G 16) with k and W shrunk 4x, so that the 2,000-
// and 8,000-token golden prompts run mostly sparse.
inline SelectionParams golden_cisa_selection(int64_t n_ctx_train) {
  return {.budget = std::max<int64_t>(16, n_ctx_train / 1024),
          .window = std::max<int64_t>(4, n_ctx_train / 4096),
          .qshare = 16};
}

// KL(p ‖ q) of the softmax of two logit rows of V entries, and whether their argmax agree.
inline void compare_rows(const float* ref, const float* got, int V, LogitsCompare* c) {
  auto lse = [V](const float* x) {
    double m = -INFINITY;
    for (int i = 0; i < V; ++i) m = std::max(m, static_cast<double>(x[i]));
    double z = 0;
    for (int i = 0; i < V; ++i) z += std::exp(x[i] - m);
    return m + std::log(z);
  };
  const double lr = lse(ref), lg = lse(got);
  double kl = 0;
  for (int i = 0; i < V; ++i) {
    const double lp = ref[i] - lr, lq = got[i] - lg;
    kl += std::exp(lp) * (lp - lq);
  }
  c->n += 1;
  c->top1_same += argmax(std::span<const float>(ref, static_cast<size_t>(V))) ==
                  argmax(std::span<const float>(got, static_cast<size_t>(V)));
  c->kl_sum += kl;
  c->kl_max = std::max(c->kl_max, kl);
}

// The logits `m` gives at the stored positions of fixture prompt `p`, [positions][n_vocab], from
// a sequence added for the prompt and released after it.
inline Status fixture_logits(Model& m, const FixturePrompt& p, std::vector<float>* out) {
  CISA_ASSIGN_OR_RETURN(SeqId seq, m.add_sequence());
  const std::vector<int64_t> pos(p.positions.begin(), p.positions.end());
  SequenceInput in{
      .seq = seq, .tokens = p.ids, .outputs = OutputMode::kPositions, .positions = pos};
  const Status s = m.forward({&in, 1}, out);
  const Status released = m.release_sequence(seq);
  return s.ok() ? released : s;
}

}  // namespace cisa
