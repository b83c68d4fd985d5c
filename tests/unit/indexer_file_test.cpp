// The indexer file: exact round trip, and an error value (never a crash) for every truncation,
// every flipped byte, a wrong magic or version, inconsistent contents and another model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cisa/model/gguf.h"
#include "cisa/model/indexer.h"
#include "cisa/model/quant.h"

namespace cisa {
namespace {

Indexer sample_indexer() {
  Indexer idx;
  idx.model = {.arch = "llama",
               .name = "tiny test",
               .n_layer = 4,
               .n_embd = 64,
               .n_head = 6,
               .n_head_kv = 2,
               .head_dim = 16,
               .weights_hash = 0x0123456789abcdefULL};
  idx.settings = {
      .budget = 32,
      .window = 8,
      .sink_pages = 1,
      .page_size = 16,
      .positions = 64,
      .seed = 99,
      .criterion = CalibCriterion::kMass,
      .documents = {{"a.txt", 16384, 7}, {"b \xc3\xa9.txt", 20000, 0xffffffffffffffffULL}}};
  for (int layer : {1, 3})
    for (int g = 0; g < 2; ++g) {
      GroupCalibration gc{
          .layer = layer, .kv_group = g, .positions = 100 + layer, .oracle = 0.75 + 0.01 * g};
      for (int c = 0; c < 3; ++c)
        gc.candidates.push_back(
            {.head = g * 3 + c, .kl = 0.1 * c + layer, .captured = 0.5 - 0.01 * c});
      gc.candidates.push_back({.head = -1, .kl = 1.0 / 3.0, .captured = 0.6});
      gc.chosen = (layer + g) % 4;
      idx.groups.push_back(gc);
    }
  return idx;
}

void expect_equal(const Indexer& a, const Indexer& b) {
  EXPECT_EQ(a.model.arch, b.model.arch);
  EXPECT_EQ(a.model.name, b.model.name);
  EXPECT_EQ(a.model.n_layer, b.model.n_layer);
  EXPECT_EQ(a.model.n_embd, b.model.n_embd);
  EXPECT_EQ(a.model.n_head, b.model.n_head);
  EXPECT_EQ(a.model.n_head_kv, b.model.n_head_kv);
  EXPECT_EQ(a.model.head_dim, b.model.head_dim);
  EXPECT_EQ(a.model.weights_hash, b.model.weights_hash);
  EXPECT_EQ(a.settings.budget, b.settings.budget);
  EXPECT_EQ(a.settings.window, b.settings.window);
  EXPECT_EQ(a.settings.sink_pages, b.settings.sink_pages);
  EXPECT_EQ(a.settings.page_size, b.settings.page_size);
  EXPECT_EQ(a.settings.positions, b.settings.positions);
  EXPECT_EQ(a.settings.seed, b.settings.seed);
  EXPECT_EQ(a.settings.criterion, b.settings.criterion);
  ASSERT_EQ(a.settings.documents.size(), b.settings.documents.size());
  for (size_t i = 0; i < a.settings.documents.size(); ++i) {
    EXPECT_EQ(a.settings.documents[i].name, b.settings.documents[i].name);
    EXPECT_EQ(a.settings.documents[i].tokens, b.settings.documents[i].tokens);
    EXPECT_EQ(a.settings.documents[i].content_hash, b.settings.documents[i].content_hash);
  }
  ASSERT_EQ(a.groups.size(), b.groups.size());
  for (size_t i = 0; i < a.groups.size(); ++i) {
    const GroupCalibration &x = a.groups[i], &y = b.groups[i];
    EXPECT_EQ(x.layer, y.layer);
    EXPECT_EQ(x.kv_group, y.kv_group);
    EXPECT_EQ(x.positions, y.positions);
    EXPECT_EQ(x.oracle, y.oracle);  // bit-exact doubles
    EXPECT_EQ(x.chosen, y.chosen);
    ASSERT_EQ(x.candidates.size(), y.candidates.size());
    for (size_t c = 0; c < x.candidates.size(); ++c) {
      EXPECT_EQ(x.candidates[c].head, y.candidates[c].head);
      EXPECT_EQ(x.candidates[c].kl, y.candidates[c].kl);
      EXPECT_EQ(x.candidates[c].captured, y.candidates[c].captured);
    }
  }
}

TEST(IndexerFile, RoundTripInMemoryAndOnDisk) {
  const Indexer idx = sample_indexer();
  const std::vector<uint8_t> bytes = serialize_indexer(idx);
  auto back = parse_indexer(bytes);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  expect_equal(idx, *back);
  EXPECT_EQ(serialize_indexer(*back), bytes);

  const std::string path =
      (std::filesystem::temp_directory_path() / "cisa_indexer_test.cisaidx").string();
  ASSERT_TRUE(save_indexer(idx, path).ok());
  auto loaded = load_indexer(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  expect_equal(idx, *loaded);
  std::remove(path.c_str());
  EXPECT_EQ(load_indexer(path).status().code(), StatusCode::kNotFound);
}

TEST(IndexerFile, EveryTruncationIsAnError) {
  const std::vector<uint8_t> bytes = serialize_indexer(sample_indexer());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto r = parse_indexer(std::span<const uint8_t>(bytes.data(), n));
    ASSERT_FALSE(r.ok()) << n;
    if (n >= 8) {
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << n << ": " << r.status().to_string();
    }
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_EQ(parse_indexer(longer).status().code(), StatusCode::kDataLoss);
}

TEST(IndexerFile, EveryFlippedByteIsAnError) {
  const std::vector<uint8_t> bytes = serialize_indexer(sample_indexer());
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::vector<uint8_t> bad = bytes;
    bad[i] ^= 0x20;
    auto r = parse_indexer(bad);
    EXPECT_FALSE(r.ok()) << "byte " << i;
  }
  std::vector<uint8_t> bad = bytes;
  bad[0] = 'X';
  EXPECT_EQ(parse_indexer(bad).status().code(), StatusCode::kInvalidArgument);
  bad = bytes;
  bad[8] = 7;  // version 7
  EXPECT_EQ(parse_indexer(bad).status().code(), StatusCode::kUnimplemented);
}

// Contents that pass the hash but contradict themselves (as a buggy or hand-made writer could).
TEST(IndexerFile, InconsistentContentsAreRejected) {
  auto expect_rejected = [](Indexer idx, const char* what) {
    auto r = parse_indexer(serialize_indexer(idx));
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << what;
    EXPECT_FALSE(save_indexer(idx, "/nonexistent-dir/x").ok()) << what;
  };
  Indexer idx = sample_indexer();
  idx.groups[0].chosen = 4;
  expect_rejected(idx, "chosen out of range");
  idx = sample_indexer();
  idx.groups[1].layer = 4;
  expect_rejected(idx, "layer out of range");
  idx = sample_indexer();
  idx.groups[1] = idx.groups[0];
  expect_rejected(idx, "duplicate group");
  idx = sample_indexer();
  idx.groups[0].candidates.pop_back();
  expect_rejected(idx, "missing mean");
  idx = sample_indexer();
  idx.groups[0].candidates[1].head = 5;
  expect_rejected(idx, "head of another group");
  idx = sample_indexer();
  idx.model.n_head = 5;
  expect_rejected(idx, "heads not a multiple of KV heads");
  idx = sample_indexer();
  idx.groups[2].candidates[0].kl = NAN;
  expect_rejected(idx, "NaN");
  idx = sample_indexer();
  idx.settings.budget = 0;
  expect_rejected(idx, "budget 0");
}

TEST(IndexerFile, AnotherModelIsRejected) {
  const Indexer idx = sample_indexer();
  ModelIdentity same = idx.model;
  same.name = "renamed";  // the name is informative only
  EXPECT_TRUE(check_indexer_matches(idx, same).ok());
  ModelIdentity other = idx.model;
  other.n_head_kv = 3;
  Status s = check_indexer_matches(idx, other);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("another model"), std::string::npos) << s.message();
  other = idx.model;
  other.weights_hash ^= 1;
  s = check_indexer_matches(idx, other);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("weights hash"), std::string::npos) << s.message();
}

