// Running a tiny random llama (tiny_llama_builder.h) in tests of the model's attention options:
// write one to a temporary GGUF, the CISA options the tests share, and one run of a prompt
// (logits at a few prompt positions, then greedy tokens).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cisa/core/status.h"
#include "cisa/model/model.h"
#include "cisa/model/sampling.h"
#include "tiny_llama_builder.h"

namespace cisa::testing {

// A TinyLlama of `n_layer` layers with weights from `seed`, written under the test's temporary
// directory as `name` (the process id in front, so parallel test processes do not collide).
inline std::string tiny_model(const char* name, uint64_t seed, int n_layer = 2) {
  TinyLlama m;
  m.n_layer = n_layer;
  m.randomize(seed, 0.5f);
  return m.write(::testing::TempDir() + "/" + std::to_string(::getpid()) + "_" + name);
}

// CISA with budget k, W = 3 pages, G = 4 and one sink page.
inline AttentionOptions cisa_options(int64_t budget) {
  AttentionOptions a;
  a.mode = AttentionMode::kCisa;
  a.selection = {.budget = budget, .window = 3, .qshare = 4, .sink_pages = 1};
  return a;
}

struct RunResult {
  std::vector<float> logits;  // prompt logits at every 23rd position and the last
  std::vector<int32_t> generated;
  ForwardStats stats;
};

// Prompt logits at every 23rd position and the last, then greedy generation of `gen` tokens.
inline Result<RunResult> run(const std::string& path, const AttentionOptions& a,
                             const std::vector<int32_t>& prompt, int gen,
                             const AttentionTap& tap = {}) {
  ModelOptions o{.threads = 2, .context = 1024, .prefill_block = 128};
  o.attention = a;
  CISA_ASSIGN_OR_RETURN(auto m, Model::load(path, o));
  if (tap) m->set_attention_tap(tap);
  CISA_ASSIGN_OR_RETURN(SeqId s, m->add_sequence());
  std::vector<int64_t> pos;
  for (int64_t p = 0; p < static_cast<int64_t>(prompt.size()); p += 23) pos.push_back(p);
  pos.push_back(static_cast<int64_t>(prompt.size()) - 1);
  RunResult r;
  SequenceInput in{.seq = s, .tokens = prompt, .outputs = OutputMode::kPositions, .positions = pos};
  CISA_RETURN_IF_ERROR(m->forward({&in, 1}, &r.logits));
  const int V = m->hparams().n_vocab;
  std::vector<float> last(r.logits.end() - V, r.logits.end());
  for (int i = 0; i < gen; ++i) {
    r.generated.push_back(argmax(last));
    SequenceInput one{.seq = s, .tokens = {&r.generated.back(), 1}};
    CISA_RETURN_IF_ERROR(m->forward({&one, 1}, &last));
  }
  r.stats = m->stats();
  return r;
}

}  // namespace cisa::testing
