// Work decomposition of attention for a plan (plan_impl.h): row tiles of 16·warps rows, unions
// of small QShare groups (KV-outer), and split-KV tasks with their merges to fill the GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention.cuh"
#include "attention_wgmma.cuh"
#include "plan_impl.h"
#include "tile_sizes.cuh"
#include "unions.cuh"

namespace cisa::cuda {

// The current device's SM count (132 where it cannot be read).
int device_sms() {
  int sms = 132, dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    sms = 132;
  }
  return sms;
}

namespace {

// Entries of a list's page list (its capacity: the fixed ranges and the budget).
int64_t list_size(const detail::ListDesc& d) {
  return static_cast<int64_t>(d.pre_end - d.pre_begin) + d.k + (d.post_end - d.post_begin);
}

// PlanOptions::even_shares: a page-split plan's pages (every list's row tiles, in list order)
// cut into `target` equal shares, one a block; a share that crosses the end of a row tile's
// pages holds a task of each (tasks [b · S, b · S + S) of block b, S = P.tasks_per_block, an
// unused slot has rows = 0). A row tile read by several tasks merges their partials as the split
// plan's merges do (with PlanOptions::fused_merge, inside the launch by the last task of each
// merge). Returns false (nothing planned) where it does not apply: no page-split warps, unions,
// batch invariance, an empty list, fewer pages than kMinSplitPages, or more than kMaxShareTasks
// tasks a block (many short lists: the split plan serves them).
bool even_shares(Plan::Impl& P, int64_t pairs, int64_t target) {
  constexpr int64_t kMaxShareTasks = 4;
  if (!P.options.even_shares || P.page_warps == 1 || P.wgmma || !P.unions.empty() ||
      P.options.batch_invariant || pairs >= target)
    return false;
  const int hg = P.num_q_heads / P.num_kv_heads;
  const auto H = static_cast<size_t>(P.num_kv_heads);
  struct Unit {
    int32_t list, row0, rows;
    int64_t begin, pages;
  };
  std::vector<Unit> units;
  int64_t total = 0;
  for (size_t L = 0; L < P.lists.size(); ++L) {
    const auto& g = P.groups[L / H];
    const auto& d = P.lists[L];
    const int64_t n = list_size(d);
    const int64_t rows = (g.last - g.first + 1) * hg;
    if (n == 0) return false;  // its rows still need a task that writes them
    for (int64_t r0 = 0; r0 < rows; r0 += 16 * P.warps) {
      units.push_back({static_cast<int32_t>(L), static_cast<int32_t>(r0),
                       static_cast<int32_t>(std::min<int64_t>(16 * P.warps, rows - r0)),
                       d.out_begin, n});
      total += n;
    }
  }
  // PlanOptions::sm_rates: one slot of target / sms an SM, sized by the SM's rate.
  const auto sms = static_cast<size_t>(device_sms());
  const bool by_sm = P.sm_rates.size() == sms && target % static_cast<int64_t>(sms) == 0 &&
                     std::all_of(P.sm_rates.begin(), P.sm_rates.end(),
                                 [](float r) { return std::isfinite(r) && r > 0.0f; }) &&
                     total / target >= tiles::kMinSplitPages;
  const int64_t blocks = by_sm ? target : std::min(target, total / tiles::kMinSplitPages);
  if (blocks < 1 || units.empty() || total < blocks) return false;
  // Block (slot) b takes pages [bound[b], bound[b + 1]) of the units laid end to end.
  std::vector<int64_t> bound(static_cast<size_t>(blocks) + 1);
  if (by_sm) {
    const int64_t per_sm = target / static_cast<int64_t>(sms);
    double sum = 0.0;
    for (float r : P.sm_rates) sum += static_cast<double>(r) * static_cast<double>(per_sm);
    double acc = 0.0;
    for (int64_t b = 0; b < blocks; ++b) {
      bound[static_cast<size_t>(b)] = std::llround(static_cast<double>(total) * acc / sum);
      acc += P.sm_rates[static_cast<size_t>(b / per_sm)];
    }
  } else {
    for (int64_t b = 0; b < blocks; ++b) bound[static_cast<size_t>(b)] = total * b / blocks;
  }
  bound.back() = total;
  std::vector<std::vector<detail::AttnTask>> per_block(static_cast<size_t>(blocks));
  std::vector<std::vector<std::pair<int64_t, int64_t>>> unit_tasks(units.size());  // (block, slot)
  size_t u = 0;
  int64_t u_start = 0;  // first page of unit u in the concatenation
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t p = bound[static_cast<size_t>(b)];
    const int64_t end = bound[static_cast<size_t>(b) + 1];
    while (p < end) {
      while (p >= u_start + units[u].pages) u_start += units[u++].pages;
      const Unit& x = units[u];
      const int64_t stop = std::min(end, u_start + x.pages);
      detail::AttnTask t{};
      t.list = x.list;
      t.row0 = x.row0;
      t.rows = x.rows;
      t.page0 = x.begin + (p - u_start);
      t.page1 = x.begin + (stop - u_start);
      t.partial = -1;
      t.merge = -1;
      unit_tasks[u].emplace_back(b, static_cast<int64_t>(per_block[static_cast<size_t>(b)].size()));
      per_block[static_cast<size_t>(b)].push_back(t);
      p = stop;
    }
  }
  size_t S = 1;
  for (const auto& v : per_block) S = std::max(S, v.size());
  if (static_cast<int64_t>(S) > kMaxShareTasks) return false;
  for (size_t i = 0; i < units.size(); ++i) {
    const auto& ts = unit_tasks[i];
    if (ts.size() < 2) continue;
    const int32_t R = units[i].rows;
    const int64_t base = P.partial_rows;
    for (size_t sp = 0; sp < ts.size(); ++sp) {
      auto& t = per_block[static_cast<size_t>(ts[sp].first)][static_cast<size_t>(ts[sp].second)];
      t.partial = base + static_cast<int64_t>(sp) * R;
      t.merge = static_cast<int32_t>(P.merges.size());
    }
    P.merges.push_back({units[i].list, units[i].row0, R, static_cast<int32_t>(ts.size()), base});
    P.partial_rows += static_cast<int64_t>(ts.size()) * R;
    P.merge_max_rows = std::max(P.merge_max_rows, static_cast<int>(R));
  }
  detail::AttnTask unused{};
  unused.partial = -1;
  unused.merge = -1;  // rows = 0: the block skips the slot
  for (auto& v : per_block) {
    v.resize(S, unused);
    P.tasks.insert(P.tasks.end(), v.begin(), v.end());
  }
  P.tasks_per_block = static_cast<int>(S);
  P.sm_claims = by_sm;
  P.slots_per_sm = by_sm ? static_cast<int>(target / static_cast<int64_t>(sms)) : 0;
  P.big_tasks = 0;
  P.fused_merge = P.options.fused_merge && !P.merges.empty();
  return true;
}

}  // namespace

