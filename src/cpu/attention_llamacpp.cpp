// Attention over page lists with llama.cpp's CPU numerics (attention_llamacpp.h).
//
// llama.cpp without flash attention computes, per KV head, KQ = K·Q (f16 K from the cache, the
// query converted to f16 for the f16 matrix product), then a row softmax over every cell of the
// cache (masked cells hold −inf and give exactly 0), then KQV = V·P with the probabilities P
// converted to f16 for the f16 product. Its f16 products run in 16-lane fused multiply-add
// accumulators over the reduction index, added by one fixed tree at the end; its softmax sums
// 16 exponentials at a time into an fp64 total. Cells are the absolute positions of a single
// sequence filled from position 0, so "cell mod 16" is "position mod 16" below. Reproducing each
// rounding in the same order gives the same floats; any reordering would not.
#include "cisa/cpu/attention_llamacpp.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attention_inputs.h"
#include "cisa/core/bf16.h"

namespace cisa {
namespace llamacpp {

float round_f16(float x) {
  // Branch-free, so that loops over rows vectorise.
  const float a = std::fabs(x);
  // A normal half keeps 11 significant bits, the float 24: drop 13 with ties to even (a carry out
  // of the mantissa correctly bumps the exponent).
  uint32_t u = std::bit_cast<uint32_t>(a);
  u = (u + 0xFFFu + ((u >> 13) & 1u)) & ~0x1FFFu;
  float r = std::bit_cast<float>(u);
  // Subnormal halves are the multiples of 2^-24, the spacing of floats in [0.5, 1): adding and
  // removing 0.5 rounds to them (ties to even, the default mode).
  if (a < 0x1p-14f) r = (a + 0.5f) - 0.5f;
  if (a >= 65520.0f) r = INFINITY;  // past the largest half (65504) by half an ulp or more
  if (a != a) r = a;                // NaN stays NaN
  return std::bit_cast<float>(std::bit_cast<uint32_t>(r) |
                              (std::bit_cast<uint32_t>(x) & 0x80000000u));
}

float exp(float x) {
  // exp(x) = 2^n · e^b with n = round(x / ln 2) (found by adding 1.5·2^23, which leaves the
  // rounded integer in the low mantissa bits), b = x − n·ln 2 (ln 2 split in a high and a low
  // part), and e^b by a degree-5 minimax polynomial evaluated as llama.cpp's kernel does.
  const float shift = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, shift);
  const float n = z - shift;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const float u = b * b;
  const float hi = std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                            std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f));
  const float j = std::fma(hi, u, std::fma(0x1.ffffecp-1f, b, 1.0f));
  // j · 2^n, rounded once (as AVX-512's scalef does), without branches so that loops vectorise:
  // first by 2^n1 with n1 = clamp(n, −125, 127), exact since j ∈ [0.7, 1.5) keeps the product
  // normal, then by 2^(n − n1) ∈ [2^−67, 2^65], the one rounding (into subnormals, or overflow).
  const float nc = std::fmin(std::fmax(n, -192.0f), 192.0f);  // also x = −inf (n = −inf)
  const int ni = static_cast<int>(nc);
  const int n1 = std::min(std::max(ni, -125), 127);
  const float s1 = std::bit_cast<float>(static_cast<uint32_t>(n1 + 127) << 23);
  const float s2 = std::bit_cast<float>(static_cast<uint32_t>(ni - n1 + 127) << 23);
  const float res = (j * s1) * s2;
  const float alt = n <= 0.0f ? 0.0f : INFINITY;  // |n| > 192: underflow or overflow outright
  return std::fabs(n) > 192.0f ? alt : res;
}

float tree_sum16(const float* l) {
  // Halve the width three times (upper half added to lower half), then ((0+2) + (1+3)).
  float a[8], b[4];
  for (int i = 0; i < 8; ++i) a[i] = l[i + 8] + l[i];
  for (int i = 0; i < 4; ++i) b[i] = a[i + 4] + a[i];
  return (b[0] + b[2]) + (b[1] + b[3]);
}

float dot16(const float* a, const float* b, int n) {
  float l[16] = {};
  int i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) l[j] = std::fma(a[i + j], b[i + j], l[j]);
  for (int j = 0; i < n; ++i, ++j) l[j] = std::fma(a[i], b[i], l[j]);
  return tree_sum16(l);
}

