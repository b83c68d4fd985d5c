// cisa::Model behaviour that needs no reference numbers: clear errors for bad files, options and
// inputs (with the sequences left as they were), several sequences in one call equal to separate
// calls, and CISA with a budget covering the context equal to dense. The real-model cases skip
// when the models are not downloaded (scripts/pull_model.py); logits against llama.cpp are in
// tests/golden/model_golden_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cisa/model/gguf.h"
#include "cisa/model/model.h"
#include "cisa/model/model_store.h"
#include "cisa/model/quant.h"
#include "cisa/model/sampling.h"
#include "cisa/model/tokenizer.h"

namespace cisa {
namespace {

// A minimal GGUF v3 file: string metadata only, no tensors.
std::string write_gguf(const std::string& name,
                       const std::vector<std::pair<std::string, std::string>>& kv) {
  std::string b = "GGUF";
  auto u32 = [&](uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); };
  auto u64 = [&](uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); };
  u32(3);
  u64(0);
  u64(kv.size());
  for (const auto& [k, v] : kv) {
    u64(k.size());
    b += k;
    u32(8);  // string
    u64(v.size());
    b += v;
  }
  const std::string path = ::testing::TempDir() + "/" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path, std::ios::binary) << b;
  return path;
}

TEST(ModelLoad, BadFilesGiveClearErrors) {
  auto missing = Model::load(::testing::TempDir() + "/no-such-model.gguf");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);

  const std::string junk = ::testing::TempDir() + "/junk.gguf";
  std::ofstream(junk, std::ios::binary) << "this is not a model file at all";
  auto not_gguf = Model::load(junk);
  ASSERT_FALSE(not_gguf.ok());

  auto gpt2 = Model::load(write_gguf("gpt2.gguf", {{"general.architecture", "gpt2"}}));
  ASSERT_FALSE(gpt2.ok());
  EXPECT_EQ(gpt2.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(gpt2.status().message().find("gpt2"), std::string::npos) << gpt2.status().message();

  auto bare = Model::load(write_gguf("bare.gguf", {{"general.architecture", "gemma3"}}));
  ASSERT_FALSE(bare.ok());
  EXPECT_NE(bare.status().message().find("block_count"), std::string::npos)
      << bare.status().message();

  auto noarch = Model::load(write_gguf("noarch.gguf", {{"general.name", "x"}}));
  ASSERT_FALSE(noarch.ok());
  EXPECT_NE(noarch.status().message().find("architecture"), std::string::npos);
}

std::string model_path(const char* name) {
  auto p = resolve_model(name);
  return p.ok() ? *p : "";
}

// Deterministic token ids in [lo, hi).
std::vector<int32_t> tokens(int n, int32_t lo, int32_t hi, uint32_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) {
    seed = seed * 1664525u + 1013904223u;
    x = lo + static_cast<int32_t>((seed >> 8) % static_cast<uint32_t>(hi - lo));
  }
  return t;
}

TEST(ModelLoad, BadOptions) {
  const std::string path = model_path("smollm2-135m");
  if (path.empty()) GTEST_SKIP() << "smollm2-135m is not downloaded";
  EXPECT_FALSE(Model::load(path, {.threads = -1}).ok());
  EXPECT_FALSE(Model::load(path, {.context = 1 << 20}).ok());  // beyond the 8K training context
  EXPECT_FALSE(Model::load(path, {.max_sequences = 0}).ok());
  EXPECT_FALSE(Model::load(path, {.prefill_block = 0}).ok());
  ModelOptions bad_index;
  bad_index.attention.mode = AttentionMode::kCisa;
  bad_index.attention.selection.budget = 4;
  bad_index.attention.index.push_back(
      {.layer = 0, .kv_group = 0, .weight = std::vector<float>(10)});
  auto r = Model::load(path, bad_index);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("index projection"), std::string::npos)
      << r.status().message();
}

