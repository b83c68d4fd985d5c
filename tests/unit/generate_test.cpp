// The generation loop (generate.h) against hand-written forward/sample loops on a tiny random llama
// model written by the test (tiny_llama_builder.h), and on the real models when downloaded:
//  - greedy and seeded generation equal a forward/argmax (forward/Sampler) loop token for token;
//  - batched requests of different prompt lengths, also with fewer sequences than requests
//    (requests wait for a free one), give the tokens of separate runs, decode steps shared;
//  - stop tokens, stop strings (cut and never streamed), end of generation and ignore_eos,
//    max_tokens, cancelling (callback and cancel()), context limits, bad requests;
//  - every sequence is released, also after a forward error;
//  - streamed text is whole UTF-8 characters and adds up to the result's text (real model).
#include "cisa/model/generate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cisa/model/model.h"
#include "cisa/model/sampling.h"
#include "cisa/model/tokenizer.h"
#include "model/unicode.h"
#include "tiny_llama_builder.h"

namespace cisa {
namespace {

using testing::TinyLlama;

const std::string& tiny_path() {
  static const std::string path = [] {
    TinyLlama m;
    m.randomize(11, 0.5f);
    return m.write(::testing::TempDir() + "/generate_tiny_" + std::to_string(::getpid()) + ".gguf");
  }();
  return path;
}

std::unique_ptr<Model> load_tiny(int64_t context = 1024, int max_sequences = 4,
                                 int prefill_block = 32) {
  auto m = Model::load(tiny_path(), {.threads = 2,
                                     .context = context,
                                     .max_sequences = max_sequences,
                                     .prefill_block = prefill_block});
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(*m) : nullptr;
}

using testing::letters;

// The reference: prompt forward, then sample (argmax when greedy) and feed one token at a time.
std::vector<int32_t> hand_loop(Model& m, const std::vector<int32_t>& prompt, int n,
                               const SamplingParams& p) {
  auto sampler = Sampler::create(p);
  EXPECT_TRUE(sampler.ok());
  auto seq = m.add_sequence();
  EXPECT_TRUE(seq.ok());
  std::vector<float> logits;
  SequenceInput in{.seq = *seq, .tokens = prompt};
  EXPECT_TRUE(m.forward({&in, 1}, &logits).ok());
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(p.greedy ? argmax(logits) : sampler->sample(logits));
    if (i + 1 == n) break;
    SequenceInput one{.seq = *seq, .tokens = {&out.back(), 1}};
    EXPECT_TRUE(m.forward({&one, 1}, &logits).ok());
  }
  EXPECT_TRUE(m.release_sequence(*seq).ok());
  return out;
}

GenerationResult run_one(Model& m, const GenerationRequest& r, GenerationCallbacks cb = {}) {
  std::vector<GenerationResult> out;
  Status s = generate(m, {&r, 1}, &out, cb);
  EXPECT_TRUE(s.ok()) << s.message();
  return out.empty() ? GenerationResult{} : out[0];
}

// Every page is free again: max_sequences new sequences can each take a full context (the cache
// holds exactly that many pages), which fails if any page was left with a finished request.
void expect_all_released(Model& m) {
  std::vector<int32_t> fill(static_cast<size_t>(m.context()), TinyLlama::letter_token(1));
  std::vector<SequenceInput> ins;
  for (int i = 0; i < m.options().max_sequences; ++i) {
    auto seq = m.add_sequence();
    ASSERT_TRUE(seq.ok());
    ins.push_back({.seq = *seq, .tokens = fill, .outputs = OutputMode::kNone});
  }
  std::vector<float> logits;
  Status s = m.forward(ins, &logits);
  EXPECT_TRUE(s.ok()) << s.message();
  for (const SequenceInput& in : ins) EXPECT_TRUE(m.release_sequence(in.seq).ok());
}

TEST(Generate, GreedyEqualsForwardArgmaxLoop) {
  auto m = load_tiny();
  ASSERT_TRUE(m);
  for (int len : {1, 9, 70}) {
    const std::vector<int32_t> prompt = letters(len, 100u + static_cast<uint32_t>(len));
    const int n = 24;
    const std::vector<int32_t> want = hand_loop(*m, prompt, n, {.greedy = true});
    GenerationRequest r{
        .prompt = prompt, .max_tokens = n, .sampling = {.greedy = true}, .ignore_eos = true};
    std::string streamed;
    GenerationCallbacks cb{.on_token = [&](const GeneratedToken& t) {
      streamed += t.text;
      return true;
    }};
    const GenerationResult g = run_one(*m, r, cb);
    EXPECT_EQ(g.tokens, want) << "prompt length " << len;
    EXPECT_EQ(g.finish, FinishReason::kLength);
    EXPECT_EQ(g.prompt_tokens, static_cast<int64_t>(prompt.size()));
    EXPECT_EQ(g.text, m->tokenizer().decode(want));
    EXPECT_EQ(streamed, g.text);
    EXPECT_EQ(g.timings.decode_steps, n - 1);
    EXPECT_GT(g.timings.prefill_seconds, 0);
    EXPECT_GT(g.timings.decode_seconds, 0);
    EXPECT_GE(g.timings.time_to_first_token, g.timings.prefill_seconds);
    EXPECT_NEAR(g.timings.decode_tokens_per_s, (n - 1) / g.timings.decode_seconds, 1e-6);
  }
  expect_all_released(*m);
}

TEST(Generate, SeededSamplingEqualsSamplerLoopAndRepeats) {
  auto m = load_tiny();
  ASSERT_TRUE(m);
  const std::vector<int32_t> prompt = letters(20, 5);
  const SamplingParams p{.temperature = 1.5f, .top_k = 12, .top_p = 0.9f, .seed = 42};
  const std::vector<int32_t> want = hand_loop(*m, prompt, 30, p);
  GenerationRequest r{.prompt = prompt, .max_tokens = 30, .sampling = p, .ignore_eos = true};
  const GenerationResult a = run_one(*m, r), b = run_one(*m, r);
  EXPECT_EQ(a.tokens, want);
  EXPECT_EQ(b.tokens, want);
  r.sampling.seed = 43;
  EXPECT_NE(run_one(*m, r).tokens, want);  // 30 draws at T = 1.5: another seed differs somewhere
}

// Requests of different prompt lengths and budgets in one batch equal their separate runs; with
// two sequences for four requests the later ones wait and still match.
TEST(Generate, BatchedEqualsSeparateRuns) {
  const std::vector<int> lens = {4, 37, 100, 16};
  const std::vector<int> max_new = {8, 20, 3, 12};
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < lens.size(); ++i)
    reqs.push_back({.prompt = letters(lens[i], 7u * static_cast<uint32_t>(i) + 1u),
                    .max_tokens = max_new[i],
                    .sampling = i == 1 ? SamplingParams{.temperature = 1.2f, .seed = 9}
                                       : SamplingParams{.greedy = true},
                    .ignore_eos = true});
  auto m = load_tiny(1024, 4, 32);
  ASSERT_TRUE(m);
  std::vector<GenerationResult> separate;
  for (const GenerationRequest& r : reqs) separate.push_back(run_one(*m, r));

