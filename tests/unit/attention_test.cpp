// Attention over page lists against an fp64 brute-force softmax over the same token set.
#include <algorithm>

#include "cisa/cpu/attention.h"
#include "cisa/cpu/selection.h"
#include "test_util.h"

namespace cisa {
namespace {

using test::append_interleaved;
using test::append_random;

struct Case {
  int head_dim, hkv, ratio;
  KvDtype dtype;
};

struct CacheSetup {
  std::unique_ptr<PagedKvCache> cache;
  std::vector<SeqId> seqs;
};

// Several sequences of different lengths, appended in interleaved random blocks so each one's
// physical pages are scattered.
CacheSetup make_setup(const Case& c, const std::vector<int64_t>& lens, std::mt19937& rng,
                      int layers = 1, int page_size = 16) {
  CacheSetup s;
  int64_t pages = 0;
  for (auto l : lens) pages += l / page_size + 2;
  s.cache = std::move(*PagedKvCache::create({.num_layers = layers,
                                             .num_kv_heads = c.hkv,
                                             .head_dim = c.head_dim,
                                             .page_size = page_size,
                                             .num_pages = pages,
                                             .dtype = c.dtype}));
  for (size_t i = 0; i < lens.size(); ++i) s.seqs.push_back(*s.cache->add_sequence());
  append_interleaved(*s.cache, s.seqs, lens, 37, rng);
  return s;
}

// Checks every sampled row of `out`/`lse` against the fp64 reference over the tokens its list
// makes visible.
void check_rows(const PagedKvCache& cache, std::span<const BatchEntry> batch,
                const PageLists& lists, const std::vector<float>& q, int hq,
                const std::vector<float>& out, const std::vector<float>& lse, int64_t window,
                std::mt19937& rng, int max_rows = 24) {
  const int d = cache.head_dim(), hkv = cache.num_kv_heads(), hg = hq / hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (size_t gi = 0; gi < lists.groups.size(); ++gi) {
    const auto& grp = lists.groups[gi];
    const int64_t n = (grp.last - grp.first + 1) * hq;
    for (int trial = 0; trial < std::min<int64_t>(max_rows, n); ++trial) {
      const int64_t k = n <= max_rows ? trial : static_cast<int64_t>(rng() % n);
      const int64_t t = grp.first + k / hq;
      const int h = static_cast<int>(k % hq);
      const int g = h / hg;
      const int64_t row = (grp.row + (t - grp.first)) * hq + h;
      const auto pos = test::visible_positions(lists.list_chunks(static_cast<int64_t>(gi), g),
                                               cache.page_size(), t, window);
      double ref_lse = 0;
      const auto ref =
          test::reference_attention(cache, 0, batch[static_cast<size_t>(grp.entry)].seq, g,
                                    q.data() + row * d, pos, scale, &ref_lse);
      for (int i = 0; i < d; ++i) {
        const float got = out[static_cast<size_t>(row * d + i)];
        ASSERT_FALSE(std::isnan(got));
        ASSERT_NEAR(got, ref[static_cast<size_t>(i)],
                    2e-5 + 2e-5 * std::abs(ref[static_cast<size_t>(i)]))
            << "group " << gi << " t " << t << " head " << h << " dim " << i;
      }
      ASSERT_NEAR(lse[static_cast<size_t>(row)], ref_lse, 1e-4 + 1e-5 * std::abs(ref_lse));
    }
  }
}

// Dense, dense with a sliding window, sparse lists (sp) and full-budget CISA over the same batch:
// the first three against fp64 (every row up to max_rows per group), the last bit for bit equal
// to dense.
void check_dense_window_sparse_full(const CacheSetup& s, std::span<const BatchEntry> batch,
                                    const std::vector<float>& q, const std::vector<float>& iq,
                                    int hq, int64_t window, SelectionParams sp, std::mt19937& rng,
                                    int max_rows) {
  const int64_t rows = batch_row_offsets(batch).back();
  std::vector<float> out(q.size(), NAN), lse(static_cast<size_t>(rows * hq), NAN);
  ThreadPool pool(2);
  AttentionWorkspace ws;
  PageLists dense, sparse, full;
  ASSERT_TRUE(plan_dense(*s.cache, 0, batch, 0, &dense).ok());
  ASSERT_TRUE(
      attend(*s.cache, 0, batch, dense, q.data(), hq, {}, out.data(), lse.data(), pool, &ws).ok());
  check_rows(*s.cache, batch, dense, q, hq, out, lse, 0, rng, max_rows);
  const std::vector<float> dense_out = out, dense_lse = lse;

  ASSERT_TRUE(plan_dense(*s.cache, 0, batch, window, &dense).ok());
  ASSERT_TRUE(attend(*s.cache, 0, batch, dense, q.data(), hq, {.sliding_window = window},
                     out.data(), lse.data(), pool, &ws)
                  .ok());
  check_rows(*s.cache, batch, dense, q, hq, out, lse, window, rng, max_rows);

  ASSERT_TRUE(select_pages(*s.cache, 0, batch, iq.data(), sp, &pool, &sparse).ok());
  ASSERT_TRUE(
      attend(*s.cache, 0, batch, sparse, q.data(), hq, {}, out.data(), lse.data(), pool, &ws).ok());
  check_rows(*s.cache, batch, sparse, q, hq, out, lse, 0, rng, max_rows);

  sp.budget = 1 << 20;
  ASSERT_TRUE(select_pages(*s.cache, 0, batch, iq.data(), sp, &pool, &full).ok());
  ASSERT_TRUE(
      attend(*s.cache, 0, batch, full, q.data(), hq, {}, out.data(), lse.data(), pool, &ws).ok());
  EXPECT_EQ(out, dense_out);
  EXPECT_EQ(lse, dense_lse);
}

class AttentionSweep : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionSweep, DensePrefillAndDecodeMatchFp64) {
  const Case c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.head_dim * 131 + c.hkv * 17 + c.ratio));
  // Lengths cover every offset within the last page across the sweep.
  std::vector<int64_t> lens = {17 + static_cast<int64_t>(rng() % 16),
                               100 + static_cast<int64_t>(rng() % 16),
                               300 + static_cast<int64_t>(rng() % 16)};
  CacheSetup s = make_setup(c, lens, rng);
  const int hq = c.hkv * c.ratio, d = c.head_dim;
  std::vector<BatchEntry> batch = {{s.seqs[0], 0, static_cast<int32_t>(lens[0])},  // whole prefill
                                   {s.seqs[1], lens[1] - 1, 1},                    // decode
                                   {s.seqs[2], lens[2] - 70, 70}};                 // terminal block
  const int64_t rows = batch_row_offsets(batch).back();
  auto q = test::random_vec(rng, static_cast<size_t>(rows * hq * d));
  std::vector<float> out(q.size(), NAN), lse(static_cast<size_t>(rows * hq), NAN);
  PageLists lists;
  ASSERT_TRUE(plan_dense(*s.cache, 0, batch, 0, &lists).ok());
  ThreadPool pool(2);
  AttentionWorkspace ws;
  ASSERT_TRUE(
      attend(*s.cache, 0, batch, lists, q.data(), hq, {}, out.data(), lse.data(), pool, &ws).ok());
  check_rows(*s.cache, batch, lists, q, hq, out, lse, 0, rng);
}

