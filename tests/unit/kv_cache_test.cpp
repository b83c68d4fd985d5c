// Paged KV cache: allocation, block tables, storage, representatives, errors.
#include <algorithm>
#include <cstring>

#include "test_util.h"

namespace cisa {
namespace {

using test::append_random;
using test::stored;
using test::stored_rep;

std::unique_ptr<PagedKvCache> make(KvCacheConfig c) {
  auto r = PagedKvCache::create(c);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

TEST(KvCache, RejectsBadConfig) {
  EXPECT_FALSE(PagedKvCache::create({.num_layers = 0, .num_pages = 4}).ok());
  EXPECT_FALSE(PagedKvCache::create({.num_kv_heads = -1, .num_pages = 4}).ok());
  EXPECT_FALSE(PagedKvCache::create({.head_dim = 12, .num_pages = 4}).ok());
  EXPECT_FALSE(PagedKvCache::create({.page_size = 0, .num_pages = 4}).ok());
  EXPECT_FALSE(PagedKvCache::create({.num_pages = 0}).ok());
  auto r = PagedKvCache::create({.num_layers = 2, .num_pages = 4, .rep_layers = {true}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("rep_layers"), std::string::npos);
}

TEST(KvCache, StoresWhatWasAppended) {
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kBF16}) {
    auto c = make({.num_layers = 2,
                   .num_kv_heads = 3,
                   .head_dim = 16,
                   .page_size = 4,
                   .num_pages = 32,
                   .dtype = dt});
    std::mt19937 rng(1);
    SeqId a = *c->add_sequence(), b = *c->add_sequence();
    // Interleave appends so the two sequences' pages are not contiguous.
    std::vector<float> ka, va;
    for (int step = 0; step < 5; ++step) {
      const int64_t n = 1 + step * 2;
      ASSERT_TRUE(c->reserve(a, n).ok());
      for (int l = 0; l < 2; ++l) {
        auto k = test::random_vec(rng, static_cast<size_t>(n * 3 * 16));
        auto v = test::random_vec(rng, static_cast<size_t>(n * 3 * 16));
        if (l == 1) {
          ka.insert(ka.end(), k.begin(), k.end());
          va.insert(va.end(), v.begin(), v.end());
        }
        ASSERT_TRUE(c->append(l, a, n, k.data(), v.data()).ok());
      }
      append_random(*c, b, 3, rng);
    }
    ASSERT_EQ(*c->length(a), 25);
    auto table = *c->block_table(a);
    EXPECT_EQ(table.size(), 7u);
    bool contiguous = true;
    for (size_t i = 1; i < table.size(); ++i) contiguous &= table[i] == table[i - 1] + 1;
    EXPECT_FALSE(contiguous);
    for (int64_t t = 0; t < 25; ++t)
      for (int g = 0; g < 3; ++g)
        for (int i = 0; i < 16; ++i) {
          const float kx = ka[static_cast<size_t>((t * 3 + g) * 16 + i)];
          const float vx = va[static_cast<size_t>((t * 3 + g) * 16 + i)];
          const float ek = dt == KvDtype::kF32 ? kx : bf16_to_f32(f32_to_bf16(kx));
          const float ev = dt == KvDtype::kF32 ? vx : bf16_to_f32(f32_to_bf16(vx));
          ASSERT_EQ(stored(*c, true, 1, a, t, g, i), ek);
          ASSERT_EQ(stored(*c, false, 1, a, t, g, i), ev);
        }
  }
}

TEST(KvCache, RepresentativeIsMeanOfStoredKeysWrittenWhenPageFills) {
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kBF16}) {
    auto c = make({.num_layers = 1,
                   .num_kv_heads = 2,
                   .head_dim = 8,
                   .page_size = 4,
                   .num_pages = 8,
                   .dtype = dt});
    std::mt19937 rng(2);
    SeqId s = *c->add_sequence();
    append_random(*c, s, 3, rng);  // page 0 not yet full
    append_random(*c, s, 6, rng);  // fills pages 0 and 1 (positions 0..7), starts page 2
    auto table = *c->block_table(s);
    for (int j = 0; j < 2; ++j)
      for (int g = 0; g < 2; ++g)
        for (int i = 0; i < 8; ++i) {
          double mean = 0;
          for (int t = 0; t < 4; ++t) mean += stored(*c, true, 0, s, j * 4 + t, g, i);
          mean /= 4;
          const double got = stored_rep(*c, 0, table[static_cast<size_t>(j)], g, i);
          const double tol = dt == KvDtype::kF32 ? 1e-6 : std::abs(mean) * 8e-3 + 1e-6;
          ASSERT_NEAR(got, mean, tol) << "page " << j << " group " << g << " channel " << i;
        }
  }
}

