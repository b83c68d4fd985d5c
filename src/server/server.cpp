// HTTP routes of `cisa serve` (server.h) on cpp-httplib: request bodies go through api.h, requests
// through the scheduler; streams are server-sent events.
#include "server/server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "server/api.h"
#include "server/chat_template.h"
#include "server/metrics.h"

namespace cisa::server {
namespace {

using nlohmann::json;

// Generated text is whole UTF-8 characters, but a model can still emit byte tokens that form no
// character: those become U+FFFD instead of an exception.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

void reply_error(httplib::Response& res, const ApiError& e) {
  reply(res, e.http_status, error_body(e));
  if (e.http_status == 503) res.set_header("Retry-After", "1");
}

int64_t unix_time() {
  return static_cast<int64_t>(std::time(nullptr));
}

}  // namespace

struct Server::Impl {
  Model& model;
  ServerOptions opt;
  Metrics metrics;
  std::optional<ChatTemplate> chat;
  std::string chat_error;
  ApiContext ctx;
  std::unique_ptr<Scheduler> sched;
  httplib::Server http;
  std::thread listener;
  std::atomic<int> bound_port{-1};
  std::atomic<uint64_t> next_id{1};
  std::atomic<bool> stopped{false};
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool done = false;  // stop() has finished

  Impl(Model& m, ServerOptions o) : model(m), opt(std::move(o)) {}

  std::string make_id(Route route) {
    return std::string(route == Route::kChat ? "chatcmpl-" : "cmpl-") +
           std::to_string(next_id.fetch_add(1));
  }

  void routes();
  void complete(const httplib::Request& req, httplib::Response& res, Route route);
  void stream(httplib::Response& res, Route route, std::shared_ptr<RequestStream> s,
              bool include_usage);
};

void Server::Impl::routes() {
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    reply(res, 200, {{"status", "ok"}});
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json body = {{"object", "list"},
                 {"data", json::array({{{"id", opt.model_id},
                                        {"object", "model"},
                                        {"created", 0},
                                        {"owned_by", "cisa"},
                                        {"max_model_len", model.context()}}})}};
    // A synthetic model (Model::load_synthetic): random weights, its outputs mean nothing.
    if (!model.has_file()) body["data"][0]["weights"] = "synthetic weights, speed only";
    reply(res, 200, body);
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(), "text/plain; version=0.0.4");
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    complete(req, res, Route::kCompletions);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    complete(req, res, Route::kChat);
  });
  // Unknown routes, bodies over the limit (413) and other protocol errors: an OpenAI error body.
  http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string msg = res.status == 413   ? "the request body is larger than the server accepts "
                                            "(--max-body-kib)"
                      : res.status == 404 ? "no route " + req.method + " " + req.path
                                          : "bad request";
    // cpp-httplib caps form-encoded bodies at 8 KiB whatever the limit; curl -d and urllib send
    // that content type unless told otherwise, so a long prompt lands here: say what to change.
    if (res.status == 413 &&
        req.get_header_value("Content-Type").starts_with("application/x-www-form-urlencoded"))
      msg =
          "the body was sent as application/x-www-form-urlencoded (curl -d's default), which the "
          "HTTP library caps at 8 KiB: send it with 'Content-Type: application/json'";
    reply(res, res.status, error_body({.http_status = res.status, .message = msg}));
  });
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string msg = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          msg += std::string(": ") + e.what();
        } catch (...) {
        }
        reply(res, 500, error_body({.http_status = 500, .message = msg, .type = "server_error"}));
      });
}

void Server::Impl::complete(const httplib::Request& req, httplib::Response& res, Route route) {
  ApiResult<ParsedRequest> parsed = parse_request(req.body, route, ctx);
  if (!parsed.ok()) {
    metrics.count_request(RequestOutcome::kRejected);
    return reply_error(res, parsed.error());
  }
  const bool streaming = parsed->stream, include_usage = parsed->include_usage;
  auto submitted = sched->submit(std::move(parsed->gen));
  if (!submitted.ok()) {
    metrics.count_request(RequestOutcome::kRejected);
    return reply_error(res, error_from_status(submitted.status()));
  }
  std::shared_ptr<RequestStream> s = *submitted;
  if (streaming) return stream(res, route, std::move(s), include_usage);
  std::string text;
  while (!s->wait(std::chrono::milliseconds(500), &text)) text.clear();
  const GenerationResult& r = s->result();
  if (r.finish == FinishReason::kError || r.finish == FinishReason::kCancelled) {
    ApiError e = error_from_status(r.error.ok() ? internal_error("request cancelled") : r.error);
    if (e.http_status < 500) e.http_status = 500;
    return reply_error(res, e);
  }
  json body = completion_body(route, make_id(route), unix_time(), opt.model_id, r);
  if (!model.has_tokenizer()) body["choices"][0]["token_ids"] = r.tokens;  // no text to give
  reply(res, 200, body);
}

