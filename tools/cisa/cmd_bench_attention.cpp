// cisa bench attention — dense against CISA attention for one layer on the CPU, in one run.
//
// For each geometry (query heads : KV heads) it fills one sequence of N random tokens and times
// a decode step at the last position and a terminal prefill block (the last P positions), dense
// (plan_dense + attend) and CISA (select_pages + attend), median of several runs with the caches
// flushed before each. It also measures the machine's read bandwidth, so the memory-bound decode
// can be judged against it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cisa/core/atomic_file.h"
#include "cisa/core/json.h"
#include "cisa/core/membw.h"
#include "cisa/core/traffic.h"
#include "cisa/cpu/attention.h"
#include "cisa/cpu/selection.h"
#include "cli_args.h"
#include "cli_common.h"
#include "commands.h"

namespace cisa::cli {

namespace {

constexpr FailWith fail{"cisa bench attention"};

struct Options {
  int64_t context = 65536, budget = 256, window = 32, qshare = 16, prefill = 512, head_dim = 128;
  int64_t repeats = 10, threads = 0;
  std::string backend = "cpu", dtype = "bf16", geometry = "all", phase = "all";
};

struct Timing {
  double median_ms = 0, min_ms = 0;
  double select_ms = 0;  // CISA: median of the selection step alone
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Geometry {
  int hq, hkv;
};

// K/V bytes a page list makes the queries read (visible tokens of each page, K and V), plus the
// representatives scored; and the attention FLOPs (4·d per query-head per visible token).
struct Work {
  double bytes = 0, flops = 0;
};

struct Row {
  std::string geometry, phase;
  int32_t queries;
  Timing dense, cisa;
  Work dense_work, cisa_work;
};

Json row_json(const Row& r, double bw) {
  Json j = Json::object();
  j["geometry"] = r.geometry;
  j["phase"] = r.phase;
  j["queries"] = r.queries;
  j["dense_ms"] = r.dense.median_ms;
  j["dense_min_ms"] = r.dense.min_ms;
  j["cisa_ms"] = r.cisa.median_ms;
  j["cisa_min_ms"] = r.cisa.min_ms;
  j["cisa_select_ms"] = r.cisa.select_ms;
  j["cisa_attention_ms"] = r.cisa.median_ms - r.cisa.select_ms;
  j["speedup"] = r.dense.median_ms / r.cisa.median_ms;
  j["dense_bytes"] = r.dense_work.bytes;
  j["cisa_bytes"] = r.cisa_work.bytes;
  j["bytes_ratio"] = r.dense_work.bytes / r.cisa_work.bytes;
  j["dense_gbs"] = r.dense_work.bytes / r.dense.median_ms / 1e6;
  j["cisa_gbs"] = r.cisa_work.bytes / r.cisa.median_ms / 1e6;
  j["dense_fraction_of_bandwidth"] = r.dense_work.bytes / r.dense.median_ms / 1e6 / bw;
  j["dense_gflops"] = r.dense_work.flops / r.dense.median_ms / 1e6;
  j["cisa_gflops"] = r.cisa_work.flops / r.cisa.median_ms / 1e6;
  return j;
}

Work count_work(const PagedKvCache& c, const PageLists& lists, int hq, int64_t eligible_scored) {
  Work w;
  const int B = c.page_size(), d = c.head_dim(), hg = hq / c.num_kv_heads();
  for (size_t gi = 0; gi < lists.groups.size(); ++gi) {
    const auto& g = lists.groups[gi];
    for (int kv = 0; kv < c.num_kv_heads(); ++kv) {
      int64_t tokens_read = 0;
      for (int32_t j : lists.list_chunks(static_cast<int64_t>(gi), kv)) {
        const int64_t s0 = static_cast<int64_t>(j) * B;
        tokens_read += std::clamp<int64_t>(g.last - s0 + 1, 0, B);
        for (int64_t t = g.first; t <= g.last; ++t)
          w.flops += 4.0 * d * hg * static_cast<double>(std::clamp<int64_t>(t - s0 + 1, 0, B));
      }
      w.bytes += static_cast<double>(tokens_read) * 2 * d * c.elem_bytes();
    }
  }
  w.bytes += static_cast<double>(eligible_scored) * c.rep_width() * c.elem_bytes();
  return w;
}

constexpr int64_t kBandwidthBytes = int64_t{1} << 30;  // the read-bandwidth buffer

KvCacheConfig cache_config(const Options& o, const Geometry& g, KvDtype dtype) {
  return {.num_layers = 1,
          .num_kv_heads = g.hkv,
          .head_dim = static_cast<int>(o.head_dim),
          .page_size = 16,
          .num_pages = o.context / 16 + 1,
          .dtype = dtype};
}

// MemAvailable of /proc/meminfo in bytes: what can be allocated without swapping; -1 if unknown.
int64_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("MemAvailable:", 0) == 0) {
      const long long kib = std::atoll(line.c_str() + 13);  // "MemAvailable:   123456 kB"
      return kib > 0 ? static_cast<int64_t>(kib) * 1024 : -1;
    }
  return -1;
}

// The runs of one invocation: a K/V cache of random values per geometry, then dense and CISA
// for each phase on the same lists' inputs. One random stream for all of it.
struct Bench {
  const Options& o;
  ThreadPool& pool;
  CacheFlusher& flusher;
  std::mt19937 rng{1234};
  std::normal_distribution<float> nd{0.0f, 1.0f};
  AttentionWorkspace ws;
  PageLists lists;

