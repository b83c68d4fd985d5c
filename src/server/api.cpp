// OpenAI request parsing and response bodies (api.h).
#include "server/api.h"

#include <limits>
#include <random>

#include "cisa/model/tokenizer.h"

namespace cisa::server {
namespace {

using nlohmann::json;

ApiError bad(std::string message, std::string param = "") {
  return ApiError{.http_status = 400, .message = std::move(message), .param = std::move(param)};
}

// Each reader returns an error (ok() false) or leaves *out alone when the field is absent/null.
struct Check {
  std::optional<ApiError> err;
  explicit operator bool() const { return !err; }
};

Check read_int(const json& j, const char* name, int64_t lo, int64_t hi, int64_t* out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_number_integer())
    return {bad(std::string("'") + name + "' must be an integer", name)};
  int64_t v = 0;
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return {bad(std::string("'") + name + "' is too large", name)};
    v = static_cast<int64_t>(u);
  } else {
    v = it->get<int64_t>();
  }
  if (v < lo || v > hi)
    return {bad(std::string("'") + name + "' must be in [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "] (got " + std::to_string(v) + ")",
                name)};
  *out = v;
  return {};
}

Check read_number(const json& j, const char* name, double lo, double hi, bool lo_open,
                  double* out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_number()) return {bad(std::string("'") + name + "' must be a number", name)};
  const double v = it->get<double>();
  if (!(v <= hi) || (lo_open ? !(v > lo) : !(v >= lo)))
    return {bad(std::string("'") + name + "' must be in " + (lo_open ? "(" : "[") +
                    std::to_string(lo) + ", " + std::to_string(hi) + "] (got " + it->dump() + ")",
                name)};
  *out = v;
  return {};
}

Check read_bool(const json& j, const char* name, bool* out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_boolean()) return {bad(std::string("'") + name + "' must be a boolean", name)};
  *out = it->get<bool>();
  return {};
}