void Server::Impl::stream(httplib::Response& res, Route route, std::shared_ptr<RequestStream> s,
                          bool include_usage) {
  struct State {
    std::string id;
    int64_t created = 0;
    bool first = true;
    std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
  };
  auto st = std::make_shared<State>(State{.id = make_id(route), .created = unix_time()});
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, route, s, st, include_usage](size_t, httplib::DataSink& sink) {
        auto send = [&](const std::string& event) {
          st->last_write = std::chrono::steady_clock::now();
          if (sink.write(event.data(), event.size())) return true;
          s->cancel();  // the client left: free its sequence
          return false;
        };
        auto data = [&](const json& j) { return send("data: " + dump(j) + "\n\n"); };
        if (st->first && route == Route::kChat) {
          st->first = false;
          if (!data(stream_chunk(route, st->id, st->created, opt.model_id, "", nullptr, true)))
            return false;
        }
        std::string text;
        std::vector<int32_t> ids;  // a model without a tokenizer: the chunks carry token ids
        const bool ids_only = !model.has_tokenizer();
        const bool finished =
            s->wait(std::chrono::milliseconds(250), &text, ids_only ? &ids : nullptr);
        if (!text.empty() || !ids.empty()) {
          json chunk =
              stream_chunk(route, st->id, st->created, opt.model_id, text, nullptr, st->first);
          if (!ids.empty()) chunk["choices"][0]["token_ids"] = ids;
          if (!data(chunk)) return false;
          st->first = false;
        } else if (!finished &&
                   std::chrono::steady_clock::now() - st->last_write > std::chrono::seconds(1)) {
          // An SSE comment: clients ignore it; a failed write tells that the client left.
          if (!send(": keep-alive\n\n")) return false;
        }
        if (!finished) return true;
        const GenerationResult& r = s->result();
        if (r.finish == FinishReason::kError || r.finish == FinishReason::kCancelled) {
          ApiError e =
              error_from_status(r.error.ok() ? internal_error("request cancelled") : r.error);
          e.type = "server_error";
          (void)data(error_body(e));
        } else {
          if (!data(stream_chunk(route, st->id, st->created, opt.model_id, "",
                                 openai_finish_reason(r.finish), false)))
            return false;
          if (include_usage && !data(usage_chunk(route, st->id, st->created, opt.model_id, r)))
            return false;
        }
        (void)send("data: [DONE]\n\n");
        sink.done();
        return true;
      },
      [s](bool success) {
        if (!success) s->cancel();
      });
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() {
  stop();
}

Result<std::unique_ptr<Server>> Server::create(Model& model, ServerOptions options) {
  if (options.model_id.empty()) return invalid_argument("serve: the model id is empty");
  if (options.port < 0 || options.port > 65535)
    return invalid_argument("serve: port " + std::to_string(options.port) +
                            " is outside [0, 65535]");
  if (options.http_threads < 1) return invalid_argument("serve: at least one HTTP thread");
  if (options.max_body_bytes < 1024) return invalid_argument("serve: a body limit below 1 KiB");
  if (options.scheduler.max_waiting < 0 || options.scheduler.prefill_chunk < 0)
    return invalid_argument("serve: negative queue length or prefill chunk");
  if (!model.has_tokenizer() && !options.chat_template.empty())
    return invalid_argument("serve: --chat-template needs a tokenizer; this model has none");
  CISA_RETURN_IF_ERROR(validate_selection_params(options.cisa_defaults));
  auto impl = std::make_unique<Impl>(model, std::move(options));
  Impl& m = *impl;
  // A model without a tokenizer (a synthetic one) serves completions of token-id prompts only.
  auto tmpl = model.has_tokenizer()
                  ? ChatTemplate::for_model(model.file(), model.tokenizer(), m.opt.chat_template)
                  : Result<ChatTemplate>(invalid_argument(
                        "this model has no tokenizer (synthetic weights): chat needs text; send "
                        "token ids to /v1/completions"));
  if (tmpl.ok()) {
    m.chat = std::move(*tmpl);
  } else if (!m.opt.chat_template.empty()) {
    return tmpl.status();  // asked for by name: refuse to start without it
  } else {
    m.chat_error = tmpl.status().message();
  }
  m.ctx = ApiContext{.model_id = m.opt.model_id,
                     .model = &model,
                     .chat = m.chat ? &*m.chat : nullptr,
                     .chat_error = m.chat_error,
                     .cisa_defaults = m.opt.cisa_defaults};
  const size_t threads = static_cast<size_t>(m.opt.http_threads);
  m.http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  m.http.set_payload_max_length(static_cast<size_t>(m.opt.max_body_bytes));
  m.http.set_read_timeout(30, 0);
  m.http.set_write_timeout(30, 0);
  m.routes();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Status Server::start() {
  Impl& m = *impl_;
  if (m.listener.joinable()) return failed_precondition("serve: already started");
  int port = m.opt.port;
  if (port == 0) {
    port = m.http.bind_to_any_port(m.opt.host);
    if (port < 0) return unavailable("serve: cannot bind to " + m.opt.host + " on any port");
  } else if (!m.http.bind_to_port(m.opt.host, port)) {
    return unavailable("serve: cannot bind to " + m.opt.host + ":" + std::to_string(port) +
                       " (in use, or not an address of this machine)");
  }
  m.bound_port = port;
  m.sched = std::make_unique<Scheduler>(m.model, m.opt.scheduler, &m.metrics);
  m.listener = std::thread([&m] { m.http.listen_after_bind(); });
  return Status::Ok();
}

int Server::port() const {
  return impl_->bound_port;
}

void Server::wait() {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lk(m.done_mu);
  m.done_cv.wait(lk, [&] { return m.done; });
}

void Server::stop() {
  Impl& m = *impl_;
  if (!m.stopped.exchange(true)) {
    if (m.sched) m.sched->stop();  // waiting handlers get their requests ended
    m.http.stop();
    if (m.listener.joinable()) m.listener.join();
    std::lock_guard<std::mutex> lk(m.done_mu);
    m.done = true;
  }
  m.done_cv.notify_all();
  std::unique_lock<std::mutex> lk(m.done_mu);
  m.done_cv.wait(lk, [&] { return m.done; });
}

}  // namespace cisa::server
