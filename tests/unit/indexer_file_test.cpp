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

// With `fit`, every group also carries the fitted candidate and its coefficients (version 2).
Indexer sample_indexer(bool fit = false) {
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
  idx.settings.fit = fit;
  idx.settings.fit_ridge = fit ? 0.25 : 0.05;
  for (int layer : {1, 3})
    for (int g = 0; g < 2; ++g) {
      GroupCalibration gc{
          .layer = layer, .kv_group = g, .positions = 100 + layer, .oracle = 0.75 + 0.01 * g};
      for (int c = 0; c < 3; ++c)
        gc.candidates.push_back(
            {.head = g * 3 + c, .kl = 0.1 * c + layer, .captured = 0.5 - 0.01 * c});
      gc.candidates.push_back({.head = -1, .kl = 1.0 / 3.0, .captured = 0.6});
      gc.chosen = (layer + g) % 4;
      if (fit) {
        gc.candidates.push_back({.head = kFitCandidate, .kl = 0.25, .captured = 0.7});
        gc.chosen = (layer + g) % 5;
        for (int i = 0; i < 3 * 16; ++i) gc.mix.push_back(0.125f * static_cast<float>(i - layer));
      }
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
  EXPECT_EQ(a.settings.fit, b.settings.fit);
  EXPECT_EQ(a.settings.fit_ridge, b.settings.fit_ridge);
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
    EXPECT_EQ(x.mix, y.mix);
    ASSERT_EQ(x.candidates.size(), y.candidates.size());
    for (size_t c = 0; c < x.candidates.size(); ++c) {
      EXPECT_EQ(x.candidates[c].head, y.candidates[c].head);
      EXPECT_EQ(x.candidates[c].kl, y.candidates[c].kl);
      EXPECT_EQ(x.candidates[c].captured, y.candidates[c].captured);
    }
  }
}

TEST(IndexerFile, RoundTripInMemoryAndOnDisk) {
  for (bool fit : {false, true}) {
    const Indexer with = sample_indexer(fit);
    const std::vector<uint8_t> bytes = serialize_indexer(with);
    auto back = parse_indexer(bytes);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    expect_equal(with, *back);
    EXPECT_EQ(serialize_indexer(*back), bytes);
  }
  const Indexer idx = sample_indexer();

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
  for (bool fit : {false, true}) {
    const std::vector<uint8_t> b = serialize_indexer(sample_indexer(fit));
    for (size_t n = 8; n < b.size(); ++n)
      ASSERT_EQ(parse_indexer(std::span<const uint8_t>(b.data(), n)).status().code(),
                StatusCode::kDataLoss)
          << n;
  }
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
  const std::vector<uint8_t> fitted = serialize_indexer(sample_indexer(true));
  for (size_t i = 0; i < fitted.size(); ++i) {
    std::vector<uint8_t> bad = fitted;
    bad[i] ^= 0x20;
    EXPECT_FALSE(parse_indexer(bad).ok()) << "byte " << i;
  }
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
  idx = sample_indexer(true);
  idx.groups[1].mix.pop_back();
  expect_rejected(idx, "fit coefficients short");
  idx = sample_indexer(true);
  idx.groups[2].mix[5] = INFINITY;
  expect_rejected(idx, "fit coefficient not finite");
  idx = sample_indexer(true);
  idx.settings.fit = false;
  expect_rejected(idx, "fit candidate without the fit setting");
  idx = sample_indexer();
  idx.groups[0].mix.assign(48, 0.5f);
  expect_rejected(idx, "coefficients without a fit");
  idx = sample_indexer(true);
  idx.groups[0].chosen = 5;
  expect_rejected(idx, "chosen past the fit");
  idx = sample_indexer(true);
  idx.settings.fit_ridge = -1;
  expect_rejected(idx, "negative ridge");
}

