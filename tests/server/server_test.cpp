// The server's pieces against independent references: the Generator's chunked prefill and
// per-request attention against generate() runs alone (on a tiny llama written by the test, and
// on models loaded dense / CISA), request parsing rules, the HTTP server in-process (errors,
// streaming, a client that disconnects), and the chat formats on the real models when present.
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cisa/model/generate.h"
#include "cisa/model/gguf.h"
#include "cisa/model/model.h"
#include "cisa/model/tokenizer.h"
#include "gtest/gtest.h"
#include "server/api.h"
#include "server/chat_template.h"
#include "server/server.h"
#include "unit/tiny_llama_builder.h"

namespace cisa {
namespace {

using nlohmann::json;
using testing::TinyLlama;

const std::string& tiny_path() {
  static const std::string path = [] {
    TinyLlama m;
    m.randomize(5, 0.6f);
    return m.write(::testing::TempDir() + "/server_tiny_" + std::to_string(::getpid()) + ".gguf");
  }();
  return path;
}

std::unique_ptr<Model> load_tiny(AttentionMode mode = AttentionMode::kDense, int sequences = 4) {
  ModelOptions o{.threads = 2, .context = 1024, .max_sequences = sequences, .prefill_block = 64};
  o.attention.mode = mode;
  o.attention.selection = {.budget = 1, .window = 1, .qshare = 1};
  auto m = Model::load(tiny_path(), o);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return m.ok() ? std::move(*m) : nullptr;
}

using testing::letters;

GenerationRequest greedy(std::vector<int32_t> prompt, int64_t n) {
  return {.prompt = std::move(prompt),
          .max_tokens = n,
          .sampling = {.greedy = true},
          .ignore_eos = true};
}

std::vector<int32_t> alone(Model& m, const GenerationRequest& r) {
  std::vector<GenerationResult> out;
  EXPECT_TRUE(generate(m, {&r, 1}, &out).ok());
  return out.empty() ? std::vector<int32_t>{} : out[0].tokens;
}

TEST(Generator, ChunkedPrefillGivesTheTokensOfWholePrompts) {
  auto m = load_tiny();
  ASSERT_TRUE(m);
  std::vector<GenerationRequest> reqs = {greedy(letters(150, 1), 12), greedy(letters(40, 2), 12),
                                         greedy(letters(90, 3), 12)};
  std::vector<std::vector<int32_t>> ref;
  for (const auto& r : reqs) ref.push_back(alone(*m, r));
  Generator g(*m, {}, {.prefill_chunk = 16});
  for (const auto& r : reqs) ASSERT_TRUE(g.add(r).ok());
  while (!g.done()) ASSERT_TRUE(g.step().ok());
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(g.result(i).tokens, ref[i]) << i;
  g.forget(0);
  EXPECT_TRUE(g.result(0).tokens.empty());
  EXPECT_EQ(g.result(1).tokens, ref[1]);
}

TEST(Generator, DecodingGoesOnWhileALongPromptIsFedInChunks) {
  auto m = load_tiny();
  ASSERT_TRUE(m);
  int a_tokens_before_b = -1, a_tokens = 0;
  GenerationCallbacks cb;
  cb.on_token = [&](const GeneratedToken& t) {
    if (t.request == 0) ++a_tokens;
    if (t.request == 1 && a_tokens_before_b < 0) a_tokens_before_b = a_tokens;
    return true;
  };
  Generator g(*m, cb, {.prefill_chunk = 16});
  ASSERT_TRUE(g.add(greedy(letters(10, 4), 100)).ok());
  ASSERT_TRUE(g.step().ok());  // A prefilled: decoding from now on
  ASSERT_TRUE(g.add(greedy(letters(320, 5), 4)).ok());
  while (!g.done()) ASSERT_TRUE(g.step().ok());
  // B needs ceil(321 / 16) = 21 steps of prefill; A got a token in every one of them.
  EXPECT_GE(a_tokens_before_b, 20);
}

TEST(Generator, PerRequestAttentionMatchesModelsLoadedThatWay) {
  auto cisa_model = load_tiny(AttentionMode::kCisa);
  auto dense_model = load_tiny(AttentionMode::kDense);
  ASSERT_TRUE(cisa_model && dense_model);
  ASSERT_TRUE(cisa_model->has_cisa_layers());
  ASSERT_FALSE(dense_model->has_cisa_layers());
  GenerationRequest d = greedy(letters(200, 7), 10);
  d.attention = StepAttention{.mode = AttentionMode::kDense};
  GenerationRequest c = greedy(letters(200, 7), 10);  // the model's own (CISA, budget 1)
  GenerationRequest c2 = greedy(letters(200, 7), 10);
  c2.attention = StepAttention{.mode = AttentionMode::kCisa,
                               .selection = {.budget = 3, .window = 2, .qshare = 1}};
  const auto want_d = alone(*dense_model, greedy(letters(200, 7), 10));
  const auto want_c = alone(*cisa_model, c);
  ModelOptions o3 = cisa_model->options();
  o3.attention.selection = c2.attention->selection;
  auto m3 = Model::load(tiny_path(), o3);
  ASSERT_TRUE(m3.ok());
  const auto want_c2 = alone(**m3, c);
  // The three settings give three different outputs here, so each match below means something.
  ASSERT_NE(want_d, want_c);
  ASSERT_NE(want_c, want_c2);
  ASSERT_NE(want_d, want_c2);
  Generator g(*cisa_model, {}, {.prefill_chunk = 48});
  ASSERT_TRUE(g.add(d).ok());
  ASSERT_TRUE(g.add(c).ok());
  ASSERT_TRUE(g.add(c2).ok());
  while (!g.done()) ASSERT_TRUE(g.step().ok());
  EXPECT_EQ(g.result(0).tokens, want_d);
  EXPECT_EQ(g.result(1).tokens, want_c);
  EXPECT_EQ(g.result(2).tokens, want_c2);
  // A dense model refuses CISA per request.
  EXPECT_EQ(Generator::check(*dense_model, c2).code(), StatusCode::kFailedPrecondition);
}

server::ApiContext context_for(const Model& m) {
  return {.model_id = "tiny",
          .model = &m,
          .chat_error = "no chat template here",
          .cisa_defaults = m.options().attention.selection};
}

TEST(Api, RequestsAreCheckedFieldByField) {
  auto dense = load_tiny();
  auto cisa_model = load_tiny(AttentionMode::kCisa);
  ASSERT_TRUE(dense && cisa_model);
  const auto ctx = context_for(*dense), cctx = context_for(*cisa_model);
  using server::Route;
  auto status = [](const std::string& body, const server::ApiContext& c,
                   Route r = Route::kCompletions) {
    auto p = server::parse_request(body, r, c);
    return p.ok() ? 200 : p.error().http_status;
  };
  auto message = [](const std::string& body, const server::ApiContext& c) {
    auto p = server::parse_request(body, Route::kCompletions, c);
    return p.ok() ? std::string("ok") : p.error().message;
  };
  EXPECT_EQ(status(R"({"prompt": "abc", "max_tokens": 3, "temperature": 0})", ctx), 200);
  EXPECT_EQ(status(R"({"prompt": [1, 3, 4]})", ctx), 200);
  EXPECT_EQ(status(R"({"prompt": ["abc"], "model": "tiny"})", ctx), 200);
  EXPECT_EQ(status(R"({"prompt": "abc", "model": "other"})", ctx), 404);
  EXPECT_EQ(status("{", ctx), 400);
  EXPECT_EQ(status(R"({"prompt": ["a", "b"]})", ctx), 400);
  EXPECT_EQ(status(R"({"prompt": [1, 99]})", ctx), 400);
  EXPECT_EQ(status(R"({"prompt": "abc", "max_tokens": 1.5})", ctx), 400);
  EXPECT_EQ(status(R"({"prompt": "abc", "top_p": 0})", ctx), 400);
  EXPECT_EQ(status(R"({"prompt": "abc", "seed": -3})", ctx), 400);
  EXPECT_EQ(status(R"({"prompt": "abc", "stop": ["a", "b", "c", "d", "e"]})", ctx), 400);
  EXPECT_EQ(status(R"({"prompt": "abc", "stop": [""]})", ctx), 400);
  EXPECT_EQ(status(R"({"prompt": "abc", "logprobs": 2})", ctx), 400);
  EXPECT_EQ(status(R"({"prompt": "abc", "presence_penalty": 0})", ctx), 200);
  EXPECT_EQ(status(R"({"prompt": "abc", "stream": "yes"})", ctx), 400);
  EXPECT_EQ(status(R"({"messages": [{"role": "user", "content": "a"}]})", ctx, Route::kChat), 400);
  std::string long_prompt = "[1";
  for (int i = 0; i < 1100; ++i) long_prompt += ",3";
  EXPECT_NE(message("{\"prompt\": " + long_prompt + "]}", ctx).find("context"), std::string::npos);
  EXPECT_NE(message(R"({"prompt": "abc", "n": 3})", ctx).find("'n' must be 1"), std::string::npos);
  // Attention: dense per request anywhere; CISA settings need a model loaded with CISA.
  EXPECT_EQ(status(R"({"prompt": "abc", "attention": "dense"})", ctx), 200);
  EXPECT_NE(message(R"({"prompt": "abc", "cisa": {"budget": 4}})", ctx).find("--attention cisa"),
            std::string::npos);
  EXPECT_NE(message(R"({"prompt": "abc", "cisa": {"budget": -1}})", cctx).find("budget"),
            std::string::npos);
  EXPECT_NE(message(R"({"prompt": "abc", "cisa": {"qshare": 0}})", cctx).find("qshare"),
            std::string::npos);
  EXPECT_NE(message(R"({"prompt": "abc", "cisa": {"budgte": 4}})", cctx).find("unknown field"),
            std::string::npos);
  EXPECT_NE(message(R"({"prompt": "abc", "cisa": {"window": 268435456}})", cctx).find("window"),
            std::string::npos);
  auto ok = server::parse_request(
      R"({"prompt": "abc", "cisa": {"budget": 7, "sink_pages": 1}, "temperature": 0.5, "seed": 9,
          "top_k": 3, "stop": "x", "ignore_eos": true, "stream": true,
          "stream_options": {"include_usage": true}})",
      Route::kCompletions, cctx);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  ASSERT_TRUE(ok->gen.attention.has_value());
  EXPECT_EQ(ok->gen.attention->selection.budget, 7);
  EXPECT_EQ(ok->gen.attention->selection.sink_pages, 1);
  EXPECT_EQ(ok->gen.attention->selection.window, 1);  // the server's default
  EXPECT_EQ(ok->gen.sampling.seed, 9u);
  EXPECT_EQ(ok->gen.sampling.top_k, 3);
  EXPECT_FALSE(ok->gen.sampling.greedy);
  EXPECT_TRUE(ok->stream && ok->include_usage && ok->gen.ignore_eos);
  EXPECT_EQ(ok->gen.stop_strings, std::vector<std::string>{"x"});
}