float dot64x4(const float* a, const float* b, int n) {
  // Four accumulators of 16 lanes: element i goes to accumulator (i / 16) mod 4, lane i mod 16,
  // over the whole 64-element chunks in ascending order; then (s0 + s2) + (s1 + s3) lane-wise and
  // the tree; a tail of n mod 64 elements adds its f32 products one by one in fp64.
  float s[4][16] = {};
  const int np = n & ~63;
  for (int i = 0; i < np; i += 64)
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 16; ++l)
        s[j][l] = std::fma(a[i + 16 * j + l], b[i + 16 * j + l], s[j][l]);
  float t[16];
  for (int l = 0; l < 16; ++l) t[l] = (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]);
  double sum = tree_sum16(t);
  for (int i = np; i < n; ++i) sum += static_cast<double>(a[i] * b[i]);
  return static_cast<float>(sum);
}

}  // namespace llamacpp

namespace {

// Rows of one task: consecutive positions of one query group, which share every key load (each
// key and value row is read and rounded once per tile, not once per query).
constexpr int kTileRows = 16;

struct Runner {
  const PagedKvCache& cache;
  int layer;
  std::span<const BatchEntry> batch;
  const PageLists& lists;
  const float* q;
  int hq, hkv, hg, d, B;
  LlamaCppAttentionParams p;
  float* out;
  std::vector<int64_t> row_group;  // packed row → query group
  // A batch of one row in all (a decode step): llama.cpp's products then take its one-column
  // path (llamacpp::dot64x4 order) instead of the matrix kernels' (llamacpp::dot16 order).
  bool one_row = false;

  // Scratch of one thread.
  struct Scratch {
    std::vector<int64_t> pos;  // the keys some row of the tile attends to, ascending
    std::vector<const void*> kptr, vptr;
    std::vector<float> score;    // [tile rows · hg][keys]: scores, then probabilities
    std::vector<float> qs, row;  // [tile rows · hg][d], [d]
    std::vector<float> kt;       // [d][16]: a block of 16 rounded keys, transposed
    std::vector<float> acc;      // [tile rows · hg][16 lanes][d]
  };

  void load_row(const void* src, float* dst) const {
    if (cache.elem_bytes() == 4) {
      const float* s = static_cast<const float*>(src);
      for (int i = 0; i < d; ++i) dst[i] = llamacpp::round_f16(s[i]);
    } else {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int i = 0; i < d; ++i) dst[i] = llamacpp::round_f16(bf16_to_f32(s[i]));
    }
  }
  bool visible(int64_t s, int64_t t) const {
    return s <= t && (p.sliding_window == 0 || s > t - p.sliding_window);
  }

