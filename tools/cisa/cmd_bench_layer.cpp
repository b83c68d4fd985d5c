// cisa bench layer — one attention layer on the GPU in the form of the paper's Table 11:
// attention, scoring, top-k, setup and other, and their GPU-busy sum, for dense and CISA, in the
// three geometries of the paper (4:1 × 16 sequences, 32:1 × 32, 32:2 × 16; d = 128) at a
// 1,048,576-token history, terminal prefill (512 queries per sequence) and steady decode.
// Each stage is timed alone with CUDA events: median of --iters runs after warm-up; busy_ms is
// their sum. step_ms is the whole step (selection stages, attention, merge) captured as one CUDA
// graph and replayed, timed the same way: no launch gaps between stages. Every run
// reads far more than the 60 MB L2 (K/V of ≥ 0.55 GB per step), so no run is served from the
// previous one's cache. The PyTorch anchors (cuDNN, FlashAttention, gather+FA, FlexAttention)
// are measured by bench/python/anchors_layer.py from the page lists this writes with --dump-lists.
#ifdef CISA_WITH_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_layer.h"
#include "cisa/core/json.h"
#include "cisa/cuda/backend.h"
#include "cli_args.h"
#include "cli_common.h"
#include "commands.h"

namespace cisa::cli::layer_bench {
namespace {

// Writes one plan's page lists (logical chunks) for the anchors script:
// int64 num_groups, num_kv, then per group (entry, first, last), offsets[num_lists+1], int32
// chunks.
void dump_lists(const std::string& path, const PageLists& l) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    fail("cannot write " + path);
    return;
  }
  const int64_t hdr[2] = {static_cast<int64_t>(l.groups.size()), l.num_kv_heads};
  std::fwrite(hdr, sizeof hdr, 1, f);
  for (const auto& g : l.groups) {
    const int64_t v[3] = {g.entry, g.first, g.last};
    std::fwrite(v, sizeof v, 1, f);
  }
  std::fwrite(l.offsets.data(), sizeof(int64_t), l.offsets.size(), f);
  std::fwrite(l.chunks.data(), sizeof(int32_t), l.chunks.size(), f);
  std::fclose(f);
}

// Mean fraction of selected chunks that adjacent groups of one (entry, KV group) share.
double adjacent_overlap(const PageLists& l, int64_t budget) {
  double sum = 0;
  int64_t n = 0;
  const int H = l.num_kv_heads;
  for (size_t i = 0; i + 1 < l.groups.size(); ++i) {
    if (l.groups[i].entry != l.groups[i + 1].entry || l.groups[i].dense) continue;
    for (int g = 0; g < H; ++g) {
      auto a = l.list_chunks(static_cast<int64_t>(i), g).subspan(0, static_cast<size_t>(budget));
      auto b =
          l.list_chunks(static_cast<int64_t>(i + 1), g).subspan(0, static_cast<size_t>(budget));
      std::vector<int32_t> both;
      std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
      sum += static_cast<double>(both.size()) / static_cast<double>(budget);
      ++n;
    }
  }
  return n ? sum / static_cast<double>(n) : 0.0;
}

// Index queries: adjacent positions of a sequence point the same way (as real ones do).
void upload_index_queries(const Geometry& geo, int64_t count, float* index_q, std::mt19937& rng) {
  const int64_t rows = geo.seqs * count;
  std::vector<float> iq(static_cast<size_t>(rows * geo.hkv * kD));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int s = 0; s < geo.seqs; ++s)
    for (int g = 0; g < geo.hkv; ++g) {
      std::vector<float> base(kD);
      for (auto& x : base) x = nd(rng);
      for (int64_t r = 0; r < count; ++r)
        for (int i = 0; i < kD; ++i)
          iq[static_cast<size_t>(((s * count + r) * geo.hkv + g) * kD + i)] =
              base[static_cast<size_t>(i)] + 0.3f * nd(rng);
    }
  cudaMemcpy(index_q, iq.data(), iq.size() * 4, cudaMemcpyHostToDevice);
}

