// attend_llamacpp (llama.cpp's attention numerics) against independent references: its f16
// rounding against the library's own half conversion (quant.h) over every half and every midpoint
// between neighbours, its exp against fp64 exp, its dot products against fp64 sums, and whole
// attention against an fp64 softmax over the same f16-rounded inputs. Bit-exactness against
// llama.cpp itself is the golden test's job (tests/golden/model_golden_test.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>

#include "cisa/cpu/attention_llamacpp.h"
#include "cisa/cpu/selection.h"
#include "cisa/model/quant.h"
#include "test_util.h"

namespace cisa {
namespace {

float ref_half(float x) {
  return f16_to_f32(f32_to_f16(x));
}
bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}

TEST(LlamaCppNumerics, RoundF16MatchesHalfConversionEverywhere) {
  // Every finite half is a fixed point, and every midpoint to the next half rounds to the even one
  // (checked against the independent converter); values just off the midpoint go to the nearer.
  int checked = 0;
  for (uint32_t h = 0; h < 0x7C00u; ++h) {
    const float v = f16_to_f32(static_cast<uint16_t>(h));
    ASSERT_TRUE(same_bits(llamacpp::round_f16(v), v)) << h;
    ASSERT_TRUE(same_bits(llamacpp::round_f16(-v), -v)) << h;
    // Past the largest half (65504) the next value is infinity, reached from 65520 on.
    const bool last = h + 1 == 0x7C00u;
    const float next = last ? INFINITY : f16_to_f32(static_cast<uint16_t>(h + 1));
    const float mid = last ? 65520.0f : static_cast<float>((double(v) + next) / 2);  // exact
    ASSERT_TRUE(same_bits(llamacpp::round_f16(mid), ref_half(mid))) << h;
    ASSERT_EQ(llamacpp::round_f16(mid), (h & 1u) ? next : v) << "ties go to the even half, " << h;
    ASSERT_EQ(llamacpp::round_f16(std::nextafter(mid, 0.0f)), v) << h;
    ASSERT_EQ(llamacpp::round_f16(std::nextafter(mid, INFINITY)), next) << h;
    ++checked;
  }
  EXPECT_EQ(checked, 0x7C00);
  EXPECT_EQ(llamacpp::round_f16(65519.0f), 65504.0f);
  EXPECT_EQ(llamacpp::round_f16(65520.0f), INFINITY);
  EXPECT_EQ(llamacpp::round_f16(-1e30f), -INFINITY);
  EXPECT_EQ(llamacpp::round_f16(1e-9f), 0.0f);
  EXPECT_TRUE(std::isnan(llamacpp::round_f16(NAN)));
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = rng();
    float x;
    std::memcpy(&x, &u, 4);
    if (!std::isfinite(x)) continue;
    ASSERT_TRUE(same_bits(llamacpp::round_f16(x), ref_half(x))) << x;
  }
}

TEST(LlamaCppNumerics, ExpIsAccurateAndSaturates) {
  double worst = 0;
  for (float x = -87.0f; x <= 0.0f; x += 0.0137f) {
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(llamacpp::exp(x) - want) / want);
  }
  EXPECT_LT(worst, 3e-7) << "a few f32 ulps";
  EXPECT_EQ(llamacpp::exp(0.0f), 1.0f);
  EXPECT_EQ(llamacpp::exp(-INFINITY), 0.0f);
  EXPECT_EQ(llamacpp::exp(-1000.0f), 0.0f);
  EXPECT_EQ(llamacpp::exp(1000.0f), INFINITY);
  // Below e^-87 the result is subnormal but still close.
  EXPECT_NEAR(llamacpp::exp(-95.0f) / std::exp(-95.0), 1.0, 1e-4);
}

