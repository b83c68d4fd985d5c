// The attention configurations `cisa eval` compares, parsed from "kind:opt:opt" strings and
// turned into the model's attention options at a prompt length.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include "cisa/core/plan.h"
#include "eval_internal.h"

namespace cisa::eval {
namespace {

bool parse_i64(std::string_view s, int64_t* out) {
  if (s.empty()) return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// "a-b+c+…" (inclusive ranges, single layers), sorted and without duplicates.
bool parse_layer_list(std::string_view s, std::vector<int>* out) {
  out->clear();
  for (size_t b = 0;;) {
    const size_t e = s.find('+', b);
    const std::string_view item =
        s.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b);
    const size_t dash = item.find('-');
    int64_t lo = 0, hi = 0;
    if (dash == std::string_view::npos) {
      if (!parse_i64(item, &lo)) return false;
      hi = lo;
    } else if (!parse_i64(item.substr(0, dash), &lo) || !parse_i64(item.substr(dash + 1), &hi)) {
      return false;
    }
    if (lo < 0 || hi < lo || hi > 100000) return false;
    for (int64_t l = lo; l <= hi; ++l) out->push_back(static_cast<int>(l));
    if (e == std::string_view::npos) break;
    b = e + 1;
  }
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
  return true;
}

}  // namespace

Result<std::vector<double>> read_layer_budget_weights(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("layer budgets '" + path + "': cannot open");
  std::vector<double> w;
  std::vector<bool> seen;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    int64_t layer = 0;
    std::string weight, extra;
    if (!(ls >> layer)) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    }
    auto bad = [&](const std::string& why) {
      return invalid_argument("layer budgets '" + path + "' line " + std::to_string(n) + ": " +
                              why);
    };
    if (ls.fail() || !(ls >> weight) || (ls >> extra)) return bad("expected 'LAYER WEIGHT'");
    char* end = nullptr;
    const double x = std::strtod(weight.c_str(), &end);
    if (end != weight.c_str() + weight.size() || !std::isfinite(x) || x < 0)
      return bad("weight '" + weight + "' is not a finite number >= 0");
    if (layer < 0 || layer > 100000)
      return bad("layer " + std::to_string(layer) + " is out of range");
    const size_t l = static_cast<size_t>(layer);
    if (l >= w.size()) w.resize(l + 1, 0.0), seen.resize(l + 1, false);
    if (seen[l]) return bad("layer " + std::to_string(layer) + " given twice");
    seen[l] = true;
    w[l] = x;
  }
  if (w.empty()) return invalid_argument("layer budgets '" + path + "': no layers");
  for (size_t l = 0; l < seen.size(); ++l)
    if (!seen[l])
      return invalid_argument("layer budgets '" + path + "': layer " + std::to_string(l) +
                              " is missing (layers 0 … " + std::to_string(w.size() - 1) +
                              " must each appear once)");
  return w;
}

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
  else if (kind == "moment")
    c.kind = ConfigKind::kMoment;
  else if (kind == "recency")
    c.kind = ConfigKind::kRecency;
  else if (kind == "oracle")
    c.kind = ConfigKind::kOracle;
  else
    return invalid_argument("config '" + c.name + "': unknown kind '" + std::string(kind) +
                            "' (dense, cisa, quest, moment, recency, oracle)");
  if (c.kind == ConfigKind::kDense && parts.size() > 1)
    return invalid_argument("config '" + c.name + "': dense takes no options");
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string_view p = parts[i];
    auto bad = [&] {
      return invalid_argument("config '" + c.name + "': bad option '" + std::string(p) +
                              "' (kN budget, xR compression, gN QShare G, wN window, sN sinks, dN "
                              "first layers dense, eN last layers dense, dlLIST layers dense "
                              "(e.g. dl0-2+29), lb[LABEL] per-layer budgets, rN decode steps "
                              "per selection, mN reuse check mass with slack N/1000, mean|last, "
                              "cal or calLABEL, fp8|int8 representatives)");
    };
    if (p == "mean") {
      c.query = QShareQuery::kMean;
      continue;
    }
    if (p == "last") {
      c.query = QShareQuery::kLast;
      continue;
    }
    if (p == "fp8" || p == "int8") {
      if ((c.kind != ConfigKind::kCisa && c.kind != ConfigKind::kQuest) ||
          c.rep_precision != RepPrecision::kNative)
        return bad();
      c.rep_precision = *parse_rep_precision(std::string(p));
      continue;
    }
    if (p.substr(0, 3) == "cal") {
      // cal or calLABEL: the projections `cisa eval --indexer [LABEL=]FILE` names.
      const std::string_view label = p.substr(3);
      const bool label_ok = std::all_of(label.begin(), label.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-';
      });
      if ((c.kind != ConfigKind::kCisa && c.kind != ConfigKind::kQuest &&
           c.kind != ConfigKind::kMoment) ||
          !label_ok || c.calibrated)
        return bad();
      c.calibrated = true;
      c.indexer_label = std::string(label);
      continue;
    }
    if (p.substr(0, 2) == "lb") {
      // lb or lbLABEL: the weights `cisa eval --layer-budgets [LABEL=]FILE` names.
      const std::string_view label = p.substr(2);
      const bool label_ok = std::all_of(label.begin(), label.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-';
      });
      if (c.kind == ConfigKind::kRecency || !label_ok || c.layer_budgets) return bad();
      c.layer_budgets = true;
      c.layer_budgets_label = std::string(label);
      continue;
    }
    if (p.size() > 2 && p.substr(0, 2) == "dl") {
      if (!parse_layer_list(p.substr(2), &c.dense_layer_set)) return bad();
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
      case 'r':  // selection reuse: top-k selections only (not oracle, recency or dense)
        if (!parse_i64(v, &n) || n < 1 || n > kMaxReuseSteps) return bad();
        if (c.kind != ConfigKind::kCisa && c.kind != ConfigKind::kQuest &&
            c.kind != ConfigKind::kMoment)
          return bad();
        c.reuse_steps = n;
        break;
      case 'm':  // reuse check "mass" with slack n / 1000 (selections that reuse: top-k kinds)
        if (!parse_i64(v, &n) || n < 0 || n > 1000) return bad();
        if (c.kind != ConfigKind::kCisa && c.kind != ConfigKind::kQuest &&
            c.kind != ConfigKind::kMoment)
          return bad();
        c.reuse_mass_milli = n;
        break;
      case 'e':
        if (!parse_i64(v, &n) || n < 0 || n > 100000) return bad();
        c.dense_last_layers = n;
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
  a.selection.reuse_steps = c.reuse_steps;
  if (c.reuse_mass_milli >= 0) {
    a.selection.reuse_check = ReuseCheck::kMass;
    a.selection.reuse_mass_slack = static_cast<double>(c.reuse_mass_milli) / 1000.0;
  }
  a.dense_layers = static_cast<int>(c.dense_layers);
  a.dense_last_layers = static_cast<int>(c.dense_last_layers);
  a.dense_layer_set = c.dense_layer_set;
  if (c.layer_budgets) {
    if (c.layer_budget_weights.empty())
      return invalid_argument(
          "config '" + c.name + "' uses per-layer budgets (lb" + c.layer_budgets_label +
          ") but no weights were given (cisa eval --layer-budgets " +
          (c.layer_budgets_label.empty() ? "" : c.layer_budgets_label + "=") + "FILE)");
    a.layer_budget_weights = c.layer_budget_weights;
  }
  if (c.kind == ConfigKind::kQuest) *rep = RepKind::kQuest;
  if (c.kind == ConfigKind::kMoment) *rep = RepKind::kMoment;
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
