// SPEC §3–§4 and §8 for every backend: selection parameters, query groups, list layout, dense
// plans and per-position traffic (plan.h).
#include "cisa/core/plan.h"

#include <algorithm>
#include <string>

namespace cisa {

const char* qshare_query_name(QShareQuery q) {
  return q == QShareQuery::kMean ? "mean" : "last";
}

Result<QShareQuery> parse_qshare_query(const std::string& s) {
  if (s == "mean") return QShareQuery::kMean;
  if (s == "last") return QShareQuery::kLast;
  return invalid_argument("unknown QShare query '" + s + "' (expected mean or last)");
}

const char* reuse_check_name(ReuseCheck c) {
  return c == ReuseCheck::kNone ? "none" : c == ReuseCheck::kMass ? "mass" : "new-chunks";
}

Result<ReuseCheck> parse_reuse_check(const std::string& s) {
  if (s == "none") return ReuseCheck::kNone;
  if (s == "new-chunks") return ReuseCheck::kNewChunks;
  if (s == "mass") return ReuseCheck::kMass;
  return invalid_argument("unknown reuse check '" + s + "' (expected none, new-chunks or mass)");
}

namespace {

Status check_bound(const char* what, int64_t v, int64_t lo) {
  if (v < lo || v > kMaxSelectionPages)
    return invalid_argument(std::string(what) + " must be in [" + std::to_string(lo) + ", " +
                            std::to_string(kMaxSelectionPages) + "] (got " + std::to_string(v) +
                            ")");
  return Status::Ok();
}

}  // namespace

Status validate_selection_params(const SelectionParams& p) {
  CISA_RETURN_IF_ERROR(check_bound("budget k", p.budget, 0));
  CISA_RETURN_IF_ERROR(check_bound("window W", p.window, 0));
  CISA_RETURN_IF_ERROR(check_bound("QShare group size G", p.qshare, 1));
  CISA_RETURN_IF_ERROR(check_bound("sink pages", p.sink_pages, 0));
  if (p.qshare_query != QShareQuery::kMean && p.qshare_query != QShareQuery::kLast)
    return invalid_argument("unknown QShare query");
  if (p.reuse_steps < 1 || p.reuse_steps > kMaxReuseSteps)
    return invalid_argument("reuse steps r must be in [1, " + std::to_string(kMaxReuseSteps) +
                            "] (got " + std::to_string(p.reuse_steps) + ")");
  if (p.reuse_check != ReuseCheck::kNone && p.reuse_check != ReuseCheck::kNewChunks &&
      p.reuse_check != ReuseCheck::kMass)
    return invalid_argument("unknown reuse check");
  if (!(p.reuse_mass_slack >= 0.0 && p.reuse_mass_slack <= 1.0))  // NaN fails too
    return invalid_argument("reuse mass slack must be in [0, 1] (got " +
                            std::to_string(p.reuse_mass_slack) + ")");
  return Status::Ok();
}

bool reuse_allowed(int64_t a, int64_t selected_at, int64_t last_used, const SelectionParams& p) {
  return p.reuse_steps > 1 && selected_at >= 0 && last_used >= selected_at && a == last_used + 1 &&
         a - selected_at < p.reuse_steps;
}

bool same_selection_sets(const SelectionParams& a, const SelectionParams& b) {
  return a.budget == b.budget && a.window == b.window && a.sink_pages == b.sink_pages;
}

Status validate_reuse_rows(std::span<const BatchEntry> batch, const SelectionParams& p,
                           std::span<const int32_t> slots) {
  if (p.reuse_steps <= 1) return Status::Ok();
  if (!slots.empty() && slots.size() != batch.size())
    return invalid_argument("selection reuse: " + std::to_string(slots.size()) +
                            " reuse slots for " + std::to_string(batch.size()) + " batch entries");
  auto key = [&](size_t e) -> int64_t { return slots.empty() ? batch[e].seq : slots[e]; };
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].count != 1 || key(i) < 0) continue;
    for (size_t j = i + 1; j < batch.size(); ++j)
      if (batch[j].count == 1 && key(j) == key(i))
        return invalid_argument(
            "selection reuse (reuse_steps " + std::to_string(p.reuse_steps) + "): batch entries " +
            std::to_string(i) + " and " + std::to_string(j) + " are both one-position rows of " +
            (slots.empty() ? "sequence " : "reuse slot ") + std::to_string(key(i)) +
            ", which keeps one selection per layer; merge them into one entry or use "
            "reuse_steps = 1");
  }
  return Status::Ok();
}

