// The CUDA model backend's paged KV cache and attention against the CPU backend, driven through
// the Backend interface with identical calls and inputs: K/V appended in interleaved steps of
// several sequences (so physical pages scatter, and both PageTables must hand out the same IDs),
// then one step of prefill and decode rows together: dense plans shared by two layers, a sliding
// window, and a CISA plan whose selected page lists are checked against the CPU's select_pages
// on the CPU backend's own bf16 cache (identical keys, so identical representatives).
#include <gtest/gtest.h>

#if defined(CISA_WITH_CUDA_MODEL)
#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>
#include <vector>

#include "cisa/cpu/selection.h"
#include "gpu/cuda_backend_test_util.h"

namespace cisa::test {
namespace {

struct Shape {
  int hkv, hq, d;
  RepKind rep = RepKind::kMean;
  RepPrecision prec = RepPrecision::kNative;
};

// Both backends with caches of one configuration, driven by the same calls.
struct KvWorld {
  BackendPair b = make_backend_pair();
  KvCacheConfig cfg;
  std::vector<int64_t> len;  // tokens per sequence
  std::mt19937 rng{5};

  bool init(const Shape& s, int layers, std::vector<bool> rep_layers,
            const std::vector<int64_t>& target) {
    if (!b.cpu || !b.gpu) return false;
    int64_t pages = 8;
    for (int64_t n : target) pages += n / 16 + 2;
    cfg = {.num_layers = layers,
           .num_kv_heads = s.hkv,
           .head_dim = s.d,
           .num_pages = pages,
           .dtype = KvDtype::kBF16,
           .rep = s.rep,
           .rep_precision = s.prec,
           .rep_layers = std::move(rep_layers)};
    for (Backend* be : {b.cpu.get(), b.gpu.get()}) {
      const Status st = be->create_cache(cfg);
      EXPECT_TRUE(st.ok()) << be->description() << ": " << st.to_string();
      if (!st.ok()) return false;
      for (size_t i = 0; i < target.size(); ++i)
        EXPECT_EQ(*be->add_sequence(), static_cast<SeqId>(i));
    }
    len.assign(target.size(), 0);
    // Interleaved rounds of 1 … 40 tokens per sequence, several sequences per append_kv.
    for (bool more = true; more;) {
      more = false;
      std::vector<BatchEntry> step;
      for (size_t i = 0; i < target.size(); ++i) {
        const int64_t n = std::min<int64_t>(target[i] - len[i], 1 + rng() % 40);
        if (n > 0) step.push_back({static_cast<SeqId>(i), len[i], static_cast<int32_t>(n)});
      }
      if (step.empty()) break;
      append(step);
      more = true;
    }
    for (size_t i = 0; i < target.size(); ++i)
      EXPECT_TRUE(std::ranges::equal(*b.cpu->pages().block_table(static_cast<SeqId>(i)),
                                     *b.gpu->pages().block_table(static_cast<SeqId>(i))))
          << "block tables of sequence " << i << " differ";
    return !::testing::Test::HasFailure();
  }

  // Reserves room for the step on both backends and appends the same random K/V in every layer.
  void append(const std::vector<BatchEntry>& step) {
    int64_t rows = 0;
    for (const auto& e : step) rows += e.count;
    for (const auto& e : step) {
      ASSERT_EQ(e.first, len[static_cast<size_t>(e.seq)]);
      ASSERT_TRUE(b.cpu->reserve(e.seq, e.count).ok());
      ASSERT_TRUE(b.gpu->reserve(e.seq, e.count).ok());
    }
    const auto n = static_cast<size_t>(rows * cfg.num_kv_heads * cfg.head_dim);
    for (int l = 0; l < cfg.num_layers; ++l) {
      const auto k = random_vec(rng, n), v = random_vec(rng, n);
      for (Backend* be : {b.cpu.get(), b.gpu.get()}) {
        auto kb = upload_f32(*be, k), vb = upload_f32(*be, v);
        const Status st = be->append_kv(l, step, kb->f32(), vb->f32());
        ASSERT_TRUE(st.ok()) << be->description() << ": " << st.to_string();
        ASSERT_TRUE(be->synchronize().ok());
      }
    }
    for (const auto& e : step) len[static_cast<size_t>(e.seq)] += e.count;
  }