TEST(LlamaCppNumerics, TreeAndLaneSumsFollowTheirOrder) {
  // The tree adds lane i + 8 to lane i first: 1e8 and −1e8 in lanes 0 and 8 cancel exactly before
  // lane 1's 1 is added, whereas a left-to-right sum would lose the 1 (1e8 + 1 = 1e8 in f32).
  float lanes[16] = {};
  lanes[0] = 1e8f;
  lanes[1] = 1.0f;
  lanes[8] = -1e8f;
  EXPECT_EQ(llamacpp::tree_sum16(lanes), 1.0f);
  float seq = 0;
  for (float l : lanes) seq += l;
  EXPECT_EQ(seq, 0.0f);
  std::mt19937 rng(9);
  for (int n : {16, 64, 256, 40}) {
    auto a = test::random_vec(rng, static_cast<size_t>(n)),
         b = test::random_vec(rng, static_cast<size_t>(n));
    double want = 0, mag = 0;
    for (int i = 0; i < n; ++i) want += double(a[i]) * b[i], mag += std::abs(double(a[i]) * b[i]);
    EXPECT_NEAR(llamacpp::dot16(a.data(), b.data(), n), want, 1e-6 * mag) << n;
    EXPECT_NEAR(llamacpp::dot64x4(a.data(), b.data(), n), want, 1e-6 * mag) << n;
  }
}

TEST(LlamaCppNumerics, OneColumnDotFollowsItsOrder) {
  // Elements 0, 32 and 64 share dot16's lane 0, where 1e8 + 1 loses the 1 before −1e8 cancels
  // 1e8. dot64x4 puts 0 and 64 in accumulator 0 (they cancel there) and 32 in accumulator 2.
  std::vector<float> a(128, 0.0f), ones(128, 1.0f);
  a[0] = 1e8f;
  a[32] = 1.0f;
  a[64] = -1e8f;
  EXPECT_EQ(llamacpp::dot16(a.data(), ones.data(), 128), 0.0f);
  EXPECT_EQ(llamacpp::dot64x4(a.data(), ones.data(), 128), 1.0f);
  // The tail past the last whole 64-chunk is summed in fp64: 2^24 + 1 + 1 is exact there, while
  // f32 additions would round each + 1 away (ties to even).
  std::vector<float> b(70, 0.0f);
  b[0] = 0x1p24f;
  b[64] = b[65] = 1.0f;
  EXPECT_EQ(llamacpp::dot64x4(b.data(), ones.data(), 70), 0x1p24f + 2.0f);
  EXPECT_EQ(llamacpp::dot16(b.data(), ones.data(), 70), 0x1p24f);
}

struct KvSetup {
  std::unique_ptr<PagedKvCache> cache;
  std::vector<SeqId> seqs;
};

// Sequences appended in interleaved random blocks, so their physical pages are scattered.
KvSetup make_setup(int hkv, int d, KvDtype dt, const std::vector<int64_t>& lens,
                   std::mt19937& rng) {
  KvSetup s;
  int64_t pages = 0;
  for (auto l : lens) pages += l / 16 + 2;
  s.cache = std::move(*PagedKvCache::create(
      {.num_layers = 1, .num_kv_heads = hkv, .head_dim = d, .num_pages = pages, .dtype = dt}));
  for (size_t i = 0; i < lens.size(); ++i) s.seqs.push_back(*s.cache->add_sequence());
  test::append_interleaved(*s.cache, s.seqs, lens, 29, rng);
  return s;
}

// fp64 softmax attention on f16-rounded q, k, v: only the arithmetic's rounding (f16 weights,
// f32 sums) separates it from attend_llamacpp, so |error| ≤ ~2^-11 · max|v| plus f32 noise.
void check_against_fp64(const PagedKvCache& c, std::span<const BatchEntry> batch,
                        const PageLists& lists, const std::vector<float>& q, int hq, float scale,
                        bool scale_queries, int64_t window, const std::vector<float>& out) {
  const int d = c.head_dim(), hg = hq / c.num_kv_heads();
  for (size_t gi = 0; gi < lists.groups.size(); ++gi) {
    const QueryGroup& grp = lists.groups[gi];
    const SeqId seq = batch[static_cast<size_t>(grp.entry)].seq;
    for (int64_t t = grp.first; t <= grp.last; ++t)
      for (int h = 0; h < hq; ++h) {
        const int g = h / hg;
        const int64_t row = (grp.row + (t - grp.first)) * hq + h;
        const auto pos =
            test::visible_positions(lists.list_chunks(static_cast<int64_t>(gi), g), 16, t, window);
        ASSERT_FALSE(pos.empty());
        std::vector<double> s(pos.size()), o(static_cast<size_t>(d), 0.0);
        double mx = -INFINITY, sum = 0;
        for (size_t j = 0; j < pos.size(); ++j) {
          double dot = 0;
          for (int i = 0; i < d; ++i) {
            const float qi = q[static_cast<size_t>(row * d + i)];
            dot += double(ref_half(scale_queries ? qi * scale : qi)) *
                   ref_half(test::stored(c, true, 0, seq, pos[j], g, i));
          }
          s[j] = scale_queries ? dot : dot * scale;
          mx = std::max(mx, s[j]);
        }
        for (double& x : s) sum += (x = std::exp(x - mx));
        double vmax = 0;
        for (size_t j = 0; j < pos.size(); ++j)
          for (int i = 0; i < d; ++i) {
            const double v = ref_half(test::stored(c, false, 0, seq, pos[j], g, i));
            o[static_cast<size_t>(i)] += s[j] / sum * v;
            vmax = std::max(vmax, std::abs(v));
          }
        for (int i = 0; i < d; ++i)
          ASSERT_NEAR(out[static_cast<size_t>(row * d + i)], o[static_cast<size_t>(i)],
                      1e-3 * vmax + 1e-5)
              << "t " << t << " head " << h << " dim " << i;
      }
  }
}