TEST(ModelForward, BadInputsLeaveSequencesUnchanged) {
  const std::string path = model_path("smollm2-135m");
  if (path.empty()) GTEST_SKIP() << "smollm2-135m is not downloaded";
  auto m = Model::load(path, {.threads = 2, .context = 256, .max_sequences = 2});
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  Model& model = **m;
  const SeqId s = *model.add_sequence();
  std::vector<float> logits;
  const auto ids = tokens(20, 0, model.hparams().n_vocab, 1);
  SequenceInput ok{.seq = s, .tokens = ids};
  ASSERT_TRUE(model.forward({&ok, 1}, &logits).ok());
  ASSERT_EQ(logits.size(), static_cast<size_t>(model.hparams().n_vocab));

  auto expect_error = [&](const SequenceInput& in, const char* what) {
    Status st = model.forward({&in, 1}, &logits);
    EXPECT_FALSE(st.ok()) << what;
    EXPECT_FALSE(st.message().empty()) << what;
    EXPECT_EQ(*model.sequence_length(s), 20) << what;
  };
  expect_error({.seq = s, .tokens = {}}, "empty input");
  const std::vector<int32_t> bad_id = {5, model.hparams().n_vocab};
  expect_error({.seq = s, .tokens = bad_id}, "token out of the vocabulary");
  const std::vector<int32_t> neg_id = {-1};
  expect_error({.seq = s, .tokens = neg_id}, "negative token");
  const auto too_long = tokens(240, 0, 1000, 2);  // 20 + 240 > 256
  expect_error({.seq = s, .tokens = too_long}, "past the context");
  const std::vector<int64_t> unordered = {3, 1};
  expect_error({.seq = s, .tokens = ids, .outputs = OutputMode::kPositions, .positions = unordered},
               "positions");
  expect_error({.seq = 99, .tokens = ids}, "unknown sequence");
  SequenceInput twice[2] = {{.seq = s, .tokens = ids}, {.seq = s, .tokens = ids}};
  EXPECT_FALSE(model.forward(twice, &logits).ok());
  EXPECT_EQ(*model.sequence_length(s), 20);
  // Still usable afterwards.
  const std::vector<int32_t> one = {42};
  SequenceInput next{.seq = s, .tokens = one};
  EXPECT_TRUE(model.forward({&next, 1}, &logits).ok());
  EXPECT_EQ(*model.sequence_length(s), 21);
}

// Mean KL(p || q) over rows of full-vocabulary logits, in fp64, and the share of rows whose argmax
// agrees.
struct Closeness {
  double kl = 0, top1 = 0;
};
Closeness compare_rows(const float* p, const float* q, int64_t rows, int V) {
  Closeness c;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = p + r * V;
    const float* b = q + r * V;
    double ma = -1e300, mb = -1e300;
    int ia = 0, ib = 0;
    for (int i = 0; i < V; ++i) {
      if (a[i] > ma) ma = a[i], ia = i;
      if (b[i] > mb) mb = b[i], ib = i;
    }
    double za = 0, zb = 0;
    for (int i = 0; i < V; ++i) za += std::exp(a[i] - ma), zb += std::exp(b[i] - mb);
    const double la = ma + std::log(za), lb = mb + std::log(zb);
    double kl = 0;
    for (int i = 0; i < V; ++i) kl += std::exp(a[i] - la) * ((a[i] - la) - (b[i] - lb));
    c.kl += kl / rows;
    c.top1 += (ia == ib ? 1.0 : 0.0) / rows;
  }
  return c;
}