// obj[key] when it is a string, else "" (json::value(key, "") throws when the field holds another
// type, and a request body must never make the parser throw).
std::string string_field(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// Fields that must ask for nothing: false, 0 or null (the openai client sends some of them).
Check refuse_unsupported(const json& j) {
  for (const char* name : {"logprobs", "echo", "best_of", "top_logprobs", "tools", "functions",
                           "logit_bias", "suffix", "response_format", "tool_choice"}) {
    auto it = j.find(name);
    if (it == j.end() || it->is_null()) continue;
    const bool off =
        (it->is_boolean() && !it->get<bool>()) ||
        (it->is_number() && it->get<double>() == 0 && std::string(name) != "best_of") ||
        (std::string(name) == "best_of" && it->is_number_integer() && it->get<int64_t>() == 1) ||
        (it->is_object() && it->empty()) || (it->is_array() && it->empty()) ||
        (std::string(name) == "response_format" && it->is_object() &&
         string_field(*it, "type") == "text");
    if (!off) return {bad(std::string("'") + name + "' is not supported by this server", name)};
  }
  for (const char* name : {"frequency_penalty", "presence_penalty"}) {
    double v = 0;
    if (Check c = read_number(j, name, -2, 2, false, &v); !c) return c;
    if (v != 0) return {bad(std::string("'") + name + "' other than 0 is not supported", name)};
  }
  return {};
}

std::optional<ApiError> parse_attention(const json& j, const ApiContext& ctx,
                                        std::optional<StepAttention>* out) {
  std::string mode;
  if (auto it = j.find("attention"); it != j.end() && !it->is_null()) {
    if (!it->is_string() || (*it != "dense" && *it != "cisa"))
      return bad("'attention' must be \"dense\" or \"cisa\"", "attention");
    mode = it->get<std::string>();
  }
  auto c = j.find("cisa");
  const bool has_cisa = c != j.end() && !c->is_null();
  if (has_cisa && !c->is_object())
    return bad("'cisa' must be an object {budget, window, qshare, sink_pages}", "cisa");
  if (has_cisa && mode == "dense")
    return bad("'cisa' settings given with \"attention\": \"dense\"", "cisa");
  if (mode.empty() && !has_cisa) return std::nullopt;  // the server's own attention
  if (mode == "dense") {
    *out = StepAttention{.mode = AttentionMode::kDense};
    return std::nullopt;
  }
  if (!ctx.model->has_cisa_layers())
    return bad(
        "this server runs dense attention only; start it with --attention cisa to choose "
        "CISA settings per request",
        has_cisa ? "cisa" : "attention");
  StepAttention a{.mode = AttentionMode::kCisa, .selection = ctx.cisa_defaults};
  if (has_cisa) {
    for (auto it = c->begin(); it != c->end(); ++it)
      if (it.key() != "budget" && it.key() != "window" && it.key() != "qshare" &&
          it.key() != "sink_pages")
        return bad("unknown field 'cisa." + it.key() + "' (budget, window, qshare, sink_pages)",
                   "cisa." + it.key());
    const int64_t hi = kMaxSelectionPages;
    SelectionParams& p = a.selection;
    for (auto [name, field, lo] :
         {std::tuple{"budget", &p.budget, int64_t{0}}, std::tuple{"window", &p.window, int64_t{0}},
          std::tuple{"qshare", &p.qshare, int64_t{1}},
          std::tuple{"sink_pages", &p.sink_pages, int64_t{0}}})
      if (Check ch = read_int(*c, name, lo, hi, field); !ch) {
        ch.err->param = std::string("cisa.") + name;
        return ch.err;
      }
  }
  if (Status s = validate_selection_params(a.selection); !s.ok()) return bad(s.message(), "cisa");
  *out = a;
  return std::nullopt;
}

// One message's text: a string, or an array of {"type": "text", "text": ...} parts.
std::optional<ApiError> message_text(const json& content, size_t i, std::string* out) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  if (content.is_string()) {
    *out = content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array())
    return bad("'" + where + "' must be a string or an array of parts", where);
  for (const json& part : content) {
    if (!part.is_object() || string_field(part, "type") != "text" || !part.contains("text") ||
        !part["text"].is_string())
      return bad("'" + where + "' parts must be {\"type\": \"text\", \"text\": string}", where);
    *out += part["text"].get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> parse_prompt(const json& j, Route route, const ApiContext& ctx,
                                     GenerationRequest* gen) {
  const Model& m = *ctx.model;
  if (route == Route::kChat) {
    if (!ctx.chat) return bad(ctx.chat_error, "messages");
    auto it = j.find("messages");
    if (it == j.end() || !it->is_array() || it->empty())
      return bad("'messages' must be a non-empty array", "messages");
    std::vector<ChatMessage> msgs;
    for (size_t i = 0; i < it->size(); ++i) {
      const json& msg = (*it)[i];
      const std::string where = "messages[" + std::to_string(i) + "]";
      if (!msg.is_object()) return bad("'" + where + "' must be an object", where);
      auto role = msg.find("role");
      if (role == msg.end() || !role->is_string() ||
          (*role != "system" && *role != "user" && *role != "assistant" && *role != "developer"))
        return bad("'" + where + ".role' must be \"system\", \"user\" or \"assistant\"",
                   where + ".role");
      auto content = msg.find("content");
      if (content == msg.end())
        return bad("'" + where + ".content' is missing", where + ".content");
      ChatMessage cm{.role = role->get<std::string>() == "developer" ? "system"
                                                                     : role->get<std::string>()};
      if (auto e = message_text(*content, i, &cm.content)) return e;
      msgs.push_back(std::move(cm));
    }
    gen->prompt = m.tokenizer().encode(ctx.chat->render(msgs), true, /*parse_special=*/true);
    gen->stop_tokens.push_back(ctx.chat->end_of_turn());
    return std::nullopt;
  }
  auto it = j.find("prompt");
  if (it == j.end() || it->is_null()) return bad("'prompt' is required", "prompt");
  const json* p = &*it;
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
  if (p->is_string()) {
    if (!m.has_tokenizer()) return bad("this model has no tokenizer: send token ids", "prompt");
    gen->prompt = m.tokenizer().encode(p->get<std::string>(), true);
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    for (const json& t : *p) {
      if (!t.is_number_integer()) return bad("'prompt' token ids must be integers", "prompt");
      const int64_t id = t.is_number_unsigned()
                             ? int64_t(std::min<uint64_t>(t.get<uint64_t>(), INT64_MAX))
                             : t.get<int64_t>();
      if (id < 0 || id >= m.hparams().n_vocab)
        return bad("'prompt' token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                       std::to_string(m.hparams().n_vocab) + ")",
                   "prompt");
      gen->prompt.push_back(static_cast<int32_t>(id));
    }
  } else if (p->is_array()) {
    return bad(
        "'prompt' must be one string or one array of token ids (batches of prompts are not "
        "supported; send one request each)",
        "prompt");
  } else {
    return bad("'prompt' must be a string or an array of token ids", "prompt");
  }
  if (gen->prompt.empty()) return bad("'prompt' is empty", "prompt");
  return std::nullopt;
}

}  // namespace

