// server/api.h — the OpenAI-compatible request and response bodies: a JSON body in, a checked
// GenerationRequest out (or an HTTP error with a message naming the field); results and stream
// chunks back to JSON. No HTTP here (server.cpp does that), so every rule is unit-testable.
//
//   cisa::server::ApiContext ctx{.model_id = "gemma3-270m", .model = model.get()};
//   auto req = cisa::server::parse_request(body, cisa::server::Route::kCompletions, ctx);
//   if (!req.ok()) reply(req.error().http_status, error_body(req.error()));
//   // req->gen is ready for Scheduler::submit; req->stream, req->include_usage, ...
//
// Accepted fields: model (must be the served id when given), prompt (a string, one string in an
// array, or an array of token ids) or messages (role system|user|assistant, content a string or
// text parts), max_tokens / max_completion_tokens, temperature [0, 2] (0: greedy), top_p (0, 1],
// top_k, seed, stop (a string or up to 4), n (1 only), stream, stream_options.include_usage,
// ignore_eos, and per-request attention: "attention": "dense" | "cisa" and
// "cisa": {"budget", "window", "qshare", "sink_pages"} (integers, validate_selection_params).
// Other OpenAI fields are ignored when they ask for nothing (frequency_penalty 0, logprobs null)
// and refused when they ask for what the server does not do.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cisa/core/status.h"
#include "cisa/model/generate.h"
#include "cisa/model/model.h"
#include "server/chat_template.h"

namespace cisa::server {

enum class Route { kCompletions, kChat };

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, when there is one
  std::string code;
};
// {"error": {"message", "type", "param", "code"}} as OpenAI sends it.
nlohmann::json error_body(const ApiError& e);
// 400 for bad input (kInvalidArgument, kOutOfRange, kFailedPrecondition), 404 kNotFound, 503
// kResourceExhausted / kUnavailable, 500 otherwise.
ApiError error_from_status(const Status& s);

struct ApiContext {
  std::string model_id;                // what /v1/models lists and requests must name
  const Model* model = nullptr;        // tokenizer, context, CISA layers
  const ChatTemplate* chat = nullptr;  // nullptr: chat requests get chat_error
  std::string chat_error;              // why there is no chat template
  SelectionParams cisa_defaults;       // the server's CISA settings (request fields override them)
};

struct ParsedRequest {
  GenerationRequest gen;
  bool stream = false;
  bool include_usage = false;
};

template <typename T>
struct ApiResult {
  std::optional<T> value;
  ApiError err;
  bool ok() const { return value.has_value(); }
  const ApiError& error() const { return err; }
  T& operator*() { return *value; }
  T* operator->() { return &*value; }
};

ApiResult<ParsedRequest> parse_request(const std::string& body, Route route, const ApiContext& ctx);

// "stop" for kEos / kStop, "length" for kLength.
const char* openai_finish_reason(FinishReason r);

// The whole response of a request that finished.
nlohmann::json completion_body(Route route, const std::string& id, int64_t created,
                               const std::string& model_id, const GenerationResult& r);
// One stream chunk with `text` (chat: as delta.content; the first chat chunk also carries
// delta.role), or the last one with finish_reason when `finish` is given.
nlohmann::json stream_chunk(Route route, const std::string& id, int64_t created,
                            const std::string& model_id, const std::string& text,
                            const char* finish, bool first);
// The usage-only chunk of stream_options.include_usage (empty choices).
nlohmann::json usage_chunk(Route route, const std::string& id, int64_t created,
                           const std::string& model_id, const GenerationResult& r);
nlohmann::json usage_json(const GenerationResult& r);

}  // namespace cisa::server
