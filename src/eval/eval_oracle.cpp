// Oracle page selection (the upper bound of issue 5): the same query groups, window, tail and
// sinks as select_pages, but each group's k chunks are those with the largest true dense
// attention mass, p_j = Σ_{t∈P} Σ_{h∈H_g} Σ_{s∈chunk j} softmax_s(scale · q_{h,t}·k_s), s ≤ t.
// It reads the cache only through the core's public API and builds the PageLists by hand.
#include <algorithm>
#include <cmath>

#include "cisa/bf16.h"
#include "cisa/diagnostics.h"
#include "cisa/eval.h"

namespace cisa::eval {
namespace {

float key_at(const PagedKvCache& cache, int layer, int32_t page, int kv, int slot, int i) {
  const int d = cache.head_dim();
  const void* base = cache.k_page(layer, page, kv);
  if (cache.config().dtype == KvDtype::kF32) return static_cast<const float*>(base)[slot * d + i];
  return bf16_to_f32(static_cast<const uint16_t*>(base)[slot * d + i]);
}

}  // namespace

Status select_pages_oracle(const PagedKvCache& cache, int layer, std::span<const BatchEntry> batch,
                           const float* q, int num_q_heads, float scale, const SelectionParams& p,
                           ThreadPool* pool, PageLists* out) {
  CISA_RETURN_IF_ERROR(validate_batch(cache, layer, batch));
  if (!q) return invalid_argument("select_pages_oracle: null query pointer");
  const int H = cache.num_kv_heads(), d = cache.head_dim();
  if (num_q_heads <= 0 || num_q_heads % H != 0)
    return invalid_argument("select_pages_oracle: " + std::to_string(num_q_heads) +
                            " query heads for " + std::to_string(H) + " KV heads");
  CISA_RETURN_IF_ERROR(plan_query_groups(cache, batch, p, out));
  const int hg = num_q_heads / H;
  const int64_t B = cache.page_size();
  const auto num_groups = static_cast<int64_t>(out->groups.size());
  out->num_kv_heads = H;
  size_page_lists(cache.page_size(), H, p, out);

  auto task = [&](int64_t t, int) {
    const int g = static_cast<int>(t % H);
    const auto& grp = out->groups[static_cast<size_t>(t / H)];
    auto table = *cache.block_table(batch[static_cast<size_t>(grp.entry)].seq);
    if (grp.dense) return write_page_list(table, cache.page_size(), p, {}, t, out);
    const int64_t ca = grp.first / B, cb = grp.last / B;
    // True dense mass per chunk, summed over the group's positions and the KV group's heads.
    std::vector<double> mass(static_cast<size_t>(cb + 1), 0.0), logit;
    for (int64_t pos = grp.first; pos <= grp.last; ++pos) {
      const int64_t row = grp.row + (pos - grp.first);
      for (int h = 0; h < hg; ++h) {
        const float* qv = q + (row * num_q_heads + g * hg + h) * d;
        logit.assign(static_cast<size_t>(pos + 1), 0.0);
        double mx = -INFINITY;
        for (int64_t s = 0; s <= pos; ++s) {
          const int32_t page = table[static_cast<size_t>(s / B)];
          double acc = 0;
          for (int k = 0; k < d; ++k)
            acc += static_cast<double>(qv[k]) *
                   key_at(cache, layer, page, g, static_cast<int>(s % B), k);
          logit[static_cast<size_t>(s)] = acc * scale;
          mx = std::max(mx, logit[static_cast<size_t>(s)]);
        }
        double z = 0;
        for (auto& x : logit) z += (x = std::exp(x - mx));
        for (int64_t s = 0; s <= pos; ++s)
          mass[static_cast<size_t>(s / B)] += logit[static_cast<size_t>(s)] / z;
      }
    }
    const int64_t first_eligible = p.sink_pages, end_eligible = ca - p.window;
    const std::vector<int32_t> top = oracle_topk(mass, first_eligible, end_eligible, p.budget);
    write_page_list(table, cache.page_size(), p, top, t, out);
  };
  if (pool)
    pool->parallel_for(num_groups * H, task);
  else
    for (int64_t t = 0; t < num_groups * H; ++t) task(t, 0);
  return Status::Ok();
}

}  // namespace cisa::eval
