// The attention configurations `cisa eval` compares, parsed from "kind:opt:opt" strings and
// turned into the model's attention options at a prompt length.
#include <algorithm>
#include <charconv>
#include <cmath>

#include "cisa/core/plan.h"
#include "eval_internal.h"

namespace cisa::eval {
namespace {

bool parse_i64(std::string_view s, int64_t* out) {
  if (s.empty()) return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

}  // namespace

Result<EvalConfig> parse_config(std::string_view text) {
  EvalConfig c;
  c.name = std::string(text);
  std::vector<std::string_view> parts;
  for (size_t b = 0;;) {
    const size_t e = text.find(':', b);
    parts.push_back(text.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b));
    if (e == std::string_view::npos) break;
    b = e + 1;
  }
  const std::string_view kind = parts[0];
  if (kind == "dense")
    c.kind = ConfigKind::kDense;
  else if (kind == "cisa")
    c.kind = ConfigKind::kCisa;
  else if (kind == "quest")
    c.kind = ConfigKind::kQuest;
  else if (kind == "recency")
    c.kind = ConfigKind::kRecency;
  else if (kind == "oracle")
    c.kind = ConfigKind::kOracle;
  else
    return invalid_argument("config '" + c.name + "': unknown kind '" + std::string(kind) +
                            "' (dense, cisa, quest, recency, oracle)");
  if (c.kind == ConfigKind::kDense && parts.size() > 1)
    return invalid_argument("config '" + c.name + "': dense takes no options");
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string_view p = parts[i];
    auto bad = [&] {
      return invalid_argument("config '" + c.name + "': bad option '" + std::string(p) +
                              "' (kN budget, xR compression, gN QShare G, wN window, sN sinks, dN "
                              "dense layers, mean|last, cal)");
    };
    if (p == "mean") {
      c.query = QShareQuery::kMean;
      continue;
    }
    if (p == "last") {
      c.query = QShareQuery::kLast;
      continue;
    }
    if (p == "cal") {
      if (c.kind != ConfigKind::kCisa && c.kind != ConfigKind::kQuest) return bad();
      c.calibrated = true;
      continue;
    }
    if (p.size() < 2) return bad();
    const std::string_view v = p.substr(1);
    int64_t n = 0;
    switch (p[0]) {
      case 'k':
        if (!parse_i64(v, &n) || n < 0) return bad();
        c.budget = n;
        break;
      case 'g':
        if (!parse_i64(v, &n) || n < 1) return bad();
        c.group = n;
        break;
      case 'w':
        if (!parse_i64(v, &n) || n < 0) return bad();
        c.window = n;
        break;
      case 's':
        if (!parse_i64(v, &n) || n < 0) return bad();
        c.sinks = n;
        break;
      case 'd':
        if (!parse_i64(v, &n) || n < 0) return bad();
        c.dense_layers = n;
        break;
      case 'x': {
        const std::string s(v);
        char* end = nullptr;
        const double x = std::strtod(s.c_str(), &end);
        if (end != s.c_str() + s.size() || !(x >= 1.0) || !std::isfinite(x)) return bad();
        c.compression = x;
        break;
      }
      default:
        return bad();
    }
  }
  if (c.kind != ConfigKind::kDense && c.budget == 0 && c.compression == 0)
    return invalid_argument("config '" + c.name +
                            "': give a budget (kN) or a nominal compression (xR)");
  if (c.budget > 0 && c.compression > 0)
    return invalid_argument("config '" + c.name + "': give either kN or xR, not both");
  return c;
}

int64_t eval_prompt_length(int64_t requested, int64_t n_ctx) {
  if (n_ctx <= 0) return requested;
  if (requested > n_ctx) return 0;
  return std::min(requested, n_ctx - kEvalGenerationRoom);
}

int64_t config_budget(const EvalConfig& c, int64_t tokens, int page_size) {
  if (c.kind == ConfigKind::kDense) return 0;
  if (c.budget > 0) return c.budget;
  // E at the end of the prompt: full chunks older than the window, minus sinks (SPEC §3).
  const int64_t eligible =
      eligible_count(tokens, page_size, {.window = c.window, .sink_pages = c.sinks});
  return std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(static_cast<double>(eligible) / c.compression)));
}

Result<AttentionOptions> config_attention(const EvalConfig& c, int64_t tokens, int page_size,
                                          RepKind* rep) {
  AttentionOptions a;
  *rep = RepKind::kMean;
  if (c.kind == ConfigKind::kDense) return a;
  const int64_t k = config_budget(c, tokens, page_size);
  a.mode = AttentionMode::kCisa;
  a.selection.budget = k;
  a.selection.window = c.window;
  a.selection.qshare = c.group;
  a.selection.qshare_query = c.query;
  a.selection.sink_pages = c.sinks;
  a.dense_layers = static_cast<int>(c.dense_layers);
  if (c.kind == ConfigKind::kQuest) *rep = RepKind::kQuest;
  // The upper bound: the same groups, window and budget, the k chunks by true dense mass.
  if (c.kind == ConfigKind::kOracle) a.selector = oracle_page_selector();
  if (c.kind == ConfigKind::kRecency) {
    // The same number of pages as CISA reads, all of them recent: no selection, window W + k.
    a.selection.budget = 0;
    a.selection.window = c.window + k;
  }
  return a;
}

}  // namespace cisa::eval
