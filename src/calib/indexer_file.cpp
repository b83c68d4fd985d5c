// The indexer file: a fixed header (magic, version, payload size, payload hash) and a payload of
// little-endian fields. Every read is bounds-checked; every count and index is validated against
// the model shape the file itself declares, so a corrupted or truncated file is an error value.
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "cisa/core/atomic_file.h"
#include "cisa/core/plan.h"
#include "cisa/model/indexer.h"

namespace cisa {
namespace {

constexpr char kMagic[8] = {'C', 'I', 'S', 'A', 'I', 'D', 'X', '\0'};
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8 + 8;
constexpr uint32_t kMaxString = 4096;
constexpr uint32_t kMaxDocuments = 1 << 16;
constexpr int kMaxDim = 1 << 20;

static_assert(std::endian::native == std::endian::little,
              "the indexer file is written little-endian");

class Writer {
 public:
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  }
  std::vector<uint8_t> out;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  template <class T>
  Status get(T* v, const char* what) {
    if (b_.size() - pos_ < sizeof(T)) return truncated(what);
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }
  Status str(std::string* s, const char* what) {
    uint32_t n = 0;
    CISA_RETURN_IF_ERROR(get(&n, what));
    if (n > kMaxString)
      return data_loss(std::string("indexer file: ") + what + " is " + std::to_string(n) +
                       " bytes long");
    if (b_.size() - pos_ < n) return truncated(what);
    s->assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return Status::Ok();
  }
  size_t left() const { return b_.size() - pos_; }