std::string model_file(const char* name) {
  const std::string p = std::string(CISA_SOURCE_DIR) + "/models/" + name;
  return std::ifstream(p).good() ? p : "";
}

// Two exceptions out of parse_request that server_request_fuzz found (each a 500 from the HTTP
// layer, and a crash for any other caller): a field of another type inside an object ("type": 1
// in a response_format or a message part) made json::value() throw; and a number beyond a double.
// Both are 400s.
TEST(Api, AFieldOfAnotherTypeInsideAnObjectIsA400NotAnException) {
  auto dense = load_tiny();
  ASSERT_TRUE(dense);
  using server::Route;
  const auto ctx = context_for(*dense);
  // json::parse throws out_of_range for "1e999"; parse_request caught parse_error only.
  for (const char* body : {R"({"prompt": [1e999]})", R"({"prompt": "a", "top_p": -1e400})"}) {
    auto big = server::parse_request(body, Route::kCompletions, ctx);
    ASSERT_FALSE(big.ok()) << body;
    EXPECT_EQ(big.error().http_status, 400) << body;
    EXPECT_NE(big.error().message.find("not valid JSON"), std::string::npos) << body;
  }
  auto p = server::parse_request(R"({"prompt": "abc", "response_format": {"type": 1}})",
                                 Route::kCompletions, ctx);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().http_status, 400);
  EXPECT_EQ(p.error().param, "response_format");
  // Message parts are read only under a chat template: SmolLM2's ChatML.
  const std::string path = model_file("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (path.empty()) GTEST_SKIP() << "models/SmolLM2-135M-Instruct.Q4_1.gguf not downloaded";
  auto m = Model::load(path, ModelOptions{.threads = 1, .context = 256, .max_sequences = 1});
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto chat = server::ChatTemplate::for_model((*m)->file(), (*m)->tokenizer(), "");
  ASSERT_TRUE(chat.ok()) << chat.status().message();
  server::ApiContext cctx = context_for(**m);
  cctx.chat = &*chat;
  for (const char* body :
       {R"({"messages": [{"role": "user", "content": [{"type": 1, "text": "a"}]}]})",
        R"({"messages": [{"role": "user", "content": [{"type": null, "text": "a"}]}]})",
        R"({"messages": [{"role": "user", "content": [{"type": ["text"], "text": "a"}]}]})"}) {
    auto r = server::parse_request(body, Route::kChat, cctx);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error().http_status, 400) << body;
    EXPECT_EQ(r.error().param, "messages[0].content") << body;
  }
  auto ok = server::parse_request(
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]})",
      Route::kChat, cctx);
  EXPECT_TRUE(ok.ok()) << ok.error().message;
}

