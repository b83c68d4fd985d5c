// Our forward passes against llama.cpp's logits on the two real models.
//
// tests/golden/fixtures/logits_<model>.bin (tests/golden/scripts/make_llamacpp_fixtures.py, format
// in its docstring) holds llama.cpp's token IDs for prompts of about 100, 2,000 and 8,000 tokens of
// Jane Austen and, at up to 256 positions of each, llama.cpp's top-20 logits and the log-sum-exp of
// all its logits. Both engines round every matmul input to 8 bits, which makes the forward pass
// chaotic: any last-bit difference upstream flips some roundings downstream, and agreement drops
// to ~95% of positions (llama.cpp against itself with an f32 instead of an f16 KV cache: 94%).
// Only bit-identical numerics reach the model-runtime issue's 99%. Everything outside attention
// rounds as llama.cpp's CPU build does (docs/models-runtime.md, "Numerics"), and the opt-in
// attention mode AttentionNumerics::kLlamaCpp (attention_llamacpp.h) rounds attention as it does.
// With that mode we run the same token IDs in one batch, as llama.cpp did, and require per prompt:
//  - logits bit-identical to llama.cpp's (its top 20) at every stored position (with the AVX2 /
//    AVX-512 matmul kernels; the portable scalar ones sum in another order);
//  - the same top-1 token at >= 99% of the stored positions (the bar);
//  - mean KL(llama.cpp || ours) < 0.01, with KL taken over 21 outcomes: the 20 tokens llama.cpp
//    ranks highest and "any other token" (both sides' full-vocabulary probabilities, so this is
//    the exact KL of that coarse-graining of the two next-token distributions).
// The 100-token prompt is also run in awkward blocks (7 tokens) and then one token at a time, so
// the decode path and multi-block prefill are held to the same reference. llama.cpp's own
// arithmetic depends on the batch's token count (Q4_K: its repacked gemm / gemv split; attention:
// a one-token batch takes the one-column dot product), which the llama.cpp-numerics mode
// reproduces, so the blocked run is not the fixture's single-batch function: there KL < 0.01 and a
// measured top-1 floor are asserted and the 99% target printed. llama.cpp's own decode steps are
// the decode fixtures' (DecodeStepsMatchLlamaCpp: bit-identical). The default (fast) attention
// is held to the looser bars it meets (DefaultAttentionStaysClose);
// ExactForwardMatchesFp64Reference checks the architecture against an independent fp64 forward
// pass.
// $CISA_MODEL_GOLDEN_MAX_TOKENS limits the prompt length checked (for slow machines);
// $CISA_GOLDEN_FIXTURES reads the fixtures from another directory.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cisa/model/model.h"
#include "cisa/model/model_store.h"
#include "cisa/model/quant.h"
#include "golden/logits_fixture.h"

namespace {
constexpr double kTop1Target = 0.99;  // the bar
constexpr double kKlBar = 0.01;       // the bar on the mean KL
// The default attention (online softmax in f32, not llama.cpp's rounding): regression guards at
// what it measures (2026-11-30: top-1 >= 90.0%, mean KL <= 1.03e-2 over p100 and p2000).
constexpr double kDefaultTop1Floor = 0.90;
constexpr double kDefaultKlCeiling = 0.02;
}  // namespace