TEST_P(AttentionSweep, SparseMatchesFp64OverSelectedTokensAndFullBudgetEqualsDense) {
  const Case c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.head_dim * 7 + c.hkv * 3 + c.ratio + 1));
  std::vector<int64_t> lens = {900 + static_cast<int64_t>(rng() % 16),
                               1300 + static_cast<int64_t>(rng() % 16)};
  CacheSetup s = make_setup(c, lens, rng);
  const int hq = c.hkv * c.ratio, d = c.head_dim;
  std::vector<BatchEntry> batch = {{s.seqs[0], lens[0] - 40, 40}, {s.seqs[1], lens[1] - 1, 1}};
  const int64_t rows = batch_row_offsets(batch).back();
  auto q = test::random_vec(rng, static_cast<size_t>(rows * hq * d));
  auto iq = test::random_vec(rng, static_cast<size_t>(rows * c.hkv * d));
  ThreadPool pool(2);
  AttentionWorkspace ws;
  std::vector<float> out(q.size(), NAN), lse(static_cast<size_t>(rows * hq), NAN);

  PageLists sparse;
  SelectionParams p{.budget = 9, .window = 3, .qshare = 8, .sink_pages = 1};
  ASSERT_TRUE(select_pages(*s.cache, 0, batch, iq.data(), p, &pool, &sparse).ok());
  for (const auto& g : sparse.groups) ASSERT_FALSE(g.dense);
  ASSERT_TRUE(
      attend(*s.cache, 0, batch, sparse, q.data(), hq, {}, out.data(), lse.data(), pool, &ws).ok());
  check_rows(*s.cache, batch, sparse, q, hq, out, lse, 0, rng);

  // k at least every eligible count: CISA is dense attention, bit for bit.
  PageLists full, dense;
  p.budget = 1 << 20;
  ASSERT_TRUE(select_pages(*s.cache, 0, batch, iq.data(), p, &pool, &full).ok());
  ASSERT_TRUE(plan_dense(*s.cache, 0, batch, 0, &dense).ok());
  std::vector<float> out2(q.size(), NAN), lse2(lse.size(), NAN);
  ASSERT_TRUE(
      attend(*s.cache, 0, batch, full, q.data(), hq, {}, out.data(), lse.data(), pool, &ws).ok());
  ASSERT_TRUE(
      attend(*s.cache, 0, batch, dense, q.data(), hq, {}, out2.data(), lse2.data(), pool, &ws)
          .ok());
  EXPECT_EQ(out, out2);
  EXPECT_EQ(lse, lse2);
}

