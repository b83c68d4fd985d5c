// The cache readers calibration and diagnostics rely on, against brute force over the keys as
// written: chunk representatives (mean keys) and the dense chunk mass of a group's heads; and the
// query recorder's copies of tapped rows.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "calib/activations.h"

namespace cisa {
namespace {

TEST(CalibActivations, RepresentativesAndDenseMassMatchBruteForce) {
  const int d = 16, Hkv = 2, B = 16;
  const int64_t n = 203;
  auto cache =
      PagedKvCache::create({.num_layers = 2, .num_kv_heads = Hkv, .head_dim = d, .num_pages = 64});
  ASSERT_TRUE(cache.ok());
  // A second sequence first, so the first one's pages are not contiguous.
  auto other = (*cache)->add_sequence();
  auto seq = (*cache)->add_sequence();
  ASSERT_TRUE(other.ok() && seq.ok());
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> k(size_t(n) * Hkv * d), v(k.size()), junk(size_t(B) * Hkv * d, 7.0f);
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  for (int64_t done = 0; done < n; done += 40) {
    const int64_t c = std::min<int64_t>(40, n - done);
    ASSERT_TRUE((*cache)->reserve(*other, B).ok());
    for (int l = 0; l < 2; ++l)
      ASSERT_TRUE((*cache)->append(l, *other, B, junk.data(), junk.data()).ok());
    ASSERT_TRUE((*cache)->reserve(*seq, c).ok());
    for (int l = 0; l < 2; ++l)
      ASSERT_TRUE(
          (*cache)->append(l, *seq, c, k.data() + done * Hkv * d, v.data() + done * Hkv * d).ok());
  }
  auto bt = (*cache)->block_table(*seq);
  ASSERT_TRUE(bt.ok());
  const int layer = 1, g = 1;
  const int64_t chunks = n / B;
  const std::vector<float> reps = calib::chunk_representatives(**cache, layer, *bt, g, chunks);
  ASSERT_EQ(reps.size(), size_t(chunks) * d);
  for (int64_t j = 0; j < chunks; ++j)
    for (int i = 0; i < d; ++i) {
      double s = 0;
      for (int t = 0; t < B; ++t) s += k[(size_t(j * B + t) * Hkv + g) * d + size_t(i)];
      EXPECT_NEAR(reps[size_t(j) * d + size_t(i)], s / B, 1e-6);
    }

  const int heads = 3;
  std::vector<float> q(size_t(heads) * d);
  for (auto& x : q) x = 0.7f * nd(rng);
  for (int64_t t : {int64_t{0}, int64_t{15}, int64_t{16}, int64_t{130}, n - 1}) {
    const double scale = 0.25;
    const std::vector<double> mass =
        calib::dense_chunk_mass(**cache, layer, *bt, g, q.data(), heads, t, scale);
    ASSERT_EQ(mass.size(), size_t(t / B + 1));
    std::vector<long double> want(mass.size(), 0);
    for (int h = 0; h < heads; ++h) {
      std::vector<long double> e(size_t(t + 1));
      long double z = 0;
      for (int64_t s = 0; s <= t; ++s) {
        long double dot = 0;
        for (int i = 0; i < d; ++i)
          dot += (long double)q[size_t(h * d + i)] * k[(size_t(s) * Hkv + g) * d + size_t(i)];
        e[size_t(s)] = std::exp(scale * dot);
        z += e[size_t(s)];
      }
      for (int64_t s = 0; s <= t; ++s) want[size_t(s / B)] += e[size_t(s)] / z;
    }
    double total = 0;
    for (size_t j = 0; j < mass.size(); ++j) {
      EXPECT_NEAR(mass[j], static_cast<double>(want[j]), 1e-12) << "t " << t << " chunk " << j;
      total += mass[j];
    }
    EXPECT_NEAR(total, heads, 1e-12);
  }
}

TEST(CalibActivations, RecorderCopiesTappedRowsOfGlobalLayers) {
  ModelHparams hp;
  hp.n_layer = 3;
  hp.n_head = 4;
  hp.n_head_kv = 2;
  hp.head_dim = 8;
  hp.layer_swa = {true, false, true};
  const std::vector<int64_t> qpos = {5, 9}, ipos = {4, 5, 12};
  calib::QueryRecorder rec(hp, qpos, ipos);
  AttentionTap tap = rec.tap();
  const int64_t rows = 10;
  std::vector<int64_t> pos(rows);
  std::vector<float> q(size_t(rows) * 4 * 8), iq(size_t(rows) * 2 * 8);
  for (int64_t r = 0; r < rows; ++r) pos[size_t(r)] = 3 + r;  // positions 3 … 12
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(i);
  for (size_t i = 0; i < iq.size(); ++i) iq[i] = -static_cast<float>(i);
  ASSERT_TRUE(tap({.layer = 1, .positions = pos, .q = q.data(), .index_q = iq.data()}).ok());
  EXPECT_FALSE(
      tap({.layer = 0, .positions = pos, .q = q.data(), .index_q = iq.data()}).ok());  // not global
  ASSERT_NE(rec.q(1, 9), nullptr);
  EXPECT_EQ(rec.q(1, 9)[0], q[size_t(9 - 3) * 32]);
  EXPECT_EQ(rec.q(1, 5)[31], q[size_t(5 - 3) * 32 + 31]);
  EXPECT_EQ(rec.q(1, 4), nullptr);
  EXPECT_EQ(rec.index_q(1, 12)[15], iq[size_t(12 - 3) * 16 + 15]);
  EXPECT_EQ(rec.index_q(1, 9), nullptr);
}

}  // namespace
}  // namespace cisa
