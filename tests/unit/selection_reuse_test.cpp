// Selection reuse across decode steps (plan.h's rule, docs/design.md): decode lists against an
// independent reference that replays the rule step by step (fresh lists from select_pages with
// r = 1 on the same batch, the check's decision from fp64 scores), r = 1 bit-identical to no
// reuse, the check firing when a chunk leaving the window dominates, ageing, the state's
// lifetime, the CPU backend and the model (StepAttention), and bad options rejected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "cisa/core/backend.h"
#include "cisa/cpu/selection.h"
#include "cisa/model/model.h"
#include "cisa/model/sampling.h"
#include "test_util.h"

namespace cisa {
namespace {

constexpr int kB = 16;

// fp64 mean-representative score of chunk j of `seq` for KV group g (layer 0).
double ref_score(const PagedKvCache& c, SeqId seq, int g, const float* q, int64_t j) {
  const int d = c.head_dim();
  double s = 0;
  for (int i = 0; i < d; ++i) {
    double m = 0;
    for (int t = 0; t < kB; ++t) m += test::stored(c, true, 0, seq, j * kB + t, g, i);
    s += static_cast<double>(q[i]) * (m / kB);
  }
  return s / std::sqrt(static_cast<double>(d));
}

std::vector<int32_t> selected_part(const PageLists& l, int64_t group, int g, int64_t sinks) {
  auto c = l.list_chunks(group, g);
  const int32_t n = l.num_selected[static_cast<size_t>(group * l.num_kv_heads + g)];
  return {c.begin() + sinks, c.begin() + sinks + n};
}

TEST(SelectionReuse, OptionsAreValidatedAndNamed) {
  SelectionParams p{.budget = 8, .window = 4};
  EXPECT_TRUE(validate_selection_params(p).ok());
  for (int64_t r : {int64_t{0}, int64_t{-1}, kMaxReuseSteps + 1, int64_t{1} << 40}) {
    p.reuse_steps = r;
    const Status s = validate_selection_params(p);
    ASSERT_FALSE(s.ok()) << r;
    EXPECT_NE(s.message().find("reuse steps r must be in [1, 65536]"), std::string::npos)
        << s.message();
  }
  p.reuse_steps = kMaxReuseSteps;
  EXPECT_TRUE(validate_selection_params(p).ok());
  p.reuse_check = static_cast<ReuseCheck>(7);
  EXPECT_FALSE(validate_selection_params(p).ok());
  EXPECT_EQ(*parse_reuse_check("none"), ReuseCheck::kNone);
  EXPECT_EQ(*parse_reuse_check("new-chunks"), ReuseCheck::kNewChunks);
  EXPECT_EQ(*parse_reuse_check("mass"), ReuseCheck::kMass);
  EXPECT_STREQ(reuse_check_name(ReuseCheck::kMass), "mass");
  EXPECT_FALSE(parse_reuse_check("mas").ok());
  for (double bad : {-0.01, 1.01, std::nan("")}) {
    SelectionParams q{.budget = 8, .window = 4, .reuse_mass_slack = bad};
    const Status s = validate_selection_params(q);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("reuse mass slack must be in [0, 1]"), std::string::npos)
        << s.message();
  }
  EXPECT_STREQ(reuse_check_name(ReuseCheck::kNone), "none");
  EXPECT_STREQ(reuse_check_name(ReuseCheck::kNewChunks), "new-chunks");
  EXPECT_EQ(SelectionParams{}.reuse_steps, 1);  // today's behaviour stays the default