TEST(KvCache, QuestRepresentativeIsMinAndMax) {
  auto c = make({.num_layers = 1,
                 .num_kv_heads = 1,
                 .head_dim = 8,
                 .page_size = 4,
                 .num_pages = 4,
                 .rep = RepKind::kQuest});
  std::mt19937 rng(3);
  SeqId s = *c->add_sequence();
  append_random(*c, s, 4, rng);
  const auto* r = static_cast<const float*>(c->rep(0, (*c->block_table(s))[0], 0));
  for (int i = 0; i < 8; ++i) {
    float lo = INFINITY, hi = -INFINITY;
    for (int t = 0; t < 4; ++t) {
      lo = std::min(lo, stored(*c, true, 0, s, t, 0, i));
      hi = std::max(hi, stored(*c, true, 0, s, t, 0, i));
    }
    EXPECT_EQ(r[i], lo);
    EXPECT_EQ(r[8 + i], hi);
  }
}

TEST(KvCache, MomentRepresentativeIsMeanAndVariance) {
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kBF16}) {
    auto c = make({.num_layers = 1,
                   .num_kv_heads = 2,
                   .head_dim = 8,
                   .page_size = 4,
                   .num_pages = 6,
                   .dtype = dt,
                   .rep = RepKind::kMoment});
    EXPECT_EQ(c->rep_width(), 16);
    std::mt19937 rng(5);
    SeqId s = *c->add_sequence();
    append_random(*c, s, 9, rng);  // two full pages and one partial
    const bool f32 = dt == KvDtype::kF32;
    for (int j = 0; j < 2; ++j)
      for (int g = 0; g < 2; ++g) {
        const int32_t page = (*c->block_table(s))[static_cast<size_t>(j)];
        for (int i = 0; i < 8; ++i) {
          double m = 0, v = 0;
          for (int t = 0; t < 4; ++t) m += stored(*c, true, 0, s, j * 4 + t, g, i);
          m /= 4;
          for (int t = 0; t < 4; ++t) {
            const double x = stored(*c, true, 0, s, j * 4 + t, g, i) - m;
            v += x * x;
          }
          v /= 4;
          auto at = [&](int w) -> double { return stored_rep(*c, 0, page, g, w); };
          const double rel = f32 ? 1e-6 : 8e-3;  // f32 rounding, or one bf16 rounding
          EXPECT_NEAR(at(i), m, std::abs(m) * rel + 1e-7) << "page " << j << " channel " << i;
          EXPECT_NEAR(at(8 + i), v, v * rel + 1e-7) << "page " << j << " channel " << i;
          EXPECT_GE(at(8 + i), 0.0);
        }
      }
  }
}

TEST(KvCache, PoolExhaustedIsAnErrorAndLeavesCacheUsable) {
  auto c =
      make({.num_layers = 1, .num_kv_heads = 1, .head_dim = 8, .page_size = 4, .num_pages = 3});
  std::mt19937 rng(4);
  SeqId a = *c->add_sequence();
  append_random(*c, a, 5, rng);  // 2 pages
  SeqId b = *c->add_sequence();
  Status st = c->reserve(b, 8);  // needs 2, 1 free
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("exhausted"), std::string::npos);
  EXPECT_EQ(c->free_pages(), 1);
  EXPECT_EQ((*c->block_table(b)).size(), 0u);
  // Still usable: a smaller request succeeds, and releasing returns pages.
  append_random(*c, b, 4, rng);
  EXPECT_EQ(c->free_pages(), 0);
  ASSERT_TRUE(c->release_sequence(a).ok());
  EXPECT_EQ(c->free_pages(), 2);
  EXPECT_EQ(c->page_owner((*c->block_table(b))[0]), b);
  append_random(*c, b, 8, rng);
  EXPECT_EQ(*c->length(b), 12);
}