std::vector<Case> sweep_cases() {
  std::vector<Case> cs;
  for (int d : {64, 128, 256})
    for (int ratio : {1, 4, 8, 32})
      for (KvDtype dt : {KvDtype::kF32, KvDtype::kBF16})
        cs.push_back({d, ratio == 32 ? 1 : 2, ratio, dt});
  return cs;
}

INSTANTIATE_TEST_SUITE_P(HeadDimGqaDtype, AttentionSweep, ::testing::ValuesIn(sweep_cases()),
                         [](const auto& info) {
                           const Case& c = info.param;
                           std::string name = "d";  // built with += (gcc 12 warns on a + chain)
                           name += std::to_string(c.head_dim);
                           name += "_kv";
                           name += std::to_string(c.hkv);
                           name += "_gqa";
                           name += std::to_string(c.ratio);
                           name += "_";
                           name += kv_dtype_name(c.dtype);
                           return name;
                         });

// Head dims that are not a multiple of 16 (a half vector of channels left over) and pages that are
// not one 16-key block (8: a partial block; 24: a full and a partial one; 48: three blocks), for
// prefill, decode, a sliding window and sparse lists, against fp64; full-budget CISA still equals
// dense bit for bit.
TEST(Attention, OddHeadDimsAndPageSizesMatchFp64) {
  struct Odd {
    int d, page, hkv, ratio;
    KvDtype dtype;
  };
  const Odd cases[] = {{8, 16, 1, 4, KvDtype::kF32},   {40, 8, 2, 3, KvDtype::kBF16},
                       {72, 24, 1, 4, KvDtype::kF32},  {24, 48, 3, 1, KvDtype::kBF16},
                       {136, 32, 1, 8, KvDtype::kF32}, {264, 16, 1, 4, KvDtype::kBF16}};
  for (const Odd& o : cases) {
    SCOPED_TRACE("d " + std::to_string(o.d) + " page " + std::to_string(o.page) + " " +
                 kv_dtype_name(o.dtype));
    std::mt19937 rng(static_cast<uint32_t>(o.d * 31 + o.page));
    const Case c{o.d, o.hkv, o.ratio, o.dtype};
    const std::vector<int64_t> lens = {500 + static_cast<int64_t>(rng() % 48),
                                       300 + static_cast<int64_t>(rng() % 48)};
    CacheSetup s = make_setup(c, lens, rng, 1, o.page);
    const int hq = o.hkv * o.ratio;
    std::vector<BatchEntry> batch = {{s.seqs[0], lens[0] - 77, 77}, {s.seqs[1], lens[1] - 1, 1}};
    const int64_t rows = batch_row_offsets(batch).back();
    auto q = test::random_vec(rng, static_cast<size_t>(rows * hq * o.d));
    auto iq = test::random_vec(rng, static_cast<size_t>(rows * o.hkv * o.d));
    check_dense_window_sparse_full(s, batch, q, iq, hq, 45,
                                   {.budget = 5, .window = 2, .qshare = 16, .sink_pages = 1}, rng,
                                   24);
  }
}

