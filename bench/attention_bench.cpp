// Micro-benchmarks of the CPU core: top-k, scoring + selection, paged attention (decode and a
// 64-query prefill block) at a 16K context, and the prefill block of a Gemma 3 270M global layer
// (4 query heads : 1 KV head, d = 256, f32 K/V, 512 queries) with its GFLOP/s. Whole-layer
// comparisons against dense live in `cisa bench attention`.
#include <benchmark/benchmark.h>

#include <random>

#include "cisa/cpu/attention.h"
#include "cisa/cpu/selection.h"

namespace {

using namespace cisa;

struct Fixture {
  std::unique_ptr<PagedKvCache> cache;
  SeqId seq = 0;
  ThreadPool pool{0};
  AttentionWorkspace ws;
  std::vector<float> q, iq, out;

  Fixture(int64_t n, int hkv, KvDtype dt) {
    cache = std::move(*PagedKvCache::create({.num_layers = 1,
                                             .num_kv_heads = hkv,
                                             .head_dim = 128,
                                             .page_size = 16,
                                             .num_pages = n / 16 + 1,
                                             .dtype = dt}));
    seq = *cache->add_sequence();
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    std::vector<float> k(static_cast<size_t>(n * hkv * 128)), v(k.size());
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    (void)cache->reserve(seq, n);
    (void)cache->append(0, seq, n, k.data(), v.data());
    q.resize(64 * 32 * 128);
    iq.resize(64 * 8 * 128);
    out.resize(q.size());
    for (auto& x : q) x = nd(rng);
    for (auto& x : iq) x = nd(rng);
  }
};

// A one-layer cache holding one sequence of n tokens of N(0, 1) keys and values.
std::unique_ptr<PagedKvCache> filled_cache(int64_t n, int hkv, int d, KvDtype dt, uint32_t seed,
                                           SeqId* seq) {
  auto cache = std::move(*PagedKvCache::create({.num_layers = 1,
                                                .num_kv_heads = hkv,
                                                .head_dim = d,
                                                .page_size = 16,
                                                .num_pages = n / 16 + 1,
                                                .dtype = dt}));
  *seq = *cache->add_sequence();
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  const int64_t chunk = 1024;
  std::vector<float> k(static_cast<size_t>(chunk * hkv * d)), v(k.size());
  for (int64_t done = 0; done < n; done += chunk) {
    const int64_t c = std::min<int64_t>(chunk, n - done);
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    (void)cache->reserve(*seq, c);
    (void)cache->append(0, *seq, c, k.data(), v.data());
  }
  return cache;
}

void BM_TopK(benchmark::State& state) {
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  std::vector<float> s(static_cast<size_t>(state.range(0)));
  for (auto& x : s) x = nd(rng);
  std::vector<int32_t> out, scratch;
  for (auto _ : state) {
    select_topk(s, state.range(1), &out, &scratch);
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_TopK)->Args({4096, 256})->Args({65536, 4096});

void BM_Attention(benchmark::State& state) {
  const bool cisa = state.range(0) != 0;
  const int32_t nq = static_cast<int32_t>(state.range(1));
  static Fixture f(16384, 1, KvDtype::kBF16);
  std::vector<BatchEntry> batch = {{f.seq, 16384 - nq, nq}};
  PageLists lists;
  for (auto _ : state) {
    if (cisa)
      (void)select_pages(*f.cache, 0, batch, f.iq.data(),
                         {.budget = 64, .window = 16, .qshare = 16}, &f.pool, &lists);
    else
      (void)plan_dense(*f.cache, 0, batch, 0, &lists);
    (void)attend(*f.cache, 0, batch, lists, f.q.data(), 4, {}, f.out.data(), nullptr, f.pool,
                 &f.ws);
    benchmark::DoNotOptimize(f.out.data());
  }
  state.SetLabel(cisa ? "cisa k=64 W=16 G=16" : "dense");
}
BENCHMARK(BM_Attention)->ArgsProduct({{0, 1}, {1, 64}})->Unit(benchmark::kMicrosecond);

// A 512-query prefill block at the end of an N-token context in the geometry of Gemma 3 270M's
// global layers; GFLOP/s counts 4·d flops per (query head, visible key): q·k and p·v.
void BM_PrefillBlockGemmaGlobal(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int d = 256, hq = 4, nq = 512;
  auto cache = std::move(*PagedKvCache::create({.num_layers = 1,
                                                .num_kv_heads = 1,
                                                .head_dim = d,
                                                .page_size = 16,
                                                .num_pages = n / 16 + 1,
                                                .dtype = KvDtype::kF32}));
  const SeqId seq = *cache->add_sequence();
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> k(static_cast<size_t>(4096 * d)), v(k.size());
  for (int64_t done = 0; done < n; done += 4096) {
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    (void)cache->reserve(seq, std::min<int64_t>(4096, n - done));
    (void)cache->append(0, seq, std::min<int64_t>(4096, n - done), k.data(), v.data());
  }
  std::vector<float> q(static_cast<size_t>(nq * hq * d)), out(q.size());
  for (auto& x : q) x = nd(rng);
  std::vector<BatchEntry> batch = {{seq, n - nq, nq}};
  PageLists lists;
  (void)plan_dense(*cache, 0, batch, 0, &lists);
  ThreadPool pool(static_cast<int>(state.range(1)));
  AttentionWorkspace ws;
  double flops = 0;
  for (int64_t t = n - nq; t < n; ++t) flops += 4.0 * d * hq * static_cast<double>(t + 1);
  for (auto _ : state) {
    (void)attend(*cache, 0, batch, lists, q.data(), hq, {}, out.data(), nullptr, pool, &ws);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.SetLabel("4:1 d=256 f32, 512 queries, threads=" + std::to_string(state.range(1)));
}
BENCHMARK(BM_PrefillBlockGemmaGlobal)
    ->ArgsProduct({{8192, 32768}, {1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Dense decode of one position in the 32:8 geometry (d = 128, bf16 K/V) with GFLOP/s counting
// 4·d flops per (query head, key). A short context stays in cache and shows the kernel's compute
// rate; a long one streams from memory (no flush between iterations: a lower bound on time).
void BM_DecodeDense32x8(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int hkv = 8, hq = 32, d = 128;
  SeqId seq = 0;
  auto cache = filled_cache(n, hkv, d, KvDtype::kBF16, 4, &seq);
  std::mt19937 rng(40);
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<size_t>(hq * d)), out(q.size());
  for (auto& x : q) x = nd(rng);
  std::vector<BatchEntry> batch = {{seq, n - 1, 1}};
  PageLists lists;
  (void)plan_dense(*cache, 0, batch, 0, &lists);
  ThreadPool pool(static_cast<int>(state.range(1)));
  AttentionWorkspace ws;
  for (auto _ : state) {
    (void)attend(*cache, 0, batch, lists, q.data(), hq, {}, out.data(), nullptr, pool, &ws);
    benchmark::DoNotOptimize(out.data());
  }
  const double flops = 4.0 * d * hq * static_cast<double>(n);
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.SetLabel("32:8 d=128 bf16 decode, threads=" + std::to_string(state.range(1)));
}
BENCHMARK(BM_DecodeDense32x8)
    ->ArgsProduct({{2048, 65536}, {1, 2}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// CISA decode of one position at 4:1 (d = 128, bf16 K/V, k = 256, W = 32): selection and
// attention, separately timed. The pages read stay in cache between iterations, so this is the
// compute-and-overhead floor of what `cisa bench attention` measures with flushed caches.
void BM_DecodeCisa4x1(benchmark::State& state) {
  const int64_t n = state.range(0);
  const bool attend_only = state.range(1) != 0;
  const int hkv = 1, hq = 4, d = 128;
  SeqId seq = 0;
  auto cache = filled_cache(n, hkv, d, KvDtype::kBF16, 5, &seq);
  std::mt19937 rng(50);
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<size_t>(hq * d)), iq(static_cast<size_t>(hkv * d)),
      out(q.size());
  for (auto& x : q) x = nd(rng);
  for (auto& x : iq) x = nd(rng);
  std::vector<BatchEntry> batch = {{seq, n - 1, 1}};
  PageLists lists;
  ThreadPool pool(2);
  AttentionWorkspace ws;
  const SelectionParams sp{.budget = 256, .window = 32, .qshare = 1};
  (void)select_pages(*cache, 0, batch, iq.data(), sp, &pool, &lists);
  for (auto _ : state) {
    if (!attend_only) (void)select_pages(*cache, 0, batch, iq.data(), sp, &pool, &lists);
    (void)attend(*cache, 0, batch, lists, q.data(), hq, {}, out.data(), nullptr, pool, &ws);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(attend_only ? "4:1 k=256 W=32 attention only"
                             : "4:1 k=256 W=32 select + attention");
}
BENCHMARK(BM_DecodeCisa4x1)
    ->ArgsProduct({{65536}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