nlohmann::json error_body(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? json(nullptr) : json(e.param)},
            {"code", e.code.empty() ? json(nullptr) : json(e.code)}}}};
}

ApiError error_from_status(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kFailedPrecondition:
      return bad(s.message());
    case StatusCode::kNotFound:
      return ApiError{.http_status = 404, .message = s.message(), .code = "not_found"};
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnavailable:
      return ApiError{
          .http_status = 503, .message = s.message(), .type = "server_error", .code = "overloaded"};
    default:
      return ApiError{.http_status = 500, .message = s.message(), .type = "server_error"};
  }
}

ApiResult<ParsedRequest> parse_request(const std::string& body, Route route,
                                       const ApiContext& ctx) {
  ApiResult<ParsedRequest> out;
  auto fail = [&](ApiError e) {
    out.err = std::move(e);
    return out;
  };
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number beyond a double ("1e999").
    return fail(bad(std::string("the body is not valid JSON: ") + e.what()));
  }
  if (!j.is_object()) return fail(bad("the body must be a JSON object"));
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return fail(bad("'model' must be a string", "model"));
    if (it->get<std::string>() != ctx.model_id)
      return fail(ApiError{.http_status = 404,
                           .message = "the model '" + it->get<std::string>() +
                                      "' does not exist; this server serves '" + ctx.model_id + "'",
                           .param = "model",
                           .code = "model_not_found"});
  }
  if (Check c = refuse_unsupported(j); !c) return fail(*c.err);
  int64_t n = 1;
  if (Check c = read_int(j, "n", 1, 1, &n); !c) {
    c.err->message = "'n' must be 1: one choice per request";
    return fail(*c.err);
  }
  ParsedRequest r;
  GenerationRequest& g = r.gen;
  if (auto e = parse_prompt(j, route, ctx, &g)) return fail(*e);
  const int64_t ctx_tokens = ctx.model->context();
  const int64_t prompt_n = static_cast<int64_t>(g.prompt.size());
  if (prompt_n >= ctx_tokens)
    return fail(bad("the prompt has " + std::to_string(prompt_n) + " tokens; the context holds " +
                        std::to_string(ctx_tokens) +
                        " (prompt and output together), so it must be shorter",
                    route == Route::kChat ? "messages" : "prompt"));
  // OpenAI's default is 16 for completions and the rest of the context for chat.
  g.max_tokens = route == Route::kChat ? ctx_tokens - prompt_n : 16;
  for (const char* name : {"max_tokens", "max_completion_tokens"})
    if (Check c = read_int(j, name, 1, INT32_MAX, &g.max_tokens); !c) return fail(*c.err);
  double temperature = 1.0, top_p = 1.0;
  int64_t top_k = 0, seed = -1;
  if (Check c = read_number(j, "temperature", 0, 2, false, &temperature); !c) return fail(*c.err);
  if (Check c = read_number(j, "top_p", 0, 1, true, &top_p); !c) return fail(*c.err);
  if (Check c = read_int(j, "top_k", 0, INT32_MAX, &top_k); !c) return fail(*c.err);
  if (Check c = read_int(j, "seed", 0, INT64_MAX, &seed); !c) return fail(*c.err);
  if (seed < 0) seed = static_cast<int64_t>(std::random_device{}() >> 1);
  g.sampling = {.greedy = temperature == 0,
                .temperature = temperature == 0 ? 1.0f : static_cast<float>(temperature),
                .top_k = static_cast<int32_t>(top_k),
                .top_p = static_cast<float>(top_p),
                .seed = static_cast<uint64_t>(seed)};
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    std::vector<json> stops =
        it->is_array() ? it->get<std::vector<json>>() : std::vector<json>{*it};
    if (stops.size() > 4) return fail(bad("'stop' takes at most 4 strings", "stop"));
    for (const json& s : stops) {
      if (!s.is_string() || s.get<std::string>().empty())
        return fail(bad("'stop' must be a non-empty string or an array of them", "stop"));
      g.stop_strings.push_back(s.get<std::string>());
    }
  }
  if (Check c = read_bool(j, "ignore_eos", &g.ignore_eos); !c) return fail(*c.err);
  // ignore_eos (the fixed-output protocol) goes past the chat template's end of turn too, as
  // vLLM's does; the end of turn is the only stop token a request gets (parse_prompt).
  if (g.ignore_eos) g.stop_tokens.clear();
  if (Check c = read_bool(j, "stream", &r.stream); !c) return fail(*c.err);
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return fail(bad("'stream_options' must be an object", "stream_options"));
    if (Check c = read_bool(*it, "include_usage", &r.include_usage); !c) return fail(*c.err);
  }
  if (auto e = parse_attention(j, ctx, &g.attention)) return fail(*e);
  if (Status s = Generator::check(*ctx.model, g); !s.ok()) return fail(error_from_status(s));
  out.value = std::move(r);
  return out;
}

