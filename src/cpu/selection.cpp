// CISA selection: query groups, scoring against representatives, top-k, page-list assembly.
// GCC 12's AVX-512 intrinsics trip -W(maybe-)uninitialized once inlined (GCC bug 105593; see
// attention.cpp); it has to be off before <immintrin.h> is first read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "cisa/cpu/selection.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>

#include "attention_page_kernel.h"
#include "cisa/core/bf16.h"

namespace cisa {

namespace {

template <class T>
float load(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>)
    return p[i];
  else
    return bf16_to_f32(p[i]);
}

// Dot product with 8 independent lanes so the compiler vectorises it without -ffast-math.
template <class T>
float dot(const float* q, const T* r, int d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < d; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += q[i + l] * load(r, i + l);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <class T>
float quest_bound(const float* q, const T* r, int d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < d; i += 8)
    for (int l = 0; l < 8; ++l) {
      const float lo = q[i + l] * load(r, i + l), hi = q[i + l] * load(r, d + i + l);
      acc[l] += lo > hi ? lo : hi;
    }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Moment representatives (RepKind::kMoment: mean, then variance): q·μ + Σ_i q_i²σ_i²/(2√d), so
// that after the 1/√d of every score it is q·μ/√d + Σ_i q_i²σ_i²/(2d), the log of a page's
// expected exp(q·k/√d) were its keys Gaussian with that mean and diagonal covariance.
template <class T>
float moment_score(const float* q, const T* r, int d) {
  double mean = 0, var = 0;
  for (int i = 0; i < d; ++i) {
    mean += static_cast<double>(q[i]) * load(r, i);
    var += static_cast<double>(q[i]) * q[i] * load(r, d + i);
  }
  return static_cast<float>(mean + var * (0.5 / std::sqrt(static_cast<double>(d))));
}

#ifdef CISA_ATTENTION_AVX512
// Mean-key scores of the representatives of pages[0 … 3] (d % 16 == 0; reps + page·stride is a
// page's representative for the KV group): one query vector loaded feeds four FMAs. The
// representatives of table[ahead, ahead_end) are prefetched, since a sequence's pages (and so its
// representatives) need not be adjacent in the pool. Every score, wherever its chunk sits, is
// summed in this one order, so equal representatives score equal (the spec's ties).
template <class T>
void score4_mean512(const T* reps, int64_t stride, const int32_t* pages, const int32_t* table,
                    int64_t ahead, int64_t ahead_end, const float* q, int d, float scale,
                    float* out) {
  const T* r[4];
  for (int x = 0; x < 4; ++x) r[x] = reps + pages[x] * stride;
  for (int64_t x = ahead; x < ahead_end; ++x) {
    const auto* pr = reinterpret_cast<const char*>(reps + table[static_cast<size_t>(x)] * stride);
    for (int64_t off = 0; off < static_cast<int64_t>(d * sizeof(T)); off += 64)
      _mm_prefetch(pr + off, _MM_HINT_T2);
  }
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                 _mm512_setzero_ps()};
  for (int i = 0; i < d; i += 16) {
    const __m512 qv = _mm512_loadu_ps(q + i);
    for (int x = 0; x < 4; ++x) a[x] = _mm512_fmadd_ps(qv, cpu::load16(r[x] + i), a[x]);
  }
  _mm_storeu_ps(out, _mm_mul_ps(cpu::hsum4x16(a), _mm_set1_ps(scale)));
}
#endif

template <class T>
void score_typed(const PagedKvCache& cache, int layer, std::span<const int32_t> table, int g,
                 const float* q, int64_t first, int64_t n, float* scores) {
  const int d = cache.head_dim();
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(d));
  const RepKind kind = cache.config().rep;
  int64_t j = 0;
#ifdef CISA_ATTENTION_AVX512
  if (kind == RepKind::kMean && d % 16 == 0) {
    // Representative of (page, g) at reps + page·stride: [num_pages][num_kv_heads][d].
    const T* reps = static_cast<const T*>(cache.rep_pool(layer)) + static_cast<int64_t>(g) * d;
    const int64_t stride = static_cast<int64_t>(cache.num_kv_heads()) * d;
    const int32_t* t = table.data() + first;
    constexpr int64_t kAhead = 8;
    for (; j + 4 <= n; j += 4)
      score4_mean512<T>(reps, stride, t + j, t, std::min(n, j + kAhead),
                        std::min(n, j + kAhead + 4), q, d, inv_sqrt_d, scores + j);
    if (j < n) {  // the last 1-3 chunks: the same kernel on a padded quadruple, not dot()
      int32_t pages[4];
      float tail[4];
      for (int64_t x = 0; x < 4; ++x) pages[x] = t[std::min(j + x, n - 1)];
      score4_mean512<T>(reps, stride, pages, t, n, n, q, d, inv_sqrt_d, tail);
      for (int64_t x = 0; j + x < n; ++x) scores[j + x] = tail[x];
      j = n;
    }
  }
#endif
  for (; j < n; ++j) {
    const T* r = static_cast<const T*>(cache.rep(layer, table[static_cast<size_t>(first + j)], g));
    scores[j] = (kind == RepKind::kQuest    ? quest_bound(q, r, d)
                 : kind == RepKind::kMoment ? moment_score(q, r, d)
                                            : dot(q, r, d)) *
                inv_sqrt_d;
  }
}

}  // namespace

