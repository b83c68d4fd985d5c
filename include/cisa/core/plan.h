// cisa/core/plan.h — SPEC §3–§4 and §8 as code, once, for every backend: selection parameters and
// their bounds, eligible chunks, the cut of a batch into query groups (dense prefix, then QShare
// groups of G), the size and layout of every page list, dense plans, and the pages a plan reads.
// The CPU engine (selection.h, attention.h) and the CUDA backend (cuda/backend.h) both call these;
// neither restates them.
//
//   cisa::SelectionParams p{.budget = 256, .window = 32, .qshare = 16};
//   CISA_RETURN_IF_ERROR(cisa::validate_selection_params(p));
//   cisa::PageLists lists;
//   CISA_RETURN_IF_ERROR(cisa::plan_query_groups(/*page_size=*/16, batch, p, &lists));
//   cisa::size_page_lists(16, num_kv_heads, p, &lists);     // offsets of every list
//   // ... a backend scores and picks `selected` per list, then:
//   cisa::write_page_list(block_table, 16, p, selected, list, &lists);
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cisa/core/batch.h"
#include "cisa/core/page_table.h"
#include "cisa/core/status.h"

namespace cisa {

enum class QShareQuery { kMean, kLast };
const char* qshare_query_name(QShareQuery q);
Result<QShareQuery> parse_qshare_query(const std::string& s);  // "mean" | "last"

// When a decode row re-selects before its reused selection ages out (docs/design.md, "Selection
// reuse across decode steps"): kNone never; kNewChunks when a chunk that became eligible since the
// selection outranks a reused one under the row's own index query; kMass also when the index
// query's softmax mass outside the reused chunks, estimated from a sample, has grown by more than
// SelectionParams::reuse_mass_slack since the selection (kReuseMassStride below).
enum class ReuseCheck { kNone, kNewChunks, kMass };
const char* reuse_check_name(ReuseCheck c);                  // "none", "new-chunks", "mass"
Result<ReuseCheck> parse_reuse_check(const std::string& s);  // "none" | "new-chunks" | "mass"

struct SelectionParams {
  int64_t budget = 0;    // k: chunks chosen by top-k
  int64_t window = 128;  // W: recent pages always attended
  int64_t qshare = 1;    // G: positions sharing one selection (decode: 1)
  QShareQuery qshare_query = QShareQuery::kMean;
  int64_t sink_pages = 0;  // first n chunks always attended, not counted in k
  // Decode rows (batch entries of one position) keep the chunks a top-k chose for up to this many
  // steps, the selecting step included (1: select at every step). Prefill rows always select.
  int64_t reuse_steps = 1;
  ReuseCheck reuse_check = ReuseCheck::kNewChunks;  // early re-selection (reuse_steps > 1 only)
  // kMass: the growth of the mass outside S that a kept row tolerates, in [0, 1].
  double reuse_mass_slack = 0.05;
};

// The largest budget, window, sink count or QShare size any backend accepts: every page list
// (sinks + k + window + tail) then stays far below 2^31 entries, and sizes computed from these
// values cannot overflow 64 bits.
inline constexpr int64_t kMaxSelectionPages = int64_t{1} << 26;

// The largest reuse_steps accepted (a reused list misses every chunk that left the window since
// it was chosen, so far fewer steps than this are useful).
inline constexpr int64_t kMaxReuseSteps = 65536;

// Errors for negative values, G < 1, any value above kMaxSelectionPages, reuse_steps outside
// [1, kMaxReuseSteps] and an unknown enum value.
Status validate_selection_params(const SelectionParams& p);

// Number of eligible chunks for a selection made at position a: |{j : j < c(a) − W}| minus sinks.
int64_t eligible_count(int64_t a, int page_size, const SelectionParams& p);

// Where the pages of one list come from, as absolute chunk ranges [begin, end) in list order:
// `fixed` (a dense group's pages 0 … c(last), or a sparse group's sinks), then `selected` chunks
// chosen by top-k from [eligible_begin, eligible_end), then `tail` (the window and the group's own
// pages, c(first) − W … c(last); empty for a dense group).
struct ListLayout {
  int64_t fixed_begin = 0, fixed_end = 0;
  int64_t eligible_begin = 0, eligible_end = 0;
  int64_t selected = 0;  // k (0 for a dense group)
  int64_t tail_begin = 0, tail_end = 0;
  int64_t size() const { return (fixed_end - fixed_begin) + selected + (tail_end - tail_begin); }
};
ListLayout list_layout(const QueryGroup& g, int page_size, const SelectionParams& p);

// ---- Selection reuse across decode steps (docs/design.md states the rule in full) ----
// A decode row is a batch entry of one position whose group is sparse. Its backend keeps, per
// sequence, CISA layer and KV group, the chunks S of its last fresh selection (made at position
// a0), the position of the last row that used S, and the parameters S was chosen under. The row
// at position a keeps S (its list: sinks, S, then the window and tail recomputed from a by
// write_page_list) iff reuse_allowed(...) and same_selection_sets(...) hold and the check passes;
// else it selects afresh and S, a0 are replaced.

// p.reuse_steps > 1, the row directly follows the last use (a = last_used + 1: no position of the
// sequence went through the layer without S) and S is younger than r steps (a − a0 < r).
bool reuse_allowed(int64_t a, int64_t selected_at, int64_t last_used, const SelectionParams& p);
// The parameters that fix the eligible set and k agree (budget, window, sink pages).
bool same_selection_sets(const SelectionParams& a, const SelectionParams& b);
// Under reuse (p.reuse_steps > 1) each decode row reads and replaces its sequence's state, so one
// batch may hold at most one entry of one position per state: two would race on it (CPU threads
// or GPU blocks) and keep whichever selection was written last. The state of entry e is
// slots[e] (a backend's slot, −1: keeps none) or, with slots empty, batch[e].seq. InvalidArgument
// naming both entries otherwise (merge them into one entry, or use reuse_steps = 1). No
// allocation: quadratic in the number of one-position entries.
Status validate_reuse_rows(std::span<const BatchEntry> batch, const SelectionParams& p,
                           std::span<const int32_t> slots = {});

// The chunks [begin, end) a dense plan gives one batch entry: 0 … c(last), or with
// sliding_window > 0 those holding positions within the window of some query of the entry.
struct ChunkRange {
  int64_t begin = 0, end = 0;
};
ChunkRange dense_chunk_range(const BatchEntry& e, int page_size, int64_t sliding_window);

// Reuse's kMass check. u = Σ_{j ∈ X} e^{s_j} / Σ_{j ∈ E} e^{s_j}: the share of the softmax of
// scores s (the index query's, as top-k ranks them) that falls on chunks X outside S, over the
// eligible chunks E. A fresh selection at a0 stores u0, exact over E_{a0} (u0 = 0 when it was
// made under another check, so a later mass check against it re-selects unless u1 ≤ σ). The
// decode row at a that could keep S scores S, N = newly_eligible(a0, a) and the chunks j of
// E_{a0} outside S with j ≡ a (mod kReuseMassStride), and estimates u1 = (Σ_N +
// kReuseMassStride · Σ_sample) / (Σ_S + Σ_N + kReuseMassStride · Σ_sample); it re-selects iff
// kNewChunks' check fails or u1 > u0 + reuse_mass_slack. The sample's offset turns with a, so
// consecutive rows look at different chunks. Non-finite scores weigh nothing. Both backends
// compute the sums in fp64 (the order of the terms may differ).
inline constexpr int64_t kReuseMassStride = 16;
// Whether chunk j is in the sample of the row at position a.
inline bool in_reuse_mass_sample(int64_t j, int64_t a) {
  return j % kReuseMassStride == a % kReuseMassStride;
}

// Reuse's kNewChunks check scores these beside S: the chunks that became eligible between the
// selection at a0 and the row at a, [c(a0) − W, c(a) − W) (empty when no page left the window).
ChunkRange newly_eligible(int64_t selected_at, int64_t a, int page_size, const SelectionParams& p);

// What a backend's selection did with decode rows under reuse (reuse_steps > 1), per list
// (query group × KV group), since the backend was made. Lists of prefill rows, dense groups and
// reuse_steps = 1 are not counted.
struct SelectionReuseStats {
  int64_t selected = 0;    // lists whose chunks a fresh top-k chose (first, aged, or check failed)
  int64_t reused = 0;      // lists that kept a selection made at an earlier step
  int64_t checked = 0;     // reuse candidates whose check scored newly eligible chunks
  int64_t reselected = 0;  // of those, the ones that failed it (also counted in `selected`)
};

// Cuts every entry's positions into query groups (dense prefix, then QShare groups of G).
// Fills out->groups only.
Status plan_query_groups(int page_size, std::span<const BatchEntry> batch, const SelectionParams& p,
                         PageLists* out);

// Sizes the page lists of out->groups (from plan_query_groups) before they are filled: a dense
// group's list holds pages 0 … c(last); a sparse one sinks + k + the window and tail pages.
// Sets offsets and resizes pages, chunks and num_selected.
void size_page_lists(int page_size, int num_kv_heads, const SelectionParams& p, PageLists* out);

// Fills list `list` (= group · num_kv_heads + KV group) of a sized PageLists: a dense group gets
// pages 0 … c(last); a sparse one the sinks, then `selected` (absolute chunk indices, ascending,
// within the eligible range), then the window and tail c(first) − W … c(last). Records how many
// pages were selected. `table` is the sequence's block table.
void write_page_list(std::span<const int32_t> table, int page_size, const SelectionParams& p,
                     std::span<const int32_t> selected, int64_t list, PageLists* out);

// Checks that every entry names a live sequence, positions are non-negative, counts positive, and
// every query position has its K/V written in `layer` (t < tokens(layer, seq)).
// Errors name the entry and the value.
Status validate_batch(const PageTable& table, int layer, std::span<const BatchEntry> batch);

// validate_batch for a selection: every chunk eligible for a query at position a ends before a
// (E_a = { j : j < c(a) − W }, section 3 of the spec), so the selection of an entry needs its K/V
// written only before its last query position (t < tokens(layer, seq) for t < first + count − 1).
// A decode row may so be selected before its own K/V are appended (Model's early selection).
Status validate_selection_batch(const PageTable& table, int layer,
                                std::span<const BatchEntry> batch);

// Dense plan: one group per entry attending to every page of its sequence up to the page of its
// last query, or, with sliding_window > 0, only the pages that hold positions within the window
// of some query of the entry (t − window < s ≤ t).
Status plan_dense(const PageTable& table, int num_kv_heads, int layer,
                  std::span<const BatchEntry> batch, int64_t sliding_window, PageLists* out);

// SPEC §8's per-position traffic of one query group, in pages per KV group: every position t of
// the group reads its list's pages up to c(t) (later ones are masked). A dense group reads
// 0 … c(t); a sparse one its sinks, its k selected chunks and the window and tail pages from
// c(first) − W up to c(t).
int64_t pages_read(const QueryGroup& g, int page_size, const SelectionParams& p);
// The same positions under dense attention: Σ_t (c(t) + 1).
int64_t pages_read_dense(const QueryGroup& g, int page_size);

}  // namespace cisa