ChunkRange newly_eligible(int64_t selected_at, int64_t a, int page_size, const SelectionParams& p) {
  const int64_t begin = std::max<int64_t>(p.sink_pages, selected_at / page_size - p.window);
  const int64_t end = std::max<int64_t>(begin, a / page_size - p.window);
  return {begin, end};
}

int64_t eligible_count(int64_t a, int page_size, const SelectionParams& p) {
  return std::max<int64_t>(0, a / page_size - p.window - p.sink_pages);
}

ListLayout list_layout(const QueryGroup& g, int page_size, const SelectionParams& p) {
  const int64_t ca = g.first / page_size, cb = g.last / page_size;
  ListLayout l;
  if (g.dense) {
    l.fixed_end = cb + 1;
    return l;
  }
  l.fixed_end = p.sink_pages;
  l.eligible_begin = p.sink_pages;
  l.eligible_end = ca - p.window;
  l.selected = p.budget;
  l.tail_begin = ca - p.window;
  l.tail_end = cb + 1;
  return l;
}

ChunkRange dense_chunk_range(const BatchEntry& e, int page_size, int64_t sliding_window) {
  const int64_t last = e.first + e.count - 1;
  const int64_t lo = sliding_window > 0 ? std::max<int64_t>(0, e.first - sliding_window + 1) : 0;
  return {lo / page_size, last / page_size + 1};
}

Status plan_query_groups(int page_size, std::span<const BatchEntry> batch, const SelectionParams& p,
                         PageLists* out) {
  CISA_RETURN_IF_ERROR(validate_selection_params(p));
  if (page_size <= 0) return invalid_argument("page size must be positive");
  const int64_t B = page_size;
  // First position whose eligible count exceeds k: c(t) − W − sinks > k. The bounds on the
  // parameters keep this product far from overflow.
  const int64_t t_sparse = (p.budget + p.window + p.sink_pages + 1) * B;
  out->groups.clear();
  int64_t row = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    const int64_t first = batch[e].first, end = first + batch[e].count;
    const auto entry = static_cast<int32_t>(e);
    const int64_t split = std::clamp(t_sparse, first, end);
    if (split > first) out->groups.push_back({entry, first, split - 1, row, true});
    for (int64_t a = split; a < end; a += p.qshare) {
      const int64_t b = std::min(end, a + p.qshare) - 1;
      out->groups.push_back({entry, a, b, row + (a - first), false});
    }
    row += batch[e].count;
  }
  return Status::Ok();
}

void size_page_lists(int page_size, int num_kv_heads, const SelectionParams& p, PageLists* out) {
  const int64_t H = num_kv_heads;
  const auto num_groups = static_cast<int64_t>(out->groups.size());
  out->num_kv_heads = num_kv_heads;
  out->offsets.assign(static_cast<size_t>(num_groups * H + 1), 0);
  for (int64_t i = 0; i < num_groups; ++i) {
    const int64_t n = list_layout(out->groups[static_cast<size_t>(i)], page_size, p).size();
    for (int64_t g = 0; g < H; ++g) out->offsets[static_cast<size_t>(i * H + g + 1)] = n;
  }
  for (size_t i = 1; i < out->offsets.size(); ++i) out->offsets[i] += out->offsets[i - 1];
  out->pages.resize(static_cast<size_t>(out->offsets.back()));
  out->chunks.resize(out->pages.size());
  out->num_selected.assign(static_cast<size_t>(num_groups * H), 0);
}