const char* openai_finish_reason(FinishReason r) {
  return r == FinishReason::kLength ? "length" : "stop";
}

nlohmann::json usage_json(const GenerationResult& r) {
  const int64_t out = static_cast<int64_t>(r.tokens.size());
  return {{"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", out},
          {"total_tokens", r.prompt_tokens + out}};
}

nlohmann::json completion_body(Route route, const std::string& id, int64_t created,
                               const std::string& model_id, const GenerationResult& r) {
  json choice = {{"index", 0}, {"finish_reason", openai_finish_reason(r.finish)}};
  if (route == Route::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", r.text}};
  } else {
    choice["text"] = r.text;
    choice["logprobs"] = nullptr;
  }
  return {{"id", id},
          {"object", route == Route::kChat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model_id},
          {"choices", json::array({choice})},
          {"usage", usage_json(r)}};
}

nlohmann::json stream_chunk(Route route, const std::string& id, int64_t created,
                            const std::string& model_id, const std::string& text,
                            const char* finish, bool first) {
  json choice = {{"index", 0}, {"finish_reason", finish ? json(finish) : json(nullptr)}};
  if (route == Route::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!finish) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
  return {{"id", id},
          {"object", route == Route::kChat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model_id},
          {"choices", json::array({choice})}};
}

nlohmann::json usage_chunk(Route route, const std::string& id, int64_t created,
                           const std::string& model_id, const GenerationResult& r) {
  return {{"id", id},
          {"object", route == Route::kChat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model_id},
          {"choices", json::array()},
          {"usage", usage_json(r)}};
}

}  // namespace cisa::server