void score_chunks(const PagedKvCache& cache, int layer, std::span<const int32_t> block_table,
                  int kv_head, const float* q, int64_t first_chunk, int64_t n, float* scores) {
  if (cache.config().dtype == KvDtype::kF32)
    score_typed<float>(cache, layer, block_table, kv_head, q, first_chunk, n, scores);
  else
    score_typed<uint16_t>(cache, layer, block_table, kv_head, q, first_chunk, n, scores);
}

// Radix select. Each score becomes a 32-bit key whose unsigned order is the ranking (NaN → 0,
// the lowest; −0 and +0 one key, as they compare equal): positive floats order as their bits with
// the sign bit set, negative ones as their complemented bits. The k-th largest key T is found a
// digit at a time, most significant first, from histograms of the keys that still share T's
// higher digits (kept compacted at the front of the scratch). The answer is every key above T
// and, to make up k, the keys equal to T with the smallest indices; one pass in index order
// yields exactly that, already sorted.
namespace {
inline uint32_t rank_key(float f) {
  uint32_t b = std::bit_cast<uint32_t>(f);
  b = b == 0x80000000u ? 0u : b;  // −0 → +0
  const uint32_t flip = static_cast<uint32_t>(static_cast<int32_t>(b) >> 31) | 0x80000000u;
  return (b & 0x7fffffffu) > 0x7f800000u ? 0u : b ^ flip;  // NaN → 0
}
}  // namespace

void select_topk(std::span<const float> scores, int64_t k, std::vector<int32_t>* out,
                 std::vector<int32_t>* scratch) {
  const auto n = static_cast<int64_t>(scores.size());
  out->clear();
  if (k <= 0) return;
  if (k >= n) {
    for (int32_t i = 0; i < n; ++i) out->push_back(i);
    return;
  }
  scratch->resize(2 * static_cast<size_t>(n));  // keys, then the candidates for T
  auto* keys = reinterpret_cast<uint32_t*>(scratch->data());
  uint32_t* cand = keys + n;
  for (int64_t i = 0; i < n; ++i) keys[i] = rank_key(scores[static_cast<size_t>(i)]);
  // Digits of 11, 11 and 10 bits: the top 11 (sign, exponent, one mantissa bit) alone would leave
  // most of a typical score distribution in one bin.
  constexpr int kShift[3] = {21, 10, 0};
  constexpr uint32_t kBins[3] = {2048, 2048, 1024};
  uint32_t hist[2048];
  int64_t need = k;  // how many of the keys sharing T's digits found so far are still wanted
  const uint32_t* src = keys;
  int64_t m = n;  // keys sharing those digits: all of them, then the candidates compacted in cand
  uint32_t prefix = 0;
  for (int level = 0; level < 3; ++level) {
    const int shift = kShift[level];
    const uint32_t mask = kBins[level] - 1;
    std::fill(hist, hist + kBins[level], 0u);
    for (int64_t i = 0; i < m; ++i) ++hist[(src[i] >> shift) & mask];
    uint32_t bin = mask;
    for (; hist[bin] < need; --bin) need -= hist[bin];  // keys in higher bins are all taken
    prefix |= bin << shift;
    int64_t kept = 0;  // branch-free compaction: the boundary bin is often a large share
    for (int64_t i = 0; i < m; ++i) {
      const uint32_t key = src[i];
      cand[kept] = key;
      kept += ((key >> shift) & mask) == bin ? 1 : 0;
    }
    m = kept;
    src = cand;
  }
  const uint32_t t = prefix;  // the k-th largest key; `need` of the keys equal to it are taken
  for (int64_t i = 0; i < n; ++i)
    if (keys[i] >= t && (keys[i] > t || need-- > 0)) out->push_back(static_cast<int32_t>(i));
}

