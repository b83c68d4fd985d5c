// Running one example on a model: greedy generation for the tasks, and next-token
// log-likelihood (with KL against the dense run) for long documents.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "cisa/model/eval.h"
#include "cisa/model/generate.h"

namespace cisa::eval {
namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// log-softmax of one row in double (max-shifted), stored as float.
void log_softmax(const float* logits, int64_t n, float* out) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(logits[i]) - mx);
  const double lz = mx + std::log(s);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<double>(logits[i]) - lz);
}

int64_t argmax_row(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace

Status generate_greedy_batch(Model& model, std::span<const GreedyPrompt> prompts,
                             const GreedyDoneFn& done, const ProgressFn& progress) {
  for (const GreedyPrompt& p : prompts) {
    if (p.prompt.empty()) return invalid_argument("empty prompt");
    if (p.max_new < 1)
      return invalid_argument("max_new must be >= 1 (got " + std::to_string(p.max_new) + ")");
  }
  struct State {
    Generation g;
    bool started = false;  // non-space text generated
  };
  std::vector<State> st(prompts.size());
  Status failed = Status::Ok();  // the first error of a request or of `done`
  GenerationCallbacks cb;
  cb.on_prefill_progress = progress;
  // Stop at a line break once the answer has begun (base models continue with new text): the
  // text keeps what precedes the break, and the token holding it counts.
  cb.on_token = [&](const GeneratedToken& t) {
    State& s = st[t.request];
    const size_t nl = t.text.find('\n');
    if (nl != std::string_view::npos && s.started) {
      s.g.text += t.text.substr(0, nl);
      return false;
    }
    s.g.text += t.text;
    for (char c : t.text) s.started = s.started || !std::isspace(static_cast<unsigned char>(c));
    return true;
  };
  cb.on_finish = [&](size_t i, const GenerationResult& r, std::string_view tail) {
    if (r.finish == FinishReason::kError) {
      if (failed.ok()) failed = r.error;
      return;
    }
    Generation& g = st[i].g;
    g.text += tail;
    // End-of-generation tokens are not counted.
    g.tokens = static_cast<int64_t>(r.tokens.size()) - (r.finish == FinishReason::kEos ? 1 : 0);
    g.stats.tokens = r.prompt_tokens + static_cast<int64_t>(r.tokens.size());
    g.stats.global_pages_read = r.traffic.global_pages_read;
    g.stats.global_pages_dense = r.traffic.global_pages_dense;
    g.seconds = r.timings.prefill_seconds + r.timings.decode_seconds;
    if (failed.ok()) failed = done(i, g);
  };
  Generator gen(model, cb);
  for (const GreedyPrompt& p : prompts) {
    GenerationRequest req{.prompt = {p.prompt.begin(), p.prompt.end()},
                          .max_tokens = p.max_new,
                          .sampling = {.greedy = true}};
    CISA_RETURN_IF_ERROR(gen.add(std::move(req)).status());
  }
  while (!gen.done() && failed.ok()) {
    if (Status s = gen.step(); !s.ok()) return s;
  }
  if (!failed.ok()) gen.abort(failed);
  return failed;
}

Result<DocumentScores> score_document(Model& model, std::span<const int32_t> ids, int64_t tail,
                                      const std::vector<float>* reference, std::vector<float>* keep,
                                      const ProgressFn& progress, int64_t rows_per_call) {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (tail < 2 || tail > n)
    return invalid_argument("document tail " + std::to_string(tail) + " outside [2, " +
                            std::to_string(n) + "]");
  const int64_t V = model.hparams().n_vocab;
  const int64_t scored = tail - 1;
  if (reference && static_cast<int64_t>(reference->size()) != scored * V)
    return invalid_argument("reference log-probabilities have the wrong size");
  const auto t0 = std::chrono::steady_clock::now();
  model.reset_stats();
  CISA_ASSIGN_OR_RETURN(SeqId seq, model.add_sequence());
  DocumentScores d;
  if (keep) keep->assign(static_cast<size_t>(scored * V), 0.0f);
  std::vector<float> logits, lp(static_cast<size_t>(V));
  // The prefix without outputs, then the tail in slices whose logits fit in memory
  // (64 rows × 262,144 vocabulary × 4 bytes = 64 MiB for Gemma 3).
  const int64_t prefix = n - tail;
  Status st = Status::Ok();
  if (prefix > 0) {
    SequenceInput in{.seq = seq,
                     .tokens = ids.subspan(0, static_cast<size_t>(prefix)),
                     .outputs = OutputMode::kNone};
    st = model.forward({&in, 1}, &logits, progress);
  }
  if (rows_per_call < 1 || rows_per_call > 4096)
    return invalid_argument("document rows per call must be in [1, 4096] (got " +
                            std::to_string(rows_per_call) + ")");
  const int64_t kSlice = rows_per_call;
  for (int64_t r0 = 0; st.ok() && r0 < tail; r0 += kSlice) {
    const int64_t rows = std::min(kSlice, tail - r0);
    SequenceInput in{
        .seq = seq,
        .tokens = ids.subspan(static_cast<size_t>(prefix + r0), static_cast<size_t>(rows)),
        .outputs = OutputMode::kAll};
    st = model.forward({&in, 1}, &logits);
    if (!st.ok()) break;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r0 + r;  // tail row; predicts ids[prefix + i + 1]
      if (i >= scored) break;
      log_softmax(logits.data() + r * V, V, lp.data());
      const int32_t target = ids[static_cast<size_t>(prefix + i + 1)];
      d.nll.push_back(-static_cast<double>(lp[static_cast<size_t>(target)]));
      if (reference) {
        const float* ref = reference->data() + i * V;
        // KL(p_dense ‖ p_config) = Σ p_dense (log p_dense − log p_config).
        double kl = 0;
        for (int64_t v = 0; v < V; ++v) {
          const double lr = ref[v];
          if (lr > -80.0)
            kl += std::exp(lr) * (lr - static_cast<double>(lp[static_cast<size_t>(v)]));
        }
        d.kl.push_back(std::max(0.0, kl));
        d.agree.push_back(argmax_row(ref, V) == argmax_row(lp.data(), V) ? 1 : 0);
      }
      if (keep) std::copy(lp.begin(), lp.end(), keep->begin() + i * V);
    }
  }
  const Status rel = model.release_sequence(seq);
  CISA_RETURN_IF_ERROR(st);
  CISA_RETURN_IF_ERROR(rel);
  d.stats = model.stats();
  d.seconds = since(t0);
  return d;
}

}  // namespace cisa::eval