  for (int slots : {4, 2}) {
    auto mb = load_tiny(1024, slots, 32);
    ASSERT_TRUE(mb);
    Generator g(*mb);
    for (const GenerationRequest& r : reqs) ASSERT_TRUE(g.add(r).ok());
    int steps = 0;
    mb->reset_stats();
    while (!g.done()) {
      ASSERT_TRUE(g.step().ok());
      EXPECT_LE(g.num_running(), static_cast<size_t>(slots));
      ++steps;
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(g.result(i).tokens, separate[i].tokens) << "request " << i << ", " << slots;
      EXPECT_EQ(g.result(i).text, separate[i].text);
      EXPECT_EQ(g.result(i).finish, FinishReason::kLength);
    }
    if (slots == 4) {
      // One step for all prompts, then one per decode step of the longest request.
      EXPECT_EQ(steps, 20);
      // Forward blocks: the 161 prompt rows in blocks of 32, then one block per decode step.
      EXPECT_EQ(mb->stats().steps, (161 + 31) / 32 + 19);
    }
    expect_all_released(*mb);
  }
}

// Each request's pages (GenerationResult::traffic) are its own: batched CISA requests report what
// the same request run alone reports, and alone that is the model's whole count (ForwardStats).
TEST(Generate, PerRequestPagesEqualSeparateRuns) {
  const std::vector<int> lens = {200, 37, 150};
  const std::vector<int> max_new = {30, 40, 5};
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < lens.size(); ++i)
    reqs.push_back({.prompt = letters(lens[i], 5u * static_cast<uint32_t>(i) + 3u),
                    .max_tokens = max_new[i],
                    .sampling = {.greedy = true},
                    .ignore_eos = true});
  AttentionOptions cisa{.mode = AttentionMode::kCisa,
                        .selection = {.budget = 2, .window = 1, .qshare = 4}};
  auto load = [&](int slots) {
    auto m = Model::load(tiny_path(), {.threads = 2,
                                       .context = 512,
                                       .max_sequences = slots,
                                       .prefill_block = 32,
                                       .attention = cisa});
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? std::move(*m) : nullptr;
  };
  auto one = load(1);
  ASSERT_TRUE(one);
  std::vector<SequenceTraffic> alone;
  for (const GenerationRequest& r : reqs) {
    one->reset_stats();
    const GenerationResult res = run_one(*one, r);
    alone.push_back(res.traffic);
    EXPECT_EQ(res.traffic.global_pages_read, one->stats().global_pages_read);
    EXPECT_EQ(res.traffic.global_pages_dense, one->stats().global_pages_dense);
    // Past the window and budget, a query reads fewer pages than dense.
    EXPECT_GT(res.traffic.global_pages_read, 0);
    if (r.prompt.size() > 100) {
      EXPECT_LT(res.traffic.global_pages_read, res.traffic.global_pages_dense);
    }
  }
  auto batched = load(3);
  ASSERT_TRUE(batched);
  std::vector<GenerationResult> out;
  ASSERT_TRUE(generate(*batched, reqs, &out).ok());
  SequenceTraffic sum;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(out[i].traffic.global_pages_read, alone[i].global_pages_read) << "request " << i;
    EXPECT_EQ(out[i].traffic.global_pages_dense, alone[i].global_pages_dense) << "request " << i;
    sum.global_pages_read += out[i].traffic.global_pages_read;
    sum.global_pages_dense += out[i].traffic.global_pages_dense;
  }
  EXPECT_EQ(sum.global_pages_read, batched->stats().global_pages_read);
  EXPECT_EQ(sum.global_pages_dense, batched->stats().global_pages_dense);
  // A released sequence has no counters.
  auto seq = batched->add_sequence();
  ASSERT_TRUE(seq.ok());
  EXPECT_TRUE(batched->sequence_traffic(*seq).ok());
  ASSERT_TRUE(batched->release_sequence(*seq).ok());
  EXPECT_EQ(batched->sequence_traffic(*seq).status().code(), StatusCode::kNotFound);
}

