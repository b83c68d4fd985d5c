// tiny_llama_builder.h — writes a complete, tiny `llama` GGUF model (f32 weights, a SentencePiece
// vocabulary of single letters) for tests that run the real model runtime without downloaded
// models: the page-selector hook (eval_oracle_model_test) and calibration end to end
// (calib_synthetic_model_test). Every tensor starts random; a test overwrites the ones its
// construction needs.
//
//   cisa::testing::TinyLlama m;                       // 2 layers, 6 query heads, 2 KV groups
//   m.randomize(7, 0.3f);
//   m.matrix("blk.0.attn_output.weight").assign(m.n_embd * m.n_head * m.head_dim, 0.0f);
//   std::string path = m.write(::testing::TempDir() + "/tiny.gguf");
//   // text of letters a … p tokenises to one token per letter after BOS
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "gguf_test_builder.h"

namespace cisa::testing {

struct TinyLlama {
  int n_layer = 2, n_embd = 16, n_ff = 8, n_head = 6, n_head_kv = 2, head_dim = 8;
  uint32_t n_ctx = 4096;
  float rope_base = 10000.0f, rms_eps = 1e-5f;
  static constexpr int kLetters = 16;  // tokens 3 … 18 are "a" … "p"
  static constexpr int kBos = 1;
  int n_vocab() const { return 3 + kLetters; }
  static int32_t letter_token(int i) { return 3 + i; }

  // name → [rows][cols] f32, row-major (GGUF ne = {cols, rows}); vectors are one row.
  std::map<std::string, std::vector<float>> tensors;

  // Shape {cols, rows} of a tensor name of this architecture.
  std::pair<int64_t, int64_t> shape(const std::string& name) const {
    const int64_t E = n_embd, Dq = int64_t{n_head} * head_dim, Dkv = int64_t{n_head_kv} * head_dim;
    auto ends = [&](const char* s) {
      const std::string t(s);
      return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
    };
    if (name == "token_embd.weight") return {E, n_vocab()};
    if (name == "output_norm.weight" || ends("attn_norm.weight") || ends("ffn_norm.weight"))
      return {E, 1};
    if (ends("attn_q.weight")) return {E, Dq};
    if (ends("attn_k.weight") || ends("attn_v.weight")) return {E, Dkv};
    if (ends("attn_output.weight")) return {Dq, E};
    if (ends("ffn_gate.weight") || ends("ffn_up.weight")) return {E, n_ff};
    if (ends("ffn_down.weight")) return {n_ff, E};
    return {0, 0};
  }

  std::vector<std::string> names() const {
    std::vector<std::string> v = {"token_embd.weight", "output_norm.weight"};
    for (int l = 0; l < n_layer; ++l)
      for (const char* t : {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                            "ffn_gate", "ffn_up", "ffn_down"})
        v.push_back("blk." + std::to_string(l) + "." + t + ".weight");
    return v;
  }

  std::vector<float>& matrix(const std::string& name) { return tensors[name]; }

  // Every matrix uniform in [−scale, scale] from a portable generator (splitmix64), every norm
  // gain 1.
  void randomize(uint64_t seed, float scale) {
    uint64_t s = seed;
    auto next = [&] {
      uint64_t z = (s += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      return static_cast<float>(static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0));
    };
    for (const std::string& n : names()) {
      const auto [cols, rows] = shape(n);
      std::vector<float>& t = tensors[n];
      t.resize(static_cast<size_t>(cols * rows));
      const bool norm = rows == 1;
      for (float& x : t) x = norm ? 1.0f : scale * (2.0f * next() - 1.0f);
    }
  }

  std::vector<uint8_t> build() const {
    GgufBuilder g;
    g.add_string("general.architecture", "llama");
    g.add_string("general.name", "tiny-llama-test");
    g.add_u32("llama.block_count", static_cast<uint32_t>(n_layer));
    g.add_u32("llama.context_length", n_ctx);
    g.add_u32("llama.embedding_length", static_cast<uint32_t>(n_embd));
    g.add_u32("llama.feed_forward_length", static_cast<uint32_t>(n_ff));
    g.add_u32("llama.attention.head_count", static_cast<uint32_t>(n_head));
    g.add_u32("llama.attention.head_count_kv", static_cast<uint32_t>(n_head_kv));
    g.add_u32("llama.attention.key_length", static_cast<uint32_t>(head_dim));
    g.add_u32("llama.attention.value_length", static_cast<uint32_t>(head_dim));
    g.add_f32("llama.attention.layer_norm_rms_epsilon", rms_eps);
    g.add_f32("llama.rope.freq_base", rope_base);
    g.add_string("tokenizer.ggml.model", "llama");
    std::vector<std::string> vocab = {"<unk>", "<s>", "</s>"};
    std::vector<int32_t> types = {2, 3, 3};  // unknown, control, control
    for (int i = 0; i < kLetters; ++i) {
      vocab.push_back(std::string(1, static_cast<char>('a' + i)));
      types.push_back(1);
    }
    g.add_string_array("tokenizer.ggml.tokens", vocab);
    g.add_array<float>("tokenizer.ggml.scores", GgufBuilder::F32,
                       std::vector<float>(vocab.size(), 0.0f));
    g.add_array<int32_t>("tokenizer.ggml.token_type", GgufBuilder::I32, types);
    g.add_u32("tokenizer.ggml.unknown_token_id", 0);
    g.add_u32("tokenizer.ggml.bos_token_id", kBos);
    g.add_u32("tokenizer.ggml.eos_token_id", 2);
    g.add_bool("tokenizer.ggml.add_space_prefix", false);
    for (const std::string& n : names()) {
      const auto [cols, rows] = shape(n);
      const std::vector<float>& t = tensors.at(n);
      std::vector<uint8_t> bytes(t.size() * sizeof(float));
      std::memcpy(bytes.data(), t.data(), bytes.size());
      if (rows == 1)
        g.add_tensor(n, 0, {static_cast<uint64_t>(cols)}, std::move(bytes));  // 0: GGML F32
      else
        g.add_tensor(n, 0, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)},
                     std::move(bytes));
    }
    return g.build();
  }

  std::string write(const std::string& path) const {
    const std::vector<uint8_t> b = build();
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    return path;
  }
};

// BOS and n letters of TinyLlama from a fixed linear congruential sequence (the tests' prompts).
inline std::vector<int32_t> letters(int n, uint32_t seed) {
  std::vector<int32_t> ids = {TinyLlama::kBos};
  uint32_t s = seed;
  for (int i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    ids.push_back(TinyLlama::letter_token(static_cast<int>((s >> 16) % 16)));
  }
  return ids;
}

}  // namespace cisa::testing