struct Case {
  int d, hkv, hg;
  KvDtype dtype;
  int64_t window;
  bool scale_queries;
};

class LlamaCppAttention : public ::testing::TestWithParam<Case> {};

TEST_P(LlamaCppAttention, DenseAndCisaListsMatchFp64) {
  const Case c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.d * 7 + c.hkv * 3 + c.hg + c.window));
  const std::vector<int64_t> lens = {45, 170, 333};
  KvSetup s = make_setup(c.hkv, c.d, c.dtype, lens, rng);
  const int hq = c.hkv * c.hg;
  // A whole prefill, a decode row, and a terminal block, in one batch.
  std::vector<BatchEntry> batch = {{s.seqs[0], 0, 45}, {s.seqs[1], 169, 1}, {s.seqs[2], 300, 33}};
  const int64_t rows = batch_row_offsets(batch).back();
  auto q = test::random_vec(rng, static_cast<size_t>(rows * hq * c.d));
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  const LlamaCppAttentionParams p{
      .scale = scale, .sliding_window = c.window, .scale_queries = c.scale_queries};
  ThreadPool pool(2);
  PageLists dense;
  ASSERT_TRUE(plan_dense(*s.cache, 0, batch, c.window, &dense).ok());
  std::vector<float> out(q.size(), NAN);
  ASSERT_TRUE(attend_llamacpp(*s.cache, 0, batch, dense, q.data(), hq, p, out.data(), pool).ok());
  check_against_fp64(*s.cache, batch, dense, q, hq, scale, c.scale_queries, c.window, out);
  if (c.window) return;
  // CISA page lists: the same arithmetic over the selected pages only.
  auto iq = test::random_vec(rng, static_cast<size_t>(rows * c.hkv * c.d));
  PageLists sparse;
  ASSERT_TRUE(select_pages(*s.cache, 0, batch, iq.data(),
                           {.budget = 5, .window = 2, .qshare = 8, .sink_pages = 1}, &pool, &sparse)
                  .ok());
  std::vector<float> out_sparse(q.size(), NAN);
  ASSERT_TRUE(
      attend_llamacpp(*s.cache, 0, batch, sparse, q.data(), hq, p, out_sparse.data(), pool).ok());
  check_against_fp64(*s.cache, batch, sparse, q, hq, scale, c.scale_queries, 0, out_sparse);
}

