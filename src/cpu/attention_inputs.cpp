// Input checks shared by attend and attend_llamacpp (attention_inputs.h).
#include "attention_inputs.h"

#include <string>

namespace cisa::cpu {

Status validate_attention_inputs(const PagedKvCache& cache, int layer,
                                 std::span<const BatchEntry> batch, const PageLists& lists,
                                 int num_q_heads, std::vector<int64_t>* row_offsets,
                                 std::vector<int64_t>* row_group) {
  CISA_RETURN_IF_ERROR(validate_batch(cache, layer, batch));
  const int hkv = cache.num_kv_heads();
  if (num_q_heads <= 0 || num_q_heads % hkv != 0)
    return invalid_argument("query head count " + std::to_string(num_q_heads) +
                            " is not a positive multiple of the cache's " + std::to_string(hkv) +
                            " KV heads");
  if (lists.num_kv_heads != hkv)
    return invalid_argument("page lists were built for " + std::to_string(lists.num_kv_heads) +
                            " KV heads, the cache has " + std::to_string(hkv));
  if (lists.offsets.size() != static_cast<size_t>(lists.num_lists() + 1) ||
      lists.offsets.front() != 0 || lists.offsets.back() != lists.total_pages() ||
      lists.chunks.size() != lists.pages.size())
    return invalid_argument("page lists are malformed (offsets do not match the page array)");
  for (size_t i = 1; i < lists.offsets.size(); ++i)
    if (lists.offsets[i] < lists.offsets[i - 1])
      return invalid_argument("page lists are malformed (offsets decrease)");

  auto& rows = *row_offsets;
  rows.assign(batch.size() + 1, 0);
  for (size_t e = 0; e < batch.size(); ++e) rows[e + 1] = rows[e] + batch[e].count;
  row_group->assign(static_cast<size_t>(rows.back()), -1);
  for (size_t i = 0; i < lists.groups.size(); ++i) {
    const QueryGroup& g = lists.groups[i];
    if (g.entry < 0 || static_cast<size_t>(g.entry) >= batch.size())
      return invalid_argument("query group " + std::to_string(i) + " names batch entry " +
                              std::to_string(g.entry) + " of " + std::to_string(batch.size()));
    const BatchEntry& e = batch[static_cast<size_t>(g.entry)];
    if (g.first < e.first || g.last < g.first || g.last >= e.first + e.count ||
        g.row != rows[static_cast<size_t>(g.entry)] + (g.first - e.first))
      return invalid_argument("query group " + std::to_string(i) +
                              " does not lie inside its batch entry");
    for (int64_t r = g.row; r <= g.row + (g.last - g.first); ++r) {
      if ((*row_group)[static_cast<size_t>(r)] >= 0)
        return invalid_argument("query row " + std::to_string(r) + " is in two query groups");
      (*row_group)[static_cast<size_t>(r)] = static_cast<int64_t>(i);
    }
    for (int kv = 0; kv < hkv; ++kv)
      for (int32_t page : lists.list_pages(static_cast<int64_t>(i), kv))
        if (cache.page_owner(page) != e.seq)  // page_owner is −1 for free and out-of-range pages
          return invalid_argument(
              "page list of group " + std::to_string(i) + " names page " + std::to_string(page) +
              ", which sequence " + std::to_string(e.seq) +
              (cache.page_owner(page) < 0 ? " does not own (it is free)" : " does not own"));
  }
  for (size_t r = 0; r < row_group->size(); ++r)
    if ((*row_group)[r] < 0)
      return invalid_argument("query row " + std::to_string(r) + " is in no query group");
  return Status::Ok();
}

}  // namespace cisa::cpu