// A synthetic model (no file, no tokenizer) serves token-id prompts; the generated ids come back
// in choices[0].token_ids, streamed one chunk per token batch; text prompts and chat get a 400.
TEST(Http, ASyntheticModelServesTokenIds) {
  ModelOptions o{.threads = 1, .context = 256, .max_sequences = 2};
  auto m = Model::load_synthetic("tiny-llama", o);
  ASSERT_TRUE(m.ok()) << m.status().message();
  server::ServerOptions so{.host = "127.0.0.1", .port = 0, .model_id = "tiny-llama-synthetic"};
  auto srv = server::Server::create(**m, so);
  ASSERT_TRUE(srv.ok()) << srv.status().message();
  ASSERT_TRUE((*srv)->start().ok());
  httplib::Client cli("127.0.0.1", (*srv)->port());
  cli.set_read_timeout(60, 0);
  auto post = [&](const std::string& path, const std::string& body) {
    return cli.Post(path.c_str(), body, "application/json");
  };
  auto r = post("/v1/completions", R"({"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
  EXPECT_EQ(j["choices"][0]["text"], "");
  EXPECT_EQ(j["choices"][0]["token_ids"].size(), 4u);
  r = post("/v1/completions",
           R"({"prompt": [1, 2, 3], "max_tokens": 3, "stream": true, "ignore_eos": true})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  size_t ids = 0;
  for (size_t at = 0; (at = r->body.find("data: {", at)) != std::string::npos; ++at) {
    const size_t end = r->body.find("\n\n", at);
    json c = json::parse(r->body.substr(at + 6, end - at - 6));
    if (c["choices"].size() && c["choices"][0].contains("token_ids"))
      ids += c["choices"][0]["token_ids"].size();
  }
  EXPECT_EQ(ids, 3u) << r->body;
  EXPECT_EQ(post("/v1/completions", R"({"prompt": "abc"})")->status, 400);
  EXPECT_EQ(
      post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "a"}]})")->status,
      400);
  auto models = cli.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["weights"], "synthetic weights, speed only");
  (*srv)->stop();
}