namespace cisa {
namespace {

struct Agreement {
  int64_t n = 0, top1_same = 0;
  double kl_sum = 0, kl_max = 0;
  double top1_rate() const { return n ? static_cast<double>(top1_same) / n : 0; }
  double kl_mean() const { return n ? kl_sum / n : 0; }
};

// Scores our logits row (n_vocab values) against fixture row j.
void score_row(const FixturePrompt& p, size_t j, uint32_t top_k, const float* ours, int n_vocab,
               Agreement* a) {
  double mx = -INFINITY;
  int32_t best = 0;
  for (int i = 0; i < n_vocab; ++i) {
    if (ours[i] > mx) mx = ours[i], best = i;
  }
  double z = 0;
  for (int i = 0; i < n_vocab; ++i) z += std::exp(static_cast<double>(ours[i]) - mx);
  const double lse_ours = mx + std::log(z);
  double kl = 0, p_top = 0, q_top = 0;
  for (uint32_t t = 0; t < top_k; ++t) {
    const int32_t id = p.top_ids[j * top_k + t];
    const double lp = static_cast<double>(p.top_logits[j * top_k + t]) - p.lse[j];
    const double lq = static_cast<double>(ours[id]) - lse_ours;
    kl += std::exp(lp) * (lp - lq);
    p_top += std::exp(lp);
    q_top += std::exp(lq);
  }
  const double pr = std::max(0.0, 1.0 - p_top), qr = std::max(1e-300, 1.0 - q_top);
  if (pr > 0) kl += pr * std::log(pr / qr);
  if (std::getenv("CISA_GOLDEN_VERBOSE"))
    std::printf(
        "  pos %u: llama top %d (%.3f, 2nd %d %.3f) ours top %d (%.3f; llama's top at %.3f) KL "
        "%.2e\n",
        p.positions[j], p.top_ids[j * top_k], p.top_logits[j * top_k], p.top_ids[j * top_k + 1],
        p.top_logits[j * top_k + 1], best, mx, ours[p.top_ids[j * top_k]], kl);
  a->n += 1;
  a->top1_same += best == p.top_ids[j * top_k] ? 1 : 0;
  a->kl_sum += kl;
  a->kl_max = std::max(a->kl_max, kl);
}

// True when our logits for llama.cpp's 20 highest-ranked tokens at fixture row j are the very
// same floats as llama.cpp's.
bool top_logits_bit_identical(const FixturePrompt& p, size_t j, uint32_t top_k, const float* ours) {
  for (uint32_t t = 0; t < top_k; ++t) {
    const float theirs = p.top_logits[j * top_k + t];
    const float mine = ours[p.top_ids[j * top_k + t]];
    if (std::memcmp(&theirs, &mine, sizeof(float)) != 0) return false;
  }
  return true;
}

struct ModelCase {
  const char* name;
  // Top-1 floor of the blocked prefill + decode run with llama.cpp numerics against the
  // single-batch fixture (not llama.cpp's function for these batch sizes, see above): measured
  // 2026-12-02 Gemma 96%, SmolLM2 99%.
  double blocked_top1_floor;
};
void PrintTo(const ModelCase& m, std::ostream* os) {
  *os << m.name;
}
const ModelCase kModels[] = {{"gemma3-270m", 0.95}, {"smollm2-135m", 0.97}};

class ModelGolden : public ::testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    auto path = resolve_model(GetParam().name);
    if (!path.ok())
      GTEST_SKIP() << "model " << GetParam().name << " is absent: " << path.status().message();
    path_ = *path;
    const char* dir = std::getenv("CISA_GOLDEN_FIXTURES");
    const std::string fx =
        (dir && *dir ? std::string(dir) : std::string(CISA_SOURCE_DIR) + "/tests/golden/fixtures") +
        "/logits_" + GetParam().name + ".bin";
    std::string err;
    if (!read_fixture(fx, &fixture_, &err)) {
      if (err == "absent")
        GTEST_SKIP() << "no logits fixture " << fx
                     << " (tests/golden/scripts/make_llamacpp_fixtures.py)";
      FAIL() << fx << ": " << err;
    }
    if (const char* e = std::getenv("CISA_MODEL_GOLDEN_MAX_TOKENS"); e && *e)
      max_tokens_ = std::atoll(e);
  }

