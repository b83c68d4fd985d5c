// Batches and page lists.
#include "cisa/core/batch.h"

#include <algorithm>
#include <string>

namespace cisa {

std::vector<int64_t> batch_row_offsets(std::span<const BatchEntry> batch) {
  std::vector<int64_t> off(batch.size() + 1, 0);
  for (size_t e = 0; e < batch.size(); ++e) off[e + 1] = off[e] + batch[e].count;
  return off;
}

void PageLists::clear() {
  groups.clear();
  offsets.clear();
  pages.clear();
  chunks.clear();
  num_selected.clear();
}

}  // namespace cisa