// Work decomposition of attention: row tiles of 16·warps rows, page splits to fill the GPU.
Status plan_attention(Plan::Impl& P) {
  const int sms = device_sms();
  const int hg = P.num_q_heads / P.num_kv_heads;
  const int H = P.num_kv_heads;
  int64_t max_rows = 0, min_rows = INT64_MAX;
  for (const auto& g : P.groups) {
    max_rows = std::max<int64_t>(max_rows, (g.last - g.first + 1) * hg);
    min_rows = std::min<int64_t>(min_rows, (g.last - g.first + 1) * hg);
  }
  // PlanOptions::batch_invariant: one tile size, page-split warps and unions off, and splits by
  // the list's own length, so that nothing depends on the batch's other entries.
  const bool invariant = P.options.batch_invariant;
  // PlanOptions::mixed_tiles: groups of more than 64 rows in 128-row tiles (the first launch,
  // tasks [0, big_tasks)), the others in 64-row tiles (the second); else one size for all.
  const bool mixed = P.options.mixed_tiles && !invariant && max_rows > 64 && min_rows <= 64;
  P.warps = !mixed && (max_rows > 64 || invariant) ? 8 : 4;
  const auto big = [&](const QueryGroup& g) { return mixed && (g.last - g.first + 1) * hg > 64; };
  const auto tile_of = [&](const QueryGroup& g) -> int64_t { return big(g) ? 128 : 16 * P.warps; };
  // Unions of 2 … kUnionGroups consecutive small selecting groups of one entry (per KV group).
  P.unions.clear();
  P.union_capacity = 0;
  P.union_smem = 0;
  std::vector<int32_t> union_at(P.lists.size(),
                                -1);  // union id at its first list, −2 other members
  if (P.group_unions && !invariant && P.head_dim <= tiles::kUnionMaxHeadDim) {
    const size_t ng = P.groups.size();
    const auto small = [&](size_t g) {
      const auto& q = P.groups[g];
      return !q.dense && P.lists[g * static_cast<size_t>(H)].k > 0 &&
             (q.last - q.first + 1) * hg <= 16;
    };
    for (size_t gi = 0; gi < ng;) {
      if (!small(gi)) {
        ++gi;
        continue;
      }
      size_t gj = gi + 1;
      while (gj < ng && gj - gi < static_cast<size_t>(tiles::kUnionGroups) && small(gj) &&
             P.groups[gj].entry == P.groups[gi].entry)
        ++gj;
      const auto& last0 = P.lists[(gj - 1) * static_cast<size_t>(H)];
      if (gj - gi >= 2 && detail::union_smem_bytes(last0.post_end - 1) <=
                              static_cast<size_t>(tiles::kUnionMaxSmem)) {
        for (int kv = 0; kv < H; ++kv) {
          const size_t first = gi * static_cast<size_t>(H) + static_cast<size_t>(kv);
          const auto& last = P.lists[(gj - 1) * static_cast<size_t>(H) + static_cast<size_t>(kv)];
          detail::UnionDesc u{};
          u.table_begin = last.table_begin;
          u.out_begin = P.union_capacity;
          u.first_list = static_cast<int32_t>(first);
          u.members = static_cast<int32_t>(gj - gi);
          u.stride = H;
          u.max_chunk = last.post_end - 1;
          for (size_t m = 0; m < gj - gi; ++m) {
            const size_t li = first + m * static_cast<size_t>(H);
            P.union_capacity += list_size(P.lists[li]);
            union_at[li] = m == 0 ? static_cast<int32_t>(P.unions.size()) : -2;
          }
          P.union_smem = std::max(P.union_smem, detail::union_smem_bytes(u.max_chunk));
          P.unions.push_back(u);
        }
      }
      gi = gj;
    }
  }
  P.page_warps = 1;
  if (P.unions.empty() && P.warps == 4 && !mixed && !invariant &&
      P.head_dim <= tiles::kPageSplitMaxHeadDim)
    P.page_warps = max_rows <= 16 ? 4 : max_rows <= 32 ? 2 : 1;
  // AttentionKernel::kMma keeps every launch on the mma.sync kernel (A/B measurements); union
  // tasks go to wgmma unless PlanOptions::wgmma_unions is off.
  const bool unions = !P.unions.empty();
  P.wgmma =
      detail::wgmma_attention_applies(P.head_dim, P.page_warps, unions, P.warps,
                                      P.options.attention_kernel == AttentionKernel::kWgmmaV5) &&
      P.options.attention_kernel != AttentionKernel::kMma && (!unions || P.options.wgmma_unions);
  P.wgmma_big =
      mixed &&
      detail::wgmma_attention_applies(P.head_dim, 1, false, 8,
                                      P.options.attention_kernel == AttentionKernel::kWgmmaV5) &&
      P.options.attention_kernel != AttentionKernel::kMma;
  int64_t pairs = static_cast<int64_t>(P.unions.size());
  for (size_t L = 0; L < P.lists.size(); ++L) {
    if (union_at[L] != -1) continue;
    const auto& g = P.groups[L / static_cast<size_t>(H)];
    pairs += ((g.last - g.first + 1) * hg + tile_of(g) - 1) / tile_of(g);
  }
  // PlanOptions::blocks_per_sm overrides the split target (A/B runs of the work decomposition).
  int64_t per_sm = P.page_warps > 1 ? tiles::kDecodeBlocksPerSm : tiles::kBlocksPerSmTarget;
  if (P.options.blocks_per_sm > 0) per_sm = P.options.blocks_per_sm;
  const int64_t target = static_cast<int64_t>(sms) * per_sm;
  P.tasks.clear();
  P.merges.clear();
  P.partial_rows = 0;
  P.merge_max_rows = 0;
  const auto emit = [&](size_t L) {
    const auto& g = P.groups[L / static_cast<size_t>(H)];
    const auto& d = P.lists[L];
    if (union_at[L] == -2) return;
    if (union_at[L] >= 0) {
      const auto& u = P.unions[static_cast<size_t>(union_at[L])];
      int64_t cap = 0;
      for (int m = 0; m < u.members; ++m)
        cap += list_size(P.lists[static_cast<size_t>(u.first_list + m * u.stride)]);
      detail::AttnTask t{};
      t.list = static_cast<int32_t>(L);
      t.row0 = 0;
      t.rows = 16;
      t.members = u.members;
      t.page0 = u.out_begin;
      t.page1 = u.out_begin + cap;
      t.partial = -1;
      t.union_id = union_at[L];
      t.stride = u.stride;
      t.merge = -1;
      P.tasks.push_back(t);
      return;
    }
    const int64_t rows = (g.last - g.first + 1) * hg;
    const int64_t n = list_size(d);
    // Page-split (decode) plans round down: pairs · splits must not pass the target, or a few
    // tasks form one more wave (v5: 32 lists × 17 splits = 544 tasks on 264 block slots).
    int64_t splits = pairs >= target    ? 1
                     : P.page_warps > 1 ? target / pairs
                                        : (target + pairs - 1) / pairs;
    splits = std::max<int64_t>(1, std::min(splits, n / tiles::kMinSplitPages));
    if (invariant)
      splits = g.last == g.first ? std::max<int64_t>(1, n / tiles::kInvariantSplitPages) : 1;
    const int64_t tile = tile_of(g);
    for (int64_t r0 = 0; r0 < rows; r0 += tile) {
      const auto R = static_cast<int32_t>(std::min(tile, rows - r0));
      const int64_t base = P.partial_rows;
      for (int64_t sp = 0; sp < splits; ++sp) {
        detail::AttnTask t{};
        t.list = static_cast<int32_t>(L);
        t.row0 = static_cast<int32_t>(r0);
        t.rows = R;
        t.members = 0;
        t.page0 = d.out_begin + n * sp / splits;
        t.page1 = d.out_begin + n * (sp + 1) / splits;
        t.partial = splits > 1 ? base + sp * R : -1;
        t.merge = splits > 1 ? static_cast<int32_t>(P.merges.size()) : -1;
        P.tasks.push_back(t);
      }
      if (splits > 1) {
        P.merges.push_back({static_cast<int32_t>(L), static_cast<int32_t>(r0), R,
                            static_cast<int32_t>(splits), base});
        P.partial_rows += splits * R;
        P.merge_max_rows = std::max(P.merge_max_rows, static_cast<int>(R));
      }
    }
  };
  P.tasks_per_block = 1;
  P.sm_claims = false;
  P.slots_per_sm = 0;
  if (even_shares(P, pairs, target)) return Status::Ok();
  // Tasks of 128-row groups first (the first launch of a mixed plan), then the others.
  for (size_t L = 0; L < P.lists.size(); ++L)
    if (big(P.groups[L / static_cast<size_t>(H)])) emit(L);
  P.big_tasks = static_cast<int64_t>(P.tasks.size());
  for (size_t L = 0; L < P.lists.size(); ++L)
    if (!big(P.groups[L / static_cast<size_t>(H)])) emit(L);
  P.fused_merge = P.options.fused_merge && P.page_warps > 1 && !P.wgmma && P.big_tasks == 0 &&
                  !P.merges.empty();
  return Status::Ok();
}

}  // namespace cisa::cuda
