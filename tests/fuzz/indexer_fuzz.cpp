// indexer_fuzz — libFuzzer target for the indexer file parser, cisa::parse_indexer
// (tests/fuzz/CMakeLists.txt says how to run it; seeds in tests/fuzz/corpus/indexer/).
//
// Every input must either fail with a non-empty message or parse into an indexer whose arrays
// agree with its own header: model dimensions positive, groups inside layers × KV heads and
// unique, h_g + 1 candidates per group in head order ending with the mean (h_g + 2 with the fit,
// then last, and h_g · head_dim finite coefficients; none without it), the chosen candidate one of
// them. A parsed file of the current version is canonical, so serialising it must give back the
// input bytes; an older one is written as the current version, whose bytes must then be stable.
//
// The header carries an FNV-1a hash of the payload, which random mutations almost never keep
// right. The first input byte therefore picks a mode: odd, the remaining bytes are a payload and
// the fuzzer writes a correct header around it (this reaches the field parser); even, the
// remaining bytes are the whole file (this reaches the header checks).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "cisa/model/indexer.h"

namespace {

[[noreturn]] void fail() {
  __builtin_trap();
}

std::vector<uint8_t> with_header(std::span<const uint8_t> payload) {
  std::vector<uint8_t> b = {'C', 'I', 'S', 'A', 'I', 'D', 'X', '\0'};
  const auto put = [&b](auto v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof v);
  };
  put(uint32_t{cisa::kIndexerVersion});
  put(uint32_t{0});
  put(static_cast<uint64_t>(payload.size()));
  put(cisa::fnv1a64(payload));
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

void check_consistent(const cisa::Indexer& idx) {
  const cisa::ModelIdentity& m = idx.model;
  if (m.arch.empty()) fail();
  for (int v : {m.n_layer, m.n_embd, m.n_head, m.n_head_kv, m.head_dim})
    if (v <= 0) fail();
  if (m.n_head % m.n_head_kv != 0) fail();
  const int hg = m.n_head / m.n_head_kv;
  const cisa::CalibSettings& s = idx.settings;
  if (s.budget < 1 || s.window < 0 || s.sink_pages < 0 || s.page_size < 1 || s.positions < 0)
    fail();
  if (idx.groups.size() > static_cast<size_t>(m.n_layer) * static_cast<size_t>(m.n_head_kv)) fail();
  std::set<std::pair<int, int>> seen;
  for (const cisa::GroupCalibration& g : idx.groups) {
    if (g.layer < 0 || g.layer >= m.n_layer || g.kv_group < 0 || g.kv_group >= m.n_head_kv) fail();
    if (!seen.insert({g.layer, g.kv_group}).second) fail();
    const size_t n_cand = static_cast<size_t>(hg) + (s.fit ? 2 : 1);
    if (g.candidates.size() != n_cand) fail();
    for (int c = 0; c < hg; ++c)
      if (g.candidates[static_cast<size_t>(c)].head != g.kv_group * hg + c) fail();
    if (g.candidates[static_cast<size_t>(hg)].head != cisa::kMeanCandidate) fail();
    if (s.fit && g.candidates.back().head != cisa::kFitCandidate) fail();
    if (g.chosen < 0 || static_cast<size_t>(g.chosen) >= n_cand) fail();
    if (g.mix.size() != (s.fit ? static_cast<size_t>(hg) * static_cast<size_t>(m.head_dim) : 0))
      fail();
    for (float v : g.mix)
      if (!(v == v) || v - v != 0) fail();  // NaN or infinite
    if (g.positions < 0) fail();
    for (const cisa::CandidateScore& c : g.candidates)
      if (c.kl != c.kl || c.captured != c.captured) fail();  // NaN
    // The chosen candidate is addressable, as cisa run uses it.
    const int head = g.candidates[static_cast<size_t>(g.chosen)].head;
    if (head != cisa::kMeanCandidate && head != cisa::kFitCandidate &&
        (head < 0 || head >= m.n_head))
      fail();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::span<const uint8_t> rest(data + 1, size - 1);
  // An exactly sized heap buffer, so ASan sees its end.
  const std::vector<uint8_t> bytes =
      (data[0] & 1) ? with_header(rest) : std::vector<uint8_t>(rest.begin(), rest.end());
  auto r = cisa::parse_indexer(std::span<const uint8_t>(bytes.data(), bytes.size()));
  if (!r.ok()) {
    if (r.status().message().empty()) fail();  // every error explains itself
    return 0;
  }
  check_consistent(*r);
  // A parsed file of the current version has one spelling: serialising gives back the same
  // bytes. An older version is written as the current one, which must parse to the same bytes.
  uint32_t version = 0;
  std::memcpy(&version, bytes.data() + 8, sizeof version);  // parsed, so the header is there
  const std::vector<uint8_t> again = cisa::serialize_indexer(*r);
  if (version == cisa::kIndexerVersion) {
    if (again != bytes) fail();
  } else {
    auto r2 = cisa::parse_indexer(again);
    if (!r2.ok() || cisa::serialize_indexer(*r2) != again) fail();
  }
  return 0;
}