  void progress(const std::string& what) { std::fprintf(stderr, "  %s\n", what.c_str()); }

  // Appends the rows of geometry `geo` (every phase asked for).
  Status geometry(const Geometry& geo, KvDtype dtype, const SelectionParams& sp,
                  std::vector<Row>* rows) {
    const int d = static_cast<int>(o.head_dim);
    const std::string gname = std::to_string(geo.hq) + ":" + std::to_string(geo.hkv);
    progress("[" + gname + "] filling " + std::to_string(o.context) + " tokens of random K/V");
    CISA_ASSIGN_OR_RETURN(auto cache, PagedKvCache::create(cache_config(o, geo, dtype)));
    const SeqId seq = *cache->add_sequence();
    const int64_t chunk = 4096;
    std::vector<float> k(static_cast<size_t>(chunk * geo.hkv * d)), v(k.size());
    for (int64_t done = 0; done < o.context; done += chunk) {
      const int64_t n = std::min(chunk, o.context - done);
      for (auto& x : k) x = nd(rng);
      for (auto& x : v) x = nd(rng);
      CISA_RETURN_IF_ERROR(cache->reserve(seq, n));
      CISA_RETURN_IF_ERROR(cache->append(0, seq, n, k.data(), v.data()));
    }
    for (const char* phase : {"decode", "prefill"}) {
      if (o.phase != "all" && o.phase != phase) continue;
      CISA_ASSIGN_OR_RETURN(Row r, measure_phase(*cache, seq, geo, gname, phase, sp));
      rows->push_back(std::move(r));
    }
    return Status::Ok();
  }