std::string model_path(const char* file) {
  return std::string(CISA_SOURCE_DIR) + "/models/" + file;
}

// On the real models: identities differ between them, the hash sees the q weights, and a chosen
// head's projection is that head's rows of attn_q dequantised.
TEST(IndexerFile, IdentityAndProjectionsOfRealModels) {
  auto gemma = GgufFile::open(model_path("gemma-3-270m-q4_k_m.gguf"));
  auto smol = GgufFile::open(model_path("SmolLM2-135M-Instruct.Q4_1.gguf"));
  if (!gemma.ok() || !smol.ok())
    GTEST_SKIP() << "models are absent (scripts in docs/models.md fetch them)";
  auto gid = model_identity(*gemma);
  auto sid = model_identity(*smol);
  ASSERT_TRUE(gid.ok() && sid.ok());
  EXPECT_EQ(gid->arch, "gemma3");
  EXPECT_EQ(sid->arch, "llama");
  EXPECT_NE(gid->weights_hash, sid->weights_hash);
  EXPECT_EQ(model_identity(*gemma)->weights_hash, gid->weights_hash);  // deterministic

  // One flipped byte inside a query weight changes the hash.
  std::vector<uint8_t> copy(smol->bytes().begin(), smol->bytes().end());
  const GgufTensor* q0 = smol->find_tensor("blk.0.attn_q.weight");
  ASSERT_NE(q0, nullptr);
  copy[static_cast<size_t>(q0->data - smol->bytes().data()) + 100] ^= 1;
  auto flipped = GgufFile::parse(copy);
  ASSERT_TRUE(flipped.ok());
  EXPECT_NE(model_identity(*flipped)->weights_hash, sid->weights_hash);

  auto hp = read_model_hparams(*smol);
  ASSERT_TRUE(hp.ok());
  Indexer idx;
  idx.model = *sid;
  idx.settings = {.budget = 8, .window = 4};
  const int hg = hp->heads_per_group();
  for (int g = 0; g < hp->n_head_kv; ++g) {
    GroupCalibration gc{.layer = 2, .kv_group = g};
    for (int c = 0; c < hg; ++c) gc.candidates.push_back({.head = g * hg + c});
    gc.candidates.push_back({.head = -1});
    gc.chosen = g == 1 ? hg : g;  // group 1 keeps the mean
    idx.groups.push_back(gc);
  }
  std::vector<bool> layers(static_cast<size_t>(hp->n_layer), false);
  layers[2] = true;
  auto proj = indexer_projections(idx, *smol, *hp, layers);
  ASSERT_TRUE(proj.ok()) << proj.status().to_string();
  ASSERT_EQ(proj->size(), static_cast<size_t>(hp->n_head_kv - 1));
  const GgufTensor* q2 = smol->find_tensor("blk.2.attn_q.weight");
  std::vector<float> row(static_cast<size_t>(hp->n_embd));
  for (const IndexProjection& p : *proj) {
    EXPECT_EQ(p.layer, 2);
    EXPECT_NE(p.kv_group, 1);
    const int head = p.kv_group * hg + p.kv_group;
    for (int i = 0; i < hp->head_dim; i += 7) {
      ASSERT_TRUE(dequantize_row(q2->type, q2->row(int64_t{head} * hp->head_dim + i), row.data(),
                                 hp->n_embd)
                      .ok());
      for (int c = 0; c < hp->n_embd; ++c)
        ASSERT_EQ(p.weight[size_t(i) * size_t(hp->n_embd) + size_t(c)], row[size_t(c)]);
    }
  }
  layers[2] = false;
  EXPECT_TRUE(indexer_projections(idx, *smol, *hp, layers)->empty());
}

}  // namespace
}  // namespace cisa
