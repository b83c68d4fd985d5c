// cisa_logits — one prompt through cisa::Model on a fixed schedule, one record per logits row, in
// the same format as bench/llamacpp/llamacpp_logits.py writes for llama.cpp, so that
// bench/llamacpp/compare_logits.py can say at which position (and in which phase) the two
// engines' floats first part.
//
//   cisa_logits -m MODEL --ids IDS.txt [--numerics llamacpp|default] [--prefill-block B]
//               [--split S] [--generate N] [--threads T] [--ids-out GEN.txt] -o OUT.bin
//
// Schedule (the same as the Python script's):
//   prefill  tokens [0, S) in forward calls of B tokens each (B = --prefill-block, the model's
//            step size too), every row's logits kept;
//   feed     tokens [S, n) one per forward call (decode steps over known tokens);
//   generate N greedy tokens (argmax, ties to the smaller id), one per forward call: the logits
//            row that chose each token is recorded, and the token is fed back.
// IDS.txt holds whitespace-separated token ids (with BOS where the model adds one).
// OUT.bin: a 16-byte header "CISALGT1", u32 version 1, u32 record count; then records of
//   i32 position (index of the row's last input token), i32 phase (0 prefill, 1 feed, 2 generate),
//   i32 argmax, i32 pad, u64 checksum, i32[20] top ids (descending, ties by id), f32[20] top
//   logits, f64 log-sum-exp
// checksum = sum over i of bits(logit_i) * (2i + 1) mod 2^64 (a full-row bit-exactness test).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "cisa/model/model.h"
#include "cisa/model/quant.h"
#include "cisa/model/tokenizer.h"

namespace {

constexpr int kTop = 20;

#pragma pack(push, 1)
struct Record {
  int32_t position, phase, argmax, pad;
  uint64_t checksum;
  int32_t top_ids[kTop];
  float top_logits[kTop];
  double lse;
};
#pragma pack(pop)
static_assert(sizeof(Record) == 192);

Record summarise(const float* row, int V, int32_t position, int32_t phase) {
  Record r{};
  r.position = position;
  r.phase = phase;
  uint64_t h = 0;
  double mx = -INFINITY;
  int32_t best = 0;
  for (int i = 0; i < V; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &row[i], 4);
    h += static_cast<uint64_t>(bits) * (2 * static_cast<uint64_t>(i) + 1);
    if (row[i] > mx) mx = row[i], best = i;
  }
  r.checksum = h;
  r.argmax = best;
  double z = 0;
  for (int i = 0; i < V; ++i) z += std::exp(static_cast<double>(row[i]) - mx);
  r.lse = mx + std::log(z);
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + kTop, idx.end(), [&](int32_t a, int32_t b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  });
  for (int t = 0; t < kTop; ++t) {
    r.top_ids[t] = idx[static_cast<size_t>(t)];
    r.top_logits[t] = row[idx[static_cast<size_t>(t)]];
  }
  return r;
}