// A batch of one row (a decode step) in llama.cpp's one-column order, written out from the
// building blocks: q·k by dot64x4, the softmax as in batches, P·V in 64 lanes by position,
// (l + 32) added to l and (l + 48) to (l + 16), then the tree.
std::vector<float> one_row_reference(const PagedKvCache& c, SeqId seq, int64_t t, const float* q,
                                     int hq, const LlamaCppAttentionParams& p) {
  const int d = c.head_dim(), hg = hq / c.num_kv_heads();
  std::vector<float> out(static_cast<size_t>(hq * d));
  const int64_t lo = p.sliding_window > 0 ? std::max<int64_t>(0, t - p.sliding_window + 1) : 0;
  for (int h = 0; h < hq; ++h) {
    const int g = h / hg;
    std::vector<float> qh(static_cast<size_t>(d)), k(static_cast<size_t>(d)), e;
    for (int i = 0; i < d; ++i)
      qh[i] = llamacpp::round_f16(p.scale_queries ? q[h * d + i] * p.scale : q[h * d + i]);
    float mx = -INFINITY;
    for (int64_t s = lo; s <= t; ++s) {
      for (int i = 0; i < d; ++i)
        k[i] = llamacpp::round_f16(test::stored(c, true, 0, seq, s, g, i));
      const float dot = llamacpp::dot64x4(qh.data(), k.data(), d);
      e.push_back(p.scale_queries ? dot : dot * p.scale);
      mx = std::max(mx, e.back());
    }
    double total = 0;
    float lanes[16] = {};
    for (int64_t s = lo; s <= t; ++s) {
      float& x = e[static_cast<size_t>(s - lo)];
      lanes[s % 16] = x = llamacpp::exp(x - mx);
      if (s == t || s % 16 == 15) {
        total += llamacpp::tree_sum16(lanes);
        std::fill(lanes, lanes + 16, 0.0f);
      }
    }
    const float inv = static_cast<float>(1.0 / total);
    std::vector<float> acc(static_cast<size_t>(64 * d), 0.0f);
    for (int64_t s = lo; s <= t; ++s) {
      const float pr = llamacpp::round_f16(e[static_cast<size_t>(s - lo)] * inv);
      for (int i = 0; i < d; ++i)
        acc[(s % 64) * d + i] =
            std::fma(pr, llamacpp::round_f16(test::stored(c, false, 0, seq, s, g, i)),
                     acc[(s % 64) * d + i]);
    }
    for (int i = 0; i < d; ++i) {
      for (int l = 0; l < 16; ++l)
        lanes[l] = (acc[l * d + i] + acc[(l + 32) * d + i]) +
                   (acc[(l + 16) * d + i] + acc[(l + 48) * d + i]);
      out[static_cast<size_t>(h * d + i)] = llamacpp::tree_sum16(lanes);
    }
  }
  return out;
}

// A query's result depends only on its own keys and on whether its batch has one row: splitting
// a sequence's rows into blocks of two or more rows, or batching it with other sequences, gives
// the very same floats; a batch of one row takes llama.cpp's one-column order (above).
TEST_P(LlamaCppAttention, RowsAreBitIdenticalAcrossBlockSplitsAndBatches) {
  const Case c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(c.d + c.hkv * 11 + c.hg * 5 + c.window));
  KvSetup s = make_setup(c.hkv, c.d, c.dtype, {200, 90}, rng);
  const int hq = c.hkv * c.hg;
  const size_t row_floats = static_cast<size_t>(hq * c.d);
  auto q = test::random_vec(rng, 200 * row_floats);
  auto q_other = test::random_vec(rng, row_floats);
  const LlamaCppAttentionParams p{
      .scale = 0.125f, .sliding_window = c.window, .scale_queries = c.scale_queries};
  ThreadPool pool(2);
  auto run = [&](std::vector<BatchEntry> batch, const std::vector<float>& qs) {
    PageLists lists;
    EXPECT_TRUE(plan_dense(*s.cache, 0, batch, c.window, &lists).ok());
    std::vector<float> out(qs.size(), NAN);
    EXPECT_TRUE(
        attend_llamacpp(*s.cache, 0, batch, lists, qs.data(), hq, p, out.data(), pool).ok());
    return out;
  };
  const auto whole = run({{s.seqs[0], 0, 200}}, q);
  std::vector<float> pieces;
  int decode_rows_differing = 0;
  for (int64_t first = 0; first < 200;) {
    const int32_t n = first < 150 ? 7 : first < 160 ? 2 : 1;  // 7- and 2-row blocks, decode rows
    std::vector<float> qs(q.begin() + first * row_floats, q.begin() + (first + n) * row_floats);
    const auto o = run({{s.seqs[0], first, n}}, qs);
    if (n == 1) {
      const auto want = one_row_reference(*s.cache, s.seqs[0], first, qs.data(), hq, p);
      ASSERT_EQ(std::memcmp(o.data(), want.data(), row_floats * sizeof(float)), 0) << first;
      decode_rows_differing +=
          std::memcmp(o.data(), whole.data() + first * row_floats, row_floats * sizeof(float)) != 0;
      std::copy(whole.begin() + first * row_floats, whole.begin() + (first + 1) * row_floats,
                std::back_inserter(pieces));
    } else {
      pieces.insert(pieces.end(), o.begin(), o.end());
    }
    first += n;
  }
  ASSERT_EQ(pieces.size(), whole.size());
  EXPECT_EQ(std::memcmp(pieces.data(), whole.data(), whole.size() * sizeof(float)), 0);
  // The two orders are different functions: some decode row must show it (d = 40 sums its lone
  // partial chunk in fp64, which can agree with the 16 lanes).
  if (c.d >= 64) {
    EXPECT_GT(decode_rows_differing, 0);
  }
  // Batched behind another sequence's decode row.
  std::vector<float> qb = q_other;
  qb.insert(qb.end(), q.begin() + 100 * row_floats, q.begin() + 140 * row_floats);
  const auto batched = run({{s.seqs[1], 89, 1}, {s.seqs[0], 100, 40}}, qb);
  EXPECT_EQ(std::memcmp(batched.data() + row_floats, whole.data() + 100 * row_floats,
                        40 * row_floats * sizeof(float)),
            0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LlamaCppAttention,
    ::testing::Values(Case{64, 3, 3, KvDtype::kF32, 0, false},   // SmolLM2
                      Case{256, 1, 4, KvDtype::kF32, 0, true},   // Gemma 3 global
                      Case{256, 1, 4, KvDtype::kF32, 40, true},  // Gemma 3 local
                      Case{128, 2, 2, KvDtype::kBF16, 0, false},
                      Case{40, 2, 1, KvDtype::kF32, 5, false}));  // d not 16k, window < tile

