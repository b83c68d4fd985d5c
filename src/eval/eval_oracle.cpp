// Oracle page selection (the upper bound of issue 5): the same query groups, window, tail and
// sinks as select_pages, but each group's k chunks are those with the largest true dense
// attention mass, p_j = Σ_{t∈P} Σ_{h∈H_g} Σ_{s∈chunk j} softmax_s(scale · q_{h,t}·k_s), s ≤ t.
// It reads the cache only through the core's public API and builds the PageLists by hand.
//
// Cost: one dense attention pass (logits and softmax, no values) per sparse query group, in double.
// Each task walks its sequence's key pages once and scores every (position, head) of its group
// against each page, so a key is read once per group rather than once per query.
#include <algorithm>
#include <cmath>

#include "cisa/core/bf16.h"
#include "cisa/core/diagnostics.h"
#include "cisa/model/eval.h"

namespace cisa::eval {
namespace {

// q·k in double with four partial sums (independent chains the compiler can overlap).
double dot_f64(const float* q, const float* k, int d) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  int i = 0;
  for (; i + 4 <= d; i += 4) {
    a0 += static_cast<double>(q[i]) * k[i];
    a1 += static_cast<double>(q[i + 1]) * k[i + 1];
    a2 += static_cast<double>(q[i + 2]) * k[i + 2];
    a3 += static_cast<double>(q[i + 3]) * k[i + 3];
  }
  for (; i < d; ++i) a0 += static_cast<double>(q[i]) * k[i];
  return (a0 + a1) + (a2 + a3);
}

}  // namespace

Status select_pages_oracle(const PagedKvCache& cache, int layer, std::span<const BatchEntry> batch,
                           const float* q, int num_q_heads, float scale, const SelectionParams& p,
                           ThreadPool* pool, PageLists* out) {
  CISA_RETURN_IF_ERROR(validate_batch(cache, layer, batch));
  if (!q) return invalid_argument("select_pages_oracle: null query pointer");
  if (!out) return invalid_argument("select_pages_oracle: null output");
  const int H = cache.num_kv_heads(), d = cache.head_dim();
  if (num_q_heads <= 0 || num_q_heads % H != 0)
    return invalid_argument("select_pages_oracle: " + std::to_string(num_q_heads) +
                            " query heads for " + std::to_string(H) + " KV heads");
  CISA_RETURN_IF_ERROR(plan_query_groups(cache, batch, p, out));
  const int hg = num_q_heads / H;
  const int64_t B = cache.page_size();
  const bool bf16 = cache.config().dtype == KvDtype::kBF16;
  const auto num_groups = static_cast<int64_t>(out->groups.size());
  out->num_kv_heads = H;
  size_page_lists(cache.page_size(), H, p, out);

  auto task = [&](int64_t t, int) {
    const int g = static_cast<int>(t % H);
    const auto& grp = out->groups[static_cast<size_t>(t / H)];
    auto table = *cache.block_table(batch[static_cast<size_t>(grp.entry)].seq);
    if (grp.dense) return write_page_list(table, cache.page_size(), p, {}, t, out);
    const int64_t ca = grp.first / B, cb = grp.last / B;
    const int64_t n_keys = grp.last + 1;  // keys 0 … last; position pos sees 0 … pos
    const int64_t nq = (grp.last - grp.first + 1) * hg;  // (position, head) pairs, position-major
    std::vector<double> mass(static_cast<size_t>(cb + 1), 0.0);
    std::vector<float> widened(bf16 ? static_cast<size_t>(B * d) : 0);
    // Blocks of queries bound the logit buffer (a long group at a long context would otherwise
    // hold group · heads · context doubles); each block walks the key pages once.
    constexpr int64_t kQueryBlock = 16;
    std::vector<double> logit(static_cast<size_t>(std::min(nq, kQueryBlock) * n_keys));
    for (int64_t q0 = 0; q0 < nq; q0 += kQueryBlock) {
      const int64_t q1 = std::min(nq, q0 + kQueryBlock);
      // logit[qi − q0][s] = scale · q·k_s for every key the query may see (s ≤ its position).
      for (int64_t c = 0; c <= cb; ++c) {
        const void* base = cache.k_page(layer, table[static_cast<size_t>(c)], g);
        const float* keys = static_cast<const float*>(base);  // [B][d]
        if (bf16) {
          const auto* h = static_cast<const uint16_t*>(base);
          for (size_t i = 0; i < widened.size(); ++i) widened[i] = bf16_to_f32(h[i]);
          keys = widened.data();
        }
        const int64_t s_end = std::min(n_keys, (c + 1) * B);
        for (int64_t qi = q0; qi < q1; ++qi) {
          const int64_t pos = grp.first + qi / hg;
          const float* qv = q + ((grp.row + qi / hg) * num_q_heads + g * hg + qi % hg) * d;
          double* lrow = logit.data() + (qi - q0) * n_keys;
          for (int64_t s = c * B; s < s_end && s <= pos; ++s)
            lrow[s] = scale * dot_f64(qv, keys + (s - c * B) * d, d);
        }
      }
      // Softmax of each query over s ≤ pos, its mass summed per chunk over the group.
      for (int64_t qi = q0; qi < q1; ++qi) {
        const int64_t pos = grp.first + qi / hg;
        double* lrow = logit.data() + (qi - q0) * n_keys;
        const double mx = *std::max_element(lrow, lrow + pos + 1);
        double z = 0;
        for (int64_t s = 0; s <= pos; ++s) z += (lrow[s] = std::exp(lrow[s] - mx));
        for (int64_t s = 0; s <= pos; ++s) mass[static_cast<size_t>(s / B)] += lrow[s] / z;
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

PageSelector oracle_page_selector() {
  return [](const PageSelectorInput& in, PageLists* out) -> Status {
    if (!in.cache || !in.selection)
      return invalid_argument("oracle page selector: no cache or selection parameters");
    return select_pages_oracle(*in.cache, in.layer, in.batch, in.q, in.num_q_heads, in.scale,
                               *in.selection, in.pool, out);
  };
}

}  // namespace cisa::eval