  // Dense and CISA attention of one phase: decode at the last position, or the terminal prefill
  // block; medians after a warm-up, caches flushed before each run.
  Result<Row> measure_phase(const PagedKvCache& cache, SeqId seq, const Geometry& geo,
                            const std::string& gname, const char* phase,
                            const SelectionParams& sp) {
    const int d = static_cast<int>(o.head_dim);
    const bool decode = std::string(phase) == "decode";
    const int32_t nq = decode ? 1 : static_cast<int32_t>(o.prefill);
    std::vector<BatchEntry> batch = {{seq, o.context - nq, nq}};
    std::vector<float> q(static_cast<size_t>(nq) * geo.hq * d),
        iq(static_cast<size_t>(nq) * geo.hkv * d);
    for (auto& x : q) x = nd(rng);
    for (auto& x : iq) x = nd(rng);
    std::vector<float> out(q.size()), lse(static_cast<size_t>(nq) * geo.hq);
    SelectionParams p = sp;
    if (decode) p.qshare = 1;
    const int64_t reps_dense = decode ? o.repeats : std::max<int64_t>(3, o.repeats / 3);

    auto run = [&](bool cisa, int64_t reps, Timing* t, Work* w) -> Status {
      std::vector<double> total, sel;
      for (int64_t r = 0; r <= reps; ++r) {  // r = 0 is the warm-up
        flusher.flush(pool);
        const Stopwatch clock;
        if (cisa)
          CISA_RETURN_IF_ERROR(select_pages(cache, 0, batch, iq.data(), p, &pool, &lists));
        else
          CISA_RETURN_IF_ERROR(plan_dense(cache, 0, batch, 0, &lists));
        const double select_ms = clock.ms();
        CISA_RETURN_IF_ERROR(attend(cache, 0, batch, lists, q.data(), geo.hq, {}, out.data(),
                                    lse.data(), pool, &ws));
        const double total_ms = clock.ms();
        if (r > 0) {
          total.push_back(total_ms);
          sel.push_back(select_ms);
        }
      }
      t->median_ms = median(total);
      t->min_ms = *std::min_element(total.begin(), total.end());
      t->select_ms = median(sel);
      int64_t scored = 0;
      for (const auto& g : lists.groups)
        if (!g.dense) scored += eligible_count(g.first, 16, p) * geo.hkv;
      *w = count_work(cache, lists, geo.hq, scored);
      return Status::Ok();
    };
    Row row{gname, phase, nq, {}, {}, {}, {}};
    progress("[" + gname + "] " + phase + ": dense x" + std::to_string(reps_dense));
    CISA_RETURN_IF_ERROR(run(false, reps_dense, &row.dense, &row.dense_work));
    progress("[" + gname + "] " + phase + ": CISA x" + std::to_string(o.repeats));
    CISA_RETURN_IF_ERROR(run(true, o.repeats, &row.cisa, &row.cisa_work));
    return row;
  }
};

void print_table(const Options& o, int threads, double bw, const std::vector<Row>& rows) {
  std::printf(
      "CPU attention, one layer: N=%lld  k=%lld  W=%lld  G=%lld  d=%lld  %s K/V  %d threads\n",
      (long long)o.context, (long long)o.budget, (long long)o.window, (long long)o.qshare,
      (long long)o.head_dim, o.dtype.c_str(), threads);
  std::printf("measured memory read bandwidth: %.2f GB/s\n\n", bw);
  std::printf("%-6s %-8s %10s %10s %8s %11s %8s %10s %10s %10s %9s\n", "heads", "phase", "dense ms",
              "CISA ms", "speedup", "dense GB/s", "% of BW", "CISA GB/s", "dense GF/s", "CISA GF/s",
              "select ms");
  for (const auto& r : rows) {
    const double dg = r.dense_work.bytes / r.dense.median_ms / 1e6,
                 cg = r.cisa_work.bytes / r.cisa.median_ms / 1e6;
    std::printf("%-6s %-8s %10.3f %10.3f %7.2fx %11.2f %7.1f%% %10.2f %10.2f %10.2f %9.3f\n",
                r.geometry.c_str(), r.phase.c_str(), r.dense.median_ms, r.cisa.median_ms,
                r.dense.median_ms / r.cisa.median_ms, dg, 100 * dg / bw, cg,
                r.dense_work.flops / r.dense.median_ms / 1e6,
                r.cisa_work.flops / r.cisa.median_ms / 1e6, r.cisa.select_ms);
  }
  std::printf(
      "\nms: median after a warm-up, caches flushed before each run; GB/s counts the K/V bytes "
      "the\n"
      "queries' page lists make visible plus the representatives scored; speedup = dense / "
      "CISA.\n");
}

}  // namespace