TEST(LlamaCppAttentionErrors, BadInputsAreRejected) {
  std::mt19937 rng(3);
  KvSetup s = make_setup(2, 64, KvDtype::kF32, {40, 40}, rng);
  ThreadPool pool(1);
  std::vector<BatchEntry> batch = {{s.seqs[0], 30, 10}};
  PageLists lists;
  ASSERT_TRUE(plan_dense(*s.cache, 0, batch, 0, &lists).ok());
  auto q = test::random_vec(rng, 10 * 4 * 64);
  std::vector<float> out(q.size());
  const LlamaCppAttentionParams p{};
  auto code = [&](const PageLists& l, int hq, std::span<const BatchEntry> b, const float* qp) {
    return attend_llamacpp(*s.cache, 0, b, l, qp, hq, p, out.data(), pool).code();
  };
  EXPECT_EQ(code(lists, 4, batch, q.data()), StatusCode::kOk);
  EXPECT_EQ(code(lists, 3, batch, q.data()), StatusCode::kInvalidArgument);  // not a multiple of 2
  EXPECT_EQ(code(lists, 4, batch, nullptr), StatusCode::kInvalidArgument);
  std::vector<BatchEntry> past = {{s.seqs[0], 35, 10}};                // K/V of 40..44 not written
  EXPECT_EQ(code(lists, 4, past, q.data()), StatusCode::kOutOfRange);  // validate_batch's code
  PageLists foreign = lists;  // a page of the other sequence
  foreign.pages[0] = (*s.cache->block_table(s.seqs[1]))[0];
  EXPECT_EQ(code(foreign, 4, batch, q.data()), StatusCode::kInvalidArgument);
  PageLists uncovered = lists;  // rows 30..34 in no group
  uncovered.groups[0].first = 35;
  uncovered.groups[0].row = 5;
  EXPECT_EQ(code(uncovered, 4, batch, q.data()), StatusCode::kInvalidArgument);
  PageLists twice = lists;  // the same rows in two groups
  twice.groups.push_back(twice.groups[0]);
  twice.offsets.push_back(twice.offsets.back());
  twice.offsets.push_back(twice.offsets.back());
  EXPECT_EQ(code(twice, 4, batch, q.data()), StatusCode::kInvalidArgument);
  PageLists bad_offsets = lists;
  bad_offsets.offsets.back() += 1;
  EXPECT_EQ(code(bad_offsets, 4, batch, q.data()), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cisa
