// calibrate_indexer and diagnose_model end to end on SmolLM2 (skipped when absent): every global
// layer and KV group gets h_g + 1 scored candidates (h_g + 2 with the fit), the winner is the
// criterion's best, no candidate beats the oracle, the result is bit-identical across thread
// counts, the file round trips and is accepted by its model and rejected by the other one.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "cisa/model/gguf.h"
#include "cisa/model/indexer.h"
#include "cisa/model/model.h"

namespace cisa {
namespace {

const std::string kSmol = std::string(CISA_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
const std::string kGemma = std::string(CISA_SOURCE_DIR) + "/models/gemma-3-270m-q4_k_m.gguf";

std::string prose() {
  std::string s;
  for (int i = 0; i < 16; ++i)
    s += "Chapter " + std::to_string(i + 1) +
         ". It is a truth universally acknowledged, that a single man in possession of a good "
         "fortune, must be in "
         "want of a wife. However little known the feelings or views of such a man may be on his "
         "first entering a "
         "neighbourhood, this truth is so well fixed in the minds of the surrounding families, "
         "that he is "
         "considered the rightful property of some one or other of their daughters. ";
  return s;
}

TEST(CalibModel, CalibrateSmolLM2) {
  if (!GgufFile::open(kSmol).ok()) GTEST_SKIP() << "SmolLM2 is absent";
  const std::vector<CalibText> texts = {{"a", prose()},
                                        {"b", "Short text that is too short to sample."}};
  CalibrateOptions o;
  o.settings = {.budget = 4, .window = 4, .positions = 3, .seed = 5};
  o.threads = 1;
  o.max_tokens = 1000;
  auto one = calibrate_indexer(kSmol, texts, o);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  o.threads = 2;
  o.prefill_block = 200;  // other step boundaries: the tap must record the same queries
  auto two = calibrate_indexer(kSmol, texts, o);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(serialize_indexer(*one), serialize_indexer(*two));

  const Indexer& idx = *one;
  EXPECT_EQ(idx.model.arch, "llama");
  ASSERT_EQ(idx.settings.documents.size(), 2u);
  EXPECT_EQ(idx.settings.documents[0].tokens, 1000);
  ASSERT_EQ(idx.groups.size(), static_cast<size_t>(idx.model.n_layer * idx.model.n_head_kv));
  const int hg = idx.model.n_head / idx.model.n_head_kv;
  for (const GroupCalibration& g : idx.groups) {
    EXPECT_EQ(g.positions, 3);
    ASSERT_EQ(g.candidates.size(), static_cast<size_t>(hg + 1));
    EXPECT_GT(g.oracle, 0.0);
    EXPECT_LE(g.oracle, 1.0 + 1e-12);
    for (const CandidateScore& c : g.candidates) {
      EXPECT_TRUE(std::isfinite(c.kl));
      EXPECT_GE(c.kl, 0.0);
      EXPECT_LE(c.captured, g.oracle + 1e-12);
      EXPECT_GE(c.kl, g.candidates[static_cast<size_t>(g.chosen)].kl);
    }
  }
  // The file round trips and matches its model only.
  auto back = parse_indexer(serialize_indexer(idx));
  ASSERT_TRUE(back.ok());
  auto f = GgufFile::open(kSmol);
  EXPECT_TRUE(check_indexer_matches(*back, *model_identity(*f)).ok());
  if (auto g = GgufFile::open(kGemma); g.ok()) {
    EXPECT_EQ(check_indexer_matches(*back, *model_identity(*g)).code(),
              StatusCode::kFailedPrecondition);
  }

  // With the fitted candidate: the other candidates' scores are unchanged, the fit comes last with
  // h_g · d coefficients and stays under the oracle, and its projections rebuild from the model.
  {
    CalibrateOptions of = o;
    of.settings.fit = true;
    auto fit = calibrate_indexer(kSmol, texts, of);
    ASSERT_TRUE(fit.ok()) << fit.status().to_string();
    ASSERT_EQ(fit->groups.size(), idx.groups.size());
    for (size_t i = 0; i < idx.groups.size(); ++i) {
      const GroupCalibration &a = idx.groups[i], &b = fit->groups[i];
      ASSERT_EQ(b.candidates.size(), static_cast<size_t>(hg + 2));
      for (int c = 0; c <= hg; ++c) {
        EXPECT_EQ(b.candidates[size_t(c)].kl, a.candidates[size_t(c)].kl);
        EXPECT_EQ(b.candidates[size_t(c)].captured, a.candidates[size_t(c)].captured);
      }
      EXPECT_EQ(b.candidates.back().head, kFitCandidate);
      EXPECT_LE(b.candidates.back().captured, b.oracle + 1e-12);
      EXPECT_EQ(b.mix.size(), static_cast<size_t>(hg * idx.model.head_dim));
    }
    auto hp = read_model_hparams(*f);
    ASSERT_TRUE(hp.ok());
    auto proj = indexer_projections(*fit, *f, *hp,
                                    std::vector<bool>(static_cast<size_t>(hp->n_layer), true));
    ASSERT_TRUE(proj.ok()) << proj.status().to_string();
    if (GgufFile::open(kGemma).ok()) {  // q/k norms: refused before any work
      EXPECT_EQ(calibrate_indexer(kGemma, texts, of).status().code(),
                StatusCode::kFailedPrecondition);
    }
  }

  // Texts too short for a single position are an error, not an empty indexer.
  o.max_tokens = 100;
  EXPECT_EQ(calibrate_indexer(kSmol, texts, o).status().code(), StatusCode::kInvalidArgument);

  // Diagnostics with the indexer: masses are fractions, oracle ≥ CISA, one entry per G and lag.
  DiagnoseOptions d{.budget = 4,
                    .window = 4,
                    .positions = 2,
                    .qshare = {4, 16},
                    .lags = {1, 8},
                    .threads = 2,
                    .max_tokens = 1000};
  auto rep = diagnose_model(kSmol, prose(), &idx, d);
  ASSERT_TRUE(rep.ok()) << rep.status().to_string();
  EXPECT_TRUE(rep->calibrated);
  ASSERT_EQ(rep->layers.size(), static_cast<size_t>(idx.model.n_layer));
  for (const LayerDiagnostics& l : rep->layers) {
    EXPECT_EQ(l.samples, 2 * idx.model.n_head_kv);
    EXPECT_LE(l.cisa_mass, l.oracle_mass + 1e-12);
    EXPECT_LE(l.recency_mass, l.oracle_mass + 1e-12);
    EXPECT_GT(l.cisa_mass, 0.0);
    ASSERT_EQ(l.qshare_retention.size(), 2u);
    ASSERT_EQ(l.overlap.size(), 2u);
    for (double v : l.qshare_retention) EXPECT_TRUE(v >= 0 && v <= 1);
    for (double v : l.overlap) EXPECT_TRUE(v >= 0 && v <= 1);
    EXPECT_LE(l.extra_mass_index, l.extra_mass_oracle + 1e-12);
    // 8-bit representatives: masses bounded by the oracle's, selections mostly the native one.
    for (double m : {l.fp8_mass, l.int8_mass}) {
      EXPECT_GT(m, 0.0);
      EXPECT_LE(m, l.oracle_mass + 1e-12);
    }
    for (double v : {l.fp8_overlap, l.int8_overlap}) EXPECT_TRUE(v >= 0.5 && v <= 1) << v;
    // Per KV group: every group has the same samples, so the layer mean is the groups' mean.
    ASSERT_EQ(l.group_cisa_mass.size(), static_cast<size_t>(idx.model.n_head_kv));
    ASSERT_EQ(l.group_oracle_mass.size(), static_cast<size_t>(idx.model.n_head_kv));
    double gc = 0, go = 0;
    for (int g = 0; g < idx.model.n_head_kv; ++g) {
      gc += l.group_cisa_mass[static_cast<size_t>(g)] / idx.model.n_head_kv;
      go += l.group_oracle_mass[static_cast<size_t>(g)] / idx.model.n_head_kv;
      EXPECT_LE(l.group_cisa_mass[static_cast<size_t>(g)],
                l.group_oracle_mass[static_cast<size_t>(g)] + 1e-12);
    }
    EXPECT_NEAR(gc, l.cisa_mass, 1e-12);
    EXPECT_NEAR(go, l.oracle_mass, 1e-12);
  }
}

}  // namespace
}  // namespace cisa