  // attend() of one layer on one backend; the output as host values.
  std::vector<float> attend(Backend& be, PlanSlot slot, int layer, const std::vector<float>& q,
                            int hq, const AttendParams& p) {
    const int64_t n = static_cast<int64_t>(q.size());
    auto qb = upload_f32(be, q);
    auto out = upload_f32(be, std::vector<float>(q.size(), std::nanf("")));
    const Status st = be.attend(slot, layer, qb->f32(), hq, p, out->f32());
    EXPECT_TRUE(st.ok()) << be.description() << ": " << st.to_string();
    return download_f32(be, *out, n);
  }
};

int64_t rows_of(const std::vector<BatchEntry>& batch) {
  int64_t r = 0;
  for (const auto& e : batch) r += e.count;
  return r;
}

// P is rounded to bf16 before P·V on the GPU (≤ 2^-9 relative per weight) and q, K, V are exact,
// so an element is off by at most ~2^-8·max|v|; the L2 error, independent roundings, far less.
void expect_attention_close(const std::vector<float>& want, const std::vector<float>& got) {
  ASSERT_EQ(want.size(), got.size());
  double err2 = 0, ref2 = 0, max_err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i]) || std::isnan(want[i])) << "element " << i << " is NaN";
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    max_err = std::max(max_err, e);
    err2 += e * e;
    ref2 += static_cast<double>(want[i]) * want[i];
  }
  EXPECT_LT(max_err, 6.0 * std::ldexp(1.0, -8));
  EXPECT_LT(std::sqrt(err2 / ref2), 4e-3) << "relative L2 error";
}

void expect_same_groups(const std::vector<QueryGroup>& a, const std::vector<QueryGroup>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].entry, b[i].entry) << "group " << i;
    EXPECT_EQ(a[i].first, b[i].first) << "group " << i;
    EXPECT_EQ(a[i].last, b[i].last) << "group " << i;
    EXPECT_EQ(a[i].row, b[i].row) << "group " << i;
    EXPECT_EQ(a[i].dense, b[i].dense) << "group " << i;
  }
}

// Gemma 3 270M's attention (1 KV head of 256, 4 query heads), SmolLM2's (3 of 64, 9 query heads),
// and two more GQA ratios; quest representatives in two of them (CISA test).
const Shape kShapes[] = {
    {1, 4, 256}, {2, 8, 128, RepKind::kQuest}, {4, 4, 64}, {3, 9, 64, RepKind::kQuest}};
// int8 representatives through the backends (the CPU cache holds code · 2^e, the device the codes).
const Shape kInt8Shapes[] = {{2, 8, 128, RepKind::kMean, RepPrecision::kInt8},
                             {1, 4, 256, RepKind::kQuest, RepPrecision::kInt8}};

// Prefill and decode rows of three sequences in one step; one dense plan serves two layers;
// then a decode step (planned for the query-head count learned in the first).
TEST(CudaBackendKv, DenseAttentionMatchesTheCpuBackend) {
  CISA_REQUIRE_GPU();
  for (const Shape& s : kShapes) {
    SCOPED_TRACE("hkv " + std::to_string(s.hkv) + " hq " + std::to_string(s.hq) + " d " +
                 std::to_string(s.d));
    KvWorld w;
    ASSERT_TRUE(w.init(s, 2, {}, {300, 41, 1000}));
    for (const std::vector<BatchEntry>& step :
         {std::vector<BatchEntry>{{0, 300, 50}, {1, 41, 1}, {2, 1000, 17}},
          std::vector<BatchEntry>{{0, 350, 1}, {1, 42, 1}, {2, 1017, 1}}}) {
      w.append(step);
      const auto q =
          bf16_exact(random_vec(w.rng, static_cast<size_t>(rows_of(step) * s.hq * s.d), 2.0f));
      for (Backend* be : {w.b.cpu.get(), w.b.gpu.get()})
        ASSERT_TRUE(be->plan(PlanSlot::kGlobal, step, {.kind = PlanKind::kDense}).ok());
      for (int layer = 0; layer < 2; ++layer) {
        SCOPED_TRACE("layer " + std::to_string(layer));
        const auto want = w.attend(*w.b.cpu, PlanSlot::kGlobal, layer, q, s.hq, {});
        const auto got = w.attend(*w.b.gpu, PlanSlot::kGlobal, layer, q, s.hq, {});
        expect_attention_close(want, got);
      }
      expect_same_groups(w.b.cpu->plan_groups(PlanSlot::kGlobal),
                         w.b.gpu->plan_groups(PlanSlot::kGlobal));
    }
  }
}

