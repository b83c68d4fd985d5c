// Scorers on hand-made outputs, the task bootstrap against the exact resampling distribution
// (every resample enumerated), and the configuration parser.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "cisa/model/eval.h"

namespace cisa::eval {
namespace {

TEST(EvalScore, CleanPrediction) {
  EXPECT_EQ(clean_prediction("  \t 1234567.\n\n"), "1234567.");
  EXPECT_EQ(clean_prediction(std::string("ab\x01"
                                         "cd",
                                         5)),
            "ab\ncd");
  EXPECT_EQ(clean_prediction("\x7f"), "");
}

TEST(EvalScore, MatchAllCountsTheFractionFound) {
  const std::vector<std::string> refs = {"1234567", "7654321", "Amber-Otter", "ZZZ"};
  EXPECT_DOUBLE_EQ(string_match_all(" 1234567 and 7654321.", refs), 0.5);
  EXPECT_DOUBLE_EQ(string_match_all("amber-otter zzz 7654321 1234567", refs),
                   1.0);                                      // case-insensitive
  EXPECT_DOUBLE_EQ(string_match_all("123456 7", refs), 0.0);  // substring, not digits
  EXPECT_DOUBLE_EQ(string_match_all("", refs), 0.0);
  EXPECT_DOUBLE_EQ(string_match_all("x", {}), 0.0);
}

TEST(EvalScore, MatchPartIsAnyReference) {
  const std::vector<std::string> refs = {"paris", "the capital"};
  EXPECT_DOUBLE_EQ(string_match_part("It is PARIS.", refs), 1.0);
  EXPECT_DOUBLE_EQ(string_match_part("The Capital city", refs), 1.0);
  EXPECT_DOUBLE_EQ(string_match_part("London", refs), 0.0);
}

TEST(EvalScore, ScorePredictionUsesTheExampleMatch) {
  Example ex;
  ex.answers = {"AAAAA", "BBBBB"};
  ex.match = MatchKind::kAll;
  EXPECT_DOUBLE_EQ(score_prediction(ex, "aaaaa"), 0.5);
  ex.match = MatchKind::kPart;
  EXPECT_DOUBLE_EQ(score_prediction(ex, "aaaaa"), 1.0);
}

// The exact distribution of the bootstrap statistic: every tuple of resampled indices, each
// with probability Π 1/n_g^{n_g}.
std::map<double, double> exact_distribution(const std::vector<std::vector<double>>& groups) {
  std::map<double, double> dist;
  std::vector<std::vector<size_t>> idx;
  for (const auto& g : groups) idx.emplace_back(g.size(), 0);
  double p_each = 1.0;
  for (const auto& g : groups)
    p_each /= std::pow(static_cast<double>(g.size()), static_cast<double>(g.size()));
  while (true) {
    double stat = 0;
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      double s = 0;
      for (size_t k : idx[gi]) s += groups[gi][k];
      stat += s / static_cast<double>(groups[gi].size());
    }
    stat /= static_cast<double>(groups.size());
    dist[std::round(stat * 1e9) / 1e9] += p_each;
    // Odometer increment over all indices of all groups.
    size_t gi = 0, k = 0;
    for (; gi < idx.size(); ++gi) {
      for (k = 0; k < idx[gi].size(); ++k) {
        if (++idx[gi][k] < groups[gi].size()) break;
        idx[gi][k] = 0;
      }
      if (k < idx[gi].size()) break;
    }
    if (gi == idx.size()) break;
  }
  return dist;
}

TEST(EvalBootstrap, AgreesWithTheExactResamplingDistribution) {
  const std::vector<std::vector<double>> groups = {{0, 1, 1, 0.5}, {1, 0, 0}, {0.25, 1}};
  const auto dist = exact_distribution(groups);
  double exact_mean = 0, total = 0;
  for (const auto& [v, p] : dist) exact_mean += v * p, total += p;
  ASSERT_NEAR(total, 1.0, 1e-12);
  const Interval iv = bootstrap_interval(groups, 200000, 17);
  // The point estimate is the mean of group means (and the bootstrap distribution's mean).
  const double direct = (2.5 / 4 + 1.0 / 3 + 1.25 / 2) / 3;
  EXPECT_NEAR(iv.mean, direct, 1e-12);
  EXPECT_NEAR(exact_mean, direct, 1e-9);  // map keys are rounded to 1e-9
  // Each end must be a quantile of the exact distribution: F(v−) ≤ q ≤ F(v), within the Monte
  // Carlo error of 200,000 draws (±0.003 covers > 5 standard errors at q = 0.025).
  auto check = [&](double v, double q) {
    double below = 0, upto = 0;
    for (const auto& [x, p] : dist) {
      if (x < v - 1e-9) below += p;
      if (x <= v + 1e-9) upto += p;
    }
    EXPECT_LE(below, q + 0.003) << "value " << v;
    EXPECT_GE(upto, q - 0.003) << "value " << v;
    EXPECT_GT(dist.count(std::round(v * 1e9) / 1e9), 0u) << "not a reachable statistic: " << v;
  };
  check(iv.lo, 0.025);
  check(iv.hi, 0.975);
  EXPECT_LT(iv.lo, iv.mean);
  EXPECT_GT(iv.hi, iv.mean);
}

TEST(EvalBootstrap, DegenerateCases) {
  EXPECT_EQ(bootstrap_interval({}, 100, 1).mean, 0.0);
  const Interval c = bootstrap_interval({{1, 1, 1}, {}}, 100, 1);  // empty group skipped
  EXPECT_EQ(c.mean, 1.0);
  EXPECT_EQ(c.lo, 1.0);
  EXPECT_EQ(c.hi, 1.0);
  // Same seed, same interval.
  const Interval a = bootstrap_interval({{0, 1, 0, 1, 1}}, 1000, 5),
                 b = bootstrap_interval({{0, 1, 0, 1, 1}}, 1000, 5);
  EXPECT_EQ(a.lo, b.lo);
  EXPECT_EQ(a.hi, b.hi);
}

// Requested lengths against the model's training context: a length that leaves no room for the
// continuation is shortened by exactly the room kept, one past the context is skipped.
TEST(EvalLength, PromptLengthLeavesRoomToGenerate) {
  EXPECT_EQ(kEvalGenerationRoom, 128);
  EXPECT_EQ(eval_prompt_length(16384, 32768), 16384);
  EXPECT_EQ(eval_prompt_length(32640, 32768), 32640);
  EXPECT_EQ(eval_prompt_length(32641, 32768), 32640);
  EXPECT_EQ(eval_prompt_length(32768, 32768), 32640);
  EXPECT_EQ(eval_prompt_length(8192, 8192), 8064);
  EXPECT_EQ(eval_prompt_length(32769, 32768), 0);
  EXPECT_EQ(eval_prompt_length(65536, 0), 65536);  // unknown context: no limit
}

TEST(EvalConfig, Parse) {
  auto d = parse_config("dense");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->kind, ConfigKind::kDense);
  auto c = parse_config("cisa:x8:g16:w32:s1:d2:last");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->kind, ConfigKind::kCisa);
  EXPECT_EQ(c->compression, 8.0);
  EXPECT_EQ(c->group, 16);
  EXPECT_EQ(c->window, 32);
  EXPECT_EQ(c->sinks, 1);
  EXPECT_EQ(c->dense_layers, 2);
  EXPECT_EQ(c->query, QShareQuery::kLast);
  EXPECT_FALSE(c->calibrated);
  auto q = parse_config("quest:k64");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->budget, 64);
  // `cal`: the run's calibrated index projections, for the configs that score with them.
  auto cal = parse_config("cisa:x8:g4:s1:cal");
  ASSERT_TRUE(cal.ok()) << cal.status().message();
  EXPECT_TRUE(cal->calibrated);
  EXPECT_EQ(cal->sinks, 1);
  EXPECT_TRUE(parse_config("quest:k8:cal").ok());
  EXPECT_FALSE(parse_config("recency:x8:cal").ok());
  EXPECT_FALSE(parse_config("oracle:x8:cal").ok());
  EXPECT_EQ(cal->indexer_label, "");
  // calLABEL: the indexer `--indexer LABEL=FILE` names; one cal option per configuration.
  auto fit = parse_config("cisa:x8:g4:s1:calfit");
  ASSERT_TRUE(fit.ok()) << fit.status().message();
  EXPECT_TRUE(fit->calibrated);
  EXPECT_EQ(fit->indexer_label, "fit");
  EXPECT_FALSE(parse_config("cisa:x8:cal:calfit").ok());
  EXPECT_FALSE(parse_config("cisa:x8:calf.t").ok());
  for (const char* bad :
       {"sparse", "dense:k4", "cisa", "cisa:k4:x8", "cisa:x0.5", "cisa:g0", "cisa:k4:q", "cisa:kx"})
    EXPECT_FALSE(parse_config(bad).ok()) << bad;
  // rN: decode steps one selection serves (SelectionParams::reuse_steps), top-k kinds only.
  auto r = parse_config("cisa:x8:g4:s1:cal:r4");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->reuse_steps, 4);
  RepKind rep;
  auto ra = config_attention(*r, 8192, 16, &rep);
  ASSERT_TRUE(ra.ok());
  EXPECT_EQ(ra->selection.reuse_steps, 4);
  EXPECT_EQ(parse_config("cisa:x8")->reuse_steps, 1);
  EXPECT_TRUE(parse_config("quest:k8:r2").ok());
  for (const char* bad : {"cisa:x8:r0", "cisa:x8:r70000", "recency:x8:r2", "oracle:x8:r2"})
    EXPECT_FALSE(parse_config(bad).ok()) << bad;
  // mN: the reuse check "mass" with slack N / 1000; without it the default check.
  EXPECT_EQ(ra->selection.reuse_check, ReuseCheck::kNewChunks);
  auto ma = config_attention(*parse_config("cisa:x8:g4:r8:m100"), 8192, 16, &rep);
  ASSERT_TRUE(ma.ok());
  EXPECT_EQ(ma->selection.reuse_check, ReuseCheck::kMass);
  EXPECT_DOUBLE_EQ(ma->selection.reuse_mass_slack, 0.1);
  for (const char* bad : {"cisa:x8:r8:m1001", "cisa:x8:r8:m-1", "recency:x8:m10", "cisa:x8:mx"})
    EXPECT_FALSE(parse_config(bad).ok()) << bad;
  // fp8 | int8: the representatives' precision (cisa and quest only, once).
  EXPECT_EQ(parse_config("cisa:x8")->rep_precision, RepPrecision::kNative);
  EXPECT_EQ(parse_config("cisa:x8:g4:fp8")->rep_precision, RepPrecision::kFp8);
  EXPECT_EQ(parse_config("quest:x8:int8")->rep_precision, RepPrecision::kInt8);
  for (const char* bad : {"dense:fp8", "recency:x8:int8", "moment:x8:fp8", "cisa:x8:fp8:int8"})
    EXPECT_FALSE(parse_config(bad).ok()) << bad;
}

