// cisa bench layer's shared pieces (cmd_bench_layer.cpp runs the phases; bench_layer_reuse.cpp
// the decode rows with selection reuse): options, geometries, device buffers, one phase's run
// context and the timing helpers.
#pragma once

#ifdef CISA_WITH_CUDA

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_cuda_timing.h"
#include "cisa/core/json.h"
#include "cisa/cuda/backend.h"
#include "cli_common.h"

namespace cisa::cli::layer_bench {

inline constexpr FailWith fail{"cisa bench layer"};

struct Geometry {
  std::string name;
  int hq, hkv, seqs;
  std::vector<int64_t> prefill_g;  // QShare sizes of the paper for this geometry
};

struct Options {
  int64_t context = 1048576, budget = 4096, window = 128, prefill = 512, iters = 10, warmup = 3;
  std::string dump_dir, geometry = "all", phase = "all";
  bool contiguous = false;  // block tables in pool order instead of a random permutation
  // Planner switches for A/B runs (cuda::PlanOptions).
  std::string attention_kernel = "auto";
  int64_t blocks_per_sm = 0, ws_copy_warps = 0, score_tiles = 0;
  bool mma_unions = false, topk_one_block = false, fused_merge = false, even_shares = false;
  bool sm_rates = false;  // --sm-rates: measured once in the run, into PlanOptions::sm_rates
  bool no_attention_pdl = false;         // --no-attention-pdl: PlanOptions::attention_pdl off
  std::string rep_precision = "native";  // native (bf16) or int8 representatives
  bool int8() const { return rep_precision == "int8"; }
  cuda::PlanOptions plan_options() const {
    cuda::PlanOptions p;
    p.attention_kernel = attention_kernel == "mma"        ? cuda::AttentionKernel::kMma
                         : attention_kernel == "wgmma-v5" ? cuda::AttentionKernel::kWgmmaV5
                                                          : cuda::AttentionKernel::kAuto;
    p.blocks_per_sm = static_cast<int>(blocks_per_sm);
    p.ws_copy_warps = static_cast<int>(ws_copy_warps);
    p.score_tiles_per_block = static_cast<int>(score_tiles);
    p.wgmma_unions = !mma_unions;
    p.topk_staged = !topk_one_block;
    p.fused_merge = fused_merge;
    p.even_shares = even_shares;
    p.attention_pdl = !no_attention_pdl;
    return p;
  }
};

constexpr int kD = 128;
constexpr int kB = 16;

inline bool cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  fail(std::string(what) + ": " + cudaGetErrorString(e));
  return false;
}

// Median over `iters` runs of `launch` (after warm-up), timed with events around each run.
template <class F>
double median_ms(F&& launch, const Options& o) {
  return bench_timing::median_ms(launch, o.warmup, o.iters);
}
template <class F>
double graph_ms(F&& enqueue, const Options& o) {
  return bench_timing::graph_ms(enqueue, o.warmup, o.iters);
}

inline void must(const Status& s, const char* what) {
  if (!s.ok()) {
    std::exit(fail(std::string(what) + ": " + s.to_string()));
  }
}

struct Buffers {
  uint16_t *k = nullptr, *v = nullptr, *q = nullptr;
  void* reps = nullptr;  // bf16 or int8 (--rep-precision)
  int32_t *tables = nullptr, *rep_pages = nullptr;
  float *out = nullptr, *lse = nullptr, *index_q = nullptr;
  int8_t* rep_exps = nullptr;  // int8 representatives: each one's scale exponent
};

inline std::string fmt(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", x);
  return b;
}

struct PhaseRun {
  const Options& o;
  const Geometry& geo;
  const cuda::DeviceLayer& layer;
  const cuda::DeviceBlockTables& tables;
  const std::vector<BatchEntry>& batch;
  const Buffers& buf;
  const cuda::PlanOptions& popt;
  bool prefill;
  int64_t count;  // queries per sequence
  Json* results;
  FILE* table_out;
  std::string phase() const { return prefill ? "prefill" : "decode"; }
  double page_bytes() const { return 2.0 * kB * kD * 2; }  // K + V of one page of one KV head
  Json row(const char* method) const {                     // a result row's identifying fields
    Json j = Json::object();
    j["geometry"] = geo.name;
    j["seqs"] = geo.seqs;
    j["phase"] = phase();
    j["method"] = method;
    return j;
  }
};

// Decode with selection reuse: the r = 2, 4, 8 rows after a per-step decode row
// (bench_layer_reuse.cpp). other: the representatives' update per step; fixed_ms: setup +
// attention + other of the per-step row; dense_ms: our dense busy time.
void reuse_rows(const PhaseRun& run, double other, double fixed_ms, double dense_ms);

}  // namespace cisa::cli::layer_bench

#endif  // CISA_WITH_CUDA