TEST(Generate, StopTokensAndStopStrings) {
  auto m = load_tiny();
  ASSERT_TRUE(m);
  GenerationRequest r{.prompt = letters(12, 77),
                      .max_tokens = 40,
                      .sampling = {.greedy = true},
                      .ignore_eos = true};
  const GenerationResult full = run_one(*m, r);
  ASSERT_EQ(full.tokens.size(), 40u);
  const std::string& text = full.text;
  ASSERT_EQ(text.size(), 40u) << "one letter per token";

  // Stop token: the first occurrence of the token generated sixth.
  const int32_t stop_id = full.tokens[5];
  size_t j = 0;
  while (full.tokens[j] != stop_id) ++j;
  GenerationRequest rt = r;
  rt.stop_tokens = {999, stop_id};
  const GenerationResult t = run_one(*m, rt);
  EXPECT_EQ(t.finish, FinishReason::kStop);
  EXPECT_EQ(t.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + j + 1));
  EXPECT_EQ(t.text, text.substr(0, j));  // the stop token's text is left out

  // Stop string: three letters from the middle; text cut before its first occurrence, the
  // token completing it the last one, and nothing of it streamed.
  const std::string stop = text.substr(20, 3);
  const size_t p = text.find(stop);
  GenerationRequest rs = r;
  rs.stop_strings = {"zzz", stop};
  std::string streamed, tail = "unset";
  GenerationCallbacks cb{
      .on_token =
          [&](const GeneratedToken& g) {
            streamed += g.text;
            return true;
          },
      .on_finish = [&](size_t, const GenerationResult&, std::string_view t) { tail = t; }};
  const GenerationResult s = run_one(*m, rs, cb);
  EXPECT_EQ(s.finish, FinishReason::kStop);
  EXPECT_EQ(s.tokens.size(), p + 3);
  EXPECT_EQ(s.text, text.substr(0, p));
  EXPECT_EQ(streamed, s.text);
  EXPECT_EQ(tail, "");

  // A stop string that never appears is held back only while it might: the stream still adds
  // up to the text, with a held-back tail at the end.
  GenerationRequest rn = r;
  rn.stop_strings = {text.substr(37, 3) + "zz"};  // the last three letters, then no match
  streamed.clear();
  const GenerationResult n = run_one(*m, rn, cb);
  EXPECT_EQ(n.finish, FinishReason::kLength);
  EXPECT_EQ(n.text, text);
  EXPECT_EQ(streamed + tail, text);
  EXPECT_EQ(tail, text.substr(37));
}