bool new_chunk_outranks(std::span<const float> reused_scores, std::span<const float> new_scores) {
  if (reused_scores.empty()) return false;  // k = 0: nothing to displace
  uint32_t lowest = UINT32_MAX;
  for (float x : reused_scores) lowest = std::min(lowest, rank_key(x));
  for (float x : new_scores)
    if (rank_key(x) > lowest) return true;  // equal keys go to the reused chunk's smaller index
  return false;
}

double exp_score_sum(std::span<const float> scores, float shift) {
  double sum = 0;
  for (float x : scores)
    if (std::isfinite(x)) sum += std::exp(static_cast<double>(x) - static_cast<double>(shift));
  return sum;
}

float max_finite_score(std::span<const float> scores) {
  float m = -INFINITY;
  for (float x : scores)
    if (std::isfinite(x)) m = std::max(m, x);
  return m;
}

std::span<ReusedSelection> SelectionReuse::states(SeqId seq, int layer, int num_kv_heads) {
  const uint64_t key = uint64_t{static_cast<uint32_t>(seq)} << 32 | static_cast<uint32_t>(layer);
  std::vector<ReusedSelection>& v = map_[key];
  if (v.size() != static_cast<size_t>(num_kv_heads))
    v.assign(static_cast<size_t>(num_kv_heads), ReusedSelection{});
  return v;
}

void SelectionReuse::release(SeqId seq) {
  std::erase_if(map_, [seq](const auto& kv) {
    return static_cast<uint32_t>(kv.first >> 32) == static_cast<uint32_t>(seq);
  });
}

void SelectionReuse::clear() {
  map_.clear();
}

namespace {
// What select_pages does with one list under selection reuse.
enum ReuseAction : uint8_t {
  kNotCandidate = 0,  // prefill row, dense group, or reuse off: selects, keeps no state
  kFresh,             // decode row without a usable selection: top-k, state replaced
  kKeep,              // keeps its selection; the check had nothing to score
  kKeepChecked,       // keeps its selection after the check scored newly eligible chunks
  kCheckFailed,       // a newly eligible chunk outranked a kept one: top-k, state replaced
};
}  // namespace