// Decode rows take the fused decode kernel wherever d % 32 == 0 and the page size is a multiple of
// 16 (attention_decode_kernel.h): pages of several 16-key blocks, a head dimension with a lone
// 32-channel block after the 64-channel ones (96, 160), query heads per KV group that are not a
// multiple of its 4-row blocks (1, 3, 6), positions anywhere in the last page, a sliding window
// that cuts through blocks, and sparse lists, against fp64; full-budget CISA equals dense bit for
// bit.
TEST(Attention, DecodeKernelShapesMatchFp64) {
  struct Shape {
    int d, page, hkv, ratio;
    KvDtype dtype;
  };
  const Shape cases[] = {{96, 32, 2, 3, KvDtype::kBF16}, {160, 48, 1, 6, KvDtype::kF32},
                         {32, 16, 3, 1, KvDtype::kBF16}, {96, 16, 1, 6, KvDtype::kF32},
                         {64, 48, 2, 4, KvDtype::kBF16}, {160, 32, 1, 3, KvDtype::kBF16}};
  for (const Shape& o : cases) {
    SCOPED_TRACE("d " + std::to_string(o.d) + " page " + std::to_string(o.page) + " " +
                 kv_dtype_name(o.dtype));
    std::mt19937 rng(static_cast<uint32_t>(o.d * 17 + o.page + o.ratio));
    const Case c{o.d, o.hkv, o.ratio, o.dtype};
    std::vector<int64_t> lens;
    for (int i = 0; i < 4; ++i) lens.push_back(600 + static_cast<int64_t>(rng() % 97));
    CacheSetup s = make_setup(c, lens, rng, 1, o.page);
    const int hq = o.hkv * o.ratio;
    std::vector<BatchEntry> batch;
    for (size_t i = 0; i < lens.size(); ++i) batch.push_back({s.seqs[i], lens[i] - 1, 1});
    const int64_t rows = batch_row_offsets(batch).back();
    auto q = test::random_vec(rng, static_cast<size_t>(rows * hq * o.d));
    auto iq = test::random_vec(rng, static_cast<size_t>(rows * o.hkv * o.d));
    check_dense_window_sparse_full(s, batch, q, iq, hq, 37,
                                   {.budget = 6, .window = 2, .qshare = 1, .sink_pages = 1}, rng,
                                   1000);
  }
}

// Same logical K/V and queries, different physical pages: identical results.
TEST(Attention, ShufflingPhysicalPagesChangesNothing) {
  std::mt19937 rng(21);
  const int d = 64, hkv = 2, hq = 8;
  const int64_t len = 777;
  auto k = test::random_vec(rng, static_cast<size_t>(len * hkv * d));
  auto v = test::random_vec(rng, static_cast<size_t>(len * hkv * d));
  auto q = test::random_vec(rng, static_cast<size_t>(50 * hq * d));
  auto iq = test::random_vec(rng, static_cast<size_t>(50 * hkv * d));
  std::vector<float> outs[2];
  for (int layout = 0; layout < 2; ++layout) {
    auto cache = std::move(*PagedKvCache::create(
        {.num_layers = 1, .num_kv_heads = hkv, .head_dim = d, .page_size = 16, .num_pages = 200}));
    SeqId filler = *cache->add_sequence();
    SeqId s = *cache->add_sequence();
    for (int64_t done = 0; done < len; done += 16) {
      const int64_t n = std::min<int64_t>(16, len - done);
      if (layout == 1) append_random(*cache, filler, 1 + static_cast<int64_t>(rng() % 40), rng);
      ASSERT_TRUE(cache->reserve(s, n).ok());
      ASSERT_TRUE(
          cache->append(0, s, n, k.data() + done * hkv * d, v.data() + done * hkv * d).ok());
    }
    std::vector<BatchEntry> batch = {{s, len - 50, 50}};
    PageLists lists;
    ThreadPool pool(2);
    AttentionWorkspace ws;
    ASSERT_TRUE(select_pages(*cache, 0, batch, iq.data(), {.budget = 8, .window = 2, .qshare = 16},
                             &pool, &lists)
                    .ok());
    outs[layout].assign(q.size(), NAN);
    ASSERT_TRUE(
        attend(*cache, 0, batch, lists, q.data(), hq, {}, outs[layout].data(), nullptr, pool, &ws)
            .ok());
  }
  EXPECT_EQ(outs[0], outs[1]);
}