struct DenseTimes {
  double setup = 0, attn = 0;
};

// Dense through the same kernels: one row. False on a CUDA error (reported).
bool dense_row(const PhaseRun& r, DenseTimes* times) {
  const Options& o = r.o;
  const Geometry& geo = r.geo;
  const std::string phase = r.phase();
  const double dense_flop =
      4.0 * static_cast<double>(geo.seqs * r.count) * geo.hq * static_cast<double>(o.context) * kD;
  cuda::Plan dense;
  Stopwatch clock;
  must(cuda::plan_dense(r.layer, r.tables, r.batch, geo.hq, 0, &dense, r.popt), "dense plan");
  const double dense_plan_host_ms = clock.ms();
  const double d_setup =
      median_ms([&] { (void)cuda::run_select(dense, r.layer, nullptr, nullptr); }, o);
  const double d_attn = median_ms(
      [&] {
        (void)cuda::run_attention(dense, r.layer, r.buf.q, 0.0f, r.buf.out, r.buf.lse, nullptr);
      },
      o);
  const double d_step = graph_ms(
      [&](cudaStream_t s) {
        (void)cuda::run_select(dense, r.layer, nullptr, s);
        (void)cuda::run_attention(dense, r.layer, r.buf.q, 0.0f, r.buf.out, r.buf.lse, s);
      },
      o);
  if (!cuda_ok(cudaGetLastError(), "dense run")) return false;
  const double dense_bytes = static_cast<double>(dense.total_pages()) * r.page_bytes();
  Json dj = r.row("dense");
  dj["setup_ms"] = d_setup;
  dj["attention_ms"] = d_attn;
  dj["busy_ms"] = d_setup + d_attn;
  if (d_step > 0) dj["step_ms"] = d_step;
  dj["host_plan_ms"] = dense_plan_host_ms;
  dj["kernels"] = dense.kernels();
  dj["kv_bytes"] = dense_bytes;
  dj["attention_tb_s"] = dense_bytes / (d_attn * 1e-3) / 1e12;
  dj["attention_tflop_s"] = dense_flop / (d_attn * 1e-3) / 1e12;
  r.results->push_back(dj);
  std::fprintf(
      r.table_out,
      "%-5s %-7s dense       attention %9s ms  setup %7s  busy %9s  %6.2f TB/s %6.1f TFLOP/s\n",
      geo.name.c_str(), phase.c_str(), fmt(d_attn).c_str(), fmt(d_setup).c_str(),
      fmt(d_setup + d_attn).c_str(), dense_bytes / (d_attn * 1e-3) / 1e12,
      dense_flop / (d_attn * 1e-3) / 1e12);
  *times = {d_setup, d_attn};
  return true;
}