Status select_pages(const PagedKvCache& cache, int layer, std::span<const BatchEntry> batch,
                    const float* index_q, const SelectionParams& p, ThreadPool* pool,
                    PageLists* out, SelectionWorkspace* ws, SelectionReuse* reuse) {
  CISA_RETURN_IF_ERROR(validate_selection_params(p));
  // The last query of an entry may not be written yet (decode rows selected before their append).
  CISA_RETURN_IF_ERROR(validate_selection_batch(cache.pages(), layer, batch));
  if (reuse) CISA_RETURN_IF_ERROR(validate_reuse_rows(batch, p));
  if (!cache.has_reps(layer))
    return failed_precondition("layer " + std::to_string(layer) + " keeps no representatives");
  if (!index_q) return invalid_argument("select_pages: null index query pointer");
  CISA_RETURN_IF_ERROR(plan_query_groups(cache.page_size(), batch, p, out));

  const int64_t B = cache.page_size();
  const int H = cache.num_kv_heads(), d = cache.head_dim();
  const auto num_groups = static_cast<int64_t>(out->groups.size());
  out->num_kv_heads = H;

  // Sizes first (they do not depend on scores), so lists can be filled in parallel.
  size_page_lists(cache.page_size(), H, p, out);

  const int threads = pool ? pool->num_threads() : 1;
  SelectionWorkspace local;
  if (!ws) ws = &local;
  if (ws->threads.size() < static_cast<size_t>(threads))
    ws->threads.resize(static_cast<size_t>(threads));
  auto& scratch = ws->threads;
  // Size every thread's scratch for the largest list up front: which thread takes which list
  // varies from call to call, and a steady decode loop must not allocate.
  int64_t max_eligible = 0;
  for (const auto& grp : out->groups)
    if (!grp.dense) max_eligible = std::max(max_eligible, eligible_count(grp.first, B, p));
  for (auto& th : scratch) {
    th.qbar.reserve(static_cast<size_t>(d));
    th.scores.reserve(static_cast<size_t>(max_eligible));
    th.tmp.reserve(2 * static_cast<size_t>(max_eligible));  // select_topk: keys and candidates
    th.top.reserve(static_cast<size_t>(std::min(p.budget, max_eligible)));
  }

  const int64_t num_lists = num_groups * H;
  // The index query of list t: the mean over its group's positions, or its last position.
  auto index_query = [&](int64_t t, float* qbar) {
    const int g = static_cast<int>(t % H);
    const auto& grp = out->groups[static_cast<size_t>(t / H)];
    std::fill(qbar, qbar + d, 0.0f);
    const int64_t r0 =
        p.qshare_query == QShareQuery::kMean ? grp.row : grp.row + (grp.last - grp.first);
    const int64_t r1 = grp.row + (grp.last - grp.first);
    for (int64_t r = r0; r <= r1; ++r) {
      const float* q = index_q + (r * H + g) * d;
      for (int k = 0; k < d; ++k) qbar[k] += q[k];
    }
    const float inv = 1.0f / static_cast<float>(r1 - r0 + 1);
    for (int k = 0; k < d; ++k) qbar[k] *= inv;
  };
  auto eligible_of = [&](int64_t t) {
    return eligible_count(out->groups[static_cast<size_t>(t / H)].first, B, p);
  };

  // Selection reuse (plan.h, docs/design.md): decide for every decode list whether it keeps its
  // selection before anything is scored, so that kept lists are not scored at all.
  const bool reusing = reuse && p.reuse_steps > 1;
  auto action = [&](int64_t t) {
    return reusing ? ws->reuse_action[static_cast<size_t>(t)] : uint8_t{kNotCandidate};
  };
  auto kept = [&](int64_t t) { return action(t) == kKeep || action(t) == kKeepChecked; };
  if (reusing) {
    ws->reuse_state.assign(static_cast<size_t>(num_lists), nullptr);
    ws->reuse_action.assign(static_cast<size_t>(num_lists), kNotCandidate);
    for (int64_t qg = 0; qg < num_groups; ++qg) {
      const auto& grp = out->groups[static_cast<size_t>(qg)];
      const BatchEntry& e = batch[static_cast<size_t>(grp.entry)];
      if (grp.dense || e.count != 1) continue;  // prefill rows always select
      std::span<ReusedSelection> st = reuse->states(e.seq, layer, H);
      for (int g = 0; g < H; ++g) {
        ws->reuse_state[static_cast<size_t>(qg * H + g)] = &st[static_cast<size_t>(g)];
        ws->reuse_action[static_cast<size_t>(qg * H + g)] = kFresh;
      }
    }
    auto decide = [&](int64_t t, int thread) {
      ReusedSelection* st = ws->reuse_state[static_cast<size_t>(t)];
      if (!st) return;
      const auto& grp = out->groups[static_cast<size_t>(t / H)];
      const int64_t a = grp.first;
      if (!same_selection_sets(st->params, p) ||
          !reuse_allowed(a, st->selected_at, st->last_used, p))
        return;  // kFresh
      uint8_t& act = ws->reuse_action[static_cast<size_t>(t)];
      act = kKeep;
      const ChunkRange n = newly_eligible(st->selected_at, a, cache.page_size(), p);
      const bool mass = p.reuse_check == ReuseCheck::kMass;
      if (p.reuse_check == ReuseCheck::kNone || (!mass && n.end == n.begin)) return;
      // Scores of S, then of the newly eligible chunks N, then (kMass) of the sample of the older
      // eligible chunks outside S, under this row's index query: the physical pages, in that
      // order, form the table score_chunks walks.
      auto table = *cache.block_table(batch[static_cast<size_t>(grp.entry)].seq);
      auto& s = scratch[static_cast<size_t>(thread)];
      const size_t k = st->chunks.size(), nn = static_cast<size_t>(n.end - n.begin);
      s.tmp.clear();
      for (int32_t j : st->chunks) s.tmp.push_back(table[static_cast<size_t>(j)]);
      for (int64_t j = n.begin; j < n.end; ++j) s.tmp.push_back(table[static_cast<size_t>(j)]);
      if (mass) {
        // E_{a0} = [sinks, n.begin): the eligible chunks at a0 end where N begins (plan.h).
        size_t si = 0;
        for (int64_t j = p.sink_pages; j < n.begin; ++j) {
          if (!in_reuse_mass_sample(j, a)) continue;
          while (si < k && st->chunks[si] < j) ++si;
          if (si < k && st->chunks[si] == j) continue;  // in S
          s.tmp.push_back(table[static_cast<size_t>(j)]);
        }
      }
      const size_t m = s.tmp.size();
      s.qbar.resize(static_cast<size_t>(d));
      index_query(t, s.qbar.data());
      s.scores.resize(m);
      score_chunks(cache, layer, s.tmp, static_cast<int>(t % H), s.qbar.data(), 0,
                   static_cast<int64_t>(m), s.scores.data());
      const std::span<const float> sc(s.scores.data(), m);
      bool fail = new_chunk_outranks(sc.first(k), sc.subspan(k, nn));
      if (mass && !fail) {
        const float shift = max_finite_score(sc);
        const double in_s = exp_score_sum(sc.first(k), shift);
        const double out =
            exp_score_sum(sc.subspan(k, nn), shift) +
            static_cast<double>(kReuseMassStride) * exp_score_sum(sc.subspan(k + nn), shift);
        const double u1 = in_s + out > 0 ? out / (in_s + out) : 0.0;
        fail = u1 > st->unselected_mass + p.reuse_mass_slack;
      }
      act = fail ? kCheckFailed : kKeepChecked;
    };
    if (pool)
      pool->parallel_for(num_lists, decide);
    else
      for (int64_t t = 0; t < num_lists; ++t) decide(t, 0);
  }

  // Score every list first, in slices of each query group's page range, when there are fewer
  // lists than threads (decode) or several KV groups: a page's representatives of all KV groups
  // are adjacent in the pool, so a slice walks its pages in blocks and scores every group's list
  // in each block, instead of one list at a time reading every H-th representative.
  const bool presplit = pool && (num_lists < threads || H > 1);
  if (presplit) {
    constexpr int64_t kBlock = 16;  // pages per block: H·16 representatives, read once
    ws->score_offsets.assign(static_cast<size_t>(num_lists + 1), 0);
    for (int64_t t = 0; t < num_lists; ++t)
      ws->score_offsets[static_cast<size_t>(t + 1)] =
          ws->score_offsets[static_cast<size_t>(t)] +
          (out->groups[static_cast<size_t>(t / H)].dense || kept(t) ? 0 : eligible_of(t));
    ws->list_qbar.resize(static_cast<size_t>(num_lists * d));
    ws->list_scores.resize(static_cast<size_t>(ws->score_offsets.back()));
    for (int64_t t = 0; t < num_lists; ++t)
      if (!out->groups[static_cast<size_t>(t / H)].dense && !kept(t))
        index_query(t, ws->list_qbar.data() + t * d);
    const int64_t parts = num_groups < threads ? threads : 1;
    pool->parallel_for(num_groups * parts, [&](int64_t sl, int) {
      const int64_t qg = sl / parts, part = sl % parts;
      const auto& grp = out->groups[static_cast<size_t>(qg)];
      if (grp.dense) return;
      const int64_t n = eligible_of(qg * H), lo = n * part / parts, hi = n * (part + 1) / parts;
      auto table = *cache.block_table(batch[static_cast<size_t>(grp.entry)].seq);
      for (int64_t j0 = lo; j0 < hi; j0 += kBlock)
        for (int g = 0; g < H; ++g) {
          const int64_t t = qg * H + g;
          if (kept(t)) continue;
          score_chunks(cache, layer, table, g, ws->list_qbar.data() + t * d, p.sink_pages + j0,
                       std::min(kBlock, hi - j0),
                       ws->list_scores.data() + ws->score_offsets[static_cast<size_t>(t)] + j0);
        }
    });
  }

  auto task = [&](int64_t t, int thread) {
    const int g = static_cast<int>(t % H);
    const auto& grp = out->groups[static_cast<size_t>(t / H)];
    auto table = *cache.block_table(batch[static_cast<size_t>(grp.entry)].seq);
    if (grp.dense) return write_page_list(table, cache.page_size(), p, {}, t, out);
    ReusedSelection* st = reusing ? ws->reuse_state[static_cast<size_t>(t)] : nullptr;
    if (kept(t)) {  // S as chosen at a0; sinks, window and tail from this row's position
      write_page_list(table, cache.page_size(), p, st->chunks, t, out);
      st->last_used = grp.first;
      return;
    }
    auto& s = scratch[static_cast<size_t>(thread)];
    const ListLayout lay = list_layout(grp, B, p);
    const int64_t first_eligible = lay.eligible_begin, end_eligible = lay.eligible_end;
    std::span<const float> scores;
    if (presplit) {
      scores = {ws->list_scores.data() + ws->score_offsets[static_cast<size_t>(t)],
                static_cast<size_t>(end_eligible - first_eligible)};
    } else {
      s.qbar.resize(static_cast<size_t>(d));
      index_query(t, s.qbar.data());
      s.scores.resize(static_cast<size_t>(end_eligible - first_eligible));
      score_chunks(cache, layer, table, g, s.qbar.data(), first_eligible,
                   end_eligible - first_eligible, s.scores.data());
      scores = s.scores;
    }
    select_topk(scores, p.budget, &s.top, &s.tmp);
    for (auto& j : s.top) j += static_cast<int32_t>(first_eligible);  // to absolute chunk indices
    write_page_list(table, cache.page_size(), p, s.top, t, out);
    if (st) {                   // a decode row's fresh selection: the one later rows may keep
      st->unselected_mass = 0;  // u0 (plan.h), exact over this row's E; 0 under other checks
      if (p.reuse_check == ReuseCheck::kMass) {
        const float shift = max_finite_score(scores);
        const double all = exp_score_sum(scores, shift);
        double in_s = 0;
        for (int32_t j : s.top)
          in_s += exp_score_sum(scores.subspan(static_cast<size_t>(j - first_eligible), 1), shift);
        st->unselected_mass = all > 0 ? 1.0 - in_s / all : 0.0;
      }
      st->chunks.assign(s.top.begin(), s.top.end());
      st->selected_at = st->last_used = grp.first;
      st->params = p;
    }
  };
  if (pool)
    pool->parallel_for(num_lists, task);
  else
    for (int64_t t = 0; t < num_lists; ++t) task(t, 0);
  if (reusing)
    for (int64_t t = 0; t < num_lists; ++t) {
      const uint8_t a = action(t);
      reuse->stats.selected += a == kFresh || a == kCheckFailed ? 1 : 0;
      reuse->stats.reused += a == kKeep || a == kKeepChecked ? 1 : 0;
      reuse->stats.checked += a == kKeepChecked || a == kCheckFailed ? 1 : 0;
      reuse->stats.reselected += a == kCheckFailed ? 1 : 0;
    }
  return Status::Ok();
}

}  // namespace cisa
