// matmul_bench — quantised matmul throughput for Gemma 3 270M's shapes (and SmolLM2's Q4_1).
//
//   build/<dir>/bench/matmul_bench --benchmark_filter='/1$' --benchmark_min_time=0.5s
//
// Arguments: /m/k/n_tok. Counters: GFLOP/s (2 m k n_tok per call) and the weight bytes streamed
// per second (GB/s), the bound for decode (n_tok = 1). Weights are random well-formed blocks of
// the type the real file uses for that matrix; speed does not depend on their values.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "cisa/model/quant.h"

namespace {

std::vector<uint8_t> random_weights(cisa::GgmlType type, int64_t m, int64_t k) {
  const uint64_t rb = *cisa::ggml_row_bytes(type, k);
  std::vector<uint8_t> w(static_cast<size_t>(m) * rb);
  std::mt19937 rng(1);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  // Give every block a small finite fp16 scale so no NaN/inf slows the float path.
  const int64_t bb = cisa::ggml_block_bytes(type), nblk = static_cast<int64_t>(w.size()) / bb;
  const uint16_t h = cisa::f32_to_f16(0.01f);
  const int64_t at = type == cisa::GgmlType::Q6_K ? 208 : 0;
  for (int64_t i = 0; i < nblk; ++i) {
    std::memcpy(&w[i * bb + at], &h, 2);
    if (type == cisa::GgmlType::Q4_1 || type == cisa::GgmlType::Q4_K)
      std::memcpy(&w[i * bb + 2], &h, 2);
  }
  return w;
}

void run(benchmark::State& state, cisa::GgmlType type) {
  const int64_t m = state.range(0), k = state.range(1), n_tok = state.range(2);
  const std::vector<uint8_t> w = random_weights(type, m, k);
  const cisa::WeightView view{type, m, k, *cisa::ggml_row_bytes(type, k), w.data()};
  std::vector<float> x(static_cast<size_t>(n_tok * k)), y(static_cast<size_t>(n_tok * m));
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  cisa::ThreadPool pool(0);
  cisa::MatmulScratch scratch;
  for (auto _ : state) {
    cisa::Status s = cisa::matmul(view, x.data(), y.data(), n_tok, pool, &scratch);
    if (!s.ok()) state.SkipWithError(s.message().c_str());
    benchmark::DoNotOptimize(y.data());
  }
  const double flops = 2.0 * static_cast<double>(m) * k * n_tok;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_GB/s"] = benchmark::Counter(static_cast<double>(w.size()) * 1e-9,
                                                     benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(cisa::ggml_type_name(type)) + " " + cisa::matmul_isa() +
                 " threads=" + std::to_string(pool.num_threads()));
}

// Gemma 3 270M Q4_K_M: the type of each matrix in the real file (blk.0; most layers alike).
void BM_gemma_attn_q_Q5_0(benchmark::State& s) {
  run(s, cisa::GgmlType::Q5_0);
}  // 640 -> 1024
void BM_gemma_ffn_up_Q5_0(benchmark::State& s) {
  run(s, cisa::GgmlType::Q5_0);
}  // 640 -> 2048
void BM_gemma_ffn_down_Q6_K(benchmark::State& s) {
  run(s, cisa::GgmlType::Q6_K);
}  // 2048 -> 640
void BM_gemma_ffn_down_Q4_K(benchmark::State& s) {
  run(s, cisa::GgmlType::Q4_K);
}  // 2048 -> 640
void BM_gemma_attn_out_Q4_K(benchmark::State& s) {
  run(s, cisa::GgmlType::Q4_K);
}  // 1024 -> 640
void BM_gemma_output_Q8_0(benchmark::State& s) {
  run(s, cisa::GgmlType::Q8_0);
}  // 640 -> 262144
void BM_smollm_ffn_up_Q4_1(benchmark::State& s) {
  run(s, cisa::GgmlType::Q4_1);
}  // 576 -> 1536

#define SHAPES(m, k) ->Args({m, k, 1})->Args({m, k, 64})->Args({m, k, 512})->UseRealTime()
BENCHMARK(BM_gemma_attn_q_Q5_0) SHAPES(1024, 640);
BENCHMARK(BM_gemma_ffn_up_Q5_0) SHAPES(2048, 640);
BENCHMARK(BM_gemma_ffn_down_Q6_K) SHAPES(640, 2048);
BENCHMARK(BM_gemma_ffn_down_Q4_K) SHAPES(640, 2048);
BENCHMARK(BM_gemma_attn_out_Q4_K) SHAPES(640, 1024);
BENCHMARK(BM_gemma_output_Q8_0)->Args({262144, 640, 1})->Args({262144, 640, 16})->UseRealTime();
BENCHMARK(BM_smollm_ffn_up_Q4_1) SHAPES(1536, 576);

}  // namespace

BENCHMARK_MAIN();
