// cisa/core/page_table.h — the bookkeeping half of a paged KV cache, free of any storage:
// sequences, their block tables (logical page → physical page ID), a free list of physical pages,
// and how many tokens each layer has written. Every backend's cache (the CPU's PagedKvCache, the
// GPU's device pools) keeps one, so the planning code in the core (batch.h, plan.h) reads block
// tables and lengths the same way whatever memory the pages live in.
//
//   cisa::PageTable t(/*num_layers=*/2, /*page_size=*/16, /*num_pages=*/4096);
//   cisa::SeqId s = *t.add_sequence();
//   CISA_RETURN_IF_ERROR(t.reserve(s, 100));        // 7 pages allocated, all or nothing
//   std::span<const int32_t> pages = *t.block_table(s);
//   ... write 100 tokens of layer 0 into those pages ...
//   t.mark_written(0, s, 100);
//
// Every failing call returns a Status and leaves the table unchanged.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cisa/core/status.h"

namespace cisa {

using SeqId = int32_t;

class PageTable {
 public:
  PageTable() = default;
  // Physical pages are handed out from the highest ID down (page 0 last), as a stack.
  PageTable(int num_layers, int page_size, int64_t num_pages);

  int num_layers() const { return num_layers_; }
  int page_size() const { return page_size_; }
  int64_t num_pages() const { return static_cast<int64_t>(owner_.size()); }
  int64_t free_pages() const { return static_cast<int64_t>(free_list_.size()) - stale_; }

  Result<SeqId> add_sequence();
  // Adds a sequence whose block table was made elsewhere (a caller's own page allocator, e.g. the
  // Python bindings' tensors): it owns exactly `pages` (physical IDs in logical order, each in
  // range, free and listed once; ceil(tokens / page_size) of them) and has `tokens` tokens
  // reserved and written in every layer. All or nothing.
  Result<SeqId> adopt_sequence(std::span<const int32_t> pages, int64_t tokens);
  // Returns every page of the sequence to the free list; the id may be reused later.
  Status release_sequence(SeqId seq);
  // Allocates pages so that `n` more tokens fit after the tokens already reserved. All or nothing.
  Status reserve(SeqId seq, int64_t n);
  // Records that layer `layer` wrote `n` more tokens; they must fit in the reserved capacity.
  Status mark_written(int layer, SeqId seq, int64_t n);

  bool has_sequence(SeqId seq) const;
  Status check_sequence(SeqId seq) const;  // not_found unless `seq` is live
  // Tokens written so far in one layer; length() is the minimum over layers.
  Result<int64_t> tokens(int layer, SeqId seq) const;
  Result<int64_t> length(SeqId seq) const;
  Result<int64_t> reserved(SeqId seq) const;  // tokens with a page allocated for them
  Result<std::span<const int32_t>> block_table(SeqId seq) const;
  // The sequence that owns a physical page, or -1 when the page is free (or out of range).
  SeqId page_owner(int32_t page) const;
  // Live sequence IDs, ascending.
  std::vector<SeqId> sequences() const;
  // Bumped by every call that changes a block table (reserve, release_sequence); backends that
  // mirror the block tables in device memory upload them again when it moves.
  uint64_t version() const { return version_; }

 private:
  struct Sequence {
    bool active = false;
    std::vector<int32_t> pages;    // block table
    int64_t reserved = 0;          // tokens with a page allocated for them (≤ pages·B)
    std::vector<int64_t> written;  // per layer
  };
  int num_layers_ = 0;
  int page_size_ = 16;
  std::vector<int32_t> free_list_;  // stack of free physical pages (and `stale_` adopted ones)
  // Adopted pages still listed in free_list_: adopt_sequence leaves them there (erasing them is a
  // pass over the whole list, which made adopting S sequences of a 1M-page pool O(S x pages));
  // reserve and release_sequence drop them in one pass before they touch the list.
  int64_t stale_ = 0;
  void drop_stale();
  std::vector<SeqId> owner_;  // per physical page, −1 when free
  std::vector<Sequence> seqs_;
  uint64_t version_ = 0;
};

}  // namespace cisa