  // Rows [r0, r0 + nr) of one query group.
  void run_tile(int64_t r0, int nr, Scratch& s) const {
    const int64_t gi = row_group[static_cast<size_t>(r0)];
    const QueryGroup& g = lists.groups[static_cast<size_t>(gi)];
    const int64_t t0 = g.first + (r0 - g.row), t1 = t0 + nr - 1;
    const size_t eb = static_cast<size_t>(cache.elem_bytes());
    const int nq = nr * hg;  // queries of the tile per KV group: row-major, then head
    for (int kv = 0; kv < hkv; ++kv) {
      // The keys: listed pages in logical order, visible to at least one row of the tile.
      s.pos.clear();
      s.kptr.clear();
      s.vptr.clear();
      const auto pages = lists.list_pages(gi, kv);
      const auto chunks = lists.list_chunks(gi, kv);
      for (size_t i = 0; i < pages.size(); ++i) {
        const auto* kp = static_cast<const uint8_t*>(cache.k_page(layer, pages[i], kv));
        const auto* vp = static_cast<const uint8_t*>(cache.v_page(layer, pages[i], kv));
        for (int slot = 0; slot < B; ++slot) {
          const int64_t pos = static_cast<int64_t>(chunks[i]) * B + slot;
          if (pos > t1) break;
          if (p.sliding_window > 0 && pos <= t0 - p.sliding_window) continue;  // seen by none
          s.pos.push_back(pos);
          s.kptr.push_back(kp + static_cast<size_t>(slot) * d * eb);
          s.vptr.push_back(vp + static_cast<size_t>(slot) * d * eb);
        }
      }
      const size_t n = s.pos.size();
      s.score.resize(static_cast<size_t>(nq) * n);
      // Queries in f16 (scaled first when the graph scales them), then the scores; a key a row
      // does not see scores −inf, as llama.cpp's mask makes it (its exponential is exactly 0).
      for (int r = 0; r < nr; ++r)
        for (int h = 0; h < hg; ++h) {
          const float* src = q + ((r0 + r) * hq + kv * hg + h) * d;
          float* dst = s.qs.data() + (r * hg + h) * d;
          for (int i = 0; i < d; ++i)
            dst[i] = llamacpp::round_f16(p.scale_queries ? src[i] * p.scale : src[i]);
        }
      // One row: each score is the one-column dot product (llamacpp::dot64x4).
      for (size_t j = 0; one_row && j < n; ++j) {
        load_row(s.kptr[j], s.row.data());
        for (int qi = 0; qi < nq; ++qi) {
          const float dot = llamacpp::dot64x4(s.qs.data() + qi * d, s.row.data(), d);
          s.score[qi * n + j] = !visible(s.pos[j], t0) ? -INFINITY
                                : p.scale_queries      ? dot
                                                       : dot * p.scale;
        }
      }
      // Scores 16 keys at a time: the block's rounded keys transposed ([d][16]), so that the 16
      // dimension lanes of q·k (llamacpp::dot16) run for all 16 keys at once, then the same tree.
      for (size_t j0 = 0; !one_row && j0 < n; j0 += 16) {
        const int nk = static_cast<int>(std::min<size_t>(16, n - j0));
        for (int kk = 0; kk < 16; ++kk) {
          if (kk < nk) load_row(s.kptr[j0 + kk], s.row.data());
          for (int i = 0; i < d; ++i)
            s.kt[static_cast<size_t>(i) * 16 + kk] = kk < nk ? s.row[i] : 0.0f;
        }
        for (int qi = 0; qi < nq; ++qi) {
          const float* qv = s.qs.data() + qi * d;
          float lanes[16][16] = {};  // [dimension lane][key]
          for (int i = 0; i < d; ++i) {
            const float* kti = s.kt.data() + static_cast<size_t>(i) * 16;
            float* l = lanes[i & 15];
            for (int kk = 0; kk < 16; ++kk) l[kk] = std::fma(qv[i], kti[kk], l[kk]);
          }
          float a[8][16], b[4][16], dot[16];
          for (int i = 0; i < 8; ++i)
            for (int kk = 0; kk < 16; ++kk) a[i][kk] = lanes[i + 8][kk] + lanes[i][kk];
          for (int i = 0; i < 4; ++i)
            for (int kk = 0; kk < 16; ++kk) b[i][kk] = a[i + 4][kk] + a[i][kk];
          for (int kk = 0; kk < 16; ++kk) dot[kk] = (b[0][kk] + b[2][kk]) + (b[1][kk] + b[3][kk]);
          const int64_t t = t0 + qi / hg;
          for (int kk = 0; kk < nk; ++kk)
            s.score[qi * n + j0 + kk] = !visible(s.pos[j0 + kk], t) ? -INFINITY
                                        : p.scale_queries           ? dot[kk]
                                                                    : dot[kk] * p.scale;
        }
      }
      // Softmax per query: whole-row max, exponentials summed per aligned 16-position block into
      // an fp64 total, then P = half(e · f32(1/total)).
      for (int qi = 0; qi < nq; ++qi) {
        float* sc = s.score.data() + qi * n;
        float mx = -INFINITY;
        for (size_t j = 0; j < n; ++j) mx = std::max(mx, sc[j]);
        double total = 0;
        float lanes[16] = {};
        for (size_t j = 0; j < n; ++j) sc[j] = llamacpp::exp(sc[j] - mx);
        for (size_t j = 0; j < n; ++j) {
          lanes[s.pos[j] % 16] = sc[j];
          if (j + 1 == n || s.pos[j + 1] / 16 != s.pos[j] / 16) {
            total += static_cast<double>(llamacpp::tree_sum16(lanes));
            std::fill(lanes, lanes + 16, 0.0f);
          }
        }
        const float inv = static_cast<float>(1.0 / total);
        for (size_t j = 0; j < n; ++j) sc[j] = llamacpp::round_f16(sc[j] * inv);
      }
      // O = P·V in 16 lanes by key position, each lane accumulating in ascending position (a
      // masked key adds 0·v, exactly nothing, as in llama.cpp). One row: 64 lanes by position
      // (llamacpp::dot64x4's accumulator and lane; llama.cpp's cache length is a multiple of 256,
      // so no position falls in its tail).
      const int nl = one_row ? 64 : 16;
      std::fill(s.acc.begin(), s.acc.begin() + static_cast<ptrdiff_t>(nq) * nl * d, 0.0f);
      for (size_t j = 0; j < n; ++j) {
        load_row(s.vptr[j], s.row.data());
        const int lane = static_cast<int>(s.pos[j] % nl);
        for (int qi = 0; qi < nq; ++qi) {
          const float pj = s.score[qi * n + j];
          float* a = s.acc.data() + (static_cast<size_t>(qi) * nl + lane) * d;
          for (int i = 0; i < d; ++i) a[i] = std::fma(pj, s.row[i], a[i]);
        }
      }
      for (int r = 0; r < nr; ++r)
        for (int h = 0; h < hg; ++h) {
          float* o = out + ((r0 + r) * hq + kv * hg + h) * d;
          const float* a = s.acc.data() + static_cast<size_t>(r * hg + h) * nl * d;
          float lanes[16];
          for (int i = 0; i < d; ++i) {
            for (int l = 0; l < 16; ++l)
              lanes[l] = one_row ? (a[l * d + i] + a[(l + 32) * d + i]) +
                                       (a[(l + 16) * d + i] + a[(l + 48) * d + i])
                                 : a[l * d + i];
            o[i] = llamacpp::tree_sum16(lanes);
          }
        }
    }
  }
};

}  // namespace