// Version 1 (no fit fields) still loads: the indexers committed before version 2.
TEST(IndexerFile, VersionOneFilesStillLoad) {
  for (const char* f : {"/indexers/smollm2-135m.cisaidx", "/indexers/gemma3-270m.cisaidx"}) {
    const std::string path = std::string(CISA_SOURCE_DIR) + f;
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(in) << path;
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
    uint32_t version = 0;
    std::memcpy(&version, bytes.data() + 8, 4);
    if (version != 1) GTEST_SKIP() << path << " was rewritten as version " << version;
    auto idx = parse_indexer(bytes);
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
    EXPECT_FALSE(idx->settings.fit);
    for (const GroupCalibration& g : idx->groups) EXPECT_TRUE(g.mix.empty());
    // Written again, it is version 2 with the same contents.
    auto again = parse_indexer(serialize_indexer(*idx));
    ASSERT_TRUE(again.ok());
    expect_equal(*idx, *again);
  }
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

  // A fitted mix: row pair (2i, 2i + 1) of W̃ (llama's RoPE pairs) is Σ_h of the complex product
  // (α + iβ)(row 2i + i·row 2i + 1) of the group's heads, here computed from the rows directly.
  idx.settings.fit = true;
  const int d = hp->head_dim;
  for (GroupCalibration& gc : idx.groups) {
    gc.candidates.push_back({.head = kFitCandidate});
    gc.chosen = hg + 1;
    gc.mix.resize(static_cast<size_t>(hg * d));
    for (size_t i = 0; i < gc.mix.size(); ++i)
      gc.mix[i] =
          0.01f * static_cast<float>((i * 37 + static_cast<size_t>(gc.kv_group)) % 101) - 0.5f;
  }
  ASSERT_TRUE(parse_indexer(serialize_indexer(idx)).ok());
  layers[2] = true;
  auto fitted = indexer_projections(idx, *smol, *hp, layers);
  ASSERT_TRUE(fitted.ok()) << fitted.status().to_string();
  ASSERT_EQ(fitted->size(), static_cast<size_t>(hp->n_head_kv));
  const size_t E = static_cast<size_t>(hp->n_embd);
  std::vector<float> r1(E), r2(E);
  for (const IndexProjection& p : *fitted) {
    const std::vector<float>& mix = idx.groups[static_cast<size_t>(p.kv_group)].mix;
    for (int i = 0; i < d / 2; i += 5) {
      std::vector<double> w1(E, 0.0), w2(E, 0.0);
      for (int c = 0; c < hg; ++c) {
        const int64_t head = int64_t{p.kv_group} * hg + c;
        ASSERT_TRUE(
            dequantize_row(q2->type, q2->row(head * d + 2 * i), r1.data(), hp->n_embd).ok());
        ASSERT_TRUE(
            dequantize_row(q2->type, q2->row(head * d + 2 * i + 1), r2.data(), hp->n_embd).ok());
        const double a = mix[size_t((c * d / 2 + i) * 2)], b = mix[size_t((c * d / 2 + i) * 2 + 1)];
        for (size_t e = 0; e < E; ++e) {
          w1[e] += a * r1[e] - b * r2[e];
          w2[e] += b * r1[e] + a * r2[e];
        }
      }
      for (size_t e = 0; e < E; ++e) {
        EXPECT_NEAR(p.weight[size_t(2 * i) * E + e], w1[e], 1e-5);
        EXPECT_NEAR(p.weight[size_t(2 * i + 1) * E + e], w2[e], 1e-5);
      }
    }
  }
  // Gemma 3 normalises each query head (q-norm): a mix of heads is refused there.
  auto ghp = read_model_hparams(*gemma);
  ASSERT_TRUE(ghp.ok());
  Indexer gidx;
  gidx.model = *gid;
  gidx.settings = {.budget = 8, .window = 4, .fit = true};
  for (int l = 0; l < ghp->n_layer; ++l) {
    if (!ghp->is_global(l)) continue;
    GroupCalibration gc{.layer = l, .kv_group = 0};
    for (int c = 0; c < ghp->heads_per_group(); ++c) gc.candidates.push_back({.head = c});
    gc.candidates.push_back({.head = kMeanCandidate});
    gc.candidates.push_back({.head = kFitCandidate});
    gc.chosen = ghp->heads_per_group() + 1;
    gc.mix = std::vector<float>(static_cast<size_t>(ghp->heads_per_group() * ghp->head_dim), 0.5f);
    gidx.groups.push_back(gc);
  }
  EXPECT_EQ(indexer_projections(gidx, *gemma, *ghp, std::vector<bool>(size_t(ghp->n_layer), true))
                .status()
                .code(),
            StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace cisa