TEST(StopStringStream, HoldsBackPartialMatchesAndCharacters) {
  StopStringStream s({"o w", "\xE2\x82\xAC!"});  // "o w" and "€!"
  EXPECT_EQ(s.push("Hel"), "Hel");
  EXPECT_EQ(s.push("lo"), "l");  // "o" may start "o w"
  EXPECT_EQ(s.push(" x"), "o x");
  EXPECT_EQ(s.push("\xE2\x82"), "");  // an incomplete character
  EXPECT_EQ(s.push("\xAC"), "");      // "€" may start "€!"
  EXPECT_EQ(s.push("?"), "\xE2\x82\xAC?");
  EXPECT_EQ(s.push("yo"), "y");
  EXPECT_EQ(s.push(" world"), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.text(), "Hello x\xE2\x82\xAC?y");
  EXPECT_EQ(s.push("more"), "");
  EXPECT_EQ(s.finish(), "");

  StopStringStream plain;
  EXPECT_EQ(plain.push("a\xF0\x9F"), "a");
  EXPECT_EQ(plain.finish(), "\xF0\x9F");  // what is held at the end comes out as it is
  EXPECT_FALSE(plain.stopped());
}

// With random sampling at a high temperature the end-of-sequence token comes up; the run that
// stops there and the ignore_eos run draw the same tokens up to it.
TEST(Generate, EndOfGenerationAndIgnoreEos) {
  auto m = load_tiny();
  ASSERT_TRUE(m);
  const int32_t eos = m->tokenizer().eos_id();
  ASSERT_TRUE(m->tokenizer().is_eog(eos));
  bool found = false;
  for (uint64_t seed = 1; seed < 200 && !found; ++seed) {
    GenerationRequest r{.prompt = letters(8, 3),
                        .max_tokens = 40,
                        .sampling = {.temperature = 4.0f, .seed = seed},
                        .ignore_eos = true};
    const GenerationResult ign = run_one(*m, r);
    size_t at = 0;
    while (at < ign.tokens.size() && ign.tokens[at] != eos) ++at;
    if (at == 0 || at + 1 >= ign.tokens.size()) continue;
    found = true;
    EXPECT_EQ(ign.finish, FinishReason::kLength);
    EXPECT_EQ(ign.tokens.size(), 40u);
    r.ignore_eos = false;
    const GenerationResult e = run_one(*m, r);
    EXPECT_EQ(e.finish, FinishReason::kEos);
    EXPECT_EQ(e.tokens, std::vector<int32_t>(ign.tokens.begin(), ign.tokens.begin() + at + 1));
    EXPECT_EQ(e.text, m->tokenizer().decode({ign.tokens.data(), at}));
    EXPECT_EQ(e.timings.decode_steps, static_cast<int64_t>(at));
  }
  EXPECT_TRUE(found) << "no seed in [1, 200) sampled EOS within 40 tokens";
}