  std::unique_ptr<Model> load(int64_t context, int prefill_block,
                              AttentionNumerics numerics = AttentionNumerics::kLlamaCpp) {
    ModelOptions o;
    o.context = (context + 255) / 256 * 256;
    o.prefill_block = prefill_block;
    o.round_kv_f16 = round_kv_f16_;
    o.attention_numerics = numerics;
    auto m = Model::load(path_, o);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    return m.ok() ? std::move(*m) : nullptr;
  }

  std::string path_;
  Fixture fixture_;
  int64_t max_tokens_ = 0;
  // Only the default attention reads this: llama.cpp numerics round K/V to f16 themselves.
  bool round_kv_f16_ = std::getenv("CISA_GOLDEN_F32_KV") == nullptr;

  // Runs every fixture prompt (up to max_tokens, 0: all) in one batch, as llama.cpp did, and
  // checks it against the bars of `numerics`.
  void run_prompts(AttentionNumerics numerics, int64_t max_tokens);
};

void ModelGolden::run_prompts(AttentionNumerics numerics, int64_t max_tokens) {
  const bool llamacpp = numerics == AttentionNumerics::kLlamaCpp;
  ASSERT_GE(fixture_.prompts.size(), 3u);
  int64_t longest = 0;
  for (const auto& p : fixture_.prompts)
    longest = std::max<int64_t>(longest, static_cast<int64_t>(p.ids.size()));
  auto model = load(longest, 512, numerics);
  ASSERT_TRUE(model);
  ASSERT_EQ(static_cast<uint32_t>(model->hparams().n_vocab), fixture_.n_vocab);
  const int V = model->hparams().n_vocab;
  for (const FixturePrompt& p : fixture_.prompts) {
    if (max_tokens && static_cast<int64_t>(p.ids.size()) > max_tokens) {
      std::printf("[ skipped  ] %s: %zu tokens > CISA_MODEL_GOLDEN_MAX_TOKENS\n", p.name.c_str(),
                  p.ids.size());
      continue;
    }
    auto seq = model->add_sequence();
    ASSERT_TRUE(seq.ok());
    std::vector<int64_t> pos(p.positions.begin(), p.positions.end());
    SequenceInput in{
        .seq = *seq, .tokens = p.ids, .outputs = OutputMode::kPositions, .positions = pos};
    std::vector<float> logits;
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(model->forward({&in, 1}, &logits).ok());
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Agreement a;
    size_t exact_prefix = 0;  // leading stored positions whose top-20 logits are bit-identical
    for (size_t j = 0; j < pos.size(); ++j) {
      score_row(p, j, fixture_.top_k, logits.data() + j * V, V, &a);
      if (exact_prefix == j &&
          top_logits_bit_identical(p, j, fixture_.top_k, logits.data() + j * V))
        ++exact_prefix;
    }
    std::printf(
        "[ %-8s ] %s %s, %s attention: %zu tokens in %.1f s (%.0f tok/s), %lld positions: top-1 "
        "%.2f%%, mean KL %.2e, max KL %.2e; leading positions bit-identical to llama.cpp: %zu of "
        "%zu\n",
        "golden", GetParam().name, p.name.c_str(), llamacpp ? "llama.cpp-numerics" : "default",
        p.ids.size(), secs, p.ids.size() / secs, static_cast<long long>(a.n), 100 * a.top1_rate(),
        a.kl_mean(), a.kl_max, exact_prefix, pos.size());
    // Position 0 attends only to itself (softmax weight exactly 1), so in either mode it checks
    // every other operation's rounding: the 8-bit activations with their f16 scales, the integer
    // dot products' lanes and float order, RMSNorm, the GELU table, SiLU, the f16 cache rounding
    // of V. All of it reproduces llama.cpp's CPU build, so the logits must be the same floats;
    // with llama.cpp's attention numerics, at every position. (The portable scalar kernels sum
    // in another order: only the AVX2 ones are llama.cpp's.)
    if ((llamacpp || round_kv_f16_) && std::string(matmul_isa()) != "scalar") {
      ASSERT_EQ(pos[0], 0);
      EXPECT_TRUE(top_logits_bit_identical(p, 0, fixture_.top_k, logits.data()))
          << p.name << ": position 0's logits differ from llama.cpp's in the last bits";
      if (llamacpp) {
        EXPECT_EQ(exact_prefix, pos.size())
            << p.name << ": logits first differ from llama.cpp's at stored position "
            << (exact_prefix < pos.size() ? pos[exact_prefix] : -1);
      }
    }
    if (llamacpp) {
      EXPECT_GE(a.top1_rate(), kTop1Target) << p.name;
      EXPECT_LT(a.kl_mean(), kKlBar) << p.name;
    } else {
      EXPECT_GE(a.top1_rate(), kDefaultTop1Floor) << p.name;
      EXPECT_LT(a.kl_mean(), kDefaultKlCeiling) << p.name;
      if (a.top1_rate() < kTop1Target || a.kl_mean() >= kKlBar)
        std::printf(
            "[ golden   ] %s %s, default attention: top-1 %.2f%%, KL %.2e against the issue's 99%% "
            "and 0.01 (met by the llama.cpp-numerics mode; not asserted here)\n",
            GetParam().name, p.name.c_str(), 100 * a.top1_rate(), a.kl_mean());
    }
    ASSERT_TRUE(model->release_sequence(*seq).ok());
  }
}

