// cisa._C — the CPU engine (include/cisa/cpu/) bound for the Python package, over raw pointers.
//
// The Python side (cisa/ops.py) checks every tensor's dtype, device, shape and contiguity and
// passes data pointers and sizes; this module wraps the caller's K/V and representative tensors
// in a PagedKvCache view (PagedKvCache::wrap, nothing copied), adopts the block tables as
// sequences (which checks every page ID), and calls the engine: plan.h's rules, select_pages,
// score_chunks, select_topk and attend. Errors come back as Python exceptions carrying the
// engine's message: ValueError for malformed input, IndexError for an index out of range.
// No torch headers: the module only sees pointers.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "cisa/core/batch.h"
#include "cisa/core/page_table.h"
#include "cisa/core/plan.h"
#include "cisa/core/status.h"
#include "cisa/core/thread_pool.h"
#include "cisa/cpu/attention.h"
#include "cisa/cpu/kv_cache.h"
#include "cisa/cpu/selection.h"
#ifdef CISA_PY_WITH_CUDA
#include "cisa/cuda/backend.h"
#endif

namespace nb = nanobind;

namespace {

using cisa::BatchEntry;
using cisa::PagedKvCache;
using cisa::PageLists;
using cisa::Status;
using cisa::StatusCode;

// nanobind turns std::out_of_range into IndexError, std::invalid_argument into ValueError and
// std::bad_alloc into MemoryError.
struct IndexErrorEx : std::out_of_range {
  using std::out_of_range::out_of_range;
};

void raise_if_error(const Status& s, const char* op) {
  if (s.ok()) return;
  const std::string msg = std::string("cisa.") + op + ": " + s.message();
  switch (s.code()) {
    case StatusCode::kOutOfRange:
      throw IndexErrorEx(msg);
    case StatusCode::kResourceExhausted:
      throw std::bad_alloc();
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kFailedPrecondition:
      throw std::invalid_argument(msg);
    default:
      throw std::runtime_error(msg);
  }
}

template <class T>
T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

// The representative kinds the bindings expose (kv_cache.h's RepKind): 0 mean, 1 quest.
cisa::RepKind rep_kind(int rep) {
  if (rep == 0) return cisa::RepKind::kMean;
  if (rep == 1) return cisa::RepKind::kQuest;
  throw std::invalid_argument("cisa: unknown representative kind " + std::to_string(rep) +
                              " (0 mean, 1 quest)");
}

// One layer of a paged cache in the caller's memory.
struct CacheArgs {
  uintptr_t k = 0, v = 0, reps = 0;  // reps may be 0 (no representatives read)
  bool bf16 = false;
  int64_t num_pages = 0;
  int num_kv_heads = 0, page_size = 0, head_dim = 0;
  int rep = 0;  // representative kind: 0 mean ([head_dim] per page), 1 quest ([2 * head_dim])
};

// The batch: block tables int32 [num_seqs][max_pages], seq_lens int64 [num_seqs] and entries
// int64 [num_entries][3] (seq, first, count), all host memory.
struct BatchArgs {
  uintptr_t tables = 0;
  int64_t num_seqs = 0, max_pages = 0;
  uintptr_t lens = 0;
  uintptr_t entries = 0;
  int64_t num_entries = 0;
};

std::vector<BatchEntry> read_entries(const BatchArgs& b) {
  std::vector<BatchEntry> out(static_cast<size_t>(b.num_entries));
  const int64_t* e = ptr<const int64_t>(b.entries);
  for (int64_t i = 0; i < b.num_entries; ++i) {
    const int64_t seq = e[3 * i], first = e[3 * i + 1], count = e[3 * i + 2];
    if (seq < 0 || seq >= b.num_seqs)
      throw IndexErrorEx("cisa: entries[" + std::to_string(i) + "] names sequence " +
                         std::to_string(seq) + " but block_tables has " +
                         std::to_string(b.num_seqs) + " rows");
    if (count <= 0 || count > INT32_MAX)
      throw std::invalid_argument("cisa: entries[" + std::to_string(i) + "] has query count " +
                                  std::to_string(count) + " (must be in [1, 2^31))");
    out[static_cast<size_t>(i)] = {static_cast<cisa::SeqId>(seq), first,
                                   static_cast<int32_t>(count)};
  }
  return out;
}

// Sequence s's page count ceil(len / page_size), checked: len not negative and the pages within
// the block table's columns (ValueError naming the op otherwise).
int64_t row_pages(const BatchArgs& b, int64_t s, int page_size, const char* op) {
  const int64_t len = ptr<const int64_t>(b.lens)[s];
  if (len < 0)
    throw std::invalid_argument(std::string("cisa.") + op + ": seq_lens[" + std::to_string(s) +
                                "] = " + std::to_string(len) + " is negative");
  const int64_t n = (len + page_size - 1) / page_size;
  if (n > b.max_pages)
    throw std::invalid_argument(std::string("cisa.") + op + ": seq_lens[" + std::to_string(s) +
                                "] = " + std::to_string(len) + " needs " + std::to_string(n) +
                                " pages but block_tables has " + std::to_string(b.max_pages) +
                                " columns");
  return n;
}

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

cisa::SelectionParams selection_params(int64_t budget, int64_t window, int64_t qshare,
                                       int64_t sink_pages, bool qshare_last) {
  cisa::SelectionParams p{
      .budget = budget,
      .window = window,
      .qshare = qshare,
      .qshare_query = qshare_last ? cisa::QShareQuery::kLast : cisa::QShareQuery::kMean,
      .sink_pages = sink_pages};
  raise_if_error(cisa::validate_selection_params(p), "plan");
  return p;
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

// The page lists of a plan as flat host vectors: groups [G][5] (entry, first, last, row, dense),
// offsets [L + 1], pages and chunks [total], num_selected [L].
using PlanTuple = std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int32_t>,
                             std::vector<int32_t>, std::vector<int32_t>>;

PlanTuple to_tuple(const PageLists& l) {
  std::vector<int64_t> groups;
  groups.reserve(l.groups.size() * 5);
  for (const auto& g : l.groups) {
    groups.push_back(g.entry);
    groups.push_back(g.first);
    groups.push_back(g.last);
    groups.push_back(g.row);
    groups.push_back(g.dense ? 1 : 0);
  }
  return {groups, l.offsets, l.pages, l.chunks, l.num_selected};
}

// ---- planning ------------------------------------------------------------------------------
// The host plan checks the block tables once, in one pass over the used part of every row (a
// bitmap of the pool: range and "listed once"), with adopt_all's messages, and the entries with
// validate_batch's, instead of adopting every row into a PageTable (a random-access pass over a
// per-page owner array, the PageTable's O(num_pages) free list; ~10x slower at 1M pages). The
// groups and list sizes then come from plan.h's rules (plan_query_groups, list_layout,
// dense_chunk_range) as in plan_dense / size_page_lists; plan_reference keeps the engine's own
// path (adopt_all, plan_dense, size_page_lists) for the tests that compare the two.

// adopt_all's checks without a PageTable: every row s has ceil(seq_lens[s] / page_size) <=
// max_pages, and its first ceil(len / page_size) page IDs are in [0, num_pages) and appear once
// in the whole batch (adopt_sequence: "out of range" IndexError, "already in use" ValueError,
// the same messages, the first bad page in row-major order).
void check_tables(const BatchArgs& b, int64_t num_pages, int page_size, const char* op) {
  const int32_t* tables = ptr<const int32_t>(b.tables);
  std::vector<uint64_t> used(static_cast<size_t>((num_pages + 63) / 64), 0);
  for (int64_t s = 0; s < b.num_seqs; ++s) {
    const int64_t n = row_pages(b, s, page_size, op);
    const int32_t* row = tables + s * b.max_pages;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t p = row[i];
      const auto where = [&] {
        return std::string("cisa.") + op + ": block_tables row " + std::to_string(s) +
               ": adopt_sequence: page ID " + std::to_string(p) + " (logical page " +
               std::to_string(i) + ") ";
      };
      if (p < 0 || p >= num_pages)
        throw IndexErrorEx(where() + "is out of range [0, " + std::to_string(num_pages) + ")");
      uint64_t& word = used[static_cast<size_t>(p) >> 6];
      const uint64_t bit = uint64_t{1} << (p & 63);
      if (word & bit) throw std::invalid_argument(where() + "is already in use");
      word |= bit;
    }
  }
}

// validate_batch's checks against seq_lens (the tokens every adopted row has written in its one
// layer), after read_entries (which checks the sequence and the count), with its messages.
void check_positions(const BatchArgs& b, std::span<const BatchEntry> batch, const char* op) {
  const int64_t* lens = ptr<const int64_t>(b.lens);
  for (size_t e = 0; e < batch.size(); ++e) {
    const BatchEntry& x = batch[e];
    const std::string where =
        std::string("cisa.") + op + ": batch entry " + std::to_string(e) + ": ";
    if (x.first < 0)
      throw std::invalid_argument(where + "negative first position " + std::to_string(x.first));
    const int64_t written = lens[x.seq];
    if (x.first > written - x.count)
      throw IndexErrorEx(where + "queries up to position " + std::to_string(x.first + x.count - 1) +
                         " but only " + std::to_string(written) + " tokens of layer 0 are written");
  }
}

// A plan's host part: the query groups [G][5] (entry, first, last, row, dense), the list offsets
// [L + 1] (list i * num_kv_heads + g: group i's for KV group g) and the batch they came from.
struct HostPlan {
  std::vector<int64_t> groups, offsets;
  std::vector<BatchEntry> batch;
  bool dense = false;
  int64_t total() const { return offsets.back(); }
  int64_t num_lists() const { return static_cast<int64_t>(offsets.size()) - 1; }
};

// Every check of the engine's path (adopt_all, read_entries, validate_batch, the parameters),
// each once, and the groups and list sizes; no page list is written.
HostPlan plan_host(const BatchArgs& b, int64_t num_pages, int num_kv_heads, int page_size,
                   bool dense, int64_t sliding_window, int64_t budget, int64_t window,
                   int64_t qshare, int64_t sink_pages, bool qshare_last, const char* op) {
  if (num_kv_heads <= 0 || page_size <= 0 || num_pages <= 0 || num_pages > INT32_MAX)
    throw std::invalid_argument(std::string("cisa.") + op +
                                ": num_kv_heads, page_size and num_pages must be "
                                "positive (num_pages below 2^31)");
  check_tables(b, num_pages, page_size, op);
  HostPlan h;
  h.batch = read_entries(b);
  h.dense = dense;
  const int64_t H = num_kv_heads;
  if (dense) {
    if (sliding_window < 0)
      throw std::invalid_argument(std::string("cisa.") + op + ": sliding_window must be >= 0");
    check_positions(b, h.batch, op);
    // plan_dense: one group per entry, every list the entry's dense_chunk_range.
    h.groups.reserve(h.batch.size() * 5);
    h.offsets.reserve(h.batch.size() * static_cast<size_t>(H) + 1);
    h.offsets.push_back(0);
    int64_t row = 0;
    for (size_t e = 0; e < h.batch.size(); ++e) {
      const BatchEntry& x = h.batch[e];
      h.groups.insert(h.groups.end(),
                      {static_cast<int64_t>(e), x.first, x.first + x.count - 1, row, 1});
      row += x.count;
      const cisa::ChunkRange r = cisa::dense_chunk_range(x, page_size, sliding_window);
      for (int64_t g = 0; g < H; ++g) h.offsets.push_back(h.offsets.back() + (r.end - r.begin));
    }
  } else {
    const cisa::SelectionParams p =
        selection_params(budget, window, qshare, sink_pages, qshare_last);
    check_positions(b, h.batch, op);
    PageLists lists;
    raise_if_error(cisa::plan_query_groups(page_size, h.batch, p, &lists), op);
    // size_page_lists' offsets, without sizing (and zeroing) the lists themselves.
    h.groups.reserve(lists.groups.size() * 5);
    h.offsets.reserve(lists.groups.size() * static_cast<size_t>(H) + 1);
    h.offsets.push_back(0);
    for (const auto& g : lists.groups) {
      h.groups.insert(h.groups.end(), {g.entry, g.first, g.last, g.row, g.dense ? 1 : 0});
      const int64_t n = cisa::list_layout(g, page_size, p).size();
      for (int64_t k = 0; k < H; ++k) h.offsets.push_back(h.offsets.back() + n);
    }
  }
  return h;
}

// A vector handed to torch without a copy (DLPack; the tensor owns the vector).
template <class T>
using Tensor1 = nb::ndarray<nb::pytorch, T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

template <class T>
Tensor1<T> to_tensor(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  if (heap->empty()) heap->reserve(1);  // a non-null data pointer for an empty tensor
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return Tensor1<T>(heap->data(), {heap->size()}, owner);
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

#ifdef CISA_PY_WITH_CUDA
// ---- the Hopper backend (cuda/backend.h), built with -DCISA_PY_CUDA=ON ----------------------
// Data pointers are device memory (bf16 K/V and representatives, q bf16, index_q and outputs
// f32); the batch and the block tables are checked on the host first (the same adopt_sequence
// and validate_batch as the CPU path), and the block tables' device copy is the caller's tensor.
struct CudaPlan {
  cisa::cuda::Plan plan;
  std::vector<int64_t> offsets;
  bool dense = true;
  int64_t rows = 0;
  int rep = 0;  // the representative kind the plan was made for (CacheArgs::rep)
};

cisa::cuda::DeviceLayer device_layer(const CacheArgs& c) {
  if (!c.bf16) throw std::invalid_argument("cisa: the CUDA backend needs bfloat16 K/V");
  return {.k = ptr<const uint16_t>(c.k),
          .v = ptr<const uint16_t>(c.v),
          .reps = ptr<uint16_t>(c.reps),
          .num_pages = c.num_pages,
          .num_kv_heads = c.num_kv_heads,
          .head_dim = c.head_dim,
          .page_size = c.page_size,
          .rep = rep_kind(c.rep)};
}

// The backend's plan of a batch already checked on the host (check_batch_on_host).
void cuda_plan_checked(CudaPlan& cp, const CacheArgs& c, const BatchArgs& b,
                       std::span<const BatchEntry> batch, uintptr_t device_tables, int num_q_heads,
                       bool dense, int64_t sliding_window, int64_t budget, int64_t window,
                       int64_t qshare, int64_t sink_pages, bool qshare_last, const char* op) {
  cp.offsets.resize(static_cast<size_t>(b.num_seqs + 1));
  for (int64_t s = 0; s <= b.num_seqs; ++s) cp.offsets[static_cast<size_t>(s)] = s * b.max_pages;
  const cisa::cuda::DeviceBlockTables tables{ptr<const int32_t>(device_tables), cp.offsets};
  cp.dense = dense;
  cp.rep = c.rep;
  cp.rows = 0;
  for (const auto& e : batch) cp.rows += e.count;
  if (dense)
    raise_if_error(cisa::cuda::plan_dense(device_layer(c), tables, batch, num_q_heads,
                                          sliding_window, &cp.plan),
                   op);
  else
    raise_if_error(cisa::cuda::plan_sparse(
                       device_layer(c), tables, batch, num_q_heads,
                       selection_params(budget, window, qshare, sink_pages, qshare_last), &cp.plan),
                   op);
}

// The host checks of the CPU path (adopt_all's and validate_batch's, each page once), then the
// backend's plan.
void cuda_plan(CudaPlan& cp, const CacheArgs& c, const BatchArgs& b, uintptr_t device_tables,
               int num_q_heads, bool dense, int64_t sliding_window, int64_t budget, int64_t window,
               int64_t qshare, int64_t sink_pages, bool qshare_last, const std::string& op_name) {
  const char* op = op_name.c_str();
  if (c.page_size <= 0)
    throw std::invalid_argument(std::string("cisa.") + op + ": page_size must be positive");
  check_tables(b, c.num_pages, c.page_size, op);
  const std::vector<BatchEntry> batch = read_entries(b);
  check_positions(b, batch, op);
  cuda_plan_checked(cp, c, b, batch, device_tables, num_q_heads, dense, sliding_window, budget,
                    window, qshare, sink_pages, qshare_last, op);
}

// The CUDA wrapper's plan in one pass over the block tables: plan_groups' host plan (the
// wrapper's num_kv_heads and page_size, which must be the layer's; pages checked against
// min(num_pages, the layer's pages)) and the backend's plan of the same checked batch.
std::tuple<Tensor1<int64_t>, Tensor1<int64_t>, int64_t, int64_t> cuda_plan_groups(
    CudaPlan& cp, const CacheArgs& c, const BatchArgs& b, uintptr_t device_tables,
    int64_t num_pages, int num_kv_heads, int page_size, int num_q_heads, bool dense,
    int64_t sliding_window, int64_t budget, int64_t window, int64_t qshare, int64_t sink_pages,
    bool qshare_last) {
  if (num_kv_heads != c.num_kv_heads || page_size != c.page_size)
    throw std::invalid_argument("cisa.plan: the wrapper's num_kv_heads and page_size (" +
                                std::to_string(num_kv_heads) + ", " + std::to_string(page_size) +
                                ") must be k_cache's (" + std::to_string(c.num_kv_heads) + ", " +
                                std::to_string(c.page_size) + ")");
  HostPlan h = plan_host(b, std::min(num_pages, c.num_pages), num_kv_heads, page_size, dense,
                         sliding_window, budget, window, qshare, sink_pages, qshare_last, "plan");
  cuda_plan_checked(cp, c, b, h.batch, device_tables, num_q_heads, dense, sliding_window, budget,
                    window, qshare, sink_pages, qshare_last, "plan");
  const int64_t total = h.total(), lists = h.num_lists();
  return {to_tensor(std::move(h.groups)), to_tensor(std::move(h.offsets)), total, lists};
}

// A sparse plan over block tables the caller built on the device (concatenated, CSR `offsets`)
// for the single-purpose plans of the chunk_scores and topk ops: no host check of page IDs (the
// caller checks the pages that are read), no unions, no fused selection.
void cuda_plan_raw(CudaPlan& cp, const CacheArgs& c, uintptr_t device_tables,
                   const std::vector<int64_t>& offsets,
                   const std::vector<std::tuple<int64_t, int64_t, int64_t>>& entries,
                   int64_t budget, int64_t window, int64_t sink_pages, const std::string& op_name) {
  const char* op = op_name.c_str();
  std::vector<BatchEntry> batch;
  cp.rows = 0;
  for (const auto& [s, f, n] : entries) {
    batch.push_back({static_cast<cisa::SeqId>(s), f, static_cast<int32_t>(n)});
    cp.rows += n;
  }
  cp.offsets = offsets;
  cp.dense = false;
  cp.rep = c.rep;
  const cisa::cuda::DeviceBlockTables tables{ptr<const int32_t>(device_tables), cp.offsets};
  cisa::cuda::PlanOptions options;
  options.group_unions = false;
  options.fused_select_cluster = 0;
  raise_if_error(cisa::cuda::plan_sparse(device_layer(c), tables, batch, c.num_kv_heads,
                                         selection_params(budget, window, 1, sink_pages, false),
                                         &cp.plan, options),
                 op);
}

// One selection stage (0 setup, 1 scores, 2 top-k), launched on the stream.
void cuda_select_stage(const CudaPlan& cp, const CacheArgs& c, uintptr_t index_q, int stage,
                       uintptr_t stream, const std::string& op) {
  if (stage < 0 || stage > 2) throw std::invalid_argument("cisa: unknown selection stage");
  raise_if_error(
      cisa::cuda::run_select_stage(cp.plan, device_layer(c), ptr<const float>(index_q),
                                   static_cast<cisa::cuda::SelectStage>(stage), ptr<void>(stream)),
      op.c_str());
}

// Attention of a plan whose lists run_select wrote, launched on the stream.
void cuda_attend(const CudaPlan& cp, const CacheArgs& c, uintptr_t q, float scale, uintptr_t out,
                 uintptr_t lse, uintptr_t stream) {
  raise_if_error(cisa::cuda::run_attention(cp.plan, device_layer(c), ptr<const uint16_t>(q), scale,
                                           ptr<float>(out), lse ? ptr<float>(lse) : nullptr,
                                           ptr<void>(stream)),
                 "paged_attention");
}

// Replaces a plan's scores (download_scores' layout) by the caller's device f32 scores.
void cuda_upload_scores(const CudaPlan& cp, uintptr_t scores, int64_t n, uintptr_t stream) {
  raise_if_error(cisa::cuda::upload_scores(cp.plan, ptr<const float>(scores), n, ptr<void>(stream)),
                 "topk");
}

// The scores of a plan's selecting lists and their offsets (synchronous copy).
std::tuple<std::vector<float>, std::vector<int64_t>> cuda_download_scores(const CudaPlan& cp) {
  std::vector<float> scores;
  std::vector<int64_t> offsets;
  raise_if_error(cisa::cuda::download_scores(cp.plan, &scores, &offsets), "chunk_scores");
  return {scores, offsets};
}

void cuda_run(const CudaPlan& cp, const CacheArgs& c, uintptr_t index_q, uintptr_t q, float scale,
              uintptr_t out, uintptr_t lse, uintptr_t stream) {
  if (c.rep != cp.rep)
    throw std::invalid_argument("cisa.cuda_run: the plan was made for another representative kind");
  const cisa::cuda::DeviceLayer layer = device_layer(c);
  // Every plan runs the selection step: it writes the lists' fixed parts (a dense plan's whole
  // lists) on the device; index_q is read only by sparse plans.
  raise_if_error(
      cisa::cuda::run_select(cp.plan, layer, ptr<const float>(index_q), ptr<void>(stream)), "run");
  raise_if_error(
      cisa::cuda::run_attention(cp.plan, layer, ptr<const uint16_t>(q), scale, ptr<float>(out),
                                lse ? ptr<float>(lse) : nullptr, ptr<void>(stream)),
      "run");
}

void cuda_update_reps(const CacheArgs& c, uintptr_t pages, int64_t n, uintptr_t stream) {
  raise_if_error(
      cisa::cuda::run_update_reps(device_layer(c), ptr<const int32_t>(pages), n, ptr<void>(stream)),
      "update_representatives");
}

std::tuple<PlanTuple, int64_t> cuda_page_lists(const CudaPlan& cp) {
  PageLists lists;
  raise_if_error(cisa::cuda::download_page_lists(cp.plan, &lists), "page_lists");
  int64_t read = 0;
  raise_if_error(cisa::cuda::count_read_pages(cp.plan, &read), "page_lists");
  return {to_tuple(lists), read};
}
#endif

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "cisa's CPU engine over raw pointers (use the torch ops in cisa.ops)";
  nb::class_<CacheArgs>(m, "CacheArgs")
      .def(nb::init<>())
      .def_rw("k", &CacheArgs::k)
      .def_rw("v", &CacheArgs::v)
      .def_rw("reps", &CacheArgs::reps)
      .def_rw("bf16", &CacheArgs::bf16)
      .def_rw("num_pages", &CacheArgs::num_pages)
      .def_rw("num_kv_heads", &CacheArgs::num_kv_heads)
      .def_rw("page_size", &CacheArgs::page_size)
      .def_rw("head_dim", &CacheArgs::head_dim)
      .def_rw("rep", &CacheArgs::rep);
  nb::class_<BatchArgs>(m, "BatchArgs")
      .def(nb::init<>())
      .def_rw("tables", &BatchArgs::tables)
      .def_rw("num_seqs", &BatchArgs::num_seqs)
      .def_rw("max_pages", &BatchArgs::max_pages)
      .def_rw("lens", &BatchArgs::lens)
      .def_rw("entries", &BatchArgs::entries)
      .def_rw("num_entries", &BatchArgs::num_entries);
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
#ifdef CISA_PY_WITH_CUDA
  nb::class_<CudaPlan>(m, "CudaPlan")
      .def(nb::init<>())
      .def_ro("rows", &CudaPlan::rows)
      .def_ro("dense", &CudaPlan::dense)
      .def_ro("rep", &CudaPlan::rep);
  m.def("cuda_plan", &cuda_plan);
  m.def("cuda_plan_groups", &cuda_plan_groups);
  m.def("cuda_plan_raw", &cuda_plan_raw);
  m.def("cuda_select_stage", &cuda_select_stage);
  m.def("cuda_attend", &cuda_attend);
  m.def("cuda_upload_scores", &cuda_upload_scores);
  m.def("cuda_download_scores", &cuda_download_scores);
  m.def("cuda_run", &cuda_run);
  m.def("cuda_update_reps", &cuda_update_reps);
  m.def("cuda_page_lists", &cuda_page_lists);
  m.def("cuda_device_available", []() {
    std::string why;
    const bool ok = cisa::cuda::device_available(&why);
    return std::make_tuple(ok, why);
  });
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
}