 private:
  static Status truncated(const char* what) {
    return data_loss(std::string("indexer file is truncated (while reading ") + what + ")");
  }
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

Status bad(const std::string& m) {
  return data_loss("indexer file is corrupted: " + m);
}

Status validate(const Indexer& idx) {
  const ModelIdentity& m = idx.model;
  if (m.arch.empty()) return bad("empty architecture");
  for (int v : {m.n_layer, m.n_embd, m.n_head, m.n_head_kv, m.head_dim})
    if (v <= 0 || v > kMaxDim) return bad("model dimension " + std::to_string(v) + " out of range");
  if (m.n_head % m.n_head_kv != 0) return bad("query heads not a multiple of KV heads");
  const CalibSettings& s = idx.settings;
  // The upper bounds are the selection's and a page size no backend comes near; they keep every
  // count computed from the settings inside int64.
  constexpr int64_t kMaxPages = kMaxSelectionPages, kMaxPageSize = int64_t{1} << 20;
  if (s.budget < 1 || s.window < 0 || s.sink_pages < 0 || s.page_size < 1 || s.positions < 0 ||
      s.budget > kMaxPages || s.window > kMaxPages || s.sink_pages > kMaxPages ||
      s.page_size > kMaxPageSize)
    return bad("calibration settings out of range (budget " + std::to_string(s.budget) +
               ", window " + std::to_string(s.window) + ", sink pages " +
               std::to_string(s.sink_pages) + ", page size " + std::to_string(s.page_size) +
               "; budget, window and sinks at most 2^26, page size at most 2^20)");
  if (!(s.fit_ridge >= 0) || !std::isfinite(s.fit_ridge)) return bad("fit ridge out of range");
  const int hg = m.n_head / m.n_head_kv;
  std::set<std::pair<int, int>> seen;
  for (const GroupCalibration& g : idx.groups) {
    if (g.layer < 0 || g.layer >= m.n_layer || g.kv_group < 0 || g.kv_group >= m.n_head_kv)
      return bad("group (layer " + std::to_string(g.layer) + ", KV group " +
                 std::to_string(g.kv_group) + ") out of range");
    if (!seen.insert({g.layer, g.kv_group}).second)
      return bad("layer " + std::to_string(g.layer) + ", KV group " + std::to_string(g.kv_group) +
                 " appears twice");
    const bool fit = s.fit;
    const int n_cand = hg + 1 + (fit ? 1 : 0);
    if (static_cast<int>(g.candidates.size()) != n_cand)
      return bad("layer " + std::to_string(g.layer) + " has " +
                 std::to_string(g.candidates.size()) + " candidates, expected " +
                 std::to_string(n_cand));
    for (int c = 0; c < hg; ++c)
      if (g.candidates[static_cast<size_t>(c)].head != g.kv_group * hg + c)
        return bad("candidate head out of order");
    if (g.candidates[static_cast<size_t>(hg)].head != kMeanCandidate)
      return bad("the candidate after the heads is not the mean");
    if (fit && g.candidates.back().head != kFitCandidate)
      return bad("the last candidate is not the fit");
    if (g.chosen < 0 || g.chosen >= n_cand)
      return bad("chosen candidate " + std::to_string(g.chosen) + " out of range");
    if (g.mix.size() != (fit ? static_cast<size_t>(hg) * static_cast<size_t>(m.head_dim) : 0) ||
        (fit && m.head_dim % 2 != 0))
      return bad("layer " + std::to_string(g.layer) + " has " + std::to_string(g.mix.size()) +
                 " fit coefficients");
    for (float v : g.mix)
      if (!std::isfinite(v)) return bad("a fit coefficient is not finite");
    if (g.positions < 0 || !std::isfinite(g.oracle)) return bad("group statistics out of range");
    for (const CandidateScore& c : g.candidates)
      if (std::isnan(c.kl) || std::isnan(c.captured)) return bad("NaN score");
  }
  return Status::Ok();
}

}  // namespace

uint64_t fnv1a64(std::span<const uint8_t> bytes, uint64_t h) {
  for (uint8_t b : bytes) {
    h ^= b;
    h *= 0x100000001b3ULL;
  }
  return h;
}

std::vector<uint8_t> serialize_indexer(const Indexer& idx) {
  Writer p;
  const ModelIdentity& m = idx.model;
  p.str(m.arch);
  p.str(m.name);
  for (int v : {m.n_layer, m.n_embd, m.n_head, m.n_head_kv, m.head_dim}) p.put<int32_t>(v);
  p.put<uint64_t>(m.weights_hash);
  const CalibSettings& s = idx.settings;
  for (int64_t v : {s.budget, s.window, s.sink_pages, s.page_size, s.positions}) p.put<int64_t>(v);
  p.put<uint64_t>(s.seed);
  p.put<uint32_t>(s.criterion == CalibCriterion::kKl ? 0u : 1u);
  p.put<uint32_t>(s.fit ? 1u : 0u);  // version 2
  p.put<double>(s.fit_ridge);
  p.put<uint32_t>(static_cast<uint32_t>(s.documents.size()));
  for (const CalibDocument& d : s.documents) {
    p.str(d.name);
    p.put<int64_t>(d.tokens);
    p.put<uint64_t>(d.content_hash);
  }
  p.put<uint32_t>(static_cast<uint32_t>(idx.groups.size()));
  for (const GroupCalibration& g : idx.groups) {
    p.put<int32_t>(g.layer);
    p.put<int32_t>(g.kv_group);
    p.put<int64_t>(g.positions);
    p.put<double>(g.oracle);
    p.put<uint32_t>(static_cast<uint32_t>(g.candidates.size()));
    for (const CandidateScore& c : g.candidates) {
      p.put<int32_t>(c.head);
      p.put<double>(c.kl);
      p.put<double>(c.captured);
    }
    p.put<int32_t>(g.chosen);
    p.put<uint32_t>(static_cast<uint32_t>(g.mix.size()));  // version 2
    for (float v : g.mix) p.put<float>(v);
  }
  Writer h;
  h.out.insert(h.out.end(), kMagic, kMagic + 8);
  h.put<uint32_t>(kIndexerVersion);
  h.put<uint32_t>(0);
  h.put<uint64_t>(p.out.size());
  h.put<uint64_t>(fnv1a64(p.out));
  h.out.insert(h.out.end(), p.out.begin(), p.out.end());
  return std::move(h.out);
}

Result<Indexer> parse_indexer(std::span<const uint8_t> bytes) {
  if (bytes.size() < 8 || std::memcmp(bytes.data(), kMagic, 8) != 0)
    return invalid_argument("not a CISA indexer file (bad magic)");
  Reader h(bytes);
  uint8_t magic[8];
  uint32_t version = 0, reserved = 0;
  uint64_t size = 0, hash = 0;
  for (uint8_t& b : magic) CISA_RETURN_IF_ERROR(h.get(&b, "magic"));
  CISA_RETURN_IF_ERROR(h.get(&version, "version"));
  if (version != 1 && version != kIndexerVersion)
    return unimplemented("indexer file version " + std::to_string(version) +
                         " is not supported (this build reads 1 to " +
                         std::to_string(kIndexerVersion) + ")");
  CISA_RETURN_IF_ERROR(h.get(&reserved, "header"));
  CISA_RETURN_IF_ERROR(h.get(&size, "payload size"));
  CISA_RETURN_IF_ERROR(h.get(&hash, "payload hash"));
  if (h.left() != size)
    return data_loss("indexer file is " +
                     std::string(h.left() < size ? "truncated" : "longer than its header says") +
                     ": payload of " + std::to_string(h.left()) + " bytes, header says " +
                     std::to_string(size));
  const std::span<const uint8_t> payload = bytes.subspan(kHeaderBytes);
  if (fnv1a64(payload) != hash || reserved != 0)
    return data_loss("indexer file is corrupted (payload hash mismatch)");

  Reader r(payload);
  Indexer idx;
  ModelIdentity& m = idx.model;
  CISA_RETURN_IF_ERROR(r.str(&m.arch, "architecture"));
  CISA_RETURN_IF_ERROR(r.str(&m.name, "model name"));
  for (int* v : {&m.n_layer, &m.n_embd, &m.n_head, &m.n_head_kv, &m.head_dim}) {
    int32_t x = 0;
    CISA_RETURN_IF_ERROR(r.get(&x, "model shape"));
    *v = x;
  }
  CISA_RETURN_IF_ERROR(r.get(&m.weights_hash, "weights hash"));
  CalibSettings& s = idx.settings;
  for (int64_t* v : {&s.budget, &s.window, &s.sink_pages, &s.page_size, &s.positions})
    CISA_RETURN_IF_ERROR(r.get(v, "settings"));
  CISA_RETURN_IF_ERROR(r.get(&s.seed, "seed"));
  uint32_t crit = 0, n_docs = 0, n_groups = 0;
  CISA_RETURN_IF_ERROR(r.get(&crit, "criterion"));
  if (crit > 1) return bad("unknown criterion " + std::to_string(crit));
  s.criterion = crit == 0 ? CalibCriterion::kKl : CalibCriterion::kMass;
  if (version >= 2) {
    uint32_t fit = 0;
    CISA_RETURN_IF_ERROR(r.get(&fit, "fit flag"));
    if (fit > 1) return bad("fit flag " + std::to_string(fit));
    s.fit = fit == 1;
    CISA_RETURN_IF_ERROR(r.get(&s.fit_ridge, "fit ridge"));
  }
  CISA_RETURN_IF_ERROR(r.get(&n_docs, "document count"));
  if (n_docs > kMaxDocuments) return bad(std::to_string(n_docs) + " documents");
  for (uint32_t i = 0; i < n_docs; ++i) {
    CalibDocument d;
    CISA_RETURN_IF_ERROR(r.str(&d.name, "document name"));
    CISA_RETURN_IF_ERROR(r.get(&d.tokens, "document tokens"));
    CISA_RETURN_IF_ERROR(r.get(&d.content_hash, "document hash"));
    s.documents.push_back(std::move(d));
  }
  CISA_RETURN_IF_ERROR(r.get(&n_groups, "group count"));
  const int64_t max_groups = int64_t{std::max(m.n_layer, 0)} * std::max(m.n_head_kv, 0);
  if (n_groups > max_groups)
    return bad(std::to_string(n_groups) + " groups for a model of " + std::to_string(max_groups));
  for (uint32_t i = 0; i < n_groups; ++i) {
    GroupCalibration g;
    CISA_RETURN_IF_ERROR(r.get(&g.layer, "group layer"));
    CISA_RETURN_IF_ERROR(r.get(&g.kv_group, "group KV head"));
    CISA_RETURN_IF_ERROR(r.get(&g.positions, "group positions"));
    CISA_RETURN_IF_ERROR(r.get(&g.oracle, "group oracle mass"));
    uint32_t n_cand = 0;
    CISA_RETURN_IF_ERROR(r.get(&n_cand, "candidate count"));
    if (n_cand > static_cast<uint32_t>(std::max(m.n_head, 0)) + 2)
      return bad(std::to_string(n_cand) + " candidates");
    for (uint32_t c = 0; c < n_cand; ++c) {
      CandidateScore cs;
      CISA_RETURN_IF_ERROR(r.get(&cs.head, "candidate head"));
      CISA_RETURN_IF_ERROR(r.get(&cs.kl, "candidate KL"));
      CISA_RETURN_IF_ERROR(r.get(&cs.captured, "candidate mass"));
      g.candidates.push_back(cs);
    }
    CISA_RETURN_IF_ERROR(r.get(&g.chosen, "chosen candidate"));
    if (version >= 2) {
      uint32_t n_mix = 0;
      CISA_RETURN_IF_ERROR(r.get(&n_mix, "fit coefficient count"));
      if (n_mix > static_cast<uint32_t>(kMaxDim))
        return bad(std::to_string(n_mix) + " fit coefficients");
      if (r.left() / sizeof(float) < n_mix)
        return data_loss("indexer file is truncated (while reading fit coefficients)");
      g.mix.resize(n_mix);
      for (float& v : g.mix) CISA_RETURN_IF_ERROR(r.get(&v, "fit coefficients"));
    }
    idx.groups.push_back(std::move(g));
  }
  if (r.left() != 0) return bad(std::to_string(r.left()) + " bytes after the last group");
  CISA_RETURN_IF_ERROR(validate(idx));
  return idx;
}

Status save_indexer(const Indexer& idx, const std::string& path) {
  CISA_RETURN_IF_ERROR(validate(idx));
  const std::vector<uint8_t> bytes = serialize_indexer(idx);
  // Atomic: a failed write leaves the previous indexer at `path` as it was.
  return write_file_atomic(
      path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

Result<Indexer> load_indexer(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open indexer file '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  auto r = parse_indexer({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
  if (!r.ok()) return Status(r.status().code(), path + ": " + r.status().message());
  return r;
}

}  // namespace cisa
