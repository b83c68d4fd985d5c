// server_request_fuzz — libFuzzer target for `cisa serve`'s request bodies: parse_request
// (src/server/api.h) on arbitrary bytes, for /v1/completions and /v1/chat/completions, with the
// OpenAI fields and the per-request "attention" / "cisa" fields (tests/fuzz/CMakeLists.txt says
// how to run it; seeds in tests/fuzz/corpus/server_request/, words in server_request.dict).
//
// The models the parser reads (vocabulary, context, CISA layers, chat template):
//  - a tiny llama GGUF written here (tests/unit/tiny_llama_builder.h), loaded dense and with CISA;
//  - the synthetic tiny-llama (Model::load_synthetic: no tokenizer, token-id prompts only);
//  - the real models' files when they exist, with their chat templates: every path in
//    CISA_FUZZ_MODELS (colon-separated), else every models/*.gguf under the working folder
//    (SmolLM2: ChatML from its GGUF; Gemma 3 base: the gemma3 format, as --chat-template gemma3).
//
// Input: byte 0 picks the model (its value / 2, modulo how many loaded) and the route (bit 0:
// chat); the rest is the body. Invariants: parse_request never throws; an error has an HTTP status
// of 400, 404 or 503 (or 500), a non-empty message, and an error body that serialises; a parsed
// request has a prompt of in-vocabulary ids shorter than the context, max_tokens in [1, 2^31),
// sampling inside its ranges, at most 4 non-empty stop strings, per-request CISA only on a model
// with CISA layers and with selection parameters that validate_selection_params accepts and that
// stay within kMaxSelectionPages, and it passes Generator::check; its response chunks serialise.
#include <dirent.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cisa/core/plan.h"
#include "cisa/model/generate.h"
#include "cisa/model/gguf.h"
#include "cisa/model/model.h"
#include "server/api.h"
#include "server/chat_template.h"
#include "tiny_llama_builder.h"

namespace {

using cisa::server::ApiContext;
using cisa::server::Route;

[[noreturn]] void fail(const char* why) {
  std::fprintf(stderr, "server_request_fuzz: invariant broken: %s\n", why);
  __builtin_trap();
}

struct Served {
  std::string name;
  std::unique_ptr<cisa::Model> model;
  std::unique_ptr<cisa::server::ChatTemplate> chat;
  ApiContext ctx;
};

std::vector<Served>& served() {
  static std::vector<Served> s;
  return s;
}

void add(std::string name, cisa::Result<std::unique_ptr<cisa::Model>> m, const std::string& chat) {
  if (!m.ok()) {
    std::fprintf(stderr, "server_request_fuzz: %s: %s (skipped)\n", name.c_str(),
                 m.status().message().c_str());
    return;
  }
  Served s;
  s.name = std::move(name);
  s.model = std::move(*m);
  std::string chat_error = "no chat template here";
  if (s.model->has_tokenizer() && s.model->has_file()) {
    auto t = cisa::server::ChatTemplate::for_model(s.model->file(), s.model->tokenizer(), chat);
    if (t.ok()) {
      s.chat = std::make_unique<cisa::server::ChatTemplate>(std::move(*t));
    } else {
      chat_error = t.status().message();
    }
  }
  s.ctx = ApiContext{.model_id = "fuzz",
                     .model = s.model.get(),
                     .chat = s.chat.get(),
                     .chat_error = chat_error,
                     .cisa_defaults = s.model->options().attention.selection};
  std::fprintf(stderr, "server_request_fuzz: model %zu: %s (context %lld, %s, %s)\n",
               served().size(), s.name.c_str(), static_cast<long long>(s.model->context()),
               s.model->has_cisa_layers() ? "CISA layers" : "dense",
               s.chat ? "chat template" : "no chat template");
  served().push_back(std::move(s));
}

cisa::ModelOptions options(cisa::AttentionMode mode) {
  cisa::ModelOptions o{.threads = 1, .context = 512, .max_sequences = 1, .prefill_block = 64};
  o.attention.mode = mode;
  o.attention.selection = {.budget = 4, .window = 2, .qshare = 4};
  return o;
}

std::vector<std::string> model_paths() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("CISA_FUZZ_MODELS")) {
    std::string s = env;
    for (size_t at = 0; at <= s.size();) {
      const size_t end = s.find(':', at) == std::string::npos ? s.size() : s.find(':', at);
      if (end > at) out.push_back(s.substr(at, end - at));
      at = end + 1;
    }
    return out;
  }
  if (DIR* d = opendir("models")) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > 5 && n.compare(n.size() - 5, 5, ".gguf") == 0) out.push_back("models/" + n);
    }
    closedir(d);
  }
  return out;
}