TEST(CudaBackendKv, SlidingWindowMatchesTheCpuBackend) {
  CISA_REQUIRE_GPU();
  const Shape s{2, 8, 128};
  KvWorld w;
  ASSERT_TRUE(w.init(s, 1, {}, {500, 90, 700}));
  const std::vector<BatchEntry> step = {{0, 500, 40}, {1, 90, 1}, {2, 700, 1}};
  w.append(step);
  const auto q =
      bf16_exact(random_vec(w.rng, static_cast<size_t>(rows_of(step) * s.hq * s.d), 2.0f));
  for (int64_t window : {100, 16, 1}) {
    SCOPED_TRACE("window " + std::to_string(window));
    for (Backend* be : {w.b.cpu.get(), w.b.gpu.get()})
      ASSERT_TRUE(
          be->plan(PlanSlot::kSliding, step, {.kind = PlanKind::kDense, .sliding_window = window})
              .ok());
    const AttendParams p{.sliding_window = window};
    expect_attention_close(w.attend(*w.b.cpu, PlanSlot::kSliding, 0, q, s.hq, p),
                           w.attend(*w.b.gpu, PlanSlot::kSliding, 0, q, s.hq, p));
  }
  // The window is part of the GPU plan: attending with another one is an error, not a silent
  // mismatch.
  auto qb = upload_f32(*w.b.gpu, q);
  auto out = upload_f32(*w.b.gpu, q);
  EXPECT_EQ(
      w.b.gpu->attend(PlanSlot::kSliding, 0, qb->f32(), s.hq, {.sliding_window = 7}, out->f32())
          .code(),
      StatusCode::kInvalidArgument);
}

// Chunks of one list selected by one side only must be near-ties of the CPU's scores.
void expect_lists_match(const PagedKvCache& cache, const std::vector<BatchEntry>& batch,
                        const std::vector<float>& iq, const SelectionParams& p,
                        const PageLists& cpu, const PageLists& gpu, int64_t* swaps) {
  expect_same_groups(cpu.groups, gpu.groups);
  ASSERT_EQ(cpu.offsets, gpu.offsets);
  EXPECT_EQ(cpu.num_selected, gpu.num_selected);
  const int H = cache.num_kv_heads(), d = cache.head_dim();
  for (int64_t L = 0; L < cpu.num_lists(); ++L) {
    const QueryGroup& g = cpu.groups[static_cast<size_t>(L / H)];
    const int kv = static_cast<int>(L % H);
    const auto table = *cache.block_table(batch[static_cast<size_t>(g.entry)].seq);
    const auto gc = gpu.list_chunks(L / H, kv), cc = cpu.list_chunks(L / H, kv),
               gp = gpu.list_pages(L / H, kv);
    for (size_t i = 0; i < gc.size(); ++i)
      ASSERT_EQ(gp[i], table[static_cast<size_t>(gc[i])])
          << "list " << L << ": page of chunk " << gc[i];
    std::vector<int32_t> only_cpu, only_gpu;
    std::ranges::set_difference(cc, gc, std::back_inserter(only_cpu));
    std::ranges::set_difference(gc, cc, std::back_inserter(only_gpu));
    ASSERT_EQ(only_cpu.size(), only_gpu.size()) << "list " << L;
    if (only_cpu.empty()) continue;
    ASSERT_FALSE(g.dense) << "dense list " << L << " differs";
    // The CPU's index query and scores of the swapped chunks.
    std::vector<float> qbar(static_cast<size_t>(d), 0.0f);
    const int64_t r1 = g.row + (g.last - g.first),
                  r0 = p.qshare_query == QShareQuery::kMean ? g.row : r1;
    for (int64_t r = r0; r <= r1; ++r)
      for (int i = 0; i < d; ++i)
        qbar[static_cast<size_t>(i)] += iq[static_cast<size_t>((r * H + kv) * d + i)];
    for (auto& x : qbar) x /= static_cast<float>(r1 - r0 + 1);
    for (size_t i = 0; i < only_cpu.size(); ++i) {
      float x = 0, y = 0;
      score_chunks(cache, 0, table, kv, qbar.data(), only_cpu[i], 1, &x);
      score_chunks(cache, 0, table, kv, qbar.data(), only_gpu[i], 1, &y);
      EXPECT_NEAR(x, y, 1e-4f * (1 + std::fabs(x))) << "list " << L << ": chunks " << only_cpu[i]
                                                    << " / " << only_gpu[i] << " are no near-tie";
    }
    *swaps += static_cast<int64_t>(only_cpu.size());
  }
}