// The HTTP server in-process on the tiny model: the routes, errors, streams and a client that
// leaves mid-stream (its request is cancelled and its pages freed).
TEST(Http, RoutesErrorsStreamsAndDisconnects) {
  auto m = load_tiny(AttentionMode::kDense, 2);
  ASSERT_TRUE(m);
  server::ServerOptions so{
      .host = "127.0.0.1", .port = 0, .model_id = "tiny", .max_body_bytes = 64 << 10};
  so.scheduler = {.max_waiting = 4, .prefill_chunk = 8};
  auto srv = server::Server::create(*m, so);
  ASSERT_TRUE(srv.ok()) << srv.status().message();
  ASSERT_TRUE((*srv)->start().ok());
  httplib::Client cli("127.0.0.1", (*srv)->port());
  cli.set_read_timeout(60, 0);
  auto post = [&](const std::string& path, const std::string& body) {
    return cli.Post(path.c_str(), body, "application/json");
  };
  auto r = post("/v1/completions", R"({"prompt": "abcabc", "max_tokens": 5, "ignore_eos": true})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  // The same request alone through generate(): the same text.
  auto ids = m->tokenizer().encode("abcabc", true);
  GenerationRequest g{.prompt = ids, .max_tokens = 5, .ignore_eos = true};
  std::vector<GenerationResult> out;
  (void)r;
  r = post("/v1/completions", R"({"prompt": "abcabc", "max_tokens": 5, "ignore_eos": true,
                                   "temperature": 0})");
  g.sampling.greedy = true;
  ASSERT_TRUE(generate(*m, {&g, 1}, &out).ok());
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], out[0].text);

  r = post("/v1/completions", "{\"prompt\": ");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_TRUE(json::parse(r->body)["error"]["message"].get<std::string>().find("JSON") !=
              std::string::npos);
  r = post("/v1/completions", std::string(100 << 10, ' '));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  r = cli.Get("/v1/none");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(json::parse(cli.Get("/v1/models")->body)["data"][0]["id"], "tiny");

  // A stream: data events, a finish_reason, the usage chunk, [DONE].
  r = post("/v1/completions", R"({"prompt": "abc", "max_tokens": 4, "ignore_eos": true,
                                   "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->body.find("\"finish_reason\":\"length\""), std::string::npos);
  EXPECT_NE(r->body.find("\"completion_tokens\":4"), std::string::npos);
  EXPECT_EQ(r->body.substr(r->body.size() - 14), "data: [DONE]\n\n");

  // A client that reads one event and leaves.
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = R"({"prompt": "abc", "max_tokens": 1000, "ignore_eos": true, "stream": true})";
  int events = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++events < 2; };
  (void)cli.send(req);
  std::string metrics;
  for (int i = 0; i < 200; ++i) {
    metrics = cli.Get("/metrics")->body;
    if (metrics.find("cisa_requests_total{outcome=\"cancelled\"} 1") != std::string::npos &&
        metrics.find("cisa_kv_pages_used 0") != std::string::npos)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(metrics.find("cisa_requests_total{outcome=\"cancelled\"} 1"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("cisa_kv_pages_used 0"), std::string::npos) << metrics;
  r = post("/v1/completions", R"({"prompt": "ab", "max_tokens": 2})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  (*srv)->stop();
}

TEST(ChatTemplate, SmolLm2ChatMlWithItsDefaultSystemMessage) {
  const std::string path = model_file("SmolLM2-135M-Instruct.Q4_1.gguf");
  if (path.empty()) GTEST_SKIP() << "models/SmolLM2-135M-Instruct.Q4_1.gguf not downloaded";
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok());
  auto tok = Tokenizer::from_gguf(*f);
  ASSERT_TRUE(tok.ok());
  auto t = server::ChatTemplate::for_model(*f, *tok, "");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->format(), server::ChatFormat::kChatMl);
  EXPECT_EQ(t->render({{"user", "Hi"}}),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t->render({{"system", "S"}, {"user", "Hi"}, {"assistant", "Yo"}, {"user", "?"}}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>"
            "assistant\nYo<|im_end|>\n<|im_start|>user\n?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t->end_of_turn(), tok->find_token("<|im_end|>"));
}

TEST(ChatTemplate, Gemma3TurnsWhenAskedForAndAClearErrorOtherwise) {
  const std::string path = model_file("gemma-3-270m-q4_k_m.gguf");
  if (path.empty()) GTEST_SKIP() << "models/gemma-3-270m-q4_k_m.gguf not downloaded";
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok());
  auto tok = Tokenizer::from_gguf(*f);
  ASSERT_TRUE(tok.ok());
  auto none = server::ChatTemplate::for_model(*f, *tok, "");  // this GGUF carries no template
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("--chat-template"), std::string::npos);
  auto t = server::ChatTemplate::for_model(*f, *tok, "gemma3");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(
      t->render({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}}),
      "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello"
      "<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  const auto ids = tok->encode(t->render({{"user", "Hi"}}), true, true);
  EXPECT_EQ(ids.front(), tok->bos_id());
  EXPECT_EQ(ids[1], tok->find_token("<start_of_turn>"));
}

}  // namespace
}  // namespace cisa