void load_models() {
  cisa::testing::TinyLlama tiny;
  tiny.randomize(5, 0.6f);
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/server_request_fuzz_" +
                           std::to_string(::getpid()) + ".gguf";
  tiny.write(path);
  add("tiny llama, dense", cisa::Model::load(path, options(cisa::AttentionMode::kDense)), "");
  add("tiny llama, CISA", cisa::Model::load(path, options(cisa::AttentionMode::kCisa)), "");
  add("synthetic tiny-llama, CISA (no tokenizer)",
      cisa::Model::load_synthetic("tiny-llama", options(cisa::AttentionMode::kCisa)), "");
  for (const std::string& p : model_paths()) {
    // Gemma 3 base GGUFs carry no template: the server's --chat-template gemma3.
    const bool gemma = p.find("gemma") != std::string::npos;
    add(p + ", CISA", cisa::Model::load(p, options(cisa::AttentionMode::kCisa)),
        gemma ? "gemma3" : "");
  }
  ::unlink(path.c_str());  // the models keep their mappings
  if (served().empty()) fail("no model loaded");
}

void check_ok(const Served& s, Route route, const cisa::server::ParsedRequest& r) {
  const cisa::Model& m = *s.model;
  const cisa::GenerationRequest& g = r.gen;
  if (g.prompt.empty()) fail("an empty prompt was accepted");
  if (static_cast<int64_t>(g.prompt.size()) >= m.context())
    fail("a prompt that fills the context was accepted");
  for (int32_t id : g.prompt)
    if (id < 0 || id >= m.hparams().n_vocab) fail("a prompt id outside the vocabulary");
  if (g.max_tokens < 1 || g.max_tokens > INT32_MAX) fail("max_tokens out of [1, 2^31)");
  const cisa::SamplingParams& sp = g.sampling;
  if (!(sp.temperature > 0 && sp.temperature <= 2)) fail("temperature out of (0, 2]");
  if (!(sp.top_p > 0 && sp.top_p <= 1)) fail("top_p out of (0, 1]");
  if (sp.top_k < 0) fail("a negative top_k");
  if (g.stop_strings.size() > 4) fail("more than 4 stop strings");
  for (const std::string& stop : g.stop_strings)
    if (stop.empty()) fail("an empty stop string");
  if (route == Route::kChat && !s.chat) fail("a chat request without a template was accepted");
  if (g.attention) {
    if (g.attention->mode == cisa::AttentionMode::kCisa) {
      if (!m.has_cisa_layers()) fail("per-request CISA on a model without CISA layers");
      const cisa::SelectionParams& p = g.attention->selection;
      if (!cisa::validate_selection_params(p).ok()) fail("CISA settings that do not validate");
      for (int64_t v : {p.budget, p.window, p.sink_pages})
        if (v < 0 || v > cisa::kMaxSelectionPages) fail("a CISA setting out of bounds");
      if (p.qshare < 1 || p.qshare > cisa::kMaxSelectionPages) fail("qshare out of bounds");
    }
  }
  if (!cisa::Generator::check(m, g).ok()) fail("a parsed request fails Generator::check");
  // What the server sends back for it serialises (the server dumps with replacement of bad UTF-8).
  cisa::GenerationResult res;
  res.prompt_tokens = static_cast<int64_t>(g.prompt.size());
  res.tokens = {g.prompt.front()};
  res.finish = cisa::FinishReason::kLength;
  const auto dump = [](const nlohmann::json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  (void)dump(cisa::server::completion_body(route, "id", 0, s.ctx.model_id, res));
  (void)dump(cisa::server::stream_chunk(route, "id", 0, s.ctx.model_id, "x", nullptr, true));
  (void)dump(cisa::server::usage_chunk(route, "id", 0, s.ctx.model_id, res));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  load_models();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Served& s = served()[(data[0] >> 1) % served().size()];
  const Route route = (data[0] & 1) ? Route::kChat : Route::kCompletions;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  // An exception escaping parse_request aborts the fuzzer: the parser must never throw.
  auto r = cisa::server::parse_request(body, route, s.ctx);
  if (r.ok()) {
    check_ok(s, route, *r);
    return 0;
  }
  const cisa::server::ApiError& e = r.error();
  if (e.http_status != 400 && e.http_status != 404 && e.http_status != 503 && e.http_status != 500)
    fail("an error status other than 400, 404, 503 or 500");
  if (e.message.empty()) fail("an error without a message");
  (void)cisa::server::error_body(e).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return 0;
}