TEST(EvalConfig, BudgetAndAttentionOptions) {
  auto c = *parse_config("cisa:x8:g4:w32");
  // 8192 tokens, B = 16: 512 chunks, 32 in the window → E = 480, k = 60.
  EXPECT_EQ(config_budget(c, 8192, 16), 60);
  EXPECT_EQ(config_budget(c, 8190, 16), 60);  // 511 full chunks → E = 479, ceil(479/8) = 60
  EXPECT_EQ(config_budget(c, 100, 16), 1);
  RepKind rep;
  auto a = config_attention(c, 8192, 16, &rep);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->mode, AttentionMode::kCisa);
  EXPECT_EQ(a->selection.budget, 60);
  EXPECT_EQ(a->selection.window, 32);
  EXPECT_EQ(a->selection.qshare, 4);
  EXPECT_EQ(rep, RepKind::kMean);
  auto r = *config_attention(*parse_config("recency:x8:w32"), 8192, 16, &rep);
  EXPECT_EQ(r.selection.budget, 0);
  EXPECT_EQ(r.selection.window, 92);  // the same page count as CISA, all recent
  auto qa = *config_attention(*parse_config("quest:k10"), 8192, 16, &rep);
  EXPECT_EQ(rep, RepKind::kQuest);
  EXPECT_EQ(qa.selection.budget, 10);
  auto ma = *config_attention(*parse_config("moment:x8:g4:s1:cal:r2"), 8192, 16, &rep);
  EXPECT_EQ(rep, RepKind::kMoment);
  EXPECT_EQ(ma.mode, AttentionMode::kCisa);
  EXPECT_EQ(ma.selection.reuse_steps, 2);
  EXPECT_EQ(config_attention(*parse_config("dense"), 8192, 16, &rep)->mode, AttentionMode::kDense);
  EXPECT_EQ(config_attention(*parse_config("cisa:k4:d3"), 8192, 16, &rep)->dense_layers, 3);
  // The oracle: CISA's budget, G, window and sinks, with a page selector; CISA has none.
  EXPECT_FALSE(a->selector);
  auto o = parse_config("oracle:x8:g4:w32:s1");
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->kind, ConfigKind::kOracle);
  EXPECT_EQ(config_budget(*o, 8192, 16), 60);  // E = 512 − 32 − 1 = 479 → ceil(479/8)
  auto oa = config_attention(*o, 8192, 16, &rep);
  ASSERT_TRUE(oa.ok()) << oa.status().message();
  EXPECT_EQ(oa->mode, AttentionMode::kCisa);
  EXPECT_EQ(rep, RepKind::kMean);
  EXPECT_EQ(oa->selection.budget, 60);
  EXPECT_EQ(oa->selection.window, 32);
  EXPECT_EQ(oa->selection.qshare, 4);
  EXPECT_EQ(oa->selection.sink_pages, 1);
  EXPECT_TRUE(oa->selector);
  EXPECT_FALSE(parse_config("oracle").ok());  // no budget
  EXPECT_FALSE(parse_config("oracle:x8:z1").ok());
}

}  // namespace
}  // namespace cisa::eval
