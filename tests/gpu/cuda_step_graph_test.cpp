// Decode steps replayed from CUDA graphs (BackendOptions::step_graphs, Backend::begin_step) against
// the same steps launched kernel by kernel, on one CUDA backend (so both use the same GEMM
// algorithms): greedy tokens and logits must be equal bit for bit, dense and CISA, over many
// steps of sequences of different lengths that cross page boundaries (filled pages update their
// representatives), with a sequence released midway (a new batch shape). Qwen2.5-7B's shape with
// random weights; skips without a GPU.
#include <gtest/gtest.h>

#if defined(CISA_WITH_CUDA_MODEL)
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cisa/core/backend.h"
#include "cisa/cuda/model_backend.h"
#include "cisa/model/model.h"
#include "gpu/cuda_backend_test_util.h"

namespace cisa::test {
namespace {

constexpr int kSequences = 4;
constexpr int kSteps = 44;
constexpr int kReleaseAt = 20;  // sequence 1 finishes after this step

struct Trace {
  std::vector<int32_t> ids;   // every step's greedy token of every row, in order
  std::vector<float> logits;  // every step's logits rows, in order
  StepGraphStats graphs;      // the backend's counts over this trace
};

// Prefill of four prompts of different lengths, then kSteps greedy decode steps with logits.
Status decode_trace(Model& m, bool graphs, const StepAttention* attention, Trace* out) {
  CISA_RETURN_IF_ERROR(cuda::set_step_graphs(m.backend(), graphs));
  const StepGraphStats before = m.backend().step_graph_stats();
  const int V = m.hparams().n_vocab;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(0, V - 1);
  const int lengths[kSequences] = {37, 100, 181, 263};
  std::vector<std::vector<int32_t>> tokens(kSequences);
  std::vector<SequenceInput> in;
  for (int s = 0; s < kSequences; ++s) {
    for (int i = 0; i < lengths[s]; ++i) tokens[static_cast<size_t>(s)].push_back(tok(rng));
    CISA_ASSIGN_OR_RETURN(SeqId seq, m.add_sequence());
    in.push_back({.seq = seq, .tokens = tokens[static_cast<size_t>(s)]});
  }
  std::vector<int32_t> ids;
  std::vector<float> logits;
  CISA_RETURN_IF_ERROR(m.forward(in, ForwardOutputs{.argmax = &ids}, {}, attention));
  out->ids.insert(out->ids.end(), ids.begin(), ids.end());
  for (int step = 0; step < kSteps; ++step) {
    for (size_t r = 0; r < in.size(); ++r) {
      tokens[r] = {ids[r]};
      in[r].tokens = tokens[r];
    }
    CISA_RETURN_IF_ERROR(
        m.forward(in, ForwardOutputs{.logits = &logits, .argmax = &ids}, {}, attention));
    out->ids.insert(out->ids.end(), ids.begin(), ids.end());
    out->logits.insert(out->logits.end(), logits.begin(), logits.end());
    if (step == kReleaseAt) {
      CISA_RETURN_IF_ERROR(m.release_sequence(in[1].seq));
      in.erase(in.begin() + 1);
      tokens.erase(tokens.begin() + 1);
      ids.erase(ids.begin() + 1);
    }
  }
  for (const SequenceInput& i : in) CISA_RETURN_IF_ERROR(m.release_sequence(i.seq));
  const StepGraphStats after = m.backend().step_graph_stats();
  out->graphs = after;
  out->graphs.eager = after.eager - before.eager;
  out->graphs.captured = after.captured - before.captured;
  out->graphs.replayed = after.replayed - before.replayed;
  return Status::Ok();
}

void expect_same_traces(Model& m, const StepAttention* attention, const char* what) {
  Trace eager, graphs;
  ASSERT_TRUE(decode_trace(m, false, attention, &eager).ok());
  const Status s = decode_trace(m, true, attention, &graphs);
  ASSERT_TRUE(s.ok()) << s.to_string();
  std::printf(
      "%s: graphs off: %lld eager steps; graphs on: %lld eager, %lld captured, %lld "
      "replayed steps\n",
      what, static_cast<long long>(eager.graphs.eager), static_cast<long long>(graphs.graphs.eager),
      static_cast<long long>(graphs.graphs.captured),
      static_cast<long long>(graphs.graphs.replayed));
  EXPECT_EQ(eager.graphs.captured + eager.graphs.replayed, 0);
  // The test means something only if most decode steps were replayed.
  EXPECT_GT(graphs.graphs.captured, 0);
  EXPECT_GE(graphs.graphs.replayed, kSteps / 4);
  ASSERT_EQ(eager.ids.size(), graphs.ids.size());
  size_t id_diffs = 0;
  for (size_t i = 0; i < eager.ids.size(); ++i) id_diffs += eager.ids[i] != graphs.ids[i];
  EXPECT_EQ(id_diffs, 0u) << what << ": greedy tokens differ";
  ASSERT_EQ(eager.logits.size(), graphs.logits.size());
  size_t first = eager.logits.size();
  for (size_t i = 0; i < eager.logits.size() && first == eager.logits.size(); ++i)
    if (std::memcmp(&eager.logits[i], &graphs.logits[i], sizeof(float)) != 0) first = i;
  EXPECT_EQ(first, eager.logits.size())
      << what << ": logits differ first at value " << first << " (" << eager.logits[first]
      << " launched, " << graphs.logits[first] << " replayed)";
}

std::unique_ptr<Model> load(const SelectionParams& selection) {
  ModelOptions o{.context = 512, .max_sequences = kSequences, .kv_dtype = KvDtype::kBF16};
  o.attention.mode = AttentionMode::kCisa;
  o.attention.selection = selection;
  o.backend = cuda::make_model_backend;
  auto m = Model::load_synthetic("qwen2.5-7b", o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(*m) : nullptr;
}

TEST(CudaStepGraphs, ReplayedDecodeEqualsLaunchedDenseAndCisa) {
  CISA_REQUIRE_GPU();
  // k = 4 chunks, W = 2 pages: the longer sequences select from the first steps, the shorter
  // ones start dense and turn sparse as they grow.
  const SelectionParams sel{.budget = 4, .window = 2, .qshare = 16};
  std::unique_ptr<Model> m = load(sel);
  ASSERT_TRUE(m);
  const StepAttention dense{.mode = AttentionMode::kDense};
  expect_same_traces(*m, &dense, "dense");
  expect_same_traces(*m, nullptr, "cisa");
}

// Graphs off by option: every step is launched, none recorded.
TEST(CudaStepGraphs, OptionOffRecordsNothing) {
  CISA_REQUIRE_GPU();
  auto be = cuda::make_model_backend({.step_graphs = false});
  ASSERT_TRUE(be.ok()) << be.status().to_string();
  EXPECT_FALSE((*be)->step_graph_stats().enabled);
  auto on = cuda::make_model_backend({});
  ASSERT_TRUE(on.ok()) << on.status().to_string();
  EXPECT_TRUE((*on)->step_graph_stats().enabled);
}

}  // namespace
}  // namespace cisa::test

#else
TEST(CudaStepGraphs, Skipped) {
  GTEST_SKIP() << "no CUDA device: GPU tests skipped (built without the CUDA model backend)";
}
#endif