TEST_P(ModelGolden, PromptLogitsMatchLlamaCpp) {
  run_prompts(AttentionNumerics::kLlamaCpp, max_tokens_);
}

// The fast attention users run, on the prompts up to 2,000 tokens: looser bars (see the top).
TEST_P(ModelGolden, DefaultAttentionStaysClose) {
  run_prompts(AttentionNumerics::kDefault,
              max_tokens_ ? std::min<int64_t>(max_tokens_, 3000) : 3000);
}

// The shortest prompt through the other code paths: blocks of 7 rows (steps that end mid-page),
// then the last 24 tokens one by one as decode steps, each producing its own row of logits.
TEST_P(ModelGolden, BlockedPrefillAndDecodeMatchLlamaCpp) {
  const FixturePrompt* shortest = &fixture_.prompts[0];
  for (const auto& p : fixture_.prompts)
    if (p.ids.size() < shortest->ids.size()) shortest = &p;
  const FixturePrompt& p = *shortest;
  const int64_t n = static_cast<int64_t>(p.ids.size());
  ASSERT_GT(n, 32);
  auto model = load(n, 7);
  ASSERT_TRUE(model);
  const int V = model->hparams().n_vocab;
  auto seq = model->add_sequence();
  ASSERT_TRUE(seq.ok());
  const int64_t split = n - 24;
  std::map<int64_t, size_t> row_of;  // prompt position -> fixture row
  for (size_t j = 0; j < p.positions.size(); ++j) row_of[p.positions[j]] = j;
  std::vector<int64_t> want;
  for (int64_t q = 0; q < split; ++q)
    if (row_of.count(q)) want.push_back(q);
  SequenceInput in{.seq = *seq,
                   .tokens = {p.ids.data(), static_cast<size_t>(split)},
                   .outputs = OutputMode::kPositions,
                   .positions = want};
  std::vector<float> logits;
  ASSERT_TRUE(model->forward({&in, 1}, &logits).ok());
  Agreement a;
  for (size_t i = 0; i < want.size(); ++i)
    score_row(p, row_of[want[i]], fixture_.top_k, logits.data() + i * V, V, &a);
  for (int64_t q = split; q < n; ++q) {
    SequenceInput step{.seq = *seq, .tokens = {p.ids.data() + q, 1}};
    ASSERT_TRUE(model->forward({&step, 1}, &logits).ok());
    if (row_of.count(q)) score_row(p, row_of[q], fixture_.top_k, logits.data(), V, &a);
  }
  EXPECT_EQ(*model->sequence_length(*seq), n);
  std::printf(
      "[ %-8s ] %s %s blocked+decode, llama.cpp-numerics attention: %lld positions: top-1 %.2f%% "
      "(floor %.0f%%, issue's target 99%%), mean KL %.2e, max KL %.2e\n",
      "golden", GetParam().name, p.name.c_str(), static_cast<long long>(a.n), 100 * a.top1_rate(),
      100 * GetParam().blocked_top1_floor, a.kl_mean(), a.kl_max);
  EXPECT_EQ(a.n, static_cast<int64_t>(p.positions.size()));
  EXPECT_GE(a.top1_rate(), GetParam().blocked_top1_floor);
  EXPECT_LT(a.kl_mean(), kKlBar);
}

