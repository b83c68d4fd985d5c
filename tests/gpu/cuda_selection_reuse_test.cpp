// Selection reuse across decode steps (SelectionParams::reuse_steps, docs/design.md) on the CUDA
// model backend. Reuse has a CPU reference only: the CUDA backend must refuse r > 1 at plan with
// `unimplemented` and a message that says so, stay usable afterwards, and run r = 1 given
// explicitly exactly as the default (greedy tokens and logits bit for bit). Tiny synthetic model;
// skips without a GPU.
#include <gtest/gtest.h>

#if defined(CISA_WITH_CUDA_MODEL)
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cisa/core/backend.h"
#include "cisa/cuda/model_backend.h"
#include "cisa/model/model.h"
#include "gpu/cuda_backend_test_util.h"

namespace cisa::test {
namespace {

std::unique_ptr<Model> load_tiny() {
  ModelOptions o{.context = 512, .max_sequences = 2, .kv_dtype = KvDtype::kBF16};
  o.attention.mode = AttentionMode::kCisa;
  o.attention.selection = {.budget = 2, .window = 1, .qshare = 4};
  o.backend = cuda::make_model_backend;
  // The CUDA backend needs head_dim 64, 128 or 256 (tiny-llama has 16).
  auto m = Model::load_synthetic("qwen2.5-7b", o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(*m) : nullptr;
}

// A 150-token prompt and 16 greedy decode steps; the logits of every step.
Status decode(Model& m, const StepAttention* att, std::vector<float>* all) {
  CISA_ASSIGN_OR_RETURN(SeqId s, m.add_sequence());
  std::vector<int32_t> prompt(150);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 7 % 200);
  std::vector<float> logits;
  std::vector<int32_t> ids;
  SequenceInput in{.seq = s, .tokens = prompt};
  CISA_RETURN_IF_ERROR(m.forward({&in, 1}, {.logits = &logits, .argmax = &ids}, {}, att));
  all->insert(all->end(), logits.begin(), logits.end());
  for (int step = 0; step < 16; ++step) {
    const int32_t next = ids[0];
    SequenceInput d{.seq = s, .tokens = {&next, 1}};
    CISA_RETURN_IF_ERROR(m.forward({&d, 1}, {.logits = &logits, .argmax = &ids}, {}, att));
    all->insert(all->end(), logits.begin(), logits.end());
  }
  return m.release_sequence(s);
}

TEST(CudaSelectionReuse, RefusesReuseAndStaysUsable) {
  CISA_REQUIRE_GPU();
  std::unique_ptr<Model> m = load_tiny();
  ASSERT_TRUE(m);
  std::vector<float> warm, before, r1, after;
  ASSERT_TRUE(decode(*m, nullptr, &warm).ok());  // GEMM algorithm choices, graphs recorded
  ASSERT_TRUE(decode(*m, nullptr, &before).ok());

  // The backend's plan refuses r > 1 for a CISA slot.
  Backend& be = m->backend();
  auto seq = be.add_sequence();
  ASSERT_TRUE(seq.ok());
  ASSERT_TRUE(be.reserve(*seq, 200).ok());
  const std::vector<BatchEntry> batch = {{*seq, 0, 1}};
  PlanSpec spec{.kind = PlanKind::kCisa, .selection = {.budget = 2, .window = 1}};
  spec.selection.reuse_steps = 4;
  const Status s = be.plan(PlanSlot::kCisa, batch, spec);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.to_string();
  EXPECT_NE(s.message().find("CPU backend only"), std::string::npos) << s.message();
  ASSERT_TRUE(be.release_sequence(*seq).ok());
  EXPECT_EQ(be.selection_reuse_stats().selected, 0);

  // Through the model: the step fails with that error.
  StepAttention att{.mode = AttentionMode::kCisa, .selection = m->options().attention.selection};
  att.selection.reuse_steps = 4;
  std::vector<float> unused;
  const Status f = decode(*m, &att, &unused);
  EXPECT_EQ(f.code(), StatusCode::kUnimplemented) << f.to_string();
  for (SeqId live : m->backend().pages().sequences()) (void)m->release_sequence(live);

  // r = 1 given explicitly is the default, bit for bit, before and after the refusals.
  att.selection.reuse_steps = 1;
  ASSERT_TRUE(decode(*m, &att, &r1).ok());
  ASSERT_TRUE(decode(*m, nullptr, &after).ok());
  ASSERT_EQ(before.size(), r1.size());
  EXPECT_EQ(std::memcmp(before.data(), r1.data(), before.size() * sizeof(float)), 0);
  ASSERT_EQ(before.size(), after.size());
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace cisa::test

#else
TEST(CudaSelectionReuse, Skipped) {
  GTEST_SKIP() << "no CUDA device: GPU tests skipped (built without the CUDA model backend)";
}
#endif
