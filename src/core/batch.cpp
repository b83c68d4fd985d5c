// Batches, page lists and the dense plan.
#include "cisa/batch.h"

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

Status validate_batch(const PagedKvCache& cache, int layer, std::span<const BatchEntry> batch) {
  if (layer < 0 || layer >= cache.num_layers())
    return out_of_range("layer " + std::to_string(layer) + " out of range [0, " +
                        std::to_string(cache.num_layers()) + ")");
  for (size_t e = 0; e < batch.size(); ++e) {
    const auto& b = batch[e];
    auto where = [e] { return "batch entry " + std::to_string(e) + ": "; };  // built only on error
    if (!cache.has_sequence(b.seq)) return not_found(where() + "unknown sequence " + std::to_string(b.seq));
    if (b.first < 0) return invalid_argument(where() + "negative first position " + std::to_string(b.first));
    if (b.count <= 0) return invalid_argument(where() + "query count must be positive (got " + std::to_string(b.count) + ")");
    const int64_t written = *cache.tokens(layer, b.seq);
    if (b.first + b.count > written)
      return out_of_range(where() + "queries up to position " + std::to_string(b.first + b.count - 1) +
                          " but only " + std::to_string(written) + " tokens of layer " +
                          std::to_string(layer) + " are written");
  }
  return Status::Ok();
}

Status plan_dense(const PagedKvCache& cache, int layer, std::span<const BatchEntry> batch,
                  int64_t sliding_window, PageLists* out) {
  CISA_RETURN_IF_ERROR(validate_batch(cache, layer, batch));
  if (sliding_window < 0) return invalid_argument("sliding_window must be >= 0");
  const int B = cache.page_size();
  const int H = cache.num_kv_heads();
  out->clear();
  out->num_kv_heads = H;
  out->offsets.push_back(0);
  int64_t row = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    const auto& b = batch[e];
    const int64_t last = b.first + b.count - 1;
    const int64_t lo = sliding_window > 0 ? std::max<int64_t>(0, b.first - sliding_window + 1) : 0;
    out->groups.push_back({static_cast<int32_t>(e), b.first, last, row, true});
    row += b.count;
    auto table = *cache.block_table(b.seq);
    for (int g = 0; g < H; ++g) {
      for (int64_t j = lo / B; j <= last / B; ++j) {
        out->pages.push_back(table[static_cast<size_t>(j)]);
        out->chunks.push_back(static_cast<int32_t>(j));
      }
      out->offsets.push_back(static_cast<int64_t>(out->pages.size()));
      out->num_selected.push_back(0);
    }
  }
  return Status::Ok();
}

}  // namespace cisa