// Decode steps against llama.cpp's own decode steps (tests/golden/fixtures/decode_<model>.bin,
// tests/golden/scripts/make_llamacpp_decode_fixtures.py): a prefill of S tokens in calls of at
// most 512 ("name:prefill=S"), then one token per forward call, as llama.cpp was run. A batch of
// one token takes llama.cpp's one-column attention products, which the llama.cpp-numerics mode
// reproduces, so every stored row (the prefill's last and each decode step's) must be the same
// floats, including Gemma 3's sliding-window layers past 512 positions.
TEST_P(ModelGolden, DecodeStepsMatchLlamaCpp) {
  const char* dir = std::getenv("CISA_GOLDEN_FIXTURES");
  const std::string fx =
      (dir && *dir ? std::string(dir) : std::string(CISA_SOURCE_DIR) + "/tests/golden/fixtures") +
      "/decode_" + GetParam().name + ".bin";
  Fixture dec;
  std::string err;
  if (!read_fixture(fx, &dec, &err)) {
    if (err == "absent")
      GTEST_SKIP() << "no decode fixture " << fx
                   << " (tests/golden/scripts/make_llamacpp_decode_fixtures.py)";
    FAIL() << fx << ": " << err;
  }
  if (std::string(matmul_isa()) == "scalar") GTEST_SKIP() << "scalar kernels sum in another order";
  for (const FixturePrompt& p : dec.prompts) {
    const size_t at = p.name.find("prefill=");
    ASSERT_NE(at, std::string::npos) << p.name;
    const int64_t split = std::stoll(p.name.substr(at + 8)), n = static_cast<int64_t>(p.ids.size());
    ASSERT_TRUE(split >= 1 && split < n) << p.name;
    if (max_tokens_ && n > max_tokens_) continue;
    auto model = load(n, 512);
    ASSERT_TRUE(model);
    ASSERT_EQ(static_cast<uint32_t>(model->hparams().n_vocab), dec.n_vocab);
    const int V = model->hparams().n_vocab;
    auto seq = model->add_sequence();
    ASSERT_TRUE(seq.ok());
    std::map<int64_t, size_t> row_of;  // position -> fixture row
    for (size_t j = 0; j < p.positions.size(); ++j) row_of[p.positions[j]] = j;
    ASSERT_TRUE(row_of.count(split - 1)) << p.name;
    const std::vector<int64_t> last = {split - 1};
    SequenceInput in{.seq = *seq,
                     .tokens = {p.ids.data(), static_cast<size_t>(split)},
                     .outputs = OutputMode::kPositions,
                     .positions = last};
    std::vector<float> logits;
    ASSERT_TRUE(model->forward({&in, 1}, &logits).ok());
    Agreement a;
    int64_t identical = 0, first_diff = -1;
    auto check = [&](int64_t q) {
      score_row(p, row_of[q], dec.top_k, logits.data(), V, &a);
      if (top_logits_bit_identical(p, row_of[q], dec.top_k, logits.data()))
        ++identical;
      else if (first_diff < 0)
        first_diff = q;
    };
    check(split - 1);
    for (int64_t q = split; q < n; ++q) {
      SequenceInput step{.seq = *seq, .tokens = {p.ids.data() + q, 1}};
      ASSERT_TRUE(model->forward({&step, 1}, &logits).ok());
      if (row_of.count(q)) check(q);
    }
    std::printf(
        "[ %-8s ] %s %s, llama.cpp-numerics attention: %lld rows (prefill's last + decode steps): "
        "bit-identical %lld, top-1 %.2f%%, mean KL %.2e\n",
        "golden", GetParam().name, p.name.c_str(), static_cast<long long>(a.n),
        static_cast<long long>(identical), 100 * a.top1_rate(), a.kl_mean());
    EXPECT_EQ(a.n, static_cast<int64_t>(p.positions.size())) << p.name;
    EXPECT_EQ(identical, a.n) << p.name << ": first row differing from llama.cpp's at position "
                              << first_diff;
  }
}

