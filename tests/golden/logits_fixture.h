// The llama.cpp logits fixtures (tests/golden/fixtures/logits_<model>.bin, written by
// tests/golden/scripts/make_llamacpp_fixtures.py; format in its docstring): token IDs of prompts of
// about 100, 2,000 and 8,000 tokens and, at up to 256 positions of each, llama.cpp's top-k logits
// and the log-sum-exp of all its logits. A bounds-checked reader shared by the golden and GPU
// tests.
//
//   cisa::Fixture f;
//   std::string err;
//   if (!cisa::read_fixture(path, &f, &err)) ...;   // err == "absent" when the file is missing
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace cisa {

struct FixturePrompt {
  std::string name, text;
  std::vector<int32_t> ids;
  std::vector<uint32_t> positions;
  std::vector<int32_t> top_ids;   // [positions][top_k]
  std::vector<float> top_logits;  // [positions][top_k]
  std::vector<float> lse;         // [positions]
};

struct Fixture {
  uint32_t n_vocab = 0, top_k = 0;
  std::vector<FixturePrompt> prompts;
};

// A bounds-checked reader of the CISALOG1 format over bytes the caller keeps alive.
class FixtureReader {
 public:
  explicit FixtureReader(std::string_view b) : b_(b) {}
  bool ok() const { return ok_; }
  uint32_t u32() {
    uint32_t v = 0;
    take(&v, 4);
    return v;
  }
  std::string str() {
    const uint32_t n = u32();
    if (!ok_ || n > b_.size() - p_) return fail(), std::string();
    std::string s(b_.substr(p_, n));
    p_ += n;
    return s;
  }
  template <class T>
  void array(std::vector<T>* v, size_t n) {
    if (!ok_ || n > (b_.size() - p_) / sizeof(T)) return fail();
    v->resize(n);
    take(v->data(), n * sizeof(T));
  }
  void take(void* dst, size_t n) {
    if (!ok_ || n > b_.size() - p_) return fail();
    std::memcpy(dst, b_.data() + p_, n);
    p_ += n;
  }

 private:
  void fail() { ok_ = false; }
  std::string_view b_;
  size_t p_ = 0;
  bool ok_ = true;
};

inline bool read_fixture(const std::string& path, Fixture* f, std::string* err) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return *err = "absent", false;
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  FixtureReader r(bytes);
  char magic[8];
  r.take(magic, 8);
  if (!r.ok() || std::memcmp(magic, "CISALOG1", 8) != 0) return *err = "bad magic", false;
  if (r.u32() != 1) return *err = "unknown version", false;
  r.str();  // metadata
  f->n_vocab = r.u32();
  f->top_k = r.u32();
  const uint32_t n_prompts = r.u32();
  if (!r.ok() || f->top_k == 0 || f->top_k > 1000 || n_prompts > 100)
    return *err = "bad header", false;
  for (uint32_t i = 0; i < n_prompts; ++i) {
    FixturePrompt p;
    p.name = r.str();
    r.str();  // source
    p.text = r.str();
    r.array(&p.ids, r.u32());
    r.array(&p.positions, r.u32());
    if (!r.ok()) return *err = "truncated", false;
    const size_t n = p.positions.size(), k = f->top_k;
    p.top_ids.resize(n * k);
    p.top_logits.resize(n * k);
    p.lse.resize(n);
    for (size_t j = 0; j < n; ++j) {
      r.take(&p.top_ids[j * k], 4 * k);
      r.take(&p.top_logits[j * k], 4 * k);
      r.take(&p.lse[j], 4);
      if (!r.ok()) return *err = "truncated", false;
      if (p.positions[j] >= p.ids.size()) return *err = "position past the prompt", false;
    }
    f->prompts.push_back(std::move(p));
  }
  return true;
}

}  // namespace cisa