int bench_attention(int argc, char** argv) {
  ArgParser a(
      "cisa bench attention",
      "Dense against CISA attention for one layer, in one run: decode at the last position and a\n"
      "terminal prefill block, for 4:1 and 32:8 query:KV heads at d = 128. Prints ms, GB/s and\n"
      "GFLOP/s, the speedup, and the memory read bandwidth it measures on this machine.");
  Options o;
  bool json = false;
  std::string out_file;
  a.add_choice("--backend", &o.backend, {"cpu", "cuda"},
               "engine to run (default cpu; cuda: see `cisa bench layer`)");
  a.add_int("--context", &o.context, "history length N in tokens (default 65536)",
            {2, kMaxContextTokens});
  a.add_int("--budget", &o.budget, "chunk budget k (default 256)", {1, kMaxSelectionPages});
  a.add_int("--window", &o.window, "recent window W in pages (default 32)",
            {0, kMaxSelectionPages});
  a.add_int("--qshare", &o.qshare, "QShare group size G for prefill (default 16)",
            {1, kMaxSelectionPages});
  a.add_int("--prefill-queries", &o.prefill, "queries in the terminal prefill block (default 512)",
            {1, 65536});
  a.add_choice("--dtype", &o.dtype, {"bf16", "f32"}, "K/V storage (default bf16)");
  a.add_choice("--geometry", &o.geometry, {"all", "4:1", "32:8"},
               "query:KV heads to run (default all)");
  a.add_choice("--phase", &o.phase, {"all", "decode", "prefill"}, "phases to run (default all)");
  a.add_int("--repeats", &o.repeats,
            "timed runs per measurement; prefill dense uses a third (default 10)", {1, 100000});
  a.add_int("--threads", &o.threads, "worker threads (default: all hardware threads)", {0, 1024});
  a.add_string("--out", &out_file, "also write the JSON document to this file");
  a.add_flag("--json", &json, "print one JSON document on stdout");
  if (int rc = a.parse(argc, argv); rc >= 0) return rc;
  if (o.backend == "cuda") {
    return fail("the CUDA backend is benchmarked by `cisa bench layer --backend cuda`", 2);
  }
  if (o.context < 2 * o.prefill || o.prefill <= 0 || o.repeats <= 0) {
    return fail("need --context >= 2 x --prefill-queries > 0 and --repeats > 0", 2);
  }
  SelectionParams sp{.budget = o.budget, .window = o.window, .qshare = o.qshare};
  if (Status s = validate_selection_params(sp); !s.ok()) {
    return fail(s.message(), 2);
  }
  const KvDtype dtype = *parse_kv_dtype(o.dtype);
  std::vector<Geometry> geos;
  if (o.geometry != "32:8") geos.push_back({4, 1});
  if (o.geometry != "4:1") geos.push_back({32, 8});
  // Refuse before allocating what the machine does not have (an OOM kill says nothing).
  int64_t need = 0;
  for (const Geometry& g : geos) need = std::max(need, kv_cache_bytes(cache_config(o, g, dtype)));
  need += kBandwidthBytes;
  if (const int64_t avail = available_memory_bytes(); avail >= 0 && need > avail) {
    std::fprintf(
        stderr,
        "cisa bench attention: --context %lld needs about %.1f GiB of memory (K/V cache and "
        "the bandwidth buffer), %.1f GiB is available (MemAvailable)\n",
        static_cast<long long>(o.context), static_cast<double>(need) / (1 << 30),
        static_cast<double>(avail) / (1 << 30));
    return 1;
  }
  if (!out_file.empty())
    if (Status s = check_output_path(out_file); !s.ok()) {
      return fail("--out: " + s.message(), 2);
    }
  ThreadPool pool(static_cast<int>(o.threads));
  std::fprintf(stderr, "  measuring memory read bandwidth (1 GiB, best of 5)\n");
  const double bw = measure_read_bandwidth(pool, kBandwidthBytes, 5);
  CacheFlusher flusher;

  std::vector<Row> rows;
  Bench bench{o, pool, flusher};
  for (const Geometry& geo : geos)
    if (Status st = bench.geometry(geo, dtype, sp, &rows); !st.ok()) return fail(st.to_string());

  Json doc = Json::object();
  doc["benchmark"] = "attention";
  std::string command = "cisa bench";
  for (int i = 0; i < argc; ++i) command += std::string(" ") + argv[i];
  doc["command"] = command;
  doc["date_utc"] = utc_now();
  const std::string cpu = cpu_model_name();
  doc["cpu"] = cpu.empty() ? "unknown" : cpu;
  doc["backend"] = "cpu";
  doc["context"] = o.context;
  doc["budget"] = o.budget;
  doc["window"] = o.window;
  doc["qshare"] = o.qshare;
  doc["prefill_queries"] = o.prefill;
  doc["head_dim"] = o.head_dim;
  doc["dtype"] = o.dtype;
  doc["threads"] = pool.num_threads();
  doc["read_bandwidth_gbs"] = bw;
  Json results = Json::array();
  for (const auto& r : rows) results.push_back(row_json(r, bw));
  doc["results"] = results;
  if (!out_file.empty())
    if (Status s = write_json_atomic(out_file, doc); !s.ok()) {
      return fail("--out: " + s.message());
    }
  if (json) {
    print_json(doc);
    return 0;
  }
  print_table(o, pool.num_threads(), bw, rows);
  return 0;
}

}  // namespace cisa::cli