// The exact function of the stored weights: with every matrix widened to f32 (no 8-bit
// activations) the forward pass must reproduce an fp64 numpy implementation written from the
// architectures' descriptions (tests/golden/scripts/make_model_reference.py, weights dequantised by
// the gguf package) to f32 rounding: same top-1 everywhere, top-20 logits within 0.02, KL < 1e-5.
// This separates the architecture (checked here tightly) from quantisation noise (the llama.cpp
// comparisons above, whose spread is that of 8-bit activations).
TEST_P(ModelGolden, ExactForwardMatchesFp64Reference) {
  const std::string fx =
      std::string(CISA_SOURCE_DIR) + "/tests/golden/fixtures/reference_" + GetParam().name + ".bin";
  Fixture ref;
  std::string err;
  if (!read_fixture(fx, &ref, &err)) {
    if (err == "absent")
      GTEST_SKIP() << "no reference fixture " << fx
                   << " (tests/golden/scripts/make_model_reference.py)";
    FAIL() << fx << ": " << err;
  }
  ASSERT_EQ(ref.prompts.size(), 1u);
  const FixturePrompt& p = ref.prompts[0];
  ModelOptions o;
  o.context = 256;
  o.prefill_block = 16;  // several steps, ending mid-page
  o.weights_f32 = true;
  auto m = Model::load(path_, o);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const int V = (*m)->hparams().n_vocab;
  ASSERT_EQ(static_cast<uint32_t>(V), ref.n_vocab);
  auto seq = (*m)->add_sequence();
  ASSERT_TRUE(seq.ok());
  SequenceInput in{.seq = *seq, .tokens = p.ids, .outputs = OutputMode::kAll};
  std::vector<float> logits;
  ASSERT_TRUE((*m)->forward({&in, 1}, &logits).ok());
  Agreement a;
  double max_diff = 0;
  for (size_t j = 0; j < p.positions.size(); ++j) {
    const float* row = logits.data() + static_cast<size_t>(p.positions[j]) * V;
    score_row(p, j, ref.top_k, row, V, &a);
    for (uint32_t t = 0; t < ref.top_k; ++t)
      max_diff = std::max(max_diff, std::abs(double(row[p.top_ids[j * ref.top_k + t]]) -
                                             p.top_logits[j * ref.top_k + t]));
  }
  std::printf(
      "[ %-8s ] %s exact (f32 weights) vs fp64: %lld positions: top-1 %.2f%%, mean KL %.2e, max "
      "|logit diff| %.4f\n",
      "golden", GetParam().name, static_cast<long long>(a.n), 100 * a.top1_rate(), a.kl_mean(),
      max_diff);
  EXPECT_EQ(a.top1_same, a.n);
  EXPECT_LT(a.kl_mean(), 1e-5);
  EXPECT_LT(max_diff, 0.02);
}

INSTANTIATE_TEST_SUITE_P(Models, ModelGolden, ::testing::ValuesIn(kModels),
                         [](const ::testing::TestParamInfo<ModelCase>& info) {
                           std::string s = info.param.name;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
}  // namespace cisa