TEST(KvCache, ErrorsOnBadCalls) {
  auto c =
      make({.num_layers = 2, .num_kv_heads = 1, .head_dim = 8, .page_size = 4, .num_pages = 8});
  std::vector<float> k(64), v(64);
  EXPECT_EQ(c->reserve(7, 1).code(), StatusCode::kNotFound);
  EXPECT_EQ(c->append(0, 7, 1, k.data(), v.data()).code(), StatusCode::kNotFound);
  EXPECT_EQ(c->release_sequence(-1).code(), StatusCode::kNotFound);
  SeqId s = *c->add_sequence();
  EXPECT_EQ(c->reserve(s, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->append(2, s, 1, k.data(), v.data()).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(c->append(0, s, 1, k.data(), v.data()).code(),
            StatusCode::kFailedPrecondition);  // nothing reserved
  ASSERT_TRUE(c->reserve(s, 2).ok());
  EXPECT_EQ(c->append(0, s, 3, k.data(), v.data()).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c->append(0, s, 1, nullptr, v.data()).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(c->append(0, s, 2, k.data(), v.data()).ok());
  EXPECT_EQ(*c->tokens(0, s), 2);
  EXPECT_EQ(*c->length(s), 0);  // layer 1 not written yet
  ASSERT_TRUE(c->release_sequence(s).ok());
  EXPECT_FALSE(c->has_sequence(s));
  EXPECT_EQ(c->release_sequence(s).code(), StatusCode::kNotFound);
  EXPECT_EQ(c->free_pages(), 8);
}

// A cache over the caller's pools (the Python bindings' tensors): sequences adopted from block
// tables made elsewhere read the same bytes an owning cache wrote, and update_reps recomputes
// the representatives append wrote.
TEST(KvCache, WrapAdoptsBlockTablesOverCallerPools) {
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kBF16}) {
    const KvCacheConfig cfg{
        .num_kv_heads = 2, .head_dim = 16, .page_size = 4, .num_pages = 12, .dtype = dt};
    auto owner = make(cfg);
    SeqId s = *owner->add_sequence();
    std::mt19937 rng(3);
    append_random(*owner, s, 10, rng);
    const int64_t es = owner->elem_bytes();
    const int64_t kv_bytes = 12 * 2 * 4 * 16 * es, rep_bytes = 12 * 2 * 16 * es;
    std::vector<uint8_t> kp(static_cast<const uint8_t*>(owner->k_pool(0)),
                            static_cast<const uint8_t*>(owner->k_pool(0)) + kv_bytes);
    std::vector<uint8_t> vp(static_cast<const uint8_t*>(owner->v_pool(0)),
                            static_cast<const uint8_t*>(owner->v_pool(0)) + kv_bytes);
    std::vector<uint8_t> rp(static_cast<size_t>(rep_bytes), 0);
    void* kpp[1] = {kp.data()};
    void* vpp[1] = {vp.data()};
    void* rpp[1] = {rp.data()};
    auto view = PagedKvCache::wrap(cfg, kpp, vpp, rpp);
    ASSERT_TRUE(view.ok()) << view.status().to_string();
    PagedKvCache& w = **view;
    const std::span<const int32_t> owned = *owner->block_table(s);
    const std::vector<int32_t> table(owned.begin(), owned.end());
    // Errors first: each leaves the view unchanged.
    EXPECT_EQ(w.adopt_sequence(table, 13).status().code(), StatusCode::kInvalidArgument);
    std::vector<int32_t> bad = table;
    bad[1] = 12;
    EXPECT_EQ(w.adopt_sequence(bad, 10).status().code(), StatusCode::kOutOfRange);
    bad[1] = bad[0];
    EXPECT_EQ(w.adopt_sequence(bad, 10).status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(w.free_pages(), 12);
    auto a = w.adopt_sequence(table, 10);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    EXPECT_EQ(*w.tokens(0, *a), 10);
    EXPECT_EQ(w.free_pages(), 12 - 3);
    EXPECT_EQ(w.page_owner(table[2]), *a);
    EXPECT_EQ(w.adopt_sequence(std::span<const int32_t>(table).first(1), 4).status().code(),
              StatusCode::kInvalidArgument);  // page in use
    for (int g = 0; g < 2; ++g)
      EXPECT_EQ(0,
                std::memcmp(w.k_page(0, table[1], g), owner->k_page(0, table[1], g), 4 * 16 * es));
    // A new sequence takes pages the adopted one does not own.
    SeqId b = *w.add_sequence();
    ASSERT_TRUE(w.reserve(b, 4 * 9).ok());
    EXPECT_FALSE(w.reserve(b, 1).ok());
    const std::span<const int32_t> fresh = *w.block_table(b);
    for (int32_t p : fresh) EXPECT_NE(w.page_owner(p), *a);
    // Representatives of the two full pages, as append computed them.
    ASSERT_TRUE(w.update_reps(0, std::span<const int32_t>(table).first(2)).ok());
    for (int p = 0; p < 2; ++p)
      for (int g = 0; g < 2; ++g)
        EXPECT_EQ(0, std::memcmp(w.rep(0, table[p], g), owner->rep(0, table[p], g), 16 * es));
    const int32_t out[1] = {12};
    EXPECT_EQ(w.update_reps(0, out).code(), StatusCode::kOutOfRange);
    EXPECT_EQ(w.update_reps(1, table).code(), StatusCode::kOutOfRange);
  }
  void* none[1] = {nullptr};
  EXPECT_FALSE(PagedKvCache::wrap({.num_pages = 4}, none, none, none).ok());
}

TEST(KvCache, BytesAccountsForRepLayers) {
  KvCacheConfig cfg{.num_layers = 3,
                    .num_kv_heads = 2,
                    .head_dim = 16,
                    .page_size = 16,
                    .num_pages = 10,
                    .dtype = KvDtype::kBF16,
                    .rep_layers = {false, true, false}};
  // K+V: 3 layers × 2 × 10 pages × 2 heads × 16 × 16 × 2 B; reps: 1 layer × 10 × 2 × 16 × 2 B.
  EXPECT_EQ(kv_cache_bytes(cfg), 3 * 2 * 10 * 2 * 16 * 16 * 2 + 10 * 2 * 16 * 2);
  // The representative cache is 1/(2B) of one layer's K+V.
  auto c = make(cfg);
  EXPECT_FALSE(c->has_reps(0));
  EXPECT_TRUE(c->has_reps(1));
}

}  // namespace
}  // namespace cisa
