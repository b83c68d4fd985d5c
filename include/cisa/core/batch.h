// cisa/core/batch.h — a batch of sequences, each with a run of query positions, and the page lists
// that say which physical pages each group of queries attends to.
//
// Queries of all entries are packed row after row: entry e's `count` rows start at the sum of the
// counts before it. A QueryGroup is a run of consecutive positions of one entry that shares one
// page list per KV group (a QShare group, or a whole block on the dense path). The plan step
// (plan.h's plan_dense, a backend's selection) builds PageLists; the run step (attend) only reads
// them.
//
//   std::vector<cisa::BatchEntry> batch = {{.seq = s0, .first = 4096, .count = 512},   // prefill
//                                          {.seq = s1, .first = 9000, .count = 1}};    // decode
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cisa/core/page_table.h"
#include "cisa/core/status.h"

namespace cisa {

struct BatchEntry {
  SeqId seq = 0;
  int64_t first = 0;  // absolute position of the first query
  int32_t count = 0;  // number of consecutive query positions
};

// Row offset of each entry in the packed query array; size entries+1.
std::vector<int64_t> batch_row_offsets(std::span<const BatchEntry> batch);

struct QueryGroup {
  int32_t entry = 0;   // index into the batch
  int64_t first = 0;   // absolute position of the group's first query
  int64_t last = 0;    // absolute position of its last query (inclusive)
  int64_t row = 0;     // packed row index of `first`
  bool dense = false;  // no selection ran: every page up to the last query's page (or its window)
};

struct PageLists {
  int num_kv_heads = 0;
  std::vector<QueryGroup> groups;
  // List (group i, KV group g) = pages[offsets[i·H + g] … offsets[i·H + g + 1]), H = num_kv_heads.
  std::vector<int64_t> offsets;
  std::vector<int32_t> pages;         // physical page IDs, in ascending logical order within a list
  std::vector<int32_t> chunks;        // the logical chunk index of each entry of `pages`
  std::vector<int32_t> num_selected;  // per list: pages chosen by top-k (0 on the dense path)

  int64_t num_lists() const { return static_cast<int64_t>(groups.size()) * num_kv_heads; }
  std::span<const int32_t> list_pages(int64_t group, int kv) const {
    int64_t i = group * num_kv_heads + kv;
    return {pages.data() + offsets[i], static_cast<size_t>(offsets[i + 1] - offsets[i])};
  }
  std::span<const int32_t> list_chunks(int64_t group, int kv) const {
    int64_t i = group * num_kv_heads + kv;
    return {chunks.data() + offsets[i], static_cast<size_t>(offsets[i + 1] - offsets[i])};
  }
  int64_t total_pages() const { return static_cast<int64_t>(pages.size()); }
  void clear();
};

}  // namespace cisa