  StepAttention a{.selection = {.budget = 8, .window = 4}}, b = a;
  EXPECT_TRUE(a == b);
  b.selection.reuse_steps = 4;
  EXPECT_FALSE(a == b);
  b = a;
  b.selection.reuse_check = ReuseCheck::kNone;
  EXPECT_FALSE(a == b);
  b = a;
  b.selection.reuse_mass_slack = 0.1;
  EXPECT_FALSE(a == b);
}

TEST(SelectionReuse, RuleHelpers) {
  const SelectionParams p{.budget = 8, .window = 4, .sink_pages = 1, .reuse_steps = 3};
  EXPECT_TRUE(reuse_allowed(101, 100, 100, p));
  EXPECT_TRUE(reuse_allowed(102, 100, 101, p));
  EXPECT_FALSE(reuse_allowed(103, 100, 102, p));  // aged: a − a0 = r
  EXPECT_FALSE(reuse_allowed(102, 100, 100, p));  // a position went by without the selection
  EXPECT_FALSE(reuse_allowed(100, 100, 100, p));  // the same position again
  EXPECT_FALSE(reuse_allowed(101, -1, -1, p));    // nothing selected yet
  EXPECT_FALSE(reuse_allowed(101, 100, 100, {.budget = 8, .window = 4}));  // r = 1
  EXPECT_TRUE(same_selection_sets(p, {.budget = 8, .window = 4, .qshare = 9, .sink_pages = 1}));
  EXPECT_FALSE(same_selection_sets(p, {.budget = 9, .window = 4, .sink_pages = 1}));
  // Chunk c(a0) − W = 20 − 4 becomes eligible when a reaches page 21.
  EXPECT_EQ(newly_eligible(20 * 16 + 15, 21 * 16, 16, p).begin, 16);
  EXPECT_EQ(newly_eligible(20 * 16 + 15, 21 * 16, 16, p).end, 17);
  const ChunkRange none = newly_eligible(20 * 16, 20 * 16 + 15, 16, p);
  EXPECT_EQ(none.begin, none.end);
  EXPECT_FALSE(new_chunk_outranks(std::vector<float>{1, 2}, std::vector<float>{1}));  // tie
  EXPECT_TRUE(new_chunk_outranks(std::vector<float>{1, 2}, std::vector<float>{1.5f}));
  EXPECT_TRUE(new_chunk_outranks(std::vector<float>{NAN, 2}, std::vector<float>{-5}));
  EXPECT_FALSE(new_chunk_outranks(std::vector<float>{0, 2}, std::vector<float>{NAN}));
  EXPECT_FALSE(new_chunk_outranks({}, std::vector<float>{5}));  // k = 0
}

// One decode row per reuse state and batch: two would read and replace the same state.
TEST(SelectionReuse, OneDecodeRowPerStateAndBatch) {
  const SelectionParams p{.budget = 4, .window = 2, .reuse_steps = 2};
  const std::vector<BatchEntry> two_rows = {{0, 100, 1}, {1, 50, 1}, {0, 101, 1}};
  const Status s = validate_reuse_rows(two_rows, p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("batch entries 0 and 2 are both one-position rows of sequence 0"),
            std::string::npos)
      << s.message();
  // Allowed: reuse off; a prefill block beside a decode row of the same sequence (prefill rows
  // keep no state); rows whose backend slots differ or keep none (−1).
  EXPECT_TRUE(validate_reuse_rows(two_rows, {.budget = 4, .window = 2}).ok());
  EXPECT_TRUE(validate_reuse_rows(std::vector<BatchEntry>{{0, 90, 10}, {0, 100, 1}}, p).ok());
  EXPECT_TRUE(validate_reuse_rows(two_rows, p, std::vector<int32_t>{0, 1, 2}).ok());
  EXPECT_TRUE(validate_reuse_rows(two_rows, p, std::vector<int32_t>{-1, 1, -1}).ok());
  const Status slots = validate_reuse_rows(two_rows, p, std::vector<int32_t>{3, 1, 3});
  EXPECT_NE(slots.message().find("reuse slot 3"), std::string::npos) << slots.message();
  EXPECT_FALSE(validate_reuse_rows(two_rows, p, std::vector<int32_t>{0, 1}).ok());  // one short

  // select_pages refuses such a batch before it touches the state.
  std::mt19937 rng(5);
  auto cache = std::move(*PagedKvCache::create(
      {.num_layers = 1, .num_kv_heads = 1, .head_dim = 16, .page_size = kB, .num_pages = 200}));
  const SeqId q = *cache->add_sequence();
  test::append_random(*cache, q, 600, rng);
  SelectionReuse reuse;
  PageLists l;
  const std::vector<float> iq = test::random_vec(rng, 32);
  const std::vector<BatchEntry> dup = {{q, 598, 1}, {q, 599, 1}};
  const Status refused = select_pages(*cache, 0, dup, iq.data(), p, nullptr, &l, nullptr, &reuse);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
  EXPECT_EQ(reuse.stats.selected + reuse.stats.reused, 0);
  EXPECT_EQ(reuse.states(q, 0, 1)[0].selected_at, -1);
  // The same rows as one entry of two positions select (a prefill block keeps no state).
  EXPECT_TRUE(select_pages(*cache, 0, std::vector<BatchEntry>{{q, 598, 2}}, iq.data(), p, nullptr,
                           &l, nullptr, &reuse)
                  .ok());
}

// fp64 Σ e^{s_j − shift} over chunks js.
template <class Chunks>
double ref_exp_sum(const PagedKvCache& c, SeqId seq, int g, const float* q, const Chunks& js,
                   double shift) {
  double sum = 0;
  for (int64_t j : js) sum += std::exp(ref_score(c, seq, g, q, j) - shift);
  return sum;
}

// Two sequences decode for many steps (one skips steps, one takes a prefill block in between);
// every decode list must be what the rule says, replayed here from fresh selections (select_pages
// with r = 1 on the same batch: the top-k at that step) and fp64 scores for the check. The mass
// check's rows draw index queries that drift around a base per sequence and KV group (a new base
// every 9 steps), so that it both passes and fails; the other checks' are drawn afresh each step.
void run_against_reference(ReuseCheck check, int64_t r, int hkv, double slack = 0.05) {
  std::mt19937 rng(70 + static_cast<int>(check) * 10 + static_cast<int>(r) + hkv);
  const int d = 32;
  auto cache = std::move(*PagedKvCache::create({.num_layers = 1,
                                                .num_kv_heads = hkv,
                                                .head_dim = d,
                                                .page_size = kB,
                                                .num_pages = 400,
                                                .dtype = KvDtype::kF32}));
  const SeqId s0 = *cache->add_sequence(), s1 = *cache->add_sequence();
  std::vector<int64_t> len = {1000, 700};
  test::append_interleaved(*cache, {s0, s1}, len, 37, rng);
  const SelectionParams p{.budget = 8,
                          .window = 3,
                          .sink_pages = 1,
                          .reuse_steps = r,
                          .reuse_check = check,
                          .reuse_mass_slack = slack};
  const bool mass = check == ReuseCheck::kMass;
  std::map<std::pair<SeqId, int>, std::vector<float>> base;  // mass: drifting index queries
  SelectionParams fresh_p = p;
  fresh_p.reuse_steps = 1;
  ThreadPool pool(2);
  SelectionReuse reuse;
  SelectionWorkspace ws;
  struct Ref {
    std::vector<int32_t> chunks;
    int64_t a0 = -1, last = -1;
    double u0 = 0;  // mass: the share outside the chunks at a0
  };
  std::map<std::pair<SeqId, int>, Ref> ref;
  int64_t want_selected = 0, want_reused = 0, ties = 0, fired = 0;

  for (int step = 0; step < 70; ++step) {
    // s1 sits out every fifth step; at step 33 s0 takes a prefill block of 5 positions.
    std::vector<BatchEntry> batch;
    std::vector<SeqId> seqs = {s0};
    if (step % 5 != 4) seqs.push_back(s1);
    for (SeqId s : seqs) {
      const int32_t n = s == s0 && step == 33 ? 5 : 1;
      const int64_t first = *cache->length(s);
      test::append_random(*cache, s, n, rng);
      batch.push_back({s, first, n});
    }
    int64_t rows = 0;
    for (const BatchEntry& e : batch) rows += e.count;
    std::vector<float> iq = test::random_vec(rng, static_cast<size_t>(rows * hkv * d));
    if (mass) {
      int64_t row = 0;
      for (const BatchEntry& e : batch) {
        for (int g = 0; g < hkv; ++g) {
          std::vector<float>& b = base[{e.seq, g}];
          if (b.empty() || step % 9 == 0) b = test::random_vec(rng, static_cast<size_t>(d));
          for (int32_t i = 0; i < e.count; ++i)
            for (int c = 0; c < d; ++c) {
              float& x = iq[static_cast<size_t>(((row + i) * hkv + g) * d + c)];
              x = b[static_cast<size_t>(c)] + 0.25f * x;
            }
        }
        row += e.count;
      }
    }
    PageLists got, fresh;
    ASSERT_TRUE(select_pages(*cache, 0, batch, iq.data(), p, &pool, &got, &ws, &reuse).ok());
    ASSERT_TRUE(select_pages(*cache, 0, batch, iq.data(), fresh_p, &pool, &fresh).ok());
    ASSERT_EQ(got.groups.size(), fresh.groups.size());
    for (size_t gi = 0; gi < got.groups.size(); ++gi) {
      const QueryGroup& grp = got.groups[gi];
      const BatchEntry& e = batch[static_cast<size_t>(grp.entry)];
      for (int g = 0; g < hkv; ++g) {
        const auto list = static_cast<int64_t>(gi);
        auto want_fresh = selected_part(fresh, list, g, p.sink_pages);
        auto have = selected_part(got, list, g, p.sink_pages);
        if (e.count != 1) {  // prefill rows select as without reuse
          ASSERT_EQ(have, want_fresh) << "step " << step;
          continue;
        }
        Ref& st = ref[{e.seq, g}];
        const int64_t a = grp.first;
        bool keep = r > 1 && st.a0 >= 0 && a == st.last + 1 && a - st.a0 < r;
        bool either = false;
        const float* q = iq.data() + (grp.row * hkv + g) * d;
        if (keep && check != ReuseCheck::kNone) {
          const int64_t nb = std::max<int64_t>(p.sink_pages, st.a0 / kB - p.window);
          const int64_t ne = a / kB - p.window;
          bool fail = false;
          if (ne > nb) {
            double lo = INFINITY, hi = -INFINITY;
            for (int32_t j : st.chunks) lo = std::min(lo, ref_score(*cache, e.seq, g, q, j));
            for (int64_t j = nb; j < ne; ++j) hi = std::max(hi, ref_score(*cache, e.seq, g, q, j));
            if (std::abs(hi - lo) < 1e-5) either = true, ++ties;
            fail = hi > lo;
          }
          if (mass && !fail) {  // u1 from S, N and S's complement in E_{a0} on a's sample
            std::vector<int64_t> n_chunks, sample;
            for (int64_t j = nb; j < ne; ++j) n_chunks.push_back(j);
            for (int64_t j = p.sink_pages; j < st.a0 / kB - p.window; ++j)
              if (j % 16 == a % 16 &&
                  !std::binary_search(st.chunks.begin(), st.chunks.end(), static_cast<int32_t>(j)))
                sample.push_back(j);
            const double in_s = ref_exp_sum(*cache, e.seq, g, q, st.chunks, 0.0);
            const double out = ref_exp_sum(*cache, e.seq, g, q, n_chunks, 0.0) +
                               16.0 * ref_exp_sum(*cache, e.seq, g, q, sample, 0.0);
            const double u1 = out / (in_s + out);
            if (std::abs(u1 - (st.u0 + slack)) < 1e-6) either = true, ++ties;
            fail = u1 > st.u0 + slack;
          }
          keep = !fail;
          fired += fail ? 1 : 0;
        }
        if (either) keep = have == st.chunks && have != want_fresh;
        if (keep) {
          ASSERT_EQ(have, st.chunks) << "step " << step << " seq " << e.seq << " g " << g;
          ++want_reused;
        } else {
          ASSERT_EQ(have, want_fresh) << "step " << step << " seq " << e.seq << " g " << g;
          st.chunks = want_fresh;
          st.a0 = a;
          ++want_selected;
          if (mass) {  // u0 over E_a, exact
            std::vector<int64_t> all;
            for (int64_t j = p.sink_pages; j < a / kB - p.window; ++j) all.push_back(j);
            const double total = ref_exp_sum(*cache, e.seq, g, q, all, 0.0);
            st.u0 = 1.0 - ref_exp_sum(*cache, e.seq, g, q, st.chunks, 0.0) / total;
          }
        }
        st.last = a;
        // The whole list: sinks, the selected chunks, then the window and tail from a.
        std::vector<int32_t> want;
        for (int32_t j = 0; j < p.sink_pages; ++j) want.push_back(j);
        want.insert(want.end(), have.begin(), have.end());
        for (int64_t j = a / kB - p.window; j <= a / kB; ++j)
          want.push_back(static_cast<int32_t>(j));
        auto chunks = got.list_chunks(list, g);
        ASSERT_EQ(std::vector<int32_t>(chunks.begin(), chunks.end()), want) << "step " << step;
        auto table = *cache->block_table(e.seq);
        auto pages = got.list_pages(list, g);
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(pages[i], table[static_cast<size_t>(want[i])]);
      }
    }
  }
  if (r == 1) {  // no state, nothing counted
    EXPECT_EQ(reuse.stats.selected + reuse.stats.reused + reuse.stats.checked, 0);
    return;
  }
  EXPECT_EQ(reuse.stats.selected, want_selected);
  EXPECT_EQ(reuse.stats.reused, want_reused);
  if (ties == 0) {
    EXPECT_EQ(reuse.stats.reselected, fired);
  }
  if (r > 1 && !mass) {
    EXPECT_GT(want_reused, want_selected);  // reuse happened, and often
  }
  if (mass) {  // the check both kept and re-selected
    EXPECT_GT(want_reused, 0);
    EXPECT_GT(reuse.stats.reselected, 0);
  }
  if (check == ReuseCheck::kNone) {
    EXPECT_EQ(reuse.stats.checked, 0);
  }
  if (check != ReuseCheck::kNone && r > 1) {
    EXPECT_GT(reuse.stats.checked, 0);
  }
  EXPECT_LE(ties, 2);
  std::printf(
      "r = %lld, check %s, %d KV groups: %lld lists selected, %lld kept, %lld checked, "
      "%lld failed the check\n",
      static_cast<long long>(r), reuse_check_name(check), hkv,
      static_cast<long long>(reuse.stats.selected), static_cast<long long>(reuse.stats.reused),
      static_cast<long long>(reuse.stats.checked), static_cast<long long>(reuse.stats.reselected));
}

TEST(SelectionReuse, DecodeListsFollowTheRuleCheckNone) {
  run_against_reference(ReuseCheck::kNone, 4, 2);
}
TEST(SelectionReuse, DecodeListsFollowTheRuleCheckNewChunks) {
  run_against_reference(ReuseCheck::kNewChunks, 4, 2);
  run_against_reference(ReuseCheck::kNewChunks, 8, 1);
  run_against_reference(ReuseCheck::kNewChunks, 20, 3);
}
TEST(SelectionReuse, DecodeListsFollowTheRuleCheckMass) {
  run_against_reference(ReuseCheck::kMass, 8, 2, 0.05);
  run_against_reference(ReuseCheck::kMass, 16, 1, 0.2);
  run_against_reference(ReuseCheck::kMass, 4, 3, 0.0);
}
TEST(SelectionReuse, ReuseStepsOneNeverReuses) {
  run_against_reference(ReuseCheck::kNewChunks, 1, 2);
}

// r = 1 with a reuse state passed is bit for bit select_pages without one, and keeps no state.
TEST(SelectionReuse, ReuseStepsOneIsBitIdentical) {
  std::mt19937 rng(5);
  auto cache = std::move(*PagedKvCache::create(
      {.num_layers = 1, .num_kv_heads = 2, .head_dim = 32, .page_size = kB, .num_pages = 200}));
  const SeqId s = *cache->add_sequence();
  test::append_random(*cache, s, 900, rng);
  const SelectionParams p{.budget = 6, .window = 2};
  ThreadPool pool(2);
  SelectionReuse reuse;
  for (int step = 0; step < 20; ++step) {
    test::append_random(*cache, s, 1, rng);
    const std::vector<BatchEntry> batch = {{s, *cache->length(s) - 1, 1}};
    const std::vector<float> iq = test::random_vec(rng, 2 * 32);
    PageLists a, b;
    ASSERT_TRUE(select_pages(*cache, 0, batch, iq.data(), p, &pool, &a, nullptr, &reuse).ok());
    ASSERT_TRUE(select_pages(*cache, 0, batch, iq.data(), p, &pool, &b).ok());
    EXPECT_EQ(a.pages, b.pages);
    EXPECT_EQ(a.chunks, b.chunks);
    EXPECT_EQ(a.num_selected, b.num_selected);
    EXPECT_EQ(a.offsets, b.offsets);
  }
  EXPECT_EQ(reuse.stats.selected + reuse.stats.reused + reuse.stats.checked, 0);
  EXPECT_EQ(reuse.states(s, 0, 2)[0].selected_at, -1);
}

// Keys built so that the chunk leaving the window at the next step dominates (or is dominated by)
// every other chunk under the index query u: kNewChunks re-selects (keeps), kNone keeps.
TEST(SelectionReuse, CheckFiresWhenANewChunkBecomesDominant) {
  const int d = 16;
  for (const float sign : {10.0f, -10.0f})
    for (ReuseCheck check : {ReuseCheck::kNewChunks, ReuseCheck::kNone}) {
      auto cache = std::move(*PagedKvCache::create(
          {.num_layers = 1, .num_kv_heads = 1, .head_dim = d, .page_size = kB, .num_pages = 64}));
      const SeqId s = *cache->add_sequence();
      std::mt19937 rng(9);
      std::vector<float> u(d, 0.0f);
      u[3] = 1.0f;
      // Positions 0 … 319: small random keys, chunk 17 (positions 272 … 287) sign·u.
      const int64_t n = 320;
      std::vector<float> k = test::random_vec(rng, n * d, 0.1f), v = k;
      for (int64_t t = 17 * kB; t < 18 * kB; ++t)
        for (int i = 0; i < d; ++i) k[static_cast<size_t>(t * d + i)] = sign * u[i];
      ASSERT_TRUE(cache->reserve(s, n + 1).ok());
      ASSERT_TRUE(cache->append(0, s, 319, k.data(), v.data()).ok());
      const SelectionParams p{.budget = 4, .window = 2, .reuse_steps = 8, .reuse_check = check};
      SelectionReuse reuse;
      PageLists l0, l1;
      // Decode row 318 (page 19): eligible [0, 17), chunk 17 is in the window.
      ASSERT_TRUE(select_pages(*cache, 0, std::vector<BatchEntry>{{s, 318, 1}}, u.data(), p,
                               nullptr, &l0, nullptr, &reuse)
                      .ok());
      const std::vector<int32_t> s0 = selected_part(l0, 0, 0, 0);
      ASSERT_EQ(s0.size(), 4u);
      EXPECT_TRUE(std::find(s0.begin(), s0.end(), 17) == s0.end());
      // Decode row 319 is the same page; row 320 (page 20) makes chunk 17 eligible.
      ASSERT_TRUE(cache->append(0, s, 1, k.data() + 319 * d, v.data() + 319 * d).ok());
      ASSERT_TRUE(select_pages(*cache, 0, std::vector<BatchEntry>{{s, 319, 1}}, u.data(), p,
                               nullptr, &l1, nullptr, &reuse)
                      .ok());
      EXPECT_EQ(selected_part(l1, 0, 0, 0), s0);
      EXPECT_EQ(reuse.stats.checked, 0);  // nothing newly eligible: no scoring at all
      std::vector<float> k2(d, 0.01f);
      ASSERT_TRUE(cache->append(0, s, 1, k2.data(), k2.data()).ok());
      PageLists l2;
      ASSERT_TRUE(select_pages(*cache, 0, std::vector<BatchEntry>{{s, 320, 1}}, u.data(), p,
                               nullptr, &l2, nullptr, &reuse)
                      .ok());
      const std::vector<int32_t> s2 = selected_part(l2, 0, 0, 0);
      const bool has17 = std::find(s2.begin(), s2.end(), 17) != s2.end();
      const bool fires = check == ReuseCheck::kNewChunks && sign > 0;
      EXPECT_EQ(has17, fires) << "sign " << sign << " check " << reuse_check_name(check);
      if (!fires) {
        EXPECT_EQ(s2, s0);
      }
      EXPECT_EQ(reuse.stats.checked, check == ReuseCheck::kNewChunks ? 1 : 0);
      EXPECT_EQ(reuse.stats.reselected, fires ? 1 : 0);
      EXPECT_EQ(reuse.stats.selected, fires ? 2 : 1);
      // The tail is recomputed from 320: chunks 18, 19, 20.
      auto c = l2.list_chunks(0, 0);
      EXPECT_EQ(std::vector<int32_t>(c.end() - 3, c.end()), (std::vector<int32_t>{18, 19, 20}));
    }
}

TEST(SelectionReuse, StateIsForgottenOnReleaseAndOnOtherParameters) {
  std::mt19937 rng(3);
  auto cache = std::move(*PagedKvCache::create(
      {.num_layers = 1, .num_kv_heads = 1, .head_dim = 16, .page_size = kB, .num_pages = 200}));
  const SeqId s = *cache->add_sequence();
  test::append_random(*cache, s, 600, rng);
  SelectionParams p{.budget = 4, .window = 2, .reuse_steps = 4, .reuse_check = ReuseCheck::kNone};
  SelectionReuse reuse;
  PageLists l;
  auto decode = [&](const SelectionParams& q) {
    test::append_random(*cache, s, 1, rng);
    const std::vector<float> iq = test::random_vec(rng, 16);
    ASSERT_TRUE(select_pages(*cache, 0, std::vector<BatchEntry>{{s, *cache->length(s) - 1, 1}},
                             iq.data(), q, nullptr, &l, nullptr, &reuse)
                    .ok());
  };
  decode(p);
  decode(p);
  EXPECT_EQ(reuse.stats.selected, 1);
  EXPECT_EQ(reuse.stats.reused, 1);
  SelectionParams other = p;
  other.budget = 5;  // another k: a fresh selection
  decode(other);
  EXPECT_EQ(reuse.stats.selected, 2);
  decode(p);  // and back: fresh again (the state holds k = 5's selection)
  EXPECT_EQ(reuse.stats.selected, 3);
  reuse.release(s);
  EXPECT_EQ(reuse.states(s, 0, 1)[0].selected_at, -1);
  decode(p);
  EXPECT_EQ(reuse.stats.selected, 4);
  EXPECT_EQ(reuse.stats.reused, 1);
}

// u0 (plan.h) belongs to the selection it was measured on: a fresh selection under `mass` stores
// 1 − Σ_S / Σ_E of its own scores (fp64 here), one under another check stores 0, never the last
// mass selection's value.
TEST(SelectionReuse, MassOfAFreshSelectionIsItsOwn) {
  std::mt19937 rng(12);
  const int d = 16;
  auto cache = std::move(*PagedKvCache::create({.num_layers = 1,
                                                .num_kv_heads = 1,
                                                .head_dim = d,
                                                .page_size = kB,
                                                .num_pages = 200,
                                                .dtype = KvDtype::kF32}));
  const SeqId s = *cache->add_sequence();
  test::append_random(*cache, s, 600, rng);
  SelectionParams mass{.budget = 4, .window = 2, .reuse_steps = 4};
  mass.reuse_check = ReuseCheck::kMass;
  SelectionParams chunks = mass;
  chunks.reuse_check = ReuseCheck::kNewChunks;
  SelectionReuse reuse;
  // Each row is fresh: one position is skipped before it, so no state may be kept.
  auto fresh_row = [&](const SelectionParams& q, std::vector<float>* iq) {
    test::append_random(*cache, s, 2, rng);
    *iq = test::random_vec(rng, d);
    PageLists l;
    ASSERT_TRUE(select_pages(*cache, 0, std::vector<BatchEntry>{{s, *cache->length(s) - 1, 1}},
                             iq->data(), q, nullptr, &l, nullptr, &reuse)
                    .ok());
  };
  std::vector<float> iq;
  fresh_row(mass, &iq);
  if (::testing::Test::HasFatalFailure()) return;
  const ReusedSelection& st = reuse.states(s, 0, 1)[0];
  const int64_t a = *cache->length(s) - 1;
  double all = 0, in_s = 0;
  for (int64_t j = 0; j < a / kB - mass.window; ++j) {
    const double e = std::exp(ref_score(*cache, s, 0, iq.data(), j));
    all += e;
    if (std::binary_search(st.chunks.begin(), st.chunks.end(), static_cast<int32_t>(j))) in_s += e;
  }
  EXPECT_GT(st.unselected_mass, 0.1);  // 4 of ~33 chunks: much of the mass is outside S
  EXPECT_NEAR(st.unselected_mass, 1.0 - in_s / all, 1e-5);
  fresh_row(chunks, &iq);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(reuse.states(s, 0, 1)[0].unselected_mass, 0.0);
  EXPECT_EQ(reuse.stats.selected, 2);
}

// The CPU backend forgets a released sequence's selections: a new sequence that gets the same
// SeqId and decodes right after the released one's last position selects afresh.
TEST(SelectionReuse, CpuBackendReleasesStateWithTheSequence) {
  auto made = make_cpu_backend({.threads = 2});
  ASSERT_TRUE(made.ok());
  Backend& be = **made;
  const int d = 16;
  ASSERT_TRUE(be.create_cache({.num_layers = 1,
                               .num_kv_heads = 1,
                               .head_dim = d,
                               .page_size = kB,
                               .num_pages = 200,
                               .dtype = KvDtype::kF32})
                  .ok());
  std::mt19937 rng(21);
  const PlanSpec spec{
      .kind = PlanKind::kCisa,
      .selection = {.budget = 4, .window = 2, .reuse_steps = 4, .reuse_check = ReuseCheck::kNone}};
  auto grow = [&](SeqId s, int64_t first, int64_t n) {
    const std::vector<float> k = test::random_vec(rng, static_cast<size_t>(n * d)), v = k;
    ASSERT_TRUE(be.reserve(s, n).ok());
    const std::vector<BatchEntry> b = {{s, first, static_cast<int32_t>(n)}};
    ASSERT_TRUE(be.append_kv(0, b, k.data(), v.data()).ok());
  };
  auto decode = [&](SeqId s, int64_t pos) {
    grow(s, pos, 1);
    const std::vector<BatchEntry> b = {{s, pos, 1}};
    const std::vector<float> iq = test::random_vec(rng, d);
    ASSERT_TRUE(be.plan(PlanSlot::kCisa, b, spec).ok());
    ASSERT_TRUE(be.select(PlanSlot::kCisa, 0, iq.data()).ok());
  };
  const SeqId a = *be.add_sequence();
  grow(a, 0, 400);
  decode(a, 400);
  decode(a, 401);
  EXPECT_EQ(be.selection_reuse_stats().selected, 1);
  EXPECT_EQ(be.selection_reuse_stats().reused, 1);
  ASSERT_TRUE(be.release_sequence(a).ok());
  const SeqId b = *be.add_sequence();
  ASSERT_EQ(b, a);  // the SeqId is handed out again
  grow(b, 0, 402);
  decode(b, 402);  // would keep a's selection (age 2, contiguous) if the state outlived a
  EXPECT_EQ(be.selection_reuse_stats().selected, 2);
  EXPECT_EQ(be.selection_reuse_stats().reused, 1);
}

// The CPU backend keeps the state per sequence, releases it with the sequence, and the model
// passes StepAttention's reuse through: r = 1 gives today's logits bit for bit, r = 4 reuses.
TEST(SelectionReuse, ModelOnTheCpuBackend) {
  ModelOptions o{.threads = 2, .context = 512};
  o.attention.mode = AttentionMode::kCisa;
  o.attention.selection = {.budget = 2, .window = 1, .qshare = 4};
  auto loaded = Model::load_synthetic("tiny-llama", o);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  Model& m = **loaded;
  auto run = [&](const StepAttention* att, std::vector<float>* all) {
    SeqId s = *m.add_sequence();
    std::vector<int32_t> prompt(150);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 7 % 200);
    std::vector<float> logits;
    SequenceInput in{.seq = s, .tokens = prompt};
    ASSERT_TRUE(m.forward({&in, 1}, &logits, {}, att).ok());
    all->insert(all->end(), logits.begin(), logits.end());
    for (int step = 0; step < 24; ++step) {
      const int32_t next = argmax(logits);
      SequenceInput d{.seq = s, .tokens = {&next, 1}};
      const Status st = m.forward({&d, 1}, &logits, {}, att);
      ASSERT_TRUE(st.ok()) << st.message();
      all->insert(all->end(), logits.begin(), logits.end());
    }
    ASSERT_TRUE(m.release_sequence(s).ok());
  };
  std::vector<float> today, r1, r4;
  run(nullptr, &today);
  StepAttention a{.mode = AttentionMode::kCisa, .selection = o.attention.selection};
  a.selection.reuse_steps = 1;
  run(&a, &r1);
  EXPECT_EQ(today, r1);  // bit for bit
  EXPECT_EQ(m.backend().selection_reuse_stats().selected, 0);
  a.selection.reuse_steps = 4;
  m.reset_stats();
  run(&a, &r4);
  const SelectionReuseStats st = m.backend().selection_reuse_stats();
  EXPECT_EQ(m.stats().reuse_lists_selected, st.selected);  // the model's view of the same
  EXPECT_EQ(m.stats().reuse_lists_kept, st.reused);
  // 24 decode rows × 2 layers × 2 KV groups: every 4th (or a check failure) selects afresh.
  EXPECT_GT(st.reused, 0);
  EXPECT_GT(st.selected, 0);
  EXPECT_GE(st.reused, st.selected);
  EXPECT_EQ(st.reused + st.selected, 24 * 2 * m.hparams().n_head_kv);
  // A bad value is refused before any work.
  a.selection.reuse_steps = 0;
  SeqId s = *m.add_sequence();
  const int32_t tok = 1;
  SequenceInput in{.seq = s, .tokens = {&tok, 1}};
  std::vector<float> logits;
  EXPECT_FALSE(m.forward({&in, 1}, &logits, {}, &a).ok());
}

}  // namespace
}  // namespace cisa
