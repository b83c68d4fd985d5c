// The traffic model at its limits: the whole-prefill sums are closed forms equal to the sum over
// every position, extreme inputs are rejected with their range, and N = 2^40 answers at once.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "cisa/core/traffic.h"

namespace cisa {
namespace {

TEST(TrafficBounds, ClosedFormPrefillEqualsThePerPositionSum) {
  for (int64_t N : {1, 15, 16, 17, 100, 1000, 4099})
    for (int64_t k : {1, 3, 8})
      for (int64_t W : {0, 1, 5})
        for (int64_t B : {1, 4, 16})
          for (int64_t G : {1, 4}) {
            const TrafficParams p{
                .context = N, .budget = k, .window = W, .qshare = G, .page = B, .head_dim = 8};
            ASSERT_TRUE(validate_traffic_params(p).ok());
            double dense = 0, cisa = 0, cisa_nw = 0;
            for (int64_t t = 0; t < N; ++t) {
              dense += dense_elements(t, p);
              cisa += cisa_elements(t, p, G, true);
              cisa_nw += cisa_elements(t, p, G, false);
            }
            const TrafficReport r = attention_traffic(p);
            EXPECT_NEAR(r.prefill.dense, dense, 1e-9 * dense) << N << " " << k << " " << W;
            EXPECT_NEAR(r.prefill.cisa, cisa, 1e-9 * cisa) << N << " " << k << " " << W;
            EXPECT_NEAR(r.prefill.cisa_no_window, cisa_nw, 1e-9 * cisa_nw);
          }
}

TEST(TrafficBounds, ExtremeValuesAreRejectedWithTheirRange) {
  const int64_t big = INT64_MAX;
  for (TrafficParams p :
       {TrafficParams{.context = 1024, .budget = 4, .page = big},
        TrafficParams{.context = big, .budget = 4}, TrafficParams{.context = 1024, .budget = big},
        TrafficParams{.context = 1024, .budget = 4, .window = big},
        TrafficParams{.context = 1024, .budget = 4, .qshare = big},
        TrafficParams{.context = 1024, .budget = 4, .head_dim = big}}) {
    const Status s = validate_traffic_params(p);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("must be in ["), std::string::npos) << s.message();
  }
}

TEST(TrafficBounds, LargestInputsGiveFinitePositiveRatiosQuickly) {
  const TrafficParams p{.context = kMaxTrafficContext,
                        .budget = kMaxTrafficPages,
                        .window = kMaxTrafficPages,
                        .qshare = kMaxTrafficPages,
                        .page = kMaxTrafficPageSize,
                        .head_dim = kMaxTrafficHeadDim};
  ASSERT_TRUE(validate_traffic_params(p).ok());
  const auto t0 = std::chrono::steady_clock::now();
  const TrafficReport r = attention_traffic(p);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  for (double x : {r.nominal, r.end.ratio(), r.prefill.ratio(), r.decode.ratio(), r.ceiling_end,
                   r.ceiling_prefill}) {
    EXPECT_TRUE(std::isfinite(x));
    EXPECT_GT(x, 0);
  }
  const TrafficParams q{.context = int64_t{1} << 40, .budget = 4096, .page = 16};
  const TrafficReport rq = attention_traffic(q);
  EXPECT_NEAR(rq.nominal, std::ldexp(1.0, 40) / (4096.0 * 16), 1e-6);
  EXPECT_GT(rq.prefill.ratio(), 1.0);
}

}  // namespace
}  // namespace cisa