TEST(CudaBackendKv, CisaSelectionAndAttentionMatchTheCpuBackend) {
  CISA_REQUIRE_GPU();
  std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.insert(shapes.end(), std::begin(kInt8Shapes), std::end(kInt8Shapes));
  for (const Shape& s : shapes) {
    SCOPED_TRACE("hkv " + std::to_string(s.hkv) + " hq " + std::to_string(s.hq) + " d " +
                 std::to_string(s.d) + " " + rep_kind_name(s.rep) + " " +
                 rep_precision_name(s.prec));
    KvWorld w;
    // Layer 0 keeps representatives (a global layer), layer 1 none.
    ASSERT_TRUE(w.init(s, 2, {true, false}, {600, 150, 1200}));
    const SelectionParams sel{.budget = 8, .window = 2, .qshare = 4, .sink_pages = 1};
    const std::vector<BatchEntry> step = {{0, 600, 37}, {1, 150, 1}, {2, 1200, 1}};
    w.append(step);
    const int64_t rows = rows_of(step);
    const auto q = bf16_exact(random_vec(w.rng, static_cast<size_t>(rows * s.hq * s.d), 2.0f));
    const auto iq = random_vec(w.rng, static_cast<size_t>(rows * s.hkv * s.d));
    std::vector<float> out[2];
    Backend* bes[2] = {w.b.cpu.get(), w.b.gpu.get()};
    for (int k = 0; k < 2; ++k) {
      Backend& be = *bes[k];
      ASSERT_TRUE(be.plan(PlanSlot::kCisa, step, {.kind = PlanKind::kCisa, .selection = sel}).ok());
      auto iqb = upload_f32(be, iq);
      const Status st = be.select(PlanSlot::kCisa, 0, iqb->f32());
      ASSERT_TRUE(st.ok()) << be.description() << ": " << st.to_string();
      EXPECT_EQ(be.select(PlanSlot::kCisa, 1, iqb->f32()).code(), StatusCode::kFailedPrecondition)
          << be.description() << ": a layer without representatives";
      ASSERT_TRUE(be.select(PlanSlot::kCisa, 0, iqb->f32()).ok());
      out[k] = w.attend(be, PlanSlot::kCisa, 0, q, s.hq, {});
    }
    PageLists gpu, cpu;
    ASSERT_TRUE(w.b.gpu->page_lists(PlanSlot::kCisa, &gpu).ok());
    ASSERT_TRUE(
        select_pages(*w.b.cpu->cpu_cache(), 0, step, iq.data(), sel, w.b.cpu->cpu_pool(), &cpu)
            .ok());
    int64_t selecting = 0;
    for (int32_t n : cpu.num_selected) selecting += n > 0;
    ASSERT_GT(selecting, 0) << "the case must select somewhere";
    int64_t swaps = 0;
    expect_lists_match(*w.b.cpu->cpu_cache(), step, iq, sel, cpu, gpu, &swaps);
    ::testing::Test::RecordProperty("boundary_swaps", static_cast<int>(swaps));
    // Attention reads the selected pages: the outputs agree where the selections do.
    if (swaps == 0) expect_attention_close(out[0], out[1]);
    expect_same_groups(w.b.cpu->plan_groups(PlanSlot::kCisa),
                       w.b.gpu->plan_groups(PlanSlot::kCisa));
    // A fresh plan has no selection yet.
    ASSERT_TRUE(
        w.b.gpu->plan(PlanSlot::kCisa, step, {.kind = PlanKind::kCisa, .selection = sel}).ok());
    auto qb = upload_f32(*w.b.gpu, q);
    EXPECT_EQ(w.b.gpu->attend(PlanSlot::kCisa, 0, qb->f32(), s.hq, {}, qb->f32()).code(),
              StatusCode::kFailedPrecondition);
  }
}