// Split-KV decode over a long list, merged by log-sum-exp; and decode after prefill equals the
// last row of a prefill of the whole sequence.
TEST(Attention, DecodeAfterPrefillEqualsLastPrefillRow) {
  std::mt19937 rng(22);
  const int d = 128, hkv = 1, hq = 4;
  const int64_t len = 4000;
  auto cache = std::move(*PagedKvCache::create({.num_layers = 1,
                                                .num_kv_heads = hkv,
                                                .head_dim = d,
                                                .page_size = 16,
                                                .num_pages = 300,
                                                .dtype = KvDtype::kBF16}));
  SeqId s = *cache->add_sequence();
  append_random(*cache, s, len - 1, rng);
  ThreadPool pool(2);
  AttentionWorkspace ws;
  PageLists lists;
  auto q = test::random_vec(rng, static_cast<size_t>(hq * d));
  // Prefill rows for the last 64 positions once the last token is there; its last row is t = len−1.
  append_random(*cache, s, 1, rng);
  const int64_t n = 64;
  std::vector<float> qp = test::random_vec(rng, static_cast<size_t>(n * hq * d));
  std::copy(q.begin(), q.end(), qp.end() - hq * d);
  std::vector<BatchEntry> pre = {{s, len - n, static_cast<int32_t>(n)}}, dec = {{s, len - 1, 1}};
  std::vector<float> out_p(qp.size(), NAN), out_d(q.size(), NAN),
      lse_p(static_cast<size_t>(n * hq)), lse_d(hq);
  ASSERT_TRUE(plan_dense(*cache, 0, pre, 0, &lists).ok());
  ASSERT_TRUE(
      attend(*cache, 0, pre, lists, qp.data(), hq, {}, out_p.data(), lse_p.data(), pool, &ws).ok());
  ASSERT_TRUE(plan_dense(*cache, 0, dec, 0, &lists).ok());
  ASSERT_TRUE(
      attend(*cache, 0, dec, lists, q.data(), hq, {}, out_d.data(), lse_d.data(), pool, &ws).ok());
  for (int i = 0; i < hq * d; ++i)
    ASSERT_NEAR(out_d[static_cast<size_t>(i)], out_p[static_cast<size_t>((n - 1) * hq * d + i)],
                1e-5);
  for (int h = 0; h < hq; ++h)
    ASSERT_NEAR(lse_d[static_cast<size_t>(h)], lse_p[static_cast<size_t>((n - 1) * hq + h)], 1e-4);
  // And the decode (split across threads) agrees with fp64.
  std::vector<int64_t> all(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) all[static_cast<size_t>(i)] = i;
  double ref_lse = 0;
  auto ref = test::reference_attention(*cache, 0, s, 0, q.data() + 2 * d, all,
                                       1.0 / std::sqrt(128.0), &ref_lse);
  for (int i = 0; i < d; ++i)
    ASSERT_NEAR(out_d[static_cast<size_t>(2 * d + i)], ref[static_cast<size_t>(i)], 2e-5);
  EXPECT_NEAR(lse_d[2], ref_lse, 1e-4);
}

