// cisa traffic — the attention-traffic model of SPEC §8.
#include <cstdio>

#include "cisa/core/json.h"
#include "cisa/core/traffic.h"
#include "cli_args.h"
#include "cli_common.h"
#include "commands.h"

namespace cisa::cli {

namespace {

constexpr FailWith fail{"cisa traffic"};

Json point_json(const TrafficPoint& x) {
  Json j = Json::object();
  j["dense_elements"] = x.dense;
  j["cisa_elements"] = x.cisa;
  j["cisa_elements_no_window_tail"] = x.cisa_no_window;
  j["ratio"] = x.ratio();
  j["ratio_no_window_tail"] = x.ratio_no_window();
  return j;
}

// The check table of SPEC §8: N = 2^20, B = 16, no window.
int print_check_table(bool json) {
  Json rows = Json::array();
  if (!json)
    std::printf(
        "| k | nominal | G=1 (decode) | G=4 end | G=32 end | G=4 full "
        "|\n|---|---|---|---|---|---|\n");
  for (int64_t k : {8192, 4096, 2048}) {
    TrafficParams p{.context = 1 << 20, .budget = k, .window = 0, .qshare = 4, .page = 16};
    const double r1 = ceiling_ratio(p, 1), r4 = ceiling_ratio(p, 4), r32 = ceiling_ratio(p, 32);
    const double f4 = prefill_ceiling_ratio(p, 4);
    if (json) {
      Json r = Json::object();
      r["k"] = k;
      r["nominal"] = nominal_compression(p);
      r["decode_g1"] = r1;
      r["end_g4"] = r4;
      r["end_g32"] = r32;
      r["full_g4"] = f4;
      rows.push_back(r);
    } else {
      std::printf("| %lld | %.0fx | %.2fx | %.2fx | %.2fx | %.2fx |\n", static_cast<long long>(k),
                  nominal_compression(p), r1, r4, r32, f4);
    }
  }
  if (json) print_json(rows);
  return 0;
}

}  // namespace

int cmd_traffic(int argc, char** argv) {
  ArgParser a(
      "cisa traffic",
      "Elements of K, V and representatives read per query position, per KV group and layer,\n"
      "dense against CISA (SPEC section 8): at the end of a prefill, summed over a whole prefill,\n"
      "and for one decode step; with and without the recent window and current-page tail.");
  TrafficParams p;
  bool json = false, table = false;
  a.add_int("--context", &p.context, "context length N in tokens", {1, kMaxTrafficContext});
  a.add_int("--budget", &p.budget, "chunk budget k", {1, kMaxTrafficPages});
  a.add_int("--window", &p.window, "recent window W in pages (default 0)", {0, kMaxTrafficPages});
  a.add_int("--qshare", &p.qshare, "QShare group size G for prefill (default 1)",
            {1, kMaxTrafficPages});
  a.add_int("--page", &p.page, "page size B in tokens (default 16)", {1, kMaxTrafficPageSize});
  a.add_int("--head-dim", &p.head_dim, "head dimension d (default 128; ratios do not depend on it)",
            {1, kMaxTrafficHeadDim});
  a.add_flag("--table", &table, "print the check table of SPEC section 8 and exit");
  a.add_flag("--json", &json, "print one JSON document");
  if (int rc = a.parse(argc, argv); rc >= 0) return rc;
  if (table) return print_check_table(json);
  if (!a.given("--context") || !a.given("--budget")) {
    return fail("--context and --budget are required (or --table)", 2);
  }
  if (Status s = validate_traffic_params(p); !s.ok()) {
    return fail(s.message(), 2);
  }
  const TrafficReport r = attention_traffic(p);
  if (json) {
    Json j = Json::object();
    j["context"] = p.context;
    j["budget"] = p.budget;
    j["window"] = p.window;
    j["qshare"] = p.qshare;
    j["page"] = p.page;
    j["head_dim"] = p.head_dim;
    j["nominal_compression"] = r.nominal;
    j["end_of_prefill"] = point_json(r.end);
    j["whole_prefill"] = point_json(r.prefill);
    j["decode"] = point_json(r.decode);
    j["ceiling_end_of_prefill"] = r.ceiling_end;
    j["ceiling_decode"] = r.ceiling_decode;
    j["ceiling_whole_prefill"] = r.ceiling_prefill;
    print_json(j);
    return 0;
  }
  std::printf(
      "context N=%lld  k=%lld  W=%lld  G=%lld  B=%lld  d=%lld   nominal compression %.2fx\n\n",
      (long long)p.context, (long long)p.budget, (long long)p.window, (long long)p.qshare,
      (long long)p.page, (long long)p.head_dim, r.nominal);
  std::printf("%-26s %16s %16s %10s %16s %10s %10s\n", "", "dense elems", "CISA elems", "ratio",
              "CISA no W/tail", "ratio", "ceiling");
  auto row = [](const char* name, const TrafficPoint& x, double ceil) {
    std::printf("%-26s %16.4g %16.4g %9.2fx %16.4g %9.2fx %9.2fx\n", name, x.dense, x.cisa,
                x.ratio(), x.cisa_no_window, x.ratio_no_window(), ceil);
  };
  row("end of prefill (G)", r.end, r.ceiling_end);
  row("whole prefill (G)", r.prefill, r.ceiling_prefill);
  row("decode step (G=1)", r.decode, r.ceiling_decode);
  std::printf(
      "\nceilings: closed forms of SPEC section 8 (no window, no tail); elements per query\n"
      "position, per KV group and layer (whole prefill: summed over all N positions).\n");
  return 0;
}

}  // namespace cisa::cli