void write_page_list(std::span<const int32_t> table, int page_size, const SelectionParams& p,
                     std::span<const int32_t> selected, int64_t list, PageLists* out) {
  const auto& grp = out->groups[static_cast<size_t>(list / out->num_kv_heads)];
  const ListLayout l = list_layout(grp, page_size, p);
  int32_t* pages = out->pages.data() + out->offsets[static_cast<size_t>(list)];
  int32_t* chunks = out->chunks.data() + out->offsets[static_cast<size_t>(list)];
  int64_t n = 0;
  auto put = [&](int64_t j) {
    pages[n] = table[static_cast<size_t>(j)];
    chunks[n++] = static_cast<int32_t>(j);
  };
  for (int64_t j = l.fixed_begin; j < l.fixed_end; ++j) put(j);
  if (grp.dense) return;
  for (int32_t j : selected) put(j);
  for (int64_t j = l.tail_begin; j < l.tail_end; ++j) put(j);
  out->num_selected[static_cast<size_t>(list)] = static_cast<int32_t>(selected.size());
}

namespace {

// validate_batch's checks, with the last `unwritten` query positions of every entry allowed to
// have no K/V yet.
Status check_batch(const PageTable& table, int layer, std::span<const BatchEntry> batch,
                   int64_t unwritten) {
  if (layer < 0 || layer >= table.num_layers())
    return out_of_range("layer " + std::to_string(layer) + " out of range [0, " +
                        std::to_string(table.num_layers()) + ")");
  for (size_t e = 0; e < batch.size(); ++e) {
    const auto& b = batch[e];
    auto where = [e] { return "batch entry " + std::to_string(e) + ": "; };  // built only on error
    if (!table.has_sequence(b.seq))
      return not_found(where() + "unknown sequence " + std::to_string(b.seq));
    if (b.first < 0)
      return invalid_argument(where() + "negative first position " + std::to_string(b.first));
    if (b.count <= 0)
      return invalid_argument(where() + "query count must be positive (got " +
                              std::to_string(b.count) + ")");
    const int64_t written = *table.tokens(layer, b.seq);
    if (b.first > written - b.count + unwritten)
      return out_of_range(where() + "queries up to position " +
                          std::to_string(b.first + b.count - 1) + " but only " +
                          std::to_string(written) + " tokens of layer " + std::to_string(layer) +
                          " are written");
  }
  return Status::Ok();
}

}  // namespace

Status validate_batch(const PageTable& table, int layer, std::span<const BatchEntry> batch) {
  return check_batch(table, layer, batch, 0);
}

Status validate_selection_batch(const PageTable& table, int layer,
                                std::span<const BatchEntry> batch) {
  return check_batch(table, layer, batch, 1);
}

Status plan_dense(const PageTable& table, int num_kv_heads, int layer,
                  std::span<const BatchEntry> batch, int64_t sliding_window, PageLists* out) {
  CISA_RETURN_IF_ERROR(validate_batch(table, layer, batch));
  if (sliding_window < 0) return invalid_argument("sliding_window must be >= 0");
  if (num_kv_heads <= 0) return invalid_argument("num_kv_heads must be positive");
  const int B = table.page_size();
  out->clear();
  out->num_kv_heads = num_kv_heads;
  out->offsets.push_back(0);
  int64_t row = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    const auto& b = batch[e];
    out->groups.push_back({static_cast<int32_t>(e), b.first, b.first + b.count - 1, row, true});
    row += b.count;
    const ChunkRange r = dense_chunk_range(b, B, sliding_window);
    auto pages = *table.block_table(b.seq);
    for (int g = 0; g < num_kv_heads; ++g) {
      for (int64_t j = r.begin; j < r.end; ++j) {
        out->pages.push_back(pages[static_cast<size_t>(j)]);
        out->chunks.push_back(static_cast<int32_t>(j));
      }
      out->offsets.push_back(static_cast<int64_t>(out->pages.size()));
      out->num_selected.push_back(0);
    }
  }
  return Status::Ok();
}

int64_t pages_read(const QueryGroup& g, int page_size, const SelectionParams& p) {
  if (g.dense) return pages_read_dense(g, page_size);
  const ListLayout l = list_layout(g, page_size, p);
  // Every position reads the fixed and selected pages (all older than its own page), and the tail
  // from tail_begin up to its own page c(t).
  int64_t n = 0;
  for (int64_t t = g.first; t <= g.last; ++t)
    n += l.fixed_end - l.fixed_begin + l.selected + (t / page_size - l.tail_begin + 1);
  return n;
}

int64_t pages_read_dense(const QueryGroup& g, int page_size) {
  int64_t n = 0;
  for (int64_t t = g.first; t <= g.last; ++t) n += t / page_size + 1;
  return n;
}

}  // namespace cisa
