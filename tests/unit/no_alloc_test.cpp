// A steady decode step (plan or select, then attend) performs no heap allocation once its
// workspaces have grown. Counts every operator new in the process while a step runs.
#include <atomic>
#include <cstdlib>
#include <new>

#include "cisa/cpu/selection.h"
#include "test_util.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocs{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

namespace cisa {
namespace {

TEST(NoAllocation, SteadyDecodeStepAllocatesNothing) {
  std::mt19937 rng(31);
  auto cache = std::move(*PagedKvCache::create({.num_layers = 1,
                                                .num_kv_heads = 2,
                                                .head_dim = 64,
                                                .page_size = 16,
                                                .num_pages = 400,
                                                .dtype = KvDtype::kBF16}));
  SeqId a = *cache->add_sequence(), b = *cache->add_sequence();
  test::append_random(*cache, a, 3000, rng);
  test::append_random(*cache, b, 2000, rng);
  ThreadPool pool(2);
  AttentionWorkspace aws;
  SelectionWorkspace sws;
  PageLists lists;
  auto q = test::random_vec(rng, 2 * 8 * 64), iq = test::random_vec(rng, 2 * 2 * 64);
  std::vector<float> out(q.size()), lse(16);
  std::vector<BatchEntry> batch = {{a, 2999, 1}, {b, 1999, 1}};
  SelectionParams p{.budget = 20, .window = 4, .qshare = 1};
  auto step = [&] {
    ASSERT_TRUE(plan_dense(*cache, 0, batch, 0, &lists).ok());
    ASSERT_TRUE(
        attend(*cache, 0, batch, lists, q.data(), 8, {}, out.data(), lse.data(), pool, &aws).ok());
    ASSERT_TRUE(select_pages(*cache, 0, batch, iq.data(), p, &pool, &lists, &sws).ok());
    ASSERT_TRUE(
        attend(*cache, 0, batch, lists, q.data(), 8, {}, out.data(), lse.data(), pool, &aws).ok());
  };
  step();
  step();
  g_allocs = 0;
  g_counting = true;
  step();
  g_counting = false;
  EXPECT_EQ(g_allocs.load(), 0);
  // One sequence on a wider pool: selection scores in slices across threads.
  ThreadPool wide(4);
  std::vector<BatchEntry> one = {{a, 2999, 1}};
  auto step_one = [&] {
    ASSERT_TRUE(select_pages(*cache, 0, one, iq.data(), p, &wide, &lists, &sws).ok());
    ASSERT_TRUE(
        attend(*cache, 0, one, lists, q.data(), 8, {}, out.data(), lse.data(), wide, &aws).ok());
  };
  step_one();
  step_one();
  g_counting = true;
  step_one();
  g_counting = false;
  EXPECT_EQ(g_allocs.load(), 0);
  // Selection reuse (r = 3, the new-chunks check): rows at advancing positions keep, check (from
  // 2992, a new page) and re-select; none of it allocates once the state exists.
  SelectionReuse reuse;
  SelectionParams pr = p;
  pr.reuse_steps = 3;
  int64_t pos = 2980;
  auto step_reuse = [&] {
    std::vector<BatchEntry>& rb = batch;  // reuses the batch's storage
    rb[0].first = pos;
    rb[1].first = pos - 1000;
    ++pos;
    ASSERT_TRUE(select_pages(*cache, 0, rb, iq.data(), pr, &pool, &lists, &sws, &reuse).ok());
    ASSERT_TRUE(
        attend(*cache, 0, rb, lists, q.data(), 8, {}, out.data(), lse.data(), pool, &aws).ok());
  };
  step_reuse();
  step_reuse();
  g_counting = true;
  for (int i = 0; i < 16; ++i) step_reuse();
  g_counting = false;
  EXPECT_EQ(g_allocs.load(), 0);
  EXPECT_GT(reuse.stats.reused, 0);
  EXPECT_GT(reuse.stats.checked, 0);
  // The counter works: an allocation in the window is seen.
  g_counting = true;
  auto* probe = new std::vector<int>(10);
  g_counting = false;
  delete probe;
  EXPECT_GE(g_allocs.load(), 1);
}

}  // namespace
}  // namespace cisa