Status attend_llamacpp(const PagedKvCache& cache, int layer, std::span<const BatchEntry> batch,
                       const PageLists& lists, const float* q, int num_q_heads,
                       const LlamaCppAttentionParams& p, float* out, ThreadPool& pool) {
  if (!q || !out) return invalid_argument("attend_llamacpp: null query or output pointer");
  if (p.sliding_window < 0) return invalid_argument("negative sliding window");
  std::vector<int64_t> first_row, row_group;
  CISA_RETURN_IF_ERROR(cpu::validate_attention_inputs(cache, layer, batch, lists, num_q_heads,
                                                      &first_row, &row_group));
  const int hkv = cache.num_kv_heads(), d = cache.head_dim();
  Runner run{.cache = cache,
             .layer = layer,
             .batch = batch,
             .lists = lists,
             .q = q,
             .hq = num_q_heads,
             .hkv = hkv,
             .hg = num_q_heads / hkv,
             .d = d,
             .B = cache.page_size(),
             .p = p,
             .out = out,
             .row_group = std::move(row_group)};
  if (run.p.scale == 0.0f) run.p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  run.one_row = run.row_group.size() == 1;

  // Tasks: tiles of up to kTileRows rows of one query group.
  std::vector<std::pair<int64_t, int>> tiles;
  for (const QueryGroup& g : lists.groups)
    for (int64_t r = g.row; r <= g.row + (g.last - g.first); r += kTileRows)
      tiles.emplace_back(
          r, static_cast<int>(std::min<int64_t>(kTileRows, g.row + (g.last - g.first) + 1 - r)));
  std::vector<Runner::Scratch> scratch(static_cast<size_t>(pool.num_threads()));
  const size_t nq = static_cast<size_t>(kTileRows) * run.hg;
  for (auto& s : scratch) {
    s.qs.resize(nq * d);
    s.row.resize(static_cast<size_t>(d));
    s.kt.resize(static_cast<size_t>(d) * 16);
    s.acc.resize(nq * 16 * d);
  }
  pool.parallel_for(static_cast<int64_t>(tiles.size()), [&](int64_t i, int thread) {
    const auto [r0, nr] = tiles[static_cast<size_t>(i)];
    run.run_tile(r0, nr, scratch[static_cast<size_t>(thread)]);
  });
  return Status::Ok();
}

}  // namespace cisa