TEST(Generate, CancelFromCallbackAndBetweenSteps) {
  auto m = load_tiny(1024, 2);
  ASSERT_TRUE(m);
  GenerationRequest a{
      .prompt = letters(10, 1), .max_tokens = 12, .sampling = {.greedy = true}, .ignore_eos = true};
  GenerationRequest b = a;
  b.prompt = letters(30, 2);
  const GenerationResult solo_a = run_one(*m, a), solo_b = run_one(*m, b);

  int seen_b = 0;
  GenerationCallbacks cb{.on_token = [&](const GeneratedToken& t) {
    return t.request != 1 || ++seen_b < 3;  // cancel b at its third token
  }};
  std::vector<GenerationResult> out;
  const std::vector<GenerationRequest> both = {a, b};
  ASSERT_TRUE(generate(*m, both, &out, cb).ok());
  EXPECT_EQ(out[0].tokens, solo_a.tokens);
  EXPECT_EQ(out[0].finish, FinishReason::kLength);
  EXPECT_EQ(out[1].finish, FinishReason::kCancelled);
  EXPECT_EQ(out[1].tokens, std::vector<int32_t>(solo_b.tokens.begin(), solo_b.tokens.begin() + 3));

  // cancel(): a running request and one still waiting for a sequence (two slots, three requests).
  Generator g(*m);
  for (const GenerationRequest* r : {&a, &b, &a}) ASSERT_TRUE(g.add(*r).ok());
  ASSERT_TRUE(g.step().ok());
  EXPECT_EQ(g.num_running(), 2u);
  g.cancel(1);
  g.cancel(2);
  EXPECT_EQ(g.num_running(), 1u);
  EXPECT_EQ(g.result(1).finish, FinishReason::kCancelled);
  EXPECT_EQ(g.result(1).tokens.size(), 1u);
  EXPECT_EQ(g.result(2).finish, FinishReason::kCancelled);
  EXPECT_TRUE(g.result(2).tokens.empty());
  while (!g.done()) ASSERT_TRUE(g.step().ok());
  EXPECT_EQ(g.result(0).tokens, solo_a.tokens);
  expect_all_released(*m);
}

