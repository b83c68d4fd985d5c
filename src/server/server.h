// server/server.h — `cisa serve`: an OpenAI-compatible HTTP server over one Model, with
// continuous batching (scheduler.h). HTTP is cpp-httplib's; bodies are nlohmann-json (api.h).
//
//   cisa::server::ServerOptions so{.host = "127.0.0.1", .port = 0, .model_id = "gemma3-270m"};
//   CISA_ASSIGN_OR_RETURN(auto srv, cisa::server::Server::create(*model, so));
//   CISA_RETURN_IF_ERROR(srv->start());    // bound and listening; srv->port() is the real port
//   srv->wait();                           // until stop() (another thread, a signal)
//
// Routes: POST /v1/completions, POST /v1/chat/completions (stream: true gives server-sent
// events, `data: {chunk}` ... `data: [DONE]`), GET /v1/models, GET /health, GET /metrics
// (Prometheus text). Errors are OpenAI error bodies: 400 for a bad request (the message names
// the field), 404 for another model or route, 413 for a body over max_body_bytes, 503 when the
// queue is full or the server is stopping, 500 when the model fails a step (only the requests of
// that step end; the server keeps serving).
//
// A streaming client that goes away is noticed at the next write (a token, or a keep-alive
// comment line at least every second), and its request is cancelled, freeing its KV pages.
// A non-streaming request runs to its end (max_tokens bounds it) even if its client left.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cisa/core/status.h"
#include "cisa/model/model.h"
#include "server/scheduler.h"

namespace cisa::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;        // 0: any free port (port() tells which)
  std::string model_id;   // the name /v1/models lists and requests must use
  int http_threads = 32;  // connections served at once (streams hold one each)
  int64_t max_body_bytes = 8 << 20;
  std::string chat_template;      // "" (the GGUF's), "gemma3" or "chatml"
  SelectionParams cisa_defaults;  // what a request's "cisa" fields start from
  SchedulerOptions scheduler;
};

class Server {
 public:
  // Checks the options and builds the routes; the model must outlive the server. A model without
  // a usable chat template still serves completions (chat requests get a 400 saying why), unless
  // options.chat_template names a format the vocabulary cannot render (an error here).
  // A model without a tokenizer (Model::load_synthetic) serves token-id prompts on completions;
  // its responses carry the generated ids in choices[0].token_ids (there is no text).
  static Result<std::unique_ptr<Server>> create(Model& model, ServerOptions options);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port and starts listening on a thread of its own. kUnavailable when it cannot bind.
  Status start();
  int port() const;
  // Blocks until stop().
  void wait();
  // Stops accepting, ends running requests (503 / an error event), joins every thread. Idempotent.
  void stop();

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cisa::server
