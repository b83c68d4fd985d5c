// cisa._C's CPU ops: the engine (include/cisa/cpu/) over views of the caller's tensors
// (PagedKvCache::wrap, nothing copied): planning, selection, attention, representatives, scores,
// top-k, and the engine's own path for the tests. cisa_ext.cpp registers them (register_cpu).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "cisa/core/page_table.h"
#include "cisa/core/thread_pool.h"
#include "cisa/cpu/attention.h"
#include "cisa/cpu/kv_cache.h"
#include "cisa/cpu/selection.h"
#include "ext_common.h"

namespace cisa_py {
namespace {

using cisa::PagedKvCache;

// Adopts every row of the block tables as sequence s (its first ceil(len / B) pages).
template <class Table>
void adopt_all(Table* t, const BatchArgs& b, int page_size, const char* op) {
  const int32_t* tables = ptr<const int32_t>(b.tables);
  const int64_t* lens = ptr<const int64_t>(b.lens);
  for (int64_t s = 0; s < b.num_seqs; ++s) {
    const int64_t len = lens[s];
    const int64_t n = row_pages(b, s, page_size, op);
    auto seq = t->adopt_sequence(
        std::span<const int32_t>(tables + s * b.max_pages, static_cast<size_t>(n)), len);
    if (!seq.ok())
      raise_if_error(Status(seq.status().code(), "block_tables row " + std::to_string(s) + ": " +
                                                     seq.status().message()),
                     op);
  }
}

std::unique_ptr<PagedKvCache> make_view(const CacheArgs& c, const BatchArgs* b, const char* op) {
  cisa::KvCacheConfig cfg{.num_layers = 1,
                          .num_kv_heads = c.num_kv_heads,
                          .head_dim = c.head_dim,
                          .page_size = c.page_size,
                          .num_pages = c.num_pages,
                          .dtype = c.bf16 ? cisa::KvDtype::kBF16 : cisa::KvDtype::kF32,
                          .rep = rep_kind(c.rep),
                          .rep_layers = {c.reps != 0}};
  void* k[1] = {ptr<void>(c.k)};
  void* v[1] = {ptr<void>(c.v)};
  void* r[1] = {ptr<void>(c.reps)};
  auto cache = PagedKvCache::wrap(cfg, k, v, r);
  raise_if_error(cache.status(), op);
  std::unique_ptr<PagedKvCache> out = std::move(*cache);
  if (b) adopt_all(out.get(), *b, c.page_size, op);
  return out;
}

// The engine's thread pool, shared by every call (the GIL is held, so calls do not overlap).
std::unique_ptr<cisa::ThreadPool>& pool_slot() {
  static std::unique_ptr<cisa::ThreadPool> pool;
  return pool;
}
cisa::ThreadPool& pool() {
  auto& p = pool_slot();
  if (!p) p = std::make_unique<cisa::ThreadPool>(0);
  return *p;
}

// Planning: the query groups and page lists (plan.h) as torch tensors (groups flat, [G * 5]).
// Dense: every list written from the block tables (plan_dense's lists); sparse: the lists'
// entries are -1 until select writes them, num_selected 0.
std::tuple<Tensor1<int64_t>, Tensor1<int64_t>, Tensor1<int32_t>, Tensor1<int32_t>, Tensor1<int32_t>>
plan(const BatchArgs& b, int64_t num_pages, int num_kv_heads, int page_size, bool dense,
     int64_t sliding_window, int64_t budget, int64_t window, int64_t qshare, int64_t sink_pages,
     bool qshare_last) {
  HostPlan h = plan_host(b, num_pages, num_kv_heads, page_size, dense, sliding_window, budget,
                         window, qshare, sink_pages, qshare_last, "plan");
  const auto total = static_cast<size_t>(h.total());
  std::vector<int32_t> pages, chunks;
  if (dense) {
    pages.resize(total);
    chunks.resize(total);
    const int32_t* tables = ptr<const int32_t>(b.tables);
    size_t at = 0;
    for (size_t e = 0; e < h.batch.size(); ++e) {
      const BatchEntry& x = h.batch[e];
      const cisa::ChunkRange r = cisa::dense_chunk_range(x, page_size, sliding_window);
      const int32_t* row = tables + int64_t{x.seq} * b.max_pages;  // checked up to r.end
      for (int g = 0; g < num_kv_heads; ++g) {
        std::copy(row + r.begin, row + r.end, pages.begin() + static_cast<ptrdiff_t>(at));
        for (int64_t j = r.begin; j < r.end; ++j) chunks[at++] = static_cast<int32_t>(j);
      }
    }
  } else {
    pages.assign(total, -1);
    chunks.assign(total, -1);
  }
  std::vector<int32_t> num_selected(static_cast<size_t>(h.num_lists()), 0);
  return {to_tensor(std::move(h.groups)), to_tensor(std::move(h.offsets)),
          to_tensor(std::move(pages)), to_tensor(std::move(chunks)),
          to_tensor(std::move(num_selected))};
}

// The engine's own planning path (adopt_all into a PageTable, plan_dense or plan_query_groups +
// size_page_lists), as flat vectors: what plan was before it checked the tables itself; the
// tests compare the two.
PlanTuple plan_reference(const BatchArgs& b, int64_t num_pages, int num_kv_heads, int page_size,
                         bool dense, int64_t sliding_window, int64_t budget, int64_t window,
                         int64_t qshare, int64_t sink_pages, bool qshare_last) {
  if (num_kv_heads <= 0 || page_size <= 0 || num_pages <= 0 || num_pages > INT32_MAX)
    throw std::invalid_argument(
        "cisa.plan: num_kv_heads, page_size and num_pages must be "
        "positive (num_pages below 2^31)");
  cisa::PageTable table(1, page_size, num_pages);
  adopt_all(&table, b, page_size, "plan");
  const std::vector<BatchEntry> batch = read_entries(b);
  PageLists lists;
  if (dense) {
    if (sliding_window < 0) throw std::invalid_argument("cisa.plan: sliding_window must be >= 0");
    raise_if_error(cisa::plan_dense(table, num_kv_heads, 0, batch, sliding_window, &lists), "plan");
  } else {
    const cisa::SelectionParams p =
        selection_params(budget, window, qshare, sink_pages, qshare_last);
    raise_if_error(cisa::validate_batch(table, 0, batch), "plan");
    raise_if_error(cisa::plan_query_groups(page_size, batch, p, &lists), "plan");
    lists.num_kv_heads = num_kv_heads;
    cisa::size_page_lists(page_size, num_kv_heads, p, &lists);
    std::fill(lists.pages.begin(), lists.pages.end(), -1);
    std::fill(lists.chunks.begin(), lists.chunks.end(), -1);
  }
  return to_tuple(lists);
}

// plan's query groups and list offsets only, with the sizes of the page lists (total pages,
// lists that select): for callers whose lists live elsewhere, without writing any list entry.
std::tuple<Tensor1<int64_t>, Tensor1<int64_t>, int64_t, int64_t> plan_groups(
    const BatchArgs& b, int64_t num_pages, int num_kv_heads, int page_size, bool dense,
    int64_t sliding_window, int64_t budget, int64_t window, int64_t qshare, int64_t sink_pages,
    bool qshare_last) {
  HostPlan h = plan_host(b, num_pages, num_kv_heads, page_size, dense, sliding_window, budget,
                         window, qshare, sink_pages, qshare_last, "plan");
  const int64_t total = h.total(), lists = h.num_lists();
  return {to_tensor(std::move(h.groups)), to_tensor(std::move(h.offsets)), total, lists};
}

// SPEC section 8's pages read per KV group by every query position of a plan's groups
// (groups [G][5] from plan), and the same positions under dense attention.
std::tuple<int64_t, int64_t> pages_read(const std::vector<int64_t>& groups, int page_size,
                                        int64_t budget, int64_t window, int64_t qshare,
                                        int64_t sink_pages) {
  const cisa::SelectionParams p = selection_params(budget, window, qshare, sink_pages, false);
  int64_t cisa_pages = 0, dense_pages = 0;
  for (size_t i = 0; i + 5 <= groups.size(); i += 5) {
    const cisa::QueryGroup g{static_cast<int32_t>(groups[i]), groups[i + 1], groups[i + 2],
                             groups[i + 3], groups[i + 4] != 0};
    cisa_pages += cisa::pages_read(g, page_size, p);
    dense_pages += cisa::pages_read_dense(g, page_size);
  }
  return {cisa_pages, dense_pages};
}

// Selection: select_pages over the view, its lists copied into the caller's buffers, which
// must have the plan's sizes.
void select_lists(const CacheArgs& c, const BatchArgs& b, uintptr_t index_q, int64_t budget,
                  int64_t window, int64_t qshare, int64_t sink_pages, bool qshare_last,
                  uintptr_t out_pages, uintptr_t out_chunks, uintptr_t out_num_selected,
                  int64_t total, int64_t num_lists) {
  auto cache = make_view(c, &b, "select_pages");
  const std::vector<BatchEntry> batch = read_entries(b);
  const cisa::SelectionParams p = selection_params(budget, window, qshare, sink_pages, qshare_last);
  static PageLists lists;  // reused: the GIL serialises calls
  static cisa::SelectionWorkspace ws;
  raise_if_error(
      cisa::select_pages(*cache, 0, batch, ptr<const float>(index_q), p, &pool(), &lists, &ws),
      "select_pages");
  if (lists.total_pages() != total || lists.num_lists() != num_lists)
    throw std::invalid_argument(
        "cisa.select_pages: the plan has " + std::to_string(num_lists) + " lists of " +
        std::to_string(total) + " pages but this batch and these parameters give " +
        std::to_string(lists.num_lists()) + " lists of " + std::to_string(lists.total_pages()) +
        " (plan again with the same batch and parameters)");
  std::copy(lists.pages.begin(), lists.pages.end(), ptr<int32_t>(out_pages));
  std::copy(lists.chunks.begin(), lists.chunks.end(), ptr<int32_t>(out_chunks));
  std::copy(lists.num_selected.begin(), lists.num_selected.end(), ptr<int32_t>(out_num_selected));
}

// Attention over page lists given as flat arrays (groups [G][5], offsets [L + 1], pages and
// chunks [total]); attend() checks them against the batch and the block tables.
void attend(const CacheArgs& c, const BatchArgs& b, uintptr_t groups, int64_t num_groups,
            uintptr_t offsets, uintptr_t pages, uintptr_t chunks, int64_t total, uintptr_t q,
            int num_q_heads, float scale, int64_t sliding_window, uintptr_t out, uintptr_t lse) {
  auto cache = make_view(c, &b, "paged_attention");
  const std::vector<BatchEntry> batch = read_entries(b);
  static PageLists lists;
  static cisa::AttentionWorkspace ws;
  lists.num_kv_heads = c.num_kv_heads;
  lists.groups.resize(static_cast<size_t>(num_groups));
  const int64_t* g = ptr<const int64_t>(groups);
  for (int64_t i = 0; i < num_groups; ++i) {
    const int64_t* r = g + 5 * i;
    if (r[0] < 0 || r[0] >= b.num_entries)
      throw IndexErrorEx("cisa.paged_attention: groups[" + std::to_string(i) + "] names entry " +
                         std::to_string(r[0]) + " of " + std::to_string(b.num_entries));
    lists.groups[static_cast<size_t>(i)] = {static_cast<int32_t>(r[0]), r[1], r[2], r[3],
                                            r[4] != 0};
  }
  const int64_t L = num_groups * c.num_kv_heads;
  const int64_t* o = ptr<const int64_t>(offsets);
  if (o[0] != 0 || o[L] != total)
    throw std::invalid_argument(
        "cisa.paged_attention: offsets must run from 0 to the number of "
        "pages (" +
        std::to_string(total) + ")");
  for (int64_t i = 0; i < L; ++i)
    if (o[i + 1] < o[i])
      throw std::invalid_argument("cisa.paged_attention: offsets must not decrease");
  lists.offsets.assign(o, o + L + 1);
  lists.pages.assign(ptr<const int32_t>(pages), ptr<const int32_t>(pages) + total);
  lists.chunks.assign(ptr<const int32_t>(chunks), ptr<const int32_t>(chunks) + total);
  lists.num_selected.assign(static_cast<size_t>(L), 0);
  for (int64_t i = 0; i < total; ++i)
    if (lists.pages[static_cast<size_t>(i)] < 0 ||
        lists.pages[static_cast<size_t>(i)] >= c.num_pages)
      throw IndexErrorEx("cisa.paged_attention: page ID " +
                         std::to_string(lists.pages[static_cast<size_t>(i)]) + " (entry " +
                         std::to_string(i) + " of the page lists) is out of range [0, " +
                         std::to_string(c.num_pages) + ")");
  cisa::AttentionParams ap{.scale = scale, .sliding_window = sliding_window};
  raise_if_error(cisa::attend(*cache, 0, batch, lists, ptr<const float>(q), num_q_heads, ap,
                              ptr<float>(out), lse ? ptr<float>(lse) : nullptr, pool(), &ws),
                 "paged_attention");
}

// Representatives of the listed pages, recomputed from the keys in the pool.
void update_reps(const CacheArgs& c, uintptr_t pages, int64_t n) {
  auto cache = make_view(c, nullptr, "update_representatives");
  raise_if_error(cache->update_reps(0, std::span<const int32_t>(ptr<const int32_t>(pages),
                                                                static_cast<size_t>(n))),
                 "update_representatives");
}

// Scores of chunks [first, first + n) of one block table for every KV group:
// out [num_kv_heads][n], q [num_kv_heads][head_dim] f32.
void chunk_scores(const CacheArgs& c, uintptr_t table, int64_t table_len, uintptr_t q,
                  int64_t first, int64_t n, uintptr_t out) {
  if (first < 0 || n < 0 || first + n > table_len)
    throw IndexErrorEx("cisa.chunk_scores: chunks [" + std::to_string(first) + ", " +
                       std::to_string(first + n) + ") are not inside the block table of " +
                       std::to_string(table_len) + " pages");
  const int32_t* t = ptr<const int32_t>(table);
  for (int64_t j = first; j < first + n; ++j)
    if (t[j] < 0 || t[j] >= c.num_pages)
      throw IndexErrorEx("cisa.chunk_scores: page ID " + std::to_string(t[j]) + " (chunk " +
                         std::to_string(j) + ") is out of range [0, " +
                         std::to_string(c.num_pages) + ")");
  auto cache = make_view(c, nullptr, "chunk_scores");
  const std::span<const int32_t> bt(t, static_cast<size_t>(table_len));
  for (int g = 0; g < c.num_kv_heads; ++g)
    cisa::score_chunks(*cache, 0, bt, g, ptr<const float>(q) + int64_t{g} * c.head_dim, first, n,
                       ptr<float>(out) + g * n);
}

// select_topk per row of scores [rows][n]: out [rows][min(k, n)] int32, ascending indices.
void topk(uintptr_t scores, int64_t rows, int64_t n, int64_t k, uintptr_t out) {
  if (k < 0)
    throw std::invalid_argument("cisa.topk: k must be >= 0 (got " + std::to_string(k) + ")");
  const int64_t m = std::min(k, n);
  std::vector<int32_t> top, scratch;
  for (int64_t r = 0; r < rows; ++r) {
    cisa::select_topk(
        std::span<const float>(ptr<const float>(scores) + r * n, static_cast<size_t>(n)), k, &top,
        &scratch);
    std::copy(top.begin(), top.end(), ptr<int32_t>(out) + r * m);
  }
}

// The engine's own path, for tests: an owning PagedKvCache filled by append() (which computes
// the representatives), then select_pages (or plan_dense) and attend. k_rows, v_rows: f32
// [sum of lens][num_kv_heads][head_dim], sequence after sequence. Returns the block tables
// the cache handed out and the page lists; the pools are copied to out_k, out_v, out_reps
// ([num_pages] pages) and the attention to out/lse.
std::tuple<std::vector<std::vector<int32_t>>, PlanTuple> engine_reference(
    uintptr_t k_rows, uintptr_t v_rows, const std::vector<int64_t>& lens, int num_kv_heads,
    int head_dim, int page_size, int64_t num_pages, bool bf16,
    const std::vector<std::tuple<int64_t, int64_t, int64_t>>& entries, uintptr_t q,
    uintptr_t index_q, int num_q_heads, bool dense, int64_t budget, int64_t window, int64_t qshare,
    int64_t sink_pages, bool qshare_last, uintptr_t out_k, uintptr_t out_v, uintptr_t out_reps,
    uintptr_t out, uintptr_t lse, int rep) {
  auto created = PagedKvCache::create({.num_layers = 1,
                                       .num_kv_heads = num_kv_heads,
                                       .head_dim = head_dim,
                                       .page_size = page_size,
                                       .num_pages = num_pages,
                                       .dtype = bf16 ? cisa::KvDtype::kBF16 : cisa::KvDtype::kF32,
                                       .rep = rep_kind(rep),
                                       .rep_layers = {}});
  raise_if_error(created.status(), "engine_reference");
  PagedKvCache& cache = **created;
  std::vector<std::vector<int32_t>> tables;
  const int64_t row = int64_t{num_kv_heads} * head_dim;
  int64_t at = 0;
  for (int64_t len : lens) {
    auto s = cache.add_sequence();
    raise_if_error(s.status(), "engine_reference");
    raise_if_error(cache.reserve(*s, len), "engine_reference");
    raise_if_error(cache.append(0, *s, len, ptr<const float>(k_rows) + at * row,
                                ptr<const float>(v_rows) + at * row),
                   "engine_reference");
    at += len;
    auto t = cache.block_table(*s);
    tables.emplace_back(t->begin(), t->end());
  }
  std::vector<BatchEntry> batch;
  for (const auto& [s, f, n] : entries)
    batch.push_back({static_cast<cisa::SeqId>(s), f, static_cast<int32_t>(n)});
  PageLists lists;
  cisa::AttentionWorkspace ws;
  if (dense) {
    raise_if_error(cisa::plan_dense(cache, 0, batch, 0, &lists), "engine_reference");
  } else {
    raise_if_error(
        cisa::select_pages(cache, 0, batch, ptr<const float>(index_q),
                           selection_params(budget, window, qshare, sink_pages, qshare_last),
                           &pool(), &lists),
        "engine_reference");
  }
  raise_if_error(cisa::attend(cache, 0, batch, lists, ptr<const float>(q), num_q_heads, {},
                              ptr<float>(out), ptr<float>(lse), pool(), &ws),
                 "engine_reference");
  const int64_t es = bf16 ? 2 : 4;
  const int64_t kv_bytes = num_pages * row * page_size * es;
  std::copy_n(static_cast<const uint8_t*>(cache.k_pool(0)), kv_bytes, ptr<uint8_t>(out_k));
  std::copy_n(static_cast<const uint8_t*>(cache.v_pool(0)), kv_bytes, ptr<uint8_t>(out_v));
  std::copy_n(static_cast<const uint8_t*>(cache.rep_pool(0)),
              num_pages * cache.rep_width() * num_kv_heads * es, ptr<uint8_t>(out_reps));
  return {tables, to_tuple(lists)};
}

}  // namespace

void register_cpu(nb::module_& m) {
  m.def("plan", &plan);
  m.def("plan_groups", &plan_groups);
  m.def("plan_reference", &plan_reference);
  m.def("select", &select_lists);
  m.def("pages_read", &pages_read);
  m.def("attend", &attend);
  m.def("update_reps", &update_reps);
  m.def("chunk_scores", &chunk_scores);
  m.def("topk", &topk);
  m.def("engine_reference", &engine_reference);
  m.def("set_num_threads", [](int n) {
    if (n < 0) throw std::invalid_argument("cisa.set_num_threads: n must be >= 0");
    pool_slot() = std::make_unique<cisa::ThreadPool>(n);
  });
  m.def("num_threads", []() { return pool().num_threads(); });
}

}  // namespace cisa_py