// A decode step selected before its K/V are appended (Model's early selection): the CUDA backend
// scores, forks top-k onto its selection stream, appends this step's K/V beside it and joins in
// attend(); the CPU backend selects in the same order. Lists as select_pages picks them, and the
// same attention.
TEST(CudaBackendKv, DecodeSelectedBeforeItsAppendMatchesTheCpuBackend) {
  CISA_REQUIRE_GPU();
  const Shape s{4, 16, 128};
  KvWorld w;
  ASSERT_TRUE(w.init(s, 1, {true}, {600, 150, 1200}));
  const SelectionParams sel{.budget = 8, .window = 2, .qshare = 4};
  const std::vector<BatchEntry> step = {{0, 600, 1}, {1, 150, 1}, {2, 1200, 1}};
  const auto n = static_cast<size_t>(3 * s.hkv * s.d);
  const auto q = bf16_exact(random_vec(w.rng, static_cast<size_t>(3 * s.hq * s.d), 2.0f));
  const auto iq = random_vec(w.rng, n), k = random_vec(w.rng, n), v = random_vec(w.rng, n);
  std::vector<float> out[2];
  Backend* bes[2] = {w.b.cpu.get(), w.b.gpu.get()};
  for (int b = 0; b < 2; ++b) {
    Backend& be = *bes[b];
    for (const auto& e : step) ASSERT_TRUE(be.reserve(e.seq, 1).ok());
    auto iqb = upload_f32(be, iq), kb = upload_f32(be, k), vb = upload_f32(be, v);
    auto qb = upload_f32(be, q);
    auto ob = upload_f32(be, std::vector<float>(q.size(), std::nanf("")));
    ASSERT_TRUE(be.plan(PlanSlot::kCisa, step, {.kind = PlanKind::kCisa, .selection = sel}).ok());
    const Status st = be.select(PlanSlot::kCisa, 0, iqb->f32());
    ASSERT_TRUE(st.ok()) << be.description() << ": " << st.to_string();
    // Attention needs this step's K/V first.
    EXPECT_EQ(be.attend(PlanSlot::kCisa, 0, qb->f32(), s.hq, {}, ob->f32()).code(),
              StatusCode::kOutOfRange)
        << be.description();
    ASSERT_TRUE(be.append_kv(0, step, kb->f32(), vb->f32()).ok());
    ASSERT_TRUE(be.attend(PlanSlot::kCisa, 0, qb->f32(), s.hq, {}, ob->f32()).ok());
    out[b] = download_f32(be, *ob, static_cast<int64_t>(q.size()));
  }
  for (const auto& e : step) w.len[static_cast<size_t>(e.seq)] += 1;
  PageLists gpu, cpu;
  ASSERT_TRUE(w.b.gpu->page_lists(PlanSlot::kCisa, &gpu).ok());
  ASSERT_TRUE(
      select_pages(*w.b.cpu->cpu_cache(), 0, step, iq.data(), sel, w.b.cpu->cpu_pool(), &cpu).ok());
  int64_t swaps = 0;
  expect_lists_match(*w.b.cpu->cpu_cache(), step, iq, sel, cpu, gpu, &swaps);
  if (swaps == 0) expect_attention_close(out[0], out[1]);
  // Two positions ahead of the written K/V is refused by both.
  const std::vector<BatchEntry> ahead = {{0, 602, 1}};
  for (Backend* be : bes) {
    ASSERT_TRUE(be->reserve(0, 2).ok());
    ASSERT_TRUE(be->plan(PlanSlot::kCisa, ahead, {.kind = PlanKind::kCisa, .selection = sel}).ok());
    auto iqb = upload_f32(*be, std::vector<float>(iq.begin(), iq.begin() + s.hkv * s.d));
    EXPECT_EQ(be->select(PlanSlot::kCisa, 0, iqb->f32()).code(), StatusCode::kOutOfRange)
        << be->description();
  }
}