int usage(const char* msg) {
  std::fprintf(stderr,
               "cisa_logits: %s\nusage: cisa_logits -m MODEL --ids IDS.txt [--numerics "
               "llamacpp|default] [--prefill-block B] [--split S] [--generate N] [--threads T] "
               "[--ids-out GEN.txt] -o OUT.bin\n",
               msg);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, ids_path, out_path, ids_out, text_path, numerics = "llamacpp";
  long block = 512, split = -1, generate = 0, threads = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "-m" && (v = val()))
      model_path = v;
    else if (a == "--ids" && (v = val()))
      ids_path = v;
    else if (a == "-o" && (v = val()))
      out_path = v;
    else if (a == "--ids-out" && (v = val()))
      ids_out = v;
    else if (a == "--tokenize" && (v = val()))
      text_path = v;
    else if (a == "--numerics" && (v = val()))
      numerics = v;
    else if (a == "--prefill-block" && (v = val()))
      block = std::atol(v);
    else if (a == "--split" && (v = val()))
      split = std::atol(v);
    else if (a == "--generate" && (v = val()))
      generate = std::atol(v);
    else if (a == "--threads" && (v = val()))
      threads = std::atol(v);
    else
      return usage(("bad argument " + a).c_str());
  }
  if (!model_path.empty() && !text_path.empty()) {
    cisa::ModelOptions o;
    o.context = 256;
    auto m = cisa::Model::load(model_path, o);
    if (!m.ok()) return 1;
    std::ifstream in(text_path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (int32_t t : (*m)->tokenizer().encode(text, true, true)) std::printf("%d\n", t);
    return 0;
  }
  if (model_path.empty() || ids_path.empty() || out_path.empty())
    return usage("-m, --ids and -o are required");
  if (numerics != "llamacpp" && numerics != "default") return usage("--numerics llamacpp|default");
  std::vector<int32_t> ids;
  {
    std::ifstream in(ids_path);
    for (long t; in >> t;) ids.push_back(static_cast<int32_t>(t));
  }
  const long n = static_cast<long>(ids.size());
  if (n == 0) return usage("no token ids");
  if (split < 0 || split > n) split = n;
  if (split < 1) return usage("--split must be >= 1");
  if (block < 1 || generate < 0) return usage("--prefill-block >= 1, --generate >= 0");

  cisa::ModelOptions o;
  o.threads = static_cast<int>(threads);
  o.context = (n + generate + 255) / 256 * 256;
  o.prefill_block = static_cast<int>(block);
  if (numerics == "llamacpp") o.attention_numerics = cisa::AttentionNumerics::kLlamaCpp;
  auto m = cisa::Model::load(model_path, o);
  if (!m.ok()) {
    std::fprintf(stderr, "cisa_logits: %s\n", m.status().to_string().c_str());
    return 1;
  }
  cisa::Model& model = **m;
  const int V = model.hparams().n_vocab;
  auto seq = model.add_sequence();
  if (!seq.ok()) return 1;
  std::vector<Record> recs;
  std::vector<float> logits;
  auto step = [&](const int32_t* tok, long count, cisa::OutputMode mode, long first,
                  int32_t phase) -> bool {
    cisa::SequenceInput in{
        .seq = *seq, .tokens = {tok, static_cast<size_t>(count)}, .outputs = mode};
    cisa::Status s = model.forward({&in, 1}, &logits);
    if (!s.ok()) {
      std::fprintf(stderr, "cisa_logits: forward: %s\n", s.to_string().c_str());
      return false;
    }
    const long rows = mode == cisa::OutputMode::kAll ? count : 1;
    for (long r = 0; r < rows; ++r)
      recs.push_back(summarise(logits.data() + r * V, V,
                               static_cast<int32_t>(first + (rows == 1 ? count - 1 : r)), phase));
    return true;
  };
  for (long b0 = 0; b0 < split; b0 += block)
    if (!step(ids.data() + b0, std::min(block, split - b0), cisa::OutputMode::kAll, b0, 0))
      return 1;
  for (long q = split; q < n; ++q)
    if (!step(ids.data() + q, 1, cisa::OutputMode::kLast, q, 1)) return 1;
  std::vector<int32_t> gen;
  for (long g = 0; g < generate; ++g) {
    const int32_t next = recs.back().argmax;
    gen.push_back(next);
    if (g + 1 == generate) break;  // the last token's own logits are not needed
    if (!step(&gen.back(), 1, cisa::OutputMode::kLast, n + g, 2)) return 1;
  }
  std::FILE* f = std::fopen(out_path.c_str(), "wb");
  if (!f) return usage("cannot write -o");
  const uint32_t version = 1, count = static_cast<uint32_t>(recs.size());
  std::fwrite("CISALGT1", 1, 8, f);
  std::fwrite(&version, 4, 1, f);
  std::fwrite(&count, 4, 1, f);
  std::fwrite(recs.data(), sizeof(Record), recs.size(), f);
  std::fclose(f);
  if (!ids_out.empty()) {
    std::FILE* g = std::fopen(ids_out.c_str(), "w");
    if (!g) return usage("cannot write --ids-out");
    for (int32_t t : gen) std::fprintf(g, "%d\n", t);
    std::fclose(g);
  }
  std::fprintf(stderr,
               "cisa_logits: %ld prompt tokens (split %ld, block %ld), %ld generated, %s "
               "numerics, matmul %s, %zu records\n",
               n, split, block, generate, numerics.c_str(), cisa::matmul_isa(), recs.size());
  return 0;
}
