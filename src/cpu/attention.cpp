// Exact attention over page lists on the CPU (SPEC §5).
//
// Work is cut into tasks (list, row tile, page split). A list is one (query group, KV group);
// its rows are the group's positions × the KV group's query heads (row = position·h_g + head),
// so one page read serves every query that shares the selection. A row tile walks its pages in
// order with an online softmax: per page, S = scale·Q·Kᵀ (masked by absolute position), then
// the running max, denominator and O += P·V are updated. Prefill rows go through the tile kernel
// (attention_tile_kernel.h: each 16-key block transposed once for up to 256 rows), decode rows
// through the fused decode kernel (attention_decode_kernel.h: scores in registers, bf16 widened
// without shuffles, the next block prefetched), or the page kernel (attention_page_kernel.h)
// without AVX-512 or where d % 32 or B % 16 is not 0. When there are too few (list, tile) pairs
// to occupy every thread (decode), the page list is split and the partial results are merged by
// log-sum-exp, as flash-decoding does; and a decode query group whose KV groups' lists hold the
// same pages is one task over all of them, so that it reads the pool in address order.
// GCC 12's AVX-512 intrinsics initialise their "undefined" operands from themselves, which
// -W(maybe-)uninitialized reports once they are inlined here (GCC bug 105593; "maybe" at -O3,
// plain at the sanitizer build's -O1); it has to be off before <immintrin.h> is first read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "cisa/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "attention_decode_kernel.h"
#include "attention_inputs.h"
#include "attention_page_kernel.h"
#include "attention_tile_kernel.h"
#include "cisa/core/bf16.h"

namespace cisa {

namespace {

// Rows of one task. Large, so the tile kernel transposes each key block once for many rows; Q and
// O of a full tile (2 × 256 KiB at d = 256) stay in a 1 MiB L2.
constexpr int kRowTile = 256;
constexpr int64_t kMinSplitPages = 16;  // a split reads at least this many pages
constexpr int64_t kPrefetchPages = 2;   // how far ahead scattered pages are prefetched
using cpu::kNegInf;

inline void axpy(float* y, float a, const float* x, int d) {
  for (int i = 0; i < d; ++i) y[i] += a * x[i];
}

using Task = detail::AttentionTask;

}  // namespace

int64_t AttentionWorkspace::bytes() const {
  int64_t b = 0;
  for (const auto& s : thread_scratch_) b += static_cast<int64_t>(s.capacity() * sizeof(float));
  b += static_cast<int64_t>((partial_out_.capacity() + partial_lse_.capacity()) * sizeof(float));
  return b + static_cast<int64_t>(tasks_.capacity() * sizeof(detail::AttentionTask));
}

struct AttentionRunner {
  const PagedKvCache& cache;
  int layer;
  std::span<const BatchEntry> batch;
  const PageLists& lists;
  const float* q;
  int hq, hkv, hg, d, B;
  float scale;
  int64_t window;
  float* out;
  float* lse;
  AttentionWorkspace* ws;