// Sequences, reservations and a full pool: the same page IDs as the CPU, clear errors, nothing
// changed by a failing call.
TEST(CudaBackendKv, FullCacheAndFailedAppendsChangeNothing) {
  CISA_REQUIRE_GPU();
  BackendPair b = make_backend_pair();
  ASSERT_TRUE(b.gpu);
  Backend& g = *b.gpu;
  ASSERT_TRUE(g.create_cache({.num_layers = 2,
                              .num_kv_heads = 1,
                              .head_dim = 64,
                              .num_pages = 8,
                              .dtype = KvDtype::kBF16})
                  .ok());
  const SeqId s0 = *g.add_sequence(), s1 = *g.add_sequence();
  ASSERT_TRUE(g.reserve(s0, 5 * 16).ok());
  ASSERT_TRUE(g.reserve(s1, 3 * 16).ok());
  EXPECT_EQ(g.pages().free_pages(), 0);
  EXPECT_EQ(g.reserve(s1, 1).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(g.pages().free_pages(), 0);
  EXPECT_EQ(*g.pages().reserved(s1), 3 * 16);
  // An append past the reservation fails whole: the first entry of the batch is not written.
  std::vector<float> kv(static_cast<size_t>(2 * 16 * 4 * 64), 0.5f);
  auto k = upload_f32(g, kv);
  const std::vector<BatchEntry> too_much = {{s0, 0, 16}, {s1, 0, 3 * 16 + 1}};
  EXPECT_EQ(g.append_kv(0, too_much, k->f32(), k->f32()).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(*g.pages().tokens(0, s0), 0);
  const std::vector<BatchEntry> fits = {{s0, 0, 16}, {s1, 0, 3 * 16}};
  ASSERT_TRUE(g.append_kv(0, fits, k->f32(), k->f32()).ok());
  EXPECT_EQ(*g.pages().tokens(0, s0), 16);
  EXPECT_EQ(*g.pages().tokens(0, s1), 48);
  EXPECT_EQ(*g.pages().tokens(1, s1), 0);
  // Attention of layer 1 before its K/V exist (kOutOfRange, the core's validate_batch, as on the
  // CPU backend), and the CPU-only paths, are clear errors.
  const std::vector<BatchEntry> q1 = {{s1, 47, 1}};
  ASSERT_TRUE(g.plan(PlanSlot::kGlobal, q1, {.kind = PlanKind::kDense}).ok());
  EXPECT_EQ(g.attend(PlanSlot::kGlobal, 1, k->f32(), 1, {}, k->f32()).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(g.attend(PlanSlot::kGlobal, 0, k->f32(), 1, {.numerics = AttentionNumerics::kLlamaCpp},
                     k->f32())
                .code(),
            StatusCode::kUnimplemented);
  EXPECT_EQ(g.set_page_lists(PlanSlot::kGlobal, PageLists{}).code(), StatusCode::kUnimplemented);
  ASSERT_TRUE(g.release_sequence(s0).ok());
  EXPECT_EQ(g.pages().free_pages(), 5);
  // s1 is now row 0 of the device block tables: its keys and values are all 0.5, so attention
  // over them is 0.5 exactly (pages of any other table would read zeros).
  ASSERT_TRUE(g.plan(PlanSlot::kGlobal, q1, {.kind = PlanKind::kDense}).ok());
  auto o = upload_f32(g, std::vector<float>(64, std::nanf("")));
  ASSERT_TRUE(g.attend(PlanSlot::kGlobal, 0, k->f32(), 1, {}, o->f32()).ok());
  EXPECT_EQ(download_f32(g, *o, 64), std::vector<float>(64, 0.5f));
  EXPECT_EQ(g.plan(PlanSlot::kGlobal, std::vector<BatchEntry>{{s0, 0, 1}}, {}).code(),
            StatusCode::kNotFound);
  ASSERT_TRUE(g.attend(PlanSlot::kGlobal, 0, k->f32(), 1, {}, k->f32()).code() ==
              StatusCode::kFailedPrecondition)
      << "the slot's last plan failed, so it is not planned";
}

}  // namespace
}  // namespace cisa::test

#else
TEST(CudaBackendKv, Skipped) {
  GTEST_SKIP() << "no CUDA device: GPU tests skipped (built without the CUDA model backend)";
}
#endif