// abort() from inside a callback ends every request at once, the later ones of the same step
// unsampled; step() from inside a callback is refused.
TEST(Generate, AbortAndStepFromCallback) {
  auto m = load_tiny(1024, 2);
  ASSERT_TRUE(m);
  Generator* gp = nullptr;
  Status inner = Status::Ok();
  GenerationCallbacks cb{.on_token = [&](const GeneratedToken& t) {
    inner = gp->step();
    gp->abort(internal_error("stop all"));
    return true;
  }};
  Generator g(*m, cb);
  gp = &g;
  const GenerationRequest r{.prompt = letters(6, 1), .max_tokens = 5, .ignore_eos = true};
  ASSERT_TRUE(g.add(r).ok());
  ASSERT_TRUE(g.add(r).ok());
  EXPECT_TRUE(g.step().ok());
  EXPECT_EQ(inner.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(g.done());
  EXPECT_EQ(g.num_running(), 0u);
  EXPECT_EQ(g.result(0).finish, FinishReason::kError);
  EXPECT_EQ(g.result(0).tokens.size(), 1u);
  EXPECT_EQ(g.result(1).finish, FinishReason::kError);
  EXPECT_TRUE(g.result(1).tokens.empty());
  EXPECT_EQ(g.result(1).error.message(), "stop all");
  expect_all_released(*m);
}

TEST(Generate, ContextLimits) {
  auto small = load_tiny(64, 1);
  auto big = load_tiny(1024, 1);
  ASSERT_TRUE(small && big);
  // prompt + max_tokens beyond the context: a length finish when the context is full.
  for (int len : {59, 62}) {  // 60 and 63 prompt tokens
    GenerationRequest r{.prompt = letters(len, 8),
                        .max_tokens = 10,
                        .sampling = {.greedy = true},
                        .ignore_eos = true};
    const GenerationResult g = run_one(*small, r);
    const size_t room = 64 - r.prompt.size();
    EXPECT_EQ(g.finish, FinishReason::kLength);
    ASSERT_EQ(g.tokens.size(), room);
    const std::vector<int32_t> want =
        hand_loop(*big, r.prompt, static_cast<int>(room), {.greedy = true});
    EXPECT_EQ(g.tokens, want);
  }
  // A prompt filling the context is refused before any work; so is the whole batch.
  GenerationRequest ok{.prompt = letters(10, 1), .max_tokens = 4};
  GenerationRequest full{.prompt = letters(63, 1), .max_tokens = 4};
  Generator g(*small);
  auto added = g.add(full);
  ASSERT_FALSE(added.ok());
  EXPECT_EQ(added.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(added.status().message().find("context of 64"), std::string::npos);
  EXPECT_EQ(g.num_requests(), 0u);
  std::vector<GenerationResult> out(1);
  out[0].prompt_tokens = -7;  // untouched on a refused batch
  const std::vector<GenerationRequest> batch = {ok, full};
  EXPECT_EQ(generate(*small, batch, &out).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].prompt_tokens, -7);
  expect_all_released(*small);
}

TEST(Generate, BadRequests) {
  auto m = load_tiny();
  ASSERT_TRUE(m);
  Generator g(*m);
  auto code = [&](GenerationRequest r) { return g.add(std::move(r)).status().code(); };
  EXPECT_EQ(code({}), StatusCode::kInvalidArgument);  // empty prompt
  EXPECT_EQ(code({.prompt = {1, 5}, .max_tokens = 0}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.prompt = {1, 19}}), StatusCode::kInvalidArgument);  // id outside the vocabulary
  EXPECT_EQ(code({.prompt = {1, -1}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.prompt = {1}, .sampling = {.temperature = -1}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.prompt = {1}, .stop_strings = {""}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.prompt = {1}, .stop_strings = {"a\xFF"}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.num_requests(), 0u);
  EXPECT_TRUE(g.done());
  EXPECT_TRUE(g.step().ok());  // nothing to run
  std::vector<GenerationResult>* none = nullptr;
  GenerationRequest r{.prompt = {1}};
  EXPECT_EQ(generate(*m, {&r, 1}, none).code(), StatusCode::kInvalidArgument);
}

// A forward error (here from an attention tap) finishes the step's requests with kError, returns
// the error, and releases their sequences.
TEST(Generate, ForwardErrorReleasesSequences) {
  auto m = load_tiny(128, 2);
  ASSERT_TRUE(m);
  int calls = 0;
  m->set_attention_tap([&](const AttentionTapData&) {
    return ++calls > 6 ? internal_error("tap says no") : Status::Ok();
  });
  const std::vector<GenerationRequest> reqs = {
      {.prompt = letters(5, 1), .max_tokens = 20, .ignore_eos = true},
      {.prompt = letters(9, 2), .max_tokens = 20, .ignore_eos = true}};
  std::vector<GenerationResult> out;
  const Status s = generate(*m, reqs, &out);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  ASSERT_EQ(out.size(), 2u);
  for (const GenerationResult& r : out) {
    EXPECT_EQ(r.finish, FinishReason::kError);
    EXPECT_EQ(r.error.message(), "tap says no");
    EXPECT_FALSE(r.tokens.empty());
    EXPECT_LT(r.tokens.size(), 20u);
  }
  m->set_attention_tap({});
  expect_all_released(*m);
}

// A model without a tokenizer generates ids only.
TEST(Generate, SyntheticModelWithoutTokenizer) {
  auto m = Model::load_synthetic("tiny-llama", {.threads = 2, .context = 256});
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_FALSE((*m)->has_tokenizer());
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  const std::vector<int32_t> want = hand_loop(**m, prompt, 6, {.greedy = true});
  const GenerationResult g =
      run_one(**m, {.prompt = prompt, .max_tokens = 6, .sampling = {.greedy = true}});
  EXPECT_EQ(g.tokens, want);
  EXPECT_EQ(g.finish, FinishReason::kLength);
  EXPECT_TRUE(g.text.empty());
  Generator gen(**m);
  EXPECT_EQ(gen.add({.prompt = prompt, .stop_strings = {"x"}}).status().code(),
            StatusCode::kInvalidArgument);
}

// ---- real models, when downloaded
// ----------------------------------------------------------------

std::string model_path(const char* file) {
  const std::string p = std::string(CISA_SOURCE_DIR) + "/models/" + file;
  return std::filesystem::exists(p) ? p : std::string();
}

TEST(GenerateRealModel, GreedyAndBatchedOnGemma3) {
  const std::string path = model_path("gemma-3-270m-q4_k_m.gguf");
  if (path.empty()) GTEST_SKIP() << "models/gemma-3-270m-q4_k_m.gguf not downloaded (cisa pull)";
  auto m = Model::load(path, {.threads = 2, .context = 512, .max_sequences = 2});
  ASSERT_TRUE(m.ok()) << m.status().message();
  const Tokenizer& tok = (*m)->tokenizer();
  const std::vector<GenerationRequest> reqs = {
      {.prompt = tok.encode("Once upon a time", true),
       .max_tokens = 10,
       .sampling = {.greedy = true}},
      {.prompt = tok.encode("The capital of France is a city that", true),
       .max_tokens = 6,
       .sampling = {.greedy = true}}};
  std::vector<GenerationResult> out;
  ASSERT_TRUE(generate(**m, reqs, &out).ok());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::vector<int32_t> want =
        hand_loop(**m, reqs[i].prompt, static_cast<int>(out[i].tokens.size()), {.greedy = true});
    EXPECT_EQ(out[i].tokens, want) << "request " << i;
    EXPECT_FALSE(out[i].text.empty());
  }
}

TEST(GenerateRealModel, StreamedTextIsWholeCharacters) {
  const std::string path = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (path.empty()) GTEST_SKIP() << "models/SmolLM2-135M-Instruct.Q4_1.gguf not downloaded";
  auto m = Model::load(path, {.threads = 2, .context = 256});
  ASSERT_TRUE(m.ok()) << m.status().message();
  const Tokenizer& tok = (*m)->tokenizer();
  GenerationRequest r{.prompt = tok.encode("日本語の文章と絵文字 🎉🍣 を書いてください:", true),
                      .max_tokens = 48,
                      .sampling = {.temperature = 1.0f, .seed = 3},
                      .ignore_eos = true};
  std::string streamed, tail;
  int64_t pieces = 0, held = 0;
  GenerationCallbacks cb{
      .on_token =
          [&](const GeneratedToken& t) {
            EXPECT_EQ(unicode::incomplete_utf8_suffix(t.text), 0u);
            const std::string raw = tok.token_to_piece(t.token);
            held += unicode::incomplete_utf8_suffix(raw) > 0;
            streamed += t.text;
            ++pieces;
            return true;
          },
      .on_finish = [&](size_t, const GenerationResult&, std::string_view t) { tail = t; }};
  const GenerationResult g = run_one(**m, r, cb);
  EXPECT_EQ(pieces, 48);
  EXPECT_EQ(streamed + tail, g.text);
  EXPECT_EQ(g.text, tok.decode(g.tokens));
  EXPECT_GT(held, 0) << "no token ended inside a character; the test checked nothing";
}

}  // namespace
}  // namespace cisa