  Status validate() const;
  void run(ThreadPool& pool);
  void run_task(const Task& t, float* scratch) const;
  template <class T>
  void walk_pages(const Task& t, const float* const* qrow, const int64_t* tpos, float* const* accp,
                  float* m, float* l, float* s) const;
  template <class T>
  void walk_pages_decode(const Task& t, const float* const* qrow, const int64_t* tpos,
                         float* const* accp, float* m, float* l, float* scratch) const;
  template <class T>
  void walk_pages_tiled(const Task& t, const float* const* qrow, const int64_t* tpos,
                        float* const* accp, float* m, float* l, float* tile) const;
  // The pages of one task's list that some row of the task can see (the walk functions share it).
  struct TaskPages {
    int g0;                                  // first KV group of the task
    std::span<const int32_t> pages, chunks;  // the list: physical page IDs, logical chunks
    int64_t tmin, tmax;                      // the task's first and last query positions
    int64_t B, window;
    int64_t start(int64_t pi) const {
      return static_cast<int64_t>(chunks[static_cast<size_t>(pi)]) * B;
    }
    // Before every row's window (the page still has to be skipped, not ended at).
    bool before_window(int64_t s0) const { return window > 0 && s0 + B - 1 <= tmin - window; }
    bool visible(int64_t pi) const { return start(pi) <= tmax && !before_window(start(pi)); }
    // visit(pi, physical page, first position) for each visible page in list order; pages ascend,
    // so the walk ends at the first page after the task's last row.
    template <class Visit>
    void for_each(const Task& t, Visit&& visit) const {
      for (int64_t pi = t.page0; pi < t.page1; ++pi) {
        const int64_t s0 = start(pi);
        if (s0 > tmax) break;
        if (before_window(s0)) continue;
        visit(pi, pages[static_cast<size_t>(pi)], s0);
      }
    }
  };
  TaskPages task_pages(const Task& t, const int64_t* tpos) const {
    const int g0 = static_cast<int>(t.list % hkv);
    return {g0,
            lists.list_pages(t.list / hkv, g0),
            lists.list_chunks(t.list / hkv, g0),
            tpos[0],
            tpos[t.rows - 1],
            B,
            window};
  }
  bool tiled(const Task& t) const;
  bool decode_kernel(const Task& t) const;
  bool same_pages_all_groups(int64_t query_group) const;
  int64_t head_row(const Task& t, int r) const;
};

Status AttentionRunner::validate() const {
  if (!q || !out) return invalid_argument("attend: null query or output pointer");
  return cpu::validate_attention_inputs(cache, layer, batch, lists, hq, &ws->row_offsets_,
                                        &ws->row_group_);
}

// The pages of one task, in order, for each block of up to 4 rows of its tile (of each of its
// lists, for a task over several KV groups: those lists hold the same pages, so one page index
// reads each group's block of that page, next to each other in the pool).
template <class T>
void AttentionRunner::walk_pages(const Task& t, const float* const* qrow, const int64_t* tpos,
                                 float* const* accp, float* m, float* l, float* s) const {
  const TaskPages tp = task_pages(t, tpos);
  const int g0 = tp.g0;
  const int R = t.rows;
  const int64_t bytes =
      static_cast<int64_t>(B) * d * static_cast<int64_t>(sizeof(T));  // one group's block
  tp.for_each(t, [&](int64_t pi, int32_t page, int64_t s0) {
    // Pages whose data does not follow this page's in memory (selected pages scattered over the
    // pool, or a KV group's pages interleaved with other groups') defeat the hardware
    // prefetcher: fetch a few pages ahead while this one is computed.
    const auto* kp0 = static_cast<const char*>(cache.k_page(layer, page, g0));
    const int64_t ahead = pi + kPrefetchPages;
    if (ahead < t.page1) {
      const int32_t next = tp.pages[static_cast<size_t>(ahead)];
      const auto* nk = static_cast<const char*>(cache.k_page(layer, next, g0));
      const int64_t span = bytes * t.groups;
      if (nk != kp0 + kPrefetchPages * span) {
        const auto* nv = static_cast<const char*>(cache.v_page(layer, next, g0));
        for (int64_t off = 0; off < span; off += 64) {
          __builtin_prefetch(nk + off, 0, 1);
          __builtin_prefetch(nv + off, 0, 1);
        }
      }
    }
    // Every group's scores first, then every group's update: K of all groups, then V of all
    // groups, each a contiguous run of the pool when the task covers several groups. Each row's
    // arithmetic is page_step's, in the same order.
    for (int pass = 0; pass < 2; ++pass)
      for (int gi = 0; gi < t.groups; ++gi) {
        const int base = gi * R;
        for (int r0 = 0; r0 < R; r0 += 4) {
          const int nr = std::min(4, R - r0);
          const int64_t lo = tpos[r0], hi = tpos[r0 + nr - 1];
          if (s0 > hi || (window > 0 && s0 + B - 1 <= lo - window)) continue;
          const int b = base + r0;
          float* sb = s + static_cast<int64_t>(b) * B;  // this block's scores: [nr][B]
          if (pass == 0) {
            cpu::page_step_scores(nr, qrow + b,
                                  static_cast<const T*>(cache.k_page(layer, page, g0 + gi)), B, d,
                                  scale, sb);
          } else {
            const bool full = s0 + B - 1 <= lo && (window == 0 || s0 > hi - window);
            const cpu::PageMask mask{s0, tpos + r0, window, full};
            cpu::page_step_update(nr, static_cast<const T*>(cache.v_page(layer, page, g0 + gi)),
                                  mask, B, d, sb, m + b, l + b, accp + b);
          }
        }
      }
  });
}

// Decode rows on AVX-512 (decode_kernel_fits): the fused kernel of attention_decode_kernel.h, one
// block of 16 keys for up to 4 rows of one KV group at a time, K and V of a block read back to
// back. The rows' queries are copied into the kernel's channel order first and the accumulators
// put back into the natural order at the end. scratch: R·d + 16·4 + 16 floats.
template <class T>
void AttentionRunner::walk_pages_decode(const Task& t, const float* const* qrow,
                                        const int64_t* tpos, float* const* accp, float* m, float* l,
                                        float* scratch) const {
#ifdef CISA_ATTENTION_AVX512
  const TaskPages tp = task_pages(t, tpos);
  const int g0 = tp.g0;
  const int R = t.rows;
  const int RT = R * t.groups;
  float* p = scratch + (16 - (reinterpret_cast<uintptr_t>(scratch) / sizeof(float)) % 16) %
                           16;  // 64-byte aligned
  float* qo = p + 4 * cpu::kKeyBlock;
  const float* qord[kRowTile];
  for (int r = 0; r < RT; ++r) {
    cpu::order_channels<T>(qrow[r], d, qo + static_cast<int64_t>(r) * d);
    qord[r] = qo + static_cast<int64_t>(r) * d;
  }
  // Blocks are visited page by page, KV group by group, 16 keys at a time; (nk, nv) is the block
  // after the current one in that order, whose lines are prefetched while this one is computed.
  tp.for_each(t, [&](int64_t pi, int32_t page, int64_t s0) {
    const int32_t next_page =
        pi + 1 < t.page1 && tp.visible(pi + 1) ? tp.pages[static_cast<size_t>(pi + 1)] : -1;
    for (int gi = 0; gi < t.groups; ++gi) {
      const T* kp = static_cast<const T*>(cache.k_page(layer, page, g0 + gi));
      const T* vp = static_cast<const T*>(cache.v_page(layer, page, g0 + gi));
      for (int j0 = 0; j0 < B; j0 += cpu::kKeyBlock) {
        const T *nk = nullptr, *nv = nullptr;
        if (j0 + cpu::kKeyBlock < B) {
          nk = kp + static_cast<int64_t>(j0 + cpu::kKeyBlock) * d,
          nv = vp + static_cast<int64_t>(j0 + cpu::kKeyBlock) * d;
        } else if (gi + 1 < t.groups) {
          nk = static_cast<const T*>(cache.k_page(layer, page, g0 + gi + 1));
          nv = static_cast<const T*>(cache.v_page(layer, page, g0 + gi + 1));
        } else if (next_page >= 0) {
          nk = static_cast<const T*>(cache.k_page(layer, next_page, g0));
          nv = static_cast<const T*>(cache.v_page(layer, next_page, g0));
        }
        const int64_t b0 = s0 + j0;
        for (int r0 = 0; r0 < R; r0 += 4) {
          const int nr = std::min(4, R - r0);
          uint32_t vis[4] = {0, 0, 0, 0}, any = 0;
          for (int i = 0; i < nr; ++i)
            any |= vis[i] = cpu::visible_lanes(b0, cpu::kKeyBlock, tpos[r0 + i], window);
          if (any == 0) continue;
          const int jend =
              static_cast<int>(std::min<int64_t>(cpu::kKeyBlock, tpos[r0 + nr - 1] - b0 + 1));
          const int b = gi * R + r0;
          cpu::decode_block_rows(nr, qord + b, kp + static_cast<int64_t>(j0) * d,
                                 vp + static_cast<int64_t>(j0) * d, r0 == 0 ? nk : nullptr,
                                 r0 == 0 ? nv : nullptr, d, scale, vis, jend, m + b, l + b,
                                 accp + b, p);
        }
      }
    }
  });
  for (int r = 0; r < RT; ++r) cpu::natural_channels<T>(accp[r], d);
#else
  (void)t, (void)qrow, (void)tpos, (void)accp, (void)m, (void)l, (void)scratch;
#endif
}

// Output row (position · num_q_heads + head) of row r of a task (rows list-major).
int64_t AttentionRunner::head_row(const Task& t, int r) const {
  const auto& grp = lists.groups[static_cast<size_t>(t.list / hkv)];
  const int g = static_cast<int>(t.list % hkv) + r / t.rows;
  const int rr = t.row0 + r % t.rows;
  return (grp.row + rr / hg) * hq + static_cast<int64_t>(g) * hg + rr % hg;
}

// Whether every KV group's list of a query group names the same pages (dense lists do).
bool AttentionRunner::same_pages_all_groups(int64_t query_group) const {
  const auto first = lists.list_pages(query_group, 0);
  for (int g = 1; g < hkv; ++g) {
    const auto other = lists.list_pages(query_group, g);
    if (!std::equal(first.begin(), first.end(), other.begin(), other.end())) return false;
  }
  return true;
}

// Prefill rows (batch entries of more than one position) use the AVX-512 tile kernel, which reads
// each key block once for the whole tile; decode rows use the page kernel, which needs no
// transposition. The choice depends on the batch entry alone, so dense and CISA lists over the
// same entry run the same kernel (and a list holding every page gives dense attention's bits).
bool AttentionRunner::tiled(const Task& t) const {
#ifdef CISA_ATTENTION_AVX512
  const auto& grp = lists.groups[static_cast<size_t>(t.list / hkv)];
  return batch[static_cast<size_t>(grp.entry)].count > 1;
#else
  (void)t;
  return false;
#endif
}

// Rows that are not tiled use the fused decode kernel where it fits the head and page sizes.
bool AttentionRunner::decode_kernel(const Task& t) const {
#ifdef CISA_ATTENTION_AVX512
  return !tiled(t) && cpu::decode_kernel_fits(d, B);
#else
  (void)t;
  return false;
#endif
}

// The pages of one task, in order, in key blocks of up to 16 for the whole tile at once.
template <class T>
void AttentionRunner::walk_pages_tiled(const Task& t, const float* const* qrow, const int64_t* tpos,
                                       float* const* accp, float* m, float* l, float* tile) const {
#ifdef CISA_ATTENTION_AVX512
  const TaskPages tp = task_pages(t, tpos);
  const int g = tp.g0;
  const int R = t.rows;
  float* kt = tile;  // [d][16], 64-byte aligned by the caller
  float* p = kt + static_cast<int64_t>(d) * cpu::kKeyBlock;
  float* c = p + static_cast<int64_t>(kRowTile) * cpu::kKeyBlock;
  tp.for_each(t, [&](int64_t pi, int32_t page, int64_t s0) {
    const T* kp = static_cast<const T*>(cache.k_page(layer, page, g));
    const T* vp = static_cast<const T*>(cache.v_page(layer, page, g));
    // The next page's K and V are fetched while this one is computed (tens of microseconds for
    // a tile): the transposition reads K rows at a stride of d, which the hardware prefetcher
    // does not follow well, and selected pages are scattered anyway.
    if (pi + 1 < t.page1) {
      const int32_t next = tp.pages[static_cast<size_t>(pi + 1)];
      const auto* nk = static_cast<const char*>(cache.k_page(layer, next, g));
      const auto* nv = static_cast<const char*>(cache.v_page(layer, next, g));
      const int64_t bytes = static_cast<int64_t>(B) * d * static_cast<int64_t>(sizeof(T));
      for (int64_t off = 0; off < bytes; off += 64) {
        __builtin_prefetch(nk + off, 0, 1);
        __builtin_prefetch(nv + off, 0, 1);
      }
    }
    for (int j0 = 0; j0 < B; j0 += cpu::kKeyBlock) {
      const int nk = std::min(cpu::kKeyBlock, B - j0);
      cpu::tile_key_block(qrow, tpos, R, kp + static_cast<int64_t>(j0) * d,
                          vp + static_cast<int64_t>(j0) * d, s0 + j0, nk, window, d, scale, kt, p,
                          c, m, l, accp);
    }
  });
#else
  (void)t, (void)qrow, (void)tpos, (void)accp, (void)m, (void)l, (void)tile;
#endif
}

// One row tile over one page range: online softmax, then either the final output or a partial.
void AttentionRunner::run_task(const Task& t, float* scratch) const {
  const auto& grp = lists.groups[static_cast<size_t>(t.list / hkv)];
  const int R = t.rows * t.groups;  // every row of the task, list-major
  // scratch layout: acc[R][d] | m[R] | l[R] | s[R][B] | tile kernel scratch (64-byte aligned)
  float* acc = scratch;
  float* m = acc + static_cast<int64_t>(kRowTile) * d;
  float* l = m + kRowTile;
  float* s = l + kRowTile;
  float* tile = s + static_cast<int64_t>(kRowTile) * B;
  tile += (16 - (reinterpret_cast<uintptr_t>(tile) / sizeof(float)) % 16) % 16;
  std::fill(acc, acc + static_cast<int64_t>(R) * d, 0.0f);
  std::fill(m, m + R, kNegInf);
  std::fill(l, l + R, 0.0f);

  const float* qrow[kRowTile] = {};
  int64_t tpos[kRowTile] = {};
  for (int r = 0; r < R; ++r) {
    tpos[r] = grp.first + (t.row0 + r % t.rows) / hg;
    qrow[r] = q + head_row(t, r) * d;
  }
  float* accp[kRowTile];
  for (int r = 0; r < R; ++r) accp[r] = acc + static_cast<int64_t>(r) * d;
  const bool bf16 = cache.config().dtype == KvDtype::kBF16;
  if (tiled(t)) {
    if (bf16)
      walk_pages_tiled<uint16_t>(t, qrow, tpos, accp, m, l, tile);
    else
      walk_pages_tiled<float>(t, qrow, tpos, accp, m, l, tile);
  } else if (decode_kernel(t)) {
    if (bf16)
      walk_pages_decode<uint16_t>(t, qrow, tpos, accp, m, l, tile);
    else
      walk_pages_decode<float>(t, qrow, tpos, accp, m, l, tile);
  } else if (bf16) {
    walk_pages<uint16_t>(t, qrow, tpos, accp, m, l, s);
  } else {
    walk_pages<float>(t, qrow, tpos, accp, m, l, s);
  }

  for (int r = 0; r < R; ++r) {
    const float* ar = acc + static_cast<int64_t>(r) * d;
    const float lse_r = l[r] > 0 ? m[r] + std::log(l[r]) : kNegInf;
    const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
    float* o;
    if (t.partial < 0) {
      const int64_t hr = head_row(t, r);
      o = out + hr * d;
      if (lse) lse[hr] = lse_r;
    } else {
      o = ws->partial_out_.data() + (t.partial + r) * d;
      ws->partial_lse_[static_cast<size_t>(t.partial + r)] = lse_r;
    }
    for (int i = 0; i < d; ++i) o[i] = ar[i] * inv;
  }
}

void AttentionRunner::run(ThreadPool& pool) {
  const int threads = pool.num_threads();
  // Pass 1: work units (a list, or every KV group's list of a decode query group when they hold
  // the same pages), their row tiles, and how many page splits each unit gets.
  auto& tasks = ws->tasks_;  // rebuilt per call in reused storage
  auto& grouped = ws->grouped_;
  tasks.clear();
  const int64_t n_groups = static_cast<int64_t>(lists.groups.size());
  grouped.assign(static_cast<size_t>(n_groups), 0);
  int64_t pairs = 0;
  for (int64_t qg = 0; qg < n_groups; ++qg) {
    const auto& grp = lists.groups[static_cast<size_t>(qg)];
    const int64_t rows = (grp.last - grp.first + 1) * hg;
    const Task probe{qg * hkv, 0, 1, 0, 0, -1};
    const bool all =
        hkv > 1 && !tiled(probe) && rows * hkv <= kRowTile && same_pages_all_groups(qg);
    grouped[static_cast<size_t>(qg)] = all ? 1 : 0;
    pairs += (all ? 1 : hkv) * ((rows + kRowTile - 1) / kRowTile);
  }
  const int64_t target = 4 * static_cast<int64_t>(threads);
  int64_t partial_rows = 0;
  for (int64_t L = 0; L < lists.num_lists(); ++L) {
    const int64_t qg = L / hkv;
    const bool all = grouped[static_cast<size_t>(qg)] != 0;
    if (all && L % hkv != 0) continue;  // covered by the task of KV group 0
    const auto& grp = lists.groups[static_cast<size_t>(qg)];
    const int64_t rows = (grp.last - grp.first + 1) * hg;
    const int64_t n_pages =
        lists.offsets[static_cast<size_t>(L + 1)] - lists.offsets[static_cast<size_t>(L)];
    int64_t splits = pairs >= target ? 1 : (target + pairs - 1) / pairs;
    splits = std::max<int64_t>(1, std::min(splits, n_pages / kMinSplitPages));
    for (int64_t r0 = 0; r0 < rows; r0 += kRowTile) {
      const auto R = static_cast<int32_t>(std::min<int64_t>(kRowTile, rows - r0));
      for (int64_t sp = 0; sp < splits; ++sp) {
        Task t{L,
               static_cast<int32_t>(r0),
               R,
               n_pages * sp / splits,
               n_pages * (sp + 1) / splits,
               -1,
               all ? hkv : 1};
        if (splits > 1) {
          t.partial = partial_rows;
          partial_rows += static_cast<int64_t>(R) * t.groups;
        }
        tasks.push_back(t);
      }
    }
  }
  ws->partial_out_.resize(static_cast<size_t>(partial_rows * d));
  ws->partial_lse_.resize(static_cast<size_t>(partial_rows));
  int64_t scratch_floats = static_cast<int64_t>(kRowTile) * (d + 2 + B);
#ifdef CISA_ATTENTION_AVX512
  scratch_floats += std::max(cpu::tile_scratch_floats(kRowTile, d),
                             static_cast<int64_t>(kRowTile) * d + 4 * cpu::kKeyBlock + 16);
#endif
  ws->thread_scratch_.resize(static_cast<size_t>(threads));
  for (auto& s : ws->thread_scratch_) s.resize(static_cast<size_t>(scratch_floats));

  pool.parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t i, int thread) {
    run_task(tasks[static_cast<size_t>(i)],
             ws->thread_scratch_[static_cast<size_t>(thread)].data());
  });
  if (partial_rows == 0) return;

  // Pass 2: merge the splits of each (unit, row tile) by log-sum-exp.
  auto& heads = ws->merge_heads_;  // first task of each split run
  heads.clear();
  for (size_t i = 0; i < tasks.size(); ++i)
    if (tasks[i].partial >= 0 && tasks[i].page0 == 0) heads.push_back(i);
  pool.parallel_for(static_cast<int64_t>(heads.size()), [&](int64_t h, int) {
    const size_t first = heads[static_cast<size_t>(h)];
    size_t last = first + 1;
    while (last < tasks.size() && tasks[last].list == tasks[first].list &&
           tasks[last].row0 == tasks[first].row0 && tasks[last].page0 != 0)
      ++last;
    const Task& t0 = tasks[first];
    for (int r = 0; r < t0.rows * t0.groups; ++r) {
      float mx = kNegInf;
      for (size_t k = first; k < last; ++k)
        mx = std::max(mx, ws->partial_lse_[static_cast<size_t>(tasks[k].partial + r)]);
      const int64_t hr = head_row(t0, r);
      float* o = out + hr * d;
      std::fill(o, o + d, 0.0f);
      float sum = 0.0f;
      if (mx != kNegInf) {
        for (size_t k = first; k < last; ++k) {
          const float w =
              std::exp(ws->partial_lse_[static_cast<size_t>(tasks[k].partial + r)] - mx);
          if (w == 0.0f) continue;
          sum += w;
          axpy(o, w, ws->partial_out_.data() + (tasks[k].partial + r) * d, d);
        }
        for (int i = 0; i < d; ++i) o[i] /= sum;
      }
      if (lse) lse[hr] = mx == kNegInf ? kNegInf : mx + std::log(sum);
    }
  });
}

Status attend(const PagedKvCache& cache, int layer, std::span<const BatchEntry> batch,
              const PageLists& lists, const float* q, int num_q_heads, const AttentionParams& p,
              float* out, float* lse, ThreadPool& pool, AttentionWorkspace* ws) {
  if (!ws) return invalid_argument("attend: null workspace");
  if (p.sliding_window < 0) return invalid_argument("sliding_window must be >= 0");
  const int hkv = cache.num_kv_heads();
  const float scale =
      p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(cache.head_dim()));
  AttentionRunner runner{cache,
                         layer,
                         batch,
                         lists,
                         q,
                         num_q_heads,
                         hkv,
                         num_q_heads > 0 && hkv > 0 ? num_q_heads / hkv : 0,
                         cache.head_dim(),
                         cache.page_size(),
                         scale,
                         p.sliding_window,
                         out,
                         lse,
                         ws};
  CISA_RETURN_IF_ERROR(runner.validate());
  runner.run(pool);
  return Status::Ok();
}

}  // namespace cisa