// Two sequences in one call (one of them spanning steps, the steps cutting across both) give the
// logits of separate calls. Bit equality is not expected: the activations are quantised to 8 bits
// per matrix product, so the last-bit differences between attention task splits flip a few
// roundings, which moves logits by ~0.1 (the same size as quantisation's own error against an
// fp64 forward, measured in docs/models-runtime.md). A sequence mix-up or a wrong position moves
// them by far more (KL > 0.1).
TEST(ModelForward, BatchedSequencesEqualSeparateRuns) {
  const std::string path = model_path("smollm2-135m");
  if (path.empty()) GTEST_SKIP() << "smollm2-135m is not downloaded";
  auto m =
      Model::load(path, {.threads = 2, .context = 512, .max_sequences = 4, .prefill_block = 64});
  ASSERT_TRUE(m.ok());
  Model& model = **m;
  const int V = model.hparams().n_vocab;
  const Tokenizer& tok = model.tokenizer();
  const auto a = tok.encode(
      "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
      "must be in want "
      "of a wife. However little known the feelings or views of such a man may be on his first "
      "entering a "
      "neighbourhood, this truth is so well fixed in the minds of the surrounding families, that "
      "he is considered "
      "the rightful property of some one or other of their daughters. My dear Mr. Bennet, said his "
      "lady to him one "
      "day, have you heard that Netherfield Park is let at last?",
      true);
  const auto b = tok.encode(
      "In the beginning God created the heaven and the earth. And the earth was without form, "
      "and void; and darkness was upon the face of the deep.",
      true);
  ASSERT_GT(a.size(), 64u);
  ASSERT_LT(b.size(), 64u);
  std::vector<float> la, lb;
  const SeqId s1 = *model.add_sequence(), s2 = *model.add_sequence();
  SequenceInput ia{.seq = s1, .tokens = a, .outputs = OutputMode::kAll};
  ASSERT_TRUE(model.forward({&ia, 1}, &la).ok());
  SequenceInput ib{.seq = s2, .tokens = b, .outputs = OutputMode::kAll};
  ASSERT_TRUE(model.forward({&ib, 1}, &lb).ok());
  const SeqId t1 = *model.add_sequence(), t2 = *model.add_sequence();
  SequenceInput both[2] = {{.seq = t2, .tokens = b, .outputs = OutputMode::kAll},
                           {.seq = t1, .tokens = a, .outputs = OutputMode::kAll}};
  std::vector<float> lab;
  ASSERT_TRUE(model.forward(both, &lab).ok());
  ASSERT_EQ(lab.size(), la.size() + lb.size());
  const int64_t nb = static_cast<int64_t>(b.size()), na = static_cast<int64_t>(a.size());
  const Closeness cb = compare_rows(lb.data(), lab.data(), nb, V);
  const Closeness ca = compare_rows(la.data(), lab.data() + nb * V, na, V);
  std::printf("batched vs separate: first input KL %.2e top-1 %.3f; second KL %.2e top-1 %.3f\n",
              cb.kl, cb.top1, ca.kl, ca.top1);
  EXPECT_LT(cb.kl, 5e-3);
  EXPECT_LT(ca.kl, 5e-3);
  EXPECT_GE(cb.top1, 0.95);
  EXPECT_GE(ca.top1, 0.95);
  EXPECT_EQ(*model.sequence_length(t1), na);
  EXPECT_EQ(*model.sequence_length(t2), nb);
  // A sequence given another's tokens is far off: the comparison can fail.
  const Closeness wrong = compare_rows(la.data(), lab.data(), std::min(na, nb), V);
  EXPECT_GT(wrong.kl, 0.1);
}

// With a budget at least the number of eligible chunks CISA takes the dense path (SPEC §3), so
// every logit equals dense; with a small budget it reads fewer pages and still produces finite
// logits.
TEST(ModelForward, CisaWithFullBudgetEqualsDense) {
  for (const char* name : {"gemma3-270m", "smollm2-135m"}) {
    const std::string path = model_path(name);
    if (path.empty()) continue;
    const int n = 700;
    std::vector<float> dense, full, sparse;
    ForwardStats sd, sf, ss;
    for (int mode = 0; mode < 3; ++mode) {
      ModelOptions o{.threads = 2, .context = 768};
      if (mode > 0) {
        o.attention.mode = AttentionMode::kCisa;
        o.attention.selection = {.budget = mode == 1 ? 4096 : 4, .window = 4, .qshare = 16};
      }
      auto m = Model::load(path, o);
      ASSERT_TRUE(m.ok()) << m.status().to_string();
      const auto ids = tokens(n, 10, (*m)->hparams().n_vocab, 5);
      const SeqId s = *(*m)->add_sequence();
      std::vector<int64_t> pos;
      for (int64_t p = 0; p < n; p += 37) pos.push_back(p);
      SequenceInput in{
          .seq = s, .tokens = ids, .outputs = OutputMode::kPositions, .positions = pos};
      std::vector<float>& out = mode == 0 ? dense : mode == 1 ? full : sparse;
      ASSERT_TRUE((*m)->forward({&in, 1}, &out).ok());
      (mode == 0 ? sd : mode == 1 ? sf : ss) = (*m)->stats();
    }
    ASSERT_EQ(dense.size(), full.size());
    for (size_t i = 0; i < dense.size(); ++i)
      ASSERT_EQ(dense[i], full[i]) << name << " logit " << i;
    EXPECT_EQ(sf.global_pages_read, sd.global_pages_read) << name;
    EXPECT_LT(ss.global_pages_read, sd.global_pages_read / 2) << name;
    EXPECT_EQ(ss.global_pages_dense, sd.global_pages_dense) << name;
    for (float x : sparse) ASSERT_TRUE(std::isfinite(x)) << name;
  }
}

}  // namespace
}  // namespace cisa

