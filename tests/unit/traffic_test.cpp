// The traffic model reproduces SPEC §8's check table and its closed forms match exact sums.
#include <gtest/gtest.h>

#include "cisa/core/traffic.h"

namespace cisa {
namespace {

TEST(Traffic, ReproducesSpecCheckTable) {
  struct Row {
    int64_t k;
    double nominal, g1, g4, g32, full4;
  };
  const Row rows[] = {{8192, 8, 6.40, 7.53, 7.94, 4.13},
                      {4096, 16, 10.67, 14.22, 15.75, 7.76},
                      {2048, 32, 16.00, 25.60, 31.03, 14.42}};
  for (const auto& r : rows) {
    TrafficParams p{.context = 1 << 20, .budget = r.k, .window = 0, .qshare = 4, .page = 16};
    EXPECT_NEAR(nominal_compression(p), r.nominal, 1e-9);
    EXPECT_NEAR(ceiling_ratio(p, 1), r.g1, 0.005);
    EXPECT_NEAR(ceiling_ratio(p, 4), r.g4, 0.005);
    EXPECT_NEAR(ceiling_ratio(p, 32), r.g32, 0.005);
    EXPECT_NEAR(prefill_ceiling_ratio(p, 4), r.full4, 0.005);
  }
}

TEST(Traffic, ExactCountsApproachClosedForms) {
  TrafficParams p{
      .context = 1 << 20, .budget = 4096, .window = 0, .qshare = 4, .page = 16, .head_dim = 128};
  const TrafficReport r = attention_traffic(p);
  // Without window and tail the end-of-prefill ratio is the closed form up to the O(1/N) terms.
  EXPECT_NEAR(r.end.ratio_no_window(), r.ceiling_end, 0.01 * r.ceiling_end);
  EXPECT_NEAR(r.decode.ratio_no_window(), r.ceiling_decode, 0.01 * r.ceiling_decode);
  EXPECT_NEAR(r.prefill.ratio_no_window(), r.ceiling_prefill, 0.01 * r.ceiling_prefill);
  // The tail adds at most B tokens: with-window ratio is lower but close when W = 0.
  EXPECT_LT(r.end.ratio(), r.end.ratio_no_window());
  // Hand count at the last position: t = N−1, |E| = N/B − 1 (c(t) = N/B − 1), tail = 16.
  const double d = 128, E = (1 << 20) / 16 - 1;
  EXPECT_DOUBLE_EQ(r.end.cisa, 2 * d * (4096 * 16 + 16) + E * d / 4);
  EXPECT_DOUBLE_EQ(r.end.dense, 2 * d * (1 << 20));
}

TEST(Traffic, DenseWhileEligibleAtMostBudget) {
  TrafficParams p{
      .context = 4096, .budget = 100, .window = 8, .qshare = 4, .page = 16, .head_dim = 64};
  // c(t) − W ≤ k ⇔ t < (k + W + 1)·B: every such position reads exactly what dense reads.
  for (int64_t t : {0, 100, (100 + 8 + 1) * 16 - 1})
    EXPECT_EQ(cisa_elements(t, p, 4, true), dense_elements(t, p));
  EXPECT_LT(cisa_elements((100 + 8 + 1) * 16 + 5000, p, 4, true),
            dense_elements((100 + 8 + 1) * 16 + 5000, p));
}

TEST(Traffic, RejectsBadParams) {
  EXPECT_FALSE(validate_traffic_params({.context = 0, .budget = 1}).ok());
  EXPECT_FALSE(validate_traffic_params({.context = 10, .budget = 0}).ok());
  EXPECT_FALSE(validate_traffic_params({.context = 10, .budget = 1, .window = -1}).ok());
  EXPECT_FALSE(validate_traffic_params({.context = 10, .budget = 1, .qshare = 0}).ok());
  EXPECT_TRUE(validate_traffic_params({.context = 10, .budget = 1}).ok());
}

}  // namespace
}  // namespace cisa
