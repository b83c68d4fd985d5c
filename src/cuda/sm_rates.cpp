// measure_sm_rates (backend.h): the decode attention kernel timed block by block on a synthetic
// paged pool. The rates come from attention itself because a probe that streams memory in order
// does not see what attention's scattered page reads see: on an H100 such a probe measured every
// SM within ±4 % of the mean, while attention ran 24 of the 132 SMs ~20 % faster in every launch
// (bench/results/decode_sm_balance_2026-12-07/).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cisa/cuda/backend.h"
#include "plan_impl.h"
#include "tile_sizes.cuh"

namespace cisa::cuda {
namespace {

// The calibration batch: decode rows of 4:1 GQA, one KV head, head dim 128, as many sequences as
// the layer benchmark's 4:1 geometry, each long enough that every block slot gets its pages.
constexpr int kSeqs = 16;
constexpr int kQHeads = 4;
constexpr int kDim = 128;

Status download(void* dst, const void* src, size_t bytes) {
  return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cuda: SM-rate download");
}

}  // namespace

Status measure_sm_rates(std::vector<float>* rates, int64_t pages_per_block, int repeats) {
  if (!rates) return invalid_argument("cuda: null output");
  if (pages_per_block < tiles::kMinSplitPages || pages_per_block > 4096)
    return invalid_argument("cuda: measure_sm_rates pages_per_block must be in [" +
                            std::to_string(tiles::kMinSplitPages) + ", 4096] (got " +
                            std::to_string(pages_per_block) + ")");
  if (repeats < 1 || repeats > 1000)
    return invalid_argument("cuda: measure_sm_rates repeats must be in [1, 1000] (got " +
                            std::to_string(repeats) + ")");
  const int sms = device_sms();
  const int64_t slots = int64_t{sms} * tiles::kDecodeBlocksPerSm;
  const int64_t per_seq = (slots * pages_per_block + kSeqs - 1) / kSeqs;  // pages a sequence
  const int64_t pool = per_seq * kSeqs;
  const int64_t page_values = int64_t{tiles::kPageSize} * kDim;  // one KV head
  DeviceBuffer k, v, tables, q, out;
  const auto kv_bytes = static_cast<size_t>(pool * page_values) * sizeof(uint16_t);
  CISA_RETURN_IF_ERROR(k.reserve(kv_bytes, "cuda: SM-rate keys"));
  CISA_RETURN_IF_ERROR(v.reserve(kv_bytes, "cuda: SM-rate values"));
  CISA_RETURN_IF_ERROR(tables.reserve(static_cast<size_t>(pool) * sizeof(int32_t), "cuda: tables"));
  CISA_RETURN_IF_ERROR(q.reserve(size_t{kSeqs} * kQHeads * kDim * sizeof(uint16_t), "cuda: q"));
  CISA_RETURN_IF_ERROR(out.reserve(size_t{kSeqs} * kQHeads * kDim * sizeof(float), "cuda: out"));
  CISA_RETURN_IF_ERROR(fill_random_bf16(k.as<uint16_t>(), pool * page_values, 1, 1.0f, nullptr));
  CISA_RETURN_IF_ERROR(fill_random_bf16(v.as<uint16_t>(), pool * page_values, 2, 1.0f, nullptr));
  CISA_RETURN_IF_ERROR(
      fill_random_bf16(q.as<uint16_t>(), kSeqs * kQHeads * kDim, 3, 1.0f, nullptr));
  // A sequence's pages scattered over the pool, as a long-running cache holds them.
  std::vector<int32_t> perm(static_cast<size_t>(pool));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  CISA_RETURN_IF_ERROR(
      cuda_status(cudaMemcpy(tables.as<void>(), perm.data(), perm.size() * sizeof(int32_t),
                             cudaMemcpyHostToDevice),
                  "cuda: SM-rate tables"));
  std::vector<int64_t> offsets(kSeqs + 1);
  std::vector<BatchEntry> batch(kSeqs);
  for (int s = 0; s <= kSeqs; ++s) offsets[static_cast<size_t>(s)] = s * per_seq;
  for (int s = 0; s < kSeqs; ++s)
    batch[static_cast<size_t>(s)] = {s, per_seq * tiles::kPageSize - 1, 1};
  DeviceLayer layer;
  layer.k = k.as<uint16_t>();
  layer.v = v.as<uint16_t>();
  layer.num_pages = pool;
  layer.num_kv_heads = 1;
  layer.head_dim = kDim;
  // Equal shares, one a block slot (two an SM): every block reads the same number of pages.
  PlanOptions options;
  options.even_shares = true;
  Plan plan;
  CISA_RETURN_IF_ERROR(plan_dense(layer, DeviceBlockTables{tables.as<int32_t>(), offsets}, batch,
                                  kQHeads, 0, &plan, options));
  const auto& P = *plan.impl();
  const auto per_block = static_cast<size_t>(std::max(P.tasks_per_block, 1));
  const size_t blocks = P.tasks.size() / per_block;
  if (static_cast<int64_t>(blocks) != slots)  // (run_attention_clocked checks the launch)
    return Status(StatusCode::kInternal,
                  "cuda: measure_sm_rates: the calibration plan is not one block a slot (" +
                      std::to_string(blocks) + " blocks for " + std::to_string(slots) + " slots)");
  std::vector<double> pages(blocks, 0.0);  // pages each block reads
  for (size_t b = 0; b < blocks; ++b)
    for (size_t j = 0; j < per_block; ++j) {
      const auto& t = P.tasks[b * per_block + j];
      if (t.rows > 0) pages[b] += static_cast<double>(t.page1 - t.page0);
    }
  DeviceBuffer clock;
  CISA_RETURN_IF_ERROR(clock.reserve(blocks * 3 * sizeof(int64_t), "cuda: SM-rate clock"));
  std::vector<int64_t> h_clock(blocks * 3);
  std::vector<std::vector<double>> per_sm(static_cast<size_t>(sms));
  for (int r = 0; r < repeats + 1; ++r) {  // the first launch warms up and is not counted
    // Zeroed first: a block that wrote nothing reads as a zero duration and is skipped.
    CISA_RETURN_IF_ERROR(
        cuda_status(cudaMemset(clock.as<void>(), 0, clock.bytes()), "cuda: SM-rate clock"));
    CISA_RETURN_IF_ERROR(run_attention_clocked(plan, layer, q.as<uint16_t>(), out.as<float>(),
                                               clock.as<int64_t>(), nullptr));
    CISA_RETURN_IF_ERROR(download(h_clock.data(), clock.as<void>(), h_clock.size() * 8));
    if (r == 0) continue;
    // An SM's rate in this launch: the mean of its blocks' pages per nanosecond.
    std::vector<double> sum(static_cast<size_t>(sms), 0.0);
    std::vector<int> count(static_cast<size_t>(sms), 0);
    for (size_t b = 0; b < blocks; ++b) {
      const int64_t s = h_clock[3 * b], ns = h_clock[3 * b + 2] - h_clock[3 * b + 1];
      if (s < 0 || s >= sms || ns <= 0 || pages[b] <= 0.0) continue;
      sum[static_cast<size_t>(s)] += pages[b] / static_cast<double>(ns);
      ++count[static_cast<size_t>(s)];
    }
    for (int s = 0; s < sms; ++s)
      if (count[static_cast<size_t>(s)] > 0)
        per_sm[static_cast<size_t>(s)].push_back(sum[static_cast<size_t>(s)] /
                                                 count[static_cast<size_t>(s)]);
  }
  rates->assign(static_cast<size_t>(sms), 0.0f);
  double mean = 0.0;
  for (int s = 0; s < sms; ++s) {
    auto& x = per_sm[static_cast<size_t>(s)];
    if (x.empty())
      return Status(StatusCode::kInternal,
                    "cuda: measure_sm_rates: no attention block ran on SM " + std::to_string(s));
    std::nth_element(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(x.size() / 2), x.end());
    (*rates)[static_cast<size_t>(s)] = static_cast<float>(x[x.size() / 2]);
    mean += x[x.size() / 2];
  }
  mean /= sms;
  for (auto& r : *rates) r = static_cast<float>(r / mean);
  return Status::Ok();
}

}  // namespace cisa::cuda