namespace cisa {
namespace {

// The index-projection hook (issue 4's indexer): supplying, for every (global layer, KV group), the
// element-wise mean of the group's query-head rows of W_q must reproduce the default index query
// (the mean of the projected heads, equal by linearity), so the same pages are read and the logits
// agree; supplying another projection (each group's first head) changes which pages are read.
// Weights are widened to f32 so that both paths are exact products.
TEST(ModelForward, SuppliedIndexProjectionIsUsed) {
  const std::string path = model_path("smollm2-135m");
  if (path.empty()) GTEST_SKIP() << "smollm2-135m is not downloaded";
  auto file = GgufFile::open(path);
  ASSERT_TRUE(file.ok());
  auto hp = read_model_hparams(*file);
  ASSERT_TRUE(hp.ok());
  const int E = hp->n_embd, d = hp->head_dim, hg = hp->heads_per_group();
  auto projections = [&](bool mean) {
    std::vector<IndexProjection> out;
    std::vector<float> row(static_cast<size_t>(E));
    for (int l = 0; l < hp->n_layer; ++l) {
      const GgufTensor* wq = file->find_tensor("blk." + std::to_string(l) + ".attn_q.weight");
      for (int g = 0; g < hp->n_head_kv; ++g) {
        IndexProjection p{.layer = l,
                          .kv_group = g,
                          .weight = std::vector<float>(static_cast<size_t>(d) * E, 0.0f)};
        const int heads = mean ? hg : 1;
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < d; ++i) {
            EXPECT_TRUE(
                dequantize_row(wq->type, wq->row((g * hg + h) * d + i), row.data(), E).ok());
            for (int c = 0; c < E; ++c)
              p.weight[static_cast<size_t>(i) * E + c] += row[static_cast<size_t>(c)] / heads;
          }
        out.push_back(std::move(p));
      }
    }
    return out;
  };
  const int n = 200;
  std::vector<float> logits[3];
  int64_t pages[3];
  for (int mode = 0; mode < 3; ++mode) {
    ModelOptions o{.threads = 2, .context = 256, .weights_f32 = true};
    o.attention.mode = AttentionMode::kCisa;
    o.attention.selection = {.budget = 2, .window = 1, .qshare = 4};
    if (mode > 0) o.attention.index = projections(/*mean=*/mode == 1);
    auto m = Model::load(path, o);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const auto ids = tokens(n, 10, (*m)->hparams().n_vocab, 9);
    const SeqId s = *(*m)->add_sequence();
    SequenceInput in{.seq = s, .tokens = ids, .outputs = OutputMode::kLast};
    ASSERT_TRUE((*m)->forward({&in, 1}, &logits[mode]).ok());
    pages[mode] = (*m)->stats().global_pages_read;
  }
  EXPECT_EQ(pages[0], pages[1]);
  double max_diff = 0;
  for (size_t i = 0; i < logits[0].size(); ++i)
    max_diff = std::max(max_diff, std::abs(double(logits[0][i]) - logits[1][i]));
  EXPECT_LT(max_diff, 1e-2);
  double other = 0;
  for (size_t i = 0; i < logits[0].size(); ++i)
    other = std::max(other, std::abs(double(logits[0][i]) - logits[2][i]));
  EXPECT_GT(other, 1e-2);  // the first head's projection selects other pages
}

// ModelOptions::bf16_matmul reaches the backend: the logits move by bf16 rounding of the products
// against exact f32 weights (visibly, yet within a bf16-sized distance of them), a model with
// weights_f32 as well gives the same logits (the weights are rounded once either way), and the
// next tokens agree at the end of a short prompt.
TEST(ModelForward, Bf16ProductsAreTheCudaBackendsRounding) {
  const std::string path = model_path("smollm2-135m");
  if (path.empty()) GTEST_SKIP() << "smollm2-135m is not downloaded";
  std::vector<float> logits[3];
  for (int mode = 0; mode < 3; ++mode) {
    ModelOptions o{.threads = 2, .context = 256};
    o.weights_f32 = mode != 1;
    o.bf16_matmul = mode > 0;
    auto m = Model::load(path, o);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const auto ids = tokens(120, 10, (*m)->hparams().n_vocab, 4);
    const SeqId s = *(*m)->add_sequence();
    SequenceInput in{.seq = s, .tokens = ids, .outputs = OutputMode::kLast};
    ASSERT_TRUE((*m)->forward({&in, 1}, &logits[mode]).ok());
  }
  EXPECT_EQ(logits[1], logits[2]);
  double max_diff = 0, spread = 0;
  for (size_t i = 0; i < logits[0].size(); ++i) {
    max_diff = std::max(max_diff, std::abs(double(logits[0][i]) - logits[1][i]));
    spread = std::max(spread, std::abs(double(logits[0][i])));
  }
  EXPECT_GT(max_diff, 1e-4);
  EXPECT_LT(max_diff, 0.05 * spread);
  EXPECT_EQ(argmax(logits[0]), argmax(logits[1]));
}

}  // namespace
}  // namespace cisa
