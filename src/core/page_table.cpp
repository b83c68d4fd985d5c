// Sequences, block tables and the free list of a paged KV cache (page_table.h).
#include "cisa/core/page_table.h"

#include <algorithm>
#include <limits>
#include <string>

namespace cisa {

PageTable::PageTable(int num_layers, int page_size, int64_t num_pages)
    : num_layers_(num_layers), page_size_(page_size) {
  owner_.assign(static_cast<size_t>(num_pages), -1);
  free_list_.reserve(static_cast<size_t>(num_pages));
  // A stack: the lowest page IDs are handed out first.
  for (int64_t p = num_pages - 1; p >= 0; --p) free_list_.push_back(static_cast<int32_t>(p));
}

bool PageTable::has_sequence(SeqId seq) const {
  return seq >= 0 && seq < static_cast<SeqId>(seqs_.size()) &&
         seqs_[static_cast<size_t>(seq)].active;
}

Status PageTable::check_sequence(SeqId seq) const {
  if (!has_sequence(seq)) return not_found("unknown sequence " + std::to_string(seq));
  return Status::Ok();
}

Result<SeqId> PageTable::add_sequence() {
  const Sequence fresh{true, {}, 0, std::vector<int64_t>(static_cast<size_t>(num_layers_), 0)};
  for (size_t i = 0; i < seqs_.size(); ++i)
    if (!seqs_[i].active) {
      seqs_[i] = fresh;
      return static_cast<SeqId>(i);
    }
  if (seqs_.size() >= static_cast<size_t>(std::numeric_limits<SeqId>::max()))
    return resource_exhausted("too many sequences");
  seqs_.push_back(fresh);
  return static_cast<SeqId>(seqs_.size() - 1);
}

Result<SeqId> PageTable::adopt_sequence(std::span<const int32_t> pages, int64_t tokens) {
  const int64_t B = page_size_;
  if (tokens < 0)
    return invalid_argument("adopt_sequence: token count must be >= 0 (got " +
                            std::to_string(tokens) + ")");
  const int64_t need = tokens / B + (tokens % B != 0);
  if (static_cast<int64_t>(pages.size()) != need)
    return invalid_argument("adopt_sequence: " + std::to_string(tokens) + " tokens need " +
                            std::to_string(need) + " pages of " + std::to_string(B) + " but " +
                            std::to_string(pages.size()) + " were given");
  for (size_t i = 0; i < pages.size(); ++i) {
    const int32_t p = pages[i];
    if (p < 0 || p >= num_pages()) {
      for (size_t j = 0; j < i; ++j) owner_[static_cast<size_t>(pages[j])] = -1;
      return out_of_range("adopt_sequence: page ID " + std::to_string(p) + " (logical page " +
                          std::to_string(i) + ") is out of range [0, " +
                          std::to_string(num_pages()) + ")");
    }
    if (owner_[static_cast<size_t>(p)] != -1) {
      for (size_t j = 0; j < i; ++j) owner_[static_cast<size_t>(pages[j])] = -1;
      return invalid_argument("adopt_sequence: page ID " + std::to_string(p) + " (logical page " +
                              std::to_string(i) + ") is already in use");
    }
    owner_[static_cast<size_t>(p)] = -2;  // claimed; the owner is set below
  }
  Result<SeqId> seq = add_sequence();
  if (!seq.ok()) {
    for (int32_t p : pages) owner_[static_cast<size_t>(p)] = -1;
    return seq.status();
  }
  for (int32_t p : pages) owner_[static_cast<size_t>(p)] = *seq;
  stale_ += static_cast<int64_t>(pages.size());  // still listed as free: see drop_stale
  auto& s = seqs_[static_cast<size_t>(*seq)];
  s.pages.assign(pages.begin(), pages.end());
  s.reserved = tokens;
  std::fill(s.written.begin(), s.written.end(), tokens);
  ++version_;
  return seq;
}

void PageTable::drop_stale() {
  if (stale_ == 0) return;
  // The same order as erasing each adopted page when it was adopted.
  std::erase_if(free_list_, [&](int32_t p) { return owner_[static_cast<size_t>(p)] != -1; });
  stale_ = 0;
}

Status PageTable::release_sequence(SeqId seq) {
  CISA_RETURN_IF_ERROR(check_sequence(seq));
  drop_stale();  // before this sequence's pages (maybe adopted, still listed) are pushed again
  auto& s = seqs_[static_cast<size_t>(seq)];
  for (auto it = s.pages.rbegin(); it != s.pages.rend(); ++it) {
    owner_[static_cast<size_t>(*it)] = -1;
    free_list_.push_back(*it);
  }
  s = Sequence{};
  ++version_;
  return Status::Ok();
}

Status PageTable::reserve(SeqId seq, int64_t n) {
  CISA_RETURN_IF_ERROR(check_sequence(seq));
  if (n < 0)
    return invalid_argument("reserve: token count must be >= 0 (got " + std::to_string(n) + ")");
  auto& s = seqs_[static_cast<size_t>(seq)];
  const int64_t B = page_size_;
  // Compared before adding, so a huge n cannot overflow the page arithmetic.
  const int64_t room = (static_cast<int64_t>(s.pages.size()) + free_pages()) * B - s.reserved;
  if (n > room)
    return resource_exhausted("page pool exhausted: sequence " + std::to_string(seq) +
                              " needs room for " + std::to_string(n) + " more tokens but " +
                              std::to_string(free_pages()) + " of " + std::to_string(num_pages()) +
                              " pages are free");
  drop_stale();
  const int64_t extra = (s.reserved + n + B - 1) / B - static_cast<int64_t>(s.pages.size());
  for (int64_t i = 0; i < extra; ++i) {
    const int32_t p = free_list_.back();
    free_list_.pop_back();
    owner_[static_cast<size_t>(p)] = seq;
    s.pages.push_back(p);
  }
  s.reserved += n;
  if (extra > 0) ++version_;
  return Status::Ok();
}

Status PageTable::mark_written(int layer, SeqId seq, int64_t n) {
  CISA_RETURN_IF_ERROR(check_sequence(seq));
  if (layer < 0 || layer >= num_layers_)
    return out_of_range("layer " + std::to_string(layer) + " out of range [0, " +
                        std::to_string(num_layers_) + ")");
  if (n < 0)
    return invalid_argument("append: token count must be >= 0 (got " + std::to_string(n) + ")");
  auto& s = seqs_[static_cast<size_t>(seq)];
  int64_t& w = s.written[static_cast<size_t>(layer)];
  if (n > s.reserved - w)
    return failed_precondition("append: sequence " + std::to_string(seq) + " layer " +
                               std::to_string(layer) + " would hold " + std::to_string(w) + " + " +
                               std::to_string(n) + " tokens but only " +
                               std::to_string(s.reserved) + " are reserved (call reserve first)");
  w += n;
  return Status::Ok();
}

Result<int64_t> PageTable::tokens(int layer, SeqId seq) const {
  CISA_RETURN_IF_ERROR(check_sequence(seq));
  if (layer < 0 || layer >= num_layers_)
    return out_of_range("layer " + std::to_string(layer) + " out of range");
  return seqs_[static_cast<size_t>(seq)].written[static_cast<size_t>(layer)];
}

Result<int64_t> PageTable::length(SeqId seq) const {
  CISA_RETURN_IF_ERROR(check_sequence(seq));
  const auto& w = seqs_[static_cast<size_t>(seq)].written;
  return w.empty() ? 0 : *std::min_element(w.begin(), w.end());
}

Result<int64_t> PageTable::reserved(SeqId seq) const {
  CISA_RETURN_IF_ERROR(check_sequence(seq));
  return seqs_[static_cast<size_t>(seq)].reserved;
}

Result<std::span<const int32_t>> PageTable::block_table(SeqId seq) const {
  CISA_RETURN_IF_ERROR(check_sequence(seq));
  const auto& p = seqs_[static_cast<size_t>(seq)].pages;
  return std::span<const int32_t>(p.data(), p.size());
}

SeqId PageTable::page_owner(int32_t page) const {
  if (page < 0 || page >= num_pages()) return -1;
  return owner_[static_cast<size_t>(page)];
}

std::vector<SeqId> PageTable::sequences() const {
  std::vector<SeqId> out;
  for (size_t i = 0; i < seqs_.size(); ++i)
    if (seqs_[i].active) out.push_back(static_cast<SeqId>(i));
  return out;
}

}  // namespace cisa