TEST(Attention, SlidingWindowMatchesFp64) {
  std::mt19937 rng(23);
  Case c{64, 1, 4, KvDtype::kF32};
  CacheSetup s = make_setup(c, {1000}, rng);
  std::vector<BatchEntry> batch = {{s.seqs[0], 900, 100}};
  auto q = test::random_vec(rng, static_cast<size_t>(100 * 4 * 64));
  std::vector<float> out(q.size(), NAN), lse(400, NAN);
  PageLists lists;
  ASSERT_TRUE(plan_dense(*s.cache, 0, batch, 77, &lists).ok());
  EXPECT_EQ(lists.list_chunks(0, 0).front(), (900 - 77 + 1) / 16);
  ThreadPool pool(2);
  AttentionWorkspace ws;
  ASSERT_TRUE(attend(*s.cache, 0, batch, lists, q.data(), 4, {.sliding_window = 77}, out.data(),
                     lse.data(), pool, &ws)
                  .ok());
  check_rows(*s.cache, batch, lists, q, 4, out, lse, 77, rng, 64);
}

TEST(Attention, RejectsBadInputAndLeavesCacheUsable) {
  std::mt19937 rng(24);
  Case c{64, 2, 2, KvDtype::kF32};
  CacheSetup s = make_setup(c, {200, 50}, rng);
  std::vector<BatchEntry> batch = {{s.seqs[0], 150, 50}};
  auto q = test::random_vec(rng, static_cast<size_t>(50 * 4 * 64));
  std::vector<float> out(q.size());
  PageLists lists;
  ASSERT_TRUE(plan_dense(*s.cache, 0, batch, 0, &lists).ok());
  ThreadPool pool(2);
  AttentionWorkspace ws;
  // Query heads not a multiple of KV heads.
  Status st = attend(*s.cache, 0, batch, lists, q.data(), 3, {}, out.data(), nullptr, pool, &ws);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("multiple"), std::string::npos);
  // A page list naming a free page.
  PageLists bad = lists;
  SeqId tmp = *s.cache->add_sequence();
  append_random(*s.cache, tmp, 16, rng);
  const int32_t freed = (*s.cache->block_table(tmp))[0];
  ASSERT_TRUE(s.cache->release_sequence(tmp).ok());
  bad.pages[3] = freed;
  st = attend(*s.cache, 0, batch, bad, q.data(), 4, {}, out.data(), nullptr, pool, &ws);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("free"), std::string::npos);
  // A page of another sequence.
  bad.pages[3] = (*s.cache->block_table(s.seqs[1]))[0];
  EXPECT_FALSE(
      attend(*s.cache, 0, batch, bad, q.data(), 4, {}, out.data(), nullptr, pool, &ws).ok());
  // Lists built for another batch, unknown sequence, queries past the written tokens.
  std::vector<BatchEntry> other = {{s.seqs[0], 150, 40}};
  EXPECT_FALSE(
      attend(*s.cache, 0, other, lists, q.data(), 4, {}, out.data(), nullptr, pool, &ws).ok());
  std::vector<BatchEntry> unknown = {{99, 0, 1}};
  EXPECT_EQ(plan_dense(*s.cache, 0, unknown, 0, &lists).code(), StatusCode::kNotFound);
  std::vector<BatchEntry> future = {{s.seqs[0], 190, 20}};
  EXPECT_EQ(plan_dense(*s.cache, 0, future, 0, &lists).code(), StatusCode::kOutOfRange);
  EXPECT_FALSE(
      attend(*s.cache, 0, batch, lists, q.data(), 4, {}, out.data(), nullptr, pool, nullptr).ok());
  // The cache still works.
  ASSERT_TRUE(plan_dense(*s.cache, 0, batch, 0, &lists).ok());
  std::vector<float> lse(200);
  ASSERT_TRUE(
      attend(*s.cache, 0, batch, lists, q.data(), 4, {}, out.data(), lse.data(), pool, &ws).ok());
  check_rows(*s.cache, batch, lists, q, 4, out, lse, 0, rng, 8);
}

}  // namespace
}  // namespace cisa