// One CISA row at QShare size G (and, in decode, its selection-reuse rows). other: the
// representatives' update per step. False on a CUDA error (reported).
bool sparse_row(const PhaseRun& r, int64_t G, double other, const DenseTimes& d) {
  const Options& o = r.o;
  const Geometry& geo = r.geo;
  const cuda::DeviceLayer& layer = r.layer;
  const Buffers& buf = r.buf;
  const std::string phase = r.phase();
  const double page_bytes = r.page_bytes();
  const int64_t pages_per_seq = o.context / kB;
  const double d_setup = d.setup, d_attn = d.attn;
  Stopwatch clock;
  SelectionParams sp{.budget = o.budget, .window = o.window, .qshare = G};
  cuda::Plan plan;
  must(cuda::plan_sparse(layer, r.tables, r.batch, geo.hq, sp, &plan, r.popt), "sparse plan");
  const double host_ms = clock.ms();
  auto stage = [&](cuda::SelectStage st) {
    (void)cuda::run_select_stage(plan, layer, buf.index_q, st, nullptr);
  };
  const double setup = median_ms([&] { stage(cuda::SelectStage::kSetup); }, o);
  const double score = median_ms([&] { stage(cuda::SelectStage::kScore); }, o);
  const double topk = median_ms([&] { stage(cuda::SelectStage::kTopK); }, o);
  const double attn = median_ms(
      [&] { (void)cuda::run_attention(plan, layer, buf.q, 0.0f, buf.out, buf.lse, nullptr); }, o);
  const double step = graph_ms(
      [&](cudaStream_t s) {
        (void)cuda::run_select(plan, layer, buf.index_q, s);
        (void)cuda::run_attention(plan, layer, buf.q, 0.0f, buf.out, buf.lse, s);
      },
      o);
  if (!cuda_ok(cudaGetLastError(), "sparse run")) return false;
  PageLists lists;
  must(cuda::download_page_lists(plan, &lists), "download lists");
  const double busy = setup + score + topk + attn + other;
  const double bytes = static_cast<double>(plan.total_pages()) * page_bytes;
  int64_t read_pages = 0;
  must(cuda::count_read_pages(plan, &read_pages), "count read pages");
  const double read_bytes = static_cast<double>(read_pages) * page_bytes;
  // Ablation: the same lists attended one block per list (no KV-outer unions).
  double attn_no_unions = attn;
  if (plan.num_unions() > 0) {
    cuda::Plan flat;
    cuda::PlanOptions flat_options = r.popt;
    flat_options.group_unions = false;
    must(cuda::plan_sparse(layer, r.tables, r.batch, geo.hq, sp, &flat, flat_options), "flat plan");
    must(cuda::run_select(flat, layer, buf.index_q, nullptr), "flat select");
    attn_no_unions = median_ms(
        [&] { (void)cuda::run_attention(flat, layer, buf.q, 0.0f, buf.out, buf.lse, nullptr); }, o);
  }
  // Representative bytes scoring reads: bf16, or int8 codes and a 4-byte scale each.
  const double rep_bytes = static_cast<double>(geo.seqs) * geo.hkv * (pages_per_seq - o.window) *
                           (o.int8() ? kD + 4 : kD * 2);
  double tokens = 0;  // attended tokens summed over query rows
  for (size_t gi = 0; gi < lists.groups.size(); ++gi) {
    const auto& g = lists.groups[gi];
    tokens += static_cast<double>(lists.list_pages(static_cast<int64_t>(gi), 0).size()) * kB *
              static_cast<double>(g.last - g.first + 1) * geo.hq;
  }
  const double flop = 4.0 * tokens * kD;
  const std::string tag = geo.name.substr(0, geo.name.find(':')) + "x" +
                          geo.name.substr(geo.name.find(':') + 1) + "_" + phase + "_G" +
                          std::to_string(G);
  if (!o.dump_dir.empty()) dump_lists(o.dump_dir + "/" + tag + ".bin", lists);
  Json j = r.row("cisa");
  j["G"] = G;
  j["tag"] = tag;
  j["setup_ms"] = setup;
  j["scoring_ms"] = score;
  j["topk_ms"] = topk;
  j["attention_ms"] = attn;
  j["other_ms"] = other;
  j["busy_ms"] = busy;
  if (step > 0) j["step_ms"] = step + other;  // one graph replay (+ the reps' share)
  j["host_plan_ms"] = host_ms;
  j["lists"] = lists.num_lists();
  j["list_pages"] = plan.total_pages();
  j["kv_bytes"] = bytes;
  j["read_bytes"] = read_bytes;
  j["unions"] = plan.num_unions();
  j["kernels"] = plan.kernels();
  j["attention_ms_no_unions"] = attn_no_unions;
  j["rep_bytes"] = rep_bytes;
  j["attention_tb_s"] = read_bytes / (attn * 1e-3) / 1e12;
  j["attention_list_tb_s"] = bytes / (attn * 1e-3) / 1e12;
  j["attention_tflop_s"] = flop / (attn * 1e-3) / 1e12;
  j["scoring_tb_s"] = rep_bytes / (score * 1e-3) / 1e12;
  j["speedup_vs_own_dense"] = (d_setup + d_attn) / busy;
  j["adjacent_group_overlap"] = adjacent_overlap(lists, o.budget);
  r.results->push_back(j);
  std::fprintf(
      r.table_out,
      "%-5s %-7s cisa G=%-3lld attention %9s ms  setup %7s  score %7s  topk %7s  other %7s  "
      "busy %8s  step %8s"
      "  %6.2f TB/s %6.1f TFLOP/s  %5.2fx own dense  overlap %.2f  no-union attn %s\n",
      geo.name.c_str(), phase.c_str(), static_cast<long long>(G), fmt(attn).c_str(),
      fmt(setup).c_str(), fmt(score).c_str(), fmt(topk).c_str(), fmt(other).c_str(),
      fmt(busy).c_str(), step > 0 ? fmt(step + other).c_str() : "failed",
      read_bytes / (attn * 1e-3) / 1e12, flop / (attn * 1e-3) / 1e12, (d_setup + d_attn) / busy,
      adjacent_overlap(lists, o.budget), fmt(attn_no_unions).c_str());
  std::fprintf(r.table_out, "      kernels: %s\n", plan.kernels().c_str());
  if (!r.prefill) reuse_rows(r, other, setup + attn + other, d_setup + d_attn);
  return true;
}

}  // namespace

