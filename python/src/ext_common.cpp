// The host-side checks and planning shared by the cisa._C ops (ext_common.h).
#include "ext_common.h"

#include <string>
#include <vector>

namespace cisa_py {

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

cisa::RepKind rep_kind(int rep) {
  if (rep == 0) return cisa::RepKind::kMean;
  if (rep == 1) return cisa::RepKind::kQuest;
  throw std::invalid_argument("cisa: unknown representative kind " + std::to_string(rep) +
                              " (0 mean, 1 quest)");
}

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

}  // namespace cisa_py