int run(int argc, char** argv) {
  ArgParser a(
      "cisa bench layer",
      "One-layer CUDA benchmark (paper Table 11 form): dense and CISA attention for 4:1 x 16,\n"
      "32:1 x 32 and 32:2 x 16 sequences, d = 128, terminal prefill and steady decode; stage\n"
      "times (setup, scoring, top-k, attention, other) as medians of CUDA-event timings.");
  Options o;
  std::string backend = "cuda";
  bool json = false;
  a.add_choice("--backend", &backend, {"cuda"}, "engine (only cuda)");
  a.add_int("--context", &o.context, "history length N in tokens (default 1048576)");
  a.add_int("--budget", &o.budget, "chunk budget k (default 4096)");
  a.add_int("--window", &o.window, "recent window W in pages (default 128)");
  a.add_int("--prefill-queries", &o.prefill,
            "queries per sequence in the terminal prefill (default 512)");
  a.add_int("--iters", &o.iters, "timed runs per measurement (default 10)");
  a.add_int("--warmup", &o.warmup, "untimed runs first (default 3)");
  a.add_choice("--geometry", &o.geometry, {"all", "4:1", "32:1", "32:2"},
               "geometry to run (default all)");
  a.add_choice("--phase", &o.phase, {"all", "prefill", "decode"}, "phase to run (default all)");
  a.add_flag("--contiguous-pages", &o.contiguous,
             "block tables in pool order (consecutive pages adjacent in memory) instead of a "
             "random permutation");
  a.add_string("--dump-lists", &o.dump_dir,
               "write each plan's page lists here for bench/python/anchors_layer.py");
  a.add_choice("--attention-kernel", &o.attention_kernel, {"auto", "mma", "wgmma-v5"},
               "attention mainloop: auto (wgmma for full prefill tiles at d = 128), mma (mma.sync "
               "everywhere) or wgmma-v5 (the v4/v5 kernel instead of the warp-specialised one)");
  a.add_flag("--mma-unions", &o.mma_unions,
             "union tasks (4:1, G = 4) on mma.sync instead of the warp-specialised wgmma kernel "
             "(PlanOptions::wgmma_unions off; the v9 path, for A/B runs)");
  a.add_flag("--topk-one-block", &o.topk_one_block,
             "prefill top-k on the one-block kernel that reads the scores once a radix pass "
             "instead of v7's (keys' top 16 bits staged in shared memory; PlanOptions::topk_staged "
             "off, for A/B runs)");
  a.add_flag("--fused-merge", &o.fused_merge,
             "decode: the last split block of each list merges the split-KV partials inside the "
             "attention launch, no merge launch (PlanOptions::fused_merge, for A/B runs)");
  a.add_flag("--even-shares", &o.even_shares,
             "decode: every block slot gets an equal share of the plan's pages, a share that "
             "crosses a list's end running two tasks (PlanOptions::even_shares, for A/B runs)");
  a.add_flag("--sm-rates", &o.sm_rates,
             "decode, with --even-shares: measure each SM's rate of running decode attention "
             "once (cuda::measure_sm_rates) and size every SM's shares by it, a block taking "
             "its SM's share (PlanOptions::sm_rates)");
  a.add_flag("--no-attention-pdl", &o.no_attention_pdl,
             "launch attention as an ordinary kernel, not a programmatic dependent of the kernel "
             "before it (PlanOptions::attention_pdl off, for A/B runs)");
  a.add_int("--blocks-per-sm", &o.blocks_per_sm,
            "split-KV target blocks per SM (default 0: tile_sizes.cuh's)", {0, 1024});
  a.add_int("--score-tiles", &o.score_tiles,
            "tiles of 512 chunks per block of the decode scoring kernel (default 0: "
            "tile_sizes.cuh's)",
            {0, 1024});
  a.add_int("--ws-copy-warps", &o.ws_copy_warps,
            "producer warps copying K/V in 128-row wgmma tiles: 1, or 0 for the default", {0, 1});
  a.add_choice("--rep-precision", &o.rep_precision, {"native", "int8"},
               "representatives: native (bf16) or int8 codes with a power-of-two scale each "
               "(default native)");
  a.add_flag("--json", &json, "print one JSON document on stdout (the table goes to stderr)");
  if (int rc = a.parse(argc, argv); rc >= 0) return rc;
  if (o.context % kB || o.context < 2 * o.prefill || o.iters < 1 || o.warmup < 0 || o.prefill < 1) {
    return fail("need --context a multiple of 16 and >= 2 x --prefill-queries, --iters >= 1", 2);
  }
  // The rates size the shares of --even-shares; alone they would be measured and then ignored.
  if (o.sm_rates && !o.even_shares)
    return fail("--sm-rates sizes --even-shares: add --even-shares", 2);
  std::string why;
  if (!cuda::device_available(&why)) {
    return fail("no usable CUDA device (" + why + ")");
  }
  FILE* table_out = json ? stderr : stdout;
  std::vector<Geometry> geos = {
      {"4:1", 4, 1, 16, {4, 16, 32}}, {"32:1", 32, 1, 32, {4}}, {"32:2", 32, 2, 16, {4}}};
  if (o.geometry != "all")
    geos.erase(std::remove_if(geos.begin(), geos.end(),
                              [&](const Geometry& g) { return g.name != o.geometry; }),
               geos.end());

  // One set of buffers sized for the largest geometry, filled once with random values.
  const int64_t pages_per_seq = o.context / kB;
  int64_t max_kv_pages = 0, max_pages = 0, max_q = 0, max_rows_kv = 0;
  for (const auto& g : geos) {
    max_pages = std::max(max_pages, g.seqs * pages_per_seq);
    max_kv_pages = std::max(max_kv_pages, g.seqs * pages_per_seq * g.hkv);
    max_q = std::max(max_q, g.seqs * o.prefill * g.hq);
    max_rows_kv = std::max(max_rows_kv, g.seqs * o.prefill * g.hkv);
  }
  Buffers buf;
  const size_t kv_elems = static_cast<size_t>(max_kv_pages) * kB * kD;
  if (!cuda_ok(cudaMalloc(&buf.k, kv_elems * 2), "K pool") ||
      !cuda_ok(cudaMalloc(&buf.v, kv_elems * 2), "V pool") ||
      !cuda_ok(cudaMalloc(&buf.reps, static_cast<size_t>(max_kv_pages) * kD * (o.int8() ? 1 : 2)),
               "representatives") ||
      !cuda_ok(cudaMalloc(&buf.rep_exps, static_cast<size_t>(max_kv_pages)),
               "representative scale exponents") ||
      !cuda_ok(cudaMalloc(&buf.q, static_cast<size_t>(max_q) * kD * 2), "queries") ||
      !cuda_ok(cudaMalloc(&buf.out, static_cast<size_t>(max_q) * kD * 4), "output") ||
      !cuda_ok(cudaMalloc(&buf.lse, static_cast<size_t>(max_q) * 4), "lse") ||
      !cuda_ok(cudaMalloc(&buf.index_q, static_cast<size_t>(max_rows_kv) * kD * 4),
               "index queries") ||
      !cuda_ok(cudaMalloc(&buf.tables, static_cast<size_t>(max_pages) * 4), "block tables") ||
      !cuda_ok(cudaMalloc(&buf.rep_pages, static_cast<size_t>(max_pages) * 4), "rep page list"))
    return 1;
  must(cuda::fill_random_bf16(buf.k, static_cast<int64_t>(kv_elems), 1, 1.0f, nullptr), "fill K");
  must(cuda::fill_random_bf16(buf.v, static_cast<int64_t>(kv_elems), 2, 1.0f, nullptr), "fill V");
  must(cuda::fill_random_bf16(buf.q, max_q * kD, 3, 1.0f, nullptr), "fill Q");

  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  int driver = 0;
  cudaDriverGetVersion(&driver);
  Json doc = Json::object();
  doc["gpu"] = prop.name;
  doc["cuda_driver_api"] = driver;
  doc["sms"] = prop.multiProcessorCount;
  doc["l2_bytes"] = prop.l2CacheSize;
  doc["context"] = o.context;
  doc["budget"] = o.budget;
  doc["window"] = o.window;
  doc["prefill_queries"] = o.prefill;
  doc["iters"] = o.iters;
  doc["block_tables"] =
      o.contiguous ? "pool order (--contiguous-pages)" : "random permutation of the pool";
  doc["kernels"] =
      "v10: v5 (cluster top-k, tensor-core prefill scoring, page-ID-first decode scoring, KV-outer "
      "unions) + warp-specialised wgmma kernel (producer warps, mbarriers; 128-row tiles with "
      "ping-pong consumer warpgroups, <= 64-row tiles and union tasks two per block), one-wave "
      "decode splits, warp-per-row split-KV merge; union tasks on wgmma (v10; --mma-unions: on "
      "mma.sync); prefill top-k v7, keys' top 16 bits staged in shared memory (--topk-one-block: "
      "the one-block kernel)";
  // --sm-rates: each SM's rate of running decode attention, measured once, sizes the shares.
  std::vector<float> sm_rates;
  if (o.sm_rates) must(cuda::measure_sm_rates(&sm_rates), "SM rates");
  const cuda::PlanOptions popt = [&] {
    cuda::PlanOptions p = o.plan_options();
    p.sm_rates = sm_rates;
    return p;
  }();
  doc["attention_mainloop"] =
      popt.attention_kernel == cuda::AttentionKernel::kMma
          ? "mma.sync everywhere (--attention-kernel mma)"
      : popt.attention_kernel == cuda::AttentionKernel::kWgmmaV5
          ? "v4/v5 wgmma kernel for full prefill tiles (--attention-kernel wgmma-v5)"
      : popt.wgmma_unions ? "wgmma for prefill tiles and union tasks at d = 128 "
                            "(warp-specialised), mma.sync elsewhere"
                          : "wgmma for full prefill tiles at d = 128 (warp-specialised), "
                            "mma.sync elsewhere (union tasks included; --mma-unions)";
  if (popt.blocks_per_sm > 0) doc["blocks_per_sm"] = popt.blocks_per_sm;
  if (popt.ws_copy_warps > 0) doc["ws_copy_warps"] = popt.ws_copy_warps;
  if (popt.score_tiles_per_block > 0) doc["score_tiles_per_block"] = popt.score_tiles_per_block;
  doc["wgmma_unions"] = popt.wgmma_unions;
  doc["topk_staged"] = popt.topk_staged;
  doc["fused_merge"] = popt.fused_merge;
  doc["even_shares"] = popt.even_shares;
  doc["attention_pdl"] = popt.attention_pdl;
  if (!sm_rates.empty()) {
    Json rates = Json::array();
    for (float r : sm_rates) rates.push_back(static_cast<double>(r));
    doc["sm_rates"] = rates;
    const auto [lo, hi] = std::minmax_element(sm_rates.begin(), sm_rates.end());
    std::fprintf(stderr, "SM rates (relative to their mean): min %.3f max %.3f\n",
                 static_cast<double>(*lo), static_cast<double>(*hi));
  }
  doc["rep_precision"] = o.rep_precision;
  doc["index_query_model"] =
      "per sequence and KV group: base ~ N(0,1) plus per-position noise N(0, 0.3^2)";
  Json results = Json::array();
  std::mt19937 rng(42);

  for (const auto& geo : geos) {
    const int64_t P = geo.seqs * pages_per_seq;
    // Block tables: a random permutation of the pool, so a sequence's pages are scattered.
    std::vector<int32_t> perm(static_cast<size_t>(P));
    std::iota(perm.begin(), perm.end(), 0);
    if (!o.contiguous) std::shuffle(perm.begin(), perm.end(), rng);
    cudaMemcpy(buf.tables, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice);
    std::vector<int64_t> offsets(static_cast<size_t>(geo.seqs) + 1);
    for (int s = 0; s <= geo.seqs; ++s) offsets[static_cast<size_t>(s)] = s * pages_per_seq;
    cuda::DeviceLayer layer{buf.k, buf.v, buf.reps, P, geo.hkv, kD, kB, RepKind::kMean};
    if (o.int8()) {
      layer.rep_exps = buf.rep_exps;
      layer.rep_precision = RepPrecision::kInt8;
    }
    cuda::DeviceBlockTables tables{buf.tables, offsets};
    std::vector<int32_t> all(static_cast<size_t>(P));
    std::iota(all.begin(), all.end(), 0);
    cudaMemcpy(buf.rep_pages, all.data(), all.size() * 4, cudaMemcpyHostToDevice);
    must(cuda::run_update_reps(layer, buf.rep_pages, P, nullptr), "representatives");
    cudaDeviceSynchronize();

    for (const bool prefill : {true, false}) {
      if (o.phase != "all" && (o.phase == "prefill") != prefill) continue;
      const int64_t count = prefill ? o.prefill : 1;
      std::vector<BatchEntry> batch;
      for (int s = 0; s < geo.seqs; ++s)
        batch.push_back({s, o.context - count, static_cast<int32_t>(count)});
      upload_index_queries(geo, count, buf.index_q, rng);
      const PhaseRun run{o,    geo,     layer, tables,   batch,    buf,
                         popt, prefill, count, &results, table_out};
      DenseTimes dense;
      if (!dense_row(run, &dense)) return 1;
      // Pages this step fills: prefill 512/16 per sequence; decode one every 16 steps.
      const int64_t fill_pages = prefill ? geo.seqs * (count / kB) : geo.seqs;
      const double other =
          median_ms([&] { (void)cuda::run_update_reps(layer, buf.rep_pages, fill_pages, nullptr); },
                    o) *
          (prefill ? 1.0 : 1.0 / kB);
      for (int64_t G : prefill ? geo.prefill_g : std::vector<int64_t>{1})
        if (!sparse_row(run, G, other, dense)) return 1;
    }
  }
  doc["results"] = results;
  cudaFree(buf.k);
  cudaFree(buf.v);
  cudaFree(buf.reps);
  cudaFree(buf.rep_exps);
  cudaFree(buf.q);
  cudaFree(buf.out);
  cudaFree(buf.lse);
  cudaFree(buf.index_q);
  cudaFree(buf.tables);
  cudaFree(buf.rep_pages);
  if (json) print_json(doc);
  return 0;
}

}  // namespace cisa::cli::layer_bench

namespace cisa::cli {
int bench_layer(int argc, char** argv) {
  return layer_bench::run(argc, argv);
}
}  // namespace cisa::cli

#endif  // CISA_WITH_CUDA
