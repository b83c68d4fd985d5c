// cisa serve — an OpenAI-compatible HTTP server with continuous batching (src/server/server.h):
// loads the model with a KV cache of --parallel full-context sequences and serves
// /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics until SIGINT/SIGTERM.
#ifdef CISA_WITH_SERVER

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>

#include "cisa/model/gguf.h"
#include "cisa/model/model.h"
#include "cisa/model/model_store.h"
#include "cisa/model/tokenizer.h"
#include "cli_args.h"
#include "commands.h"
#include "model_cli.h"
#include "server/server.h"

namespace cisa::cli {
namespace {

// "<command>: <message>" on stderr; the exit status (1: the work failed, 2: bad command line).
int fail(const std::string& msg, int status = 1) {
  std::fprintf(stderr, "cisa serve: %s\n", msg.c_str());
  return status;
}

// The model options of a server of `parallel` sequences: the context checked against the model's
// (the server's default: 4096, or the model's own when smaller) and CISA's defaults scaled to it.
Result<ModelOptions> serving_options(ModelCliOptions* o, const ModelHparams& hp, int parallel) {
  if (o->context > hp.n_ctx_train)
    return invalid_argument("--context " + std::to_string(o->context) +
                            " exceeds the model's context of " + std::to_string(hp.n_ctx_train) +
                            " tokens");
  if (o->context == 0) o->context = std::min<int64_t>(4096, hp.n_ctx_train);
  scale_cisa_defaults(o, hp.n_ctx_train);
  CISA_ASSIGN_OR_RETURN(ModelOptions mopt, to_model_options(*o));
  mopt.max_sequences = parallel;
  return mopt;
}

// The model with a cache of `parallel` sequences of o.context tokens (the server's default
// context: 4096, or the model's own when smaller).
Result<std::unique_ptr<Model>> load_for_serving(const std::string& path, ModelCliOptions o,
                                                int parallel, std::string* model_note) {
  CISA_ASSIGN_OR_RETURN(GgufFile f, GgufFile::open(path));
  CISA_ASSIGN_OR_RETURN(ModelHparams hp, read_model_hparams(f));
  CISA_ASSIGN_OR_RETURN(ModelOptions mopt, serving_options(&o, hp, parallel));
  if (!o.indexer.empty()) {
    if (mopt.attention.mode != AttentionMode::kCisa)
      return invalid_argument("--indexer needs --attention cisa");
    CISA_ASSIGN_OR_RETURN(mopt.attention.index,
                          load_index_projections(o.indexer, f, hp, mopt.attention.dense_layers));
  }
  *model_note = std::string(model_arch_name(hp.arch)) + ", context " + std::to_string(o.context) +
                " x " + std::to_string(parallel) + " sequences, " +
                attention_mode_name(mopt.attention.mode) + " attention";
  return Model::load(path, mopt);
}

// A synthetic model (--synthetic NAME): random weights of a public shape, no file, no tokenizer
// (token-id prompts only), for speed measurements (`cisa bench serve`).
Result<std::unique_ptr<Model>> load_synthetic_for_serving(ModelCliOptions o, int parallel,
                                                          std::string* model_note) {
  if (!o.indexer.empty())
    return invalid_argument("--indexer: an indexer is calibrated for a model file; --synthetic " +
                            o.synthetic + " has none (drop --indexer)");
  CISA_ASSIGN_OR_RETURN(ModelHparams hp, synthetic_hparams(o.synthetic, synthetic_layers(o)));
  CISA_ASSIGN_OR_RETURN(ModelOptions mopt, serving_options(&o, hp, parallel));
  *model_note = "synthetic " + o.synthetic +
                (o.synthetic_layers ? " (first " + std::to_string(hp.n_layer) + " layers)" : "") +
                " (" + kSyntheticNote + "), context " + std::to_string(o.context) + " x " +
                std::to_string(parallel) + " sequences, " +
                attention_mode_name(mopt.attention.mode) + " attention";
  return Model::load_synthetic(o.synthetic, mopt, synthetic_layers(o));
}

std::string default_model_id(const std::string& arg) {
  if (find_known_model(arg)) return arg;
  std::string base = arg.substr(arg.find_last_of('/') + 1);
  if (base.size() > 5 && base.ends_with(".gguf")) base.resize(base.size() - 5);
  return base.empty() ? arg : base;
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  ArgParser p("cisa serve",
              "OpenAI-compatible server (completions, chat, SSE streaming) with continuous "
              "batching. Per request: \"attention\": \"dense\" or \"cisa\": {budget, window, "
              "qshare, sink_pages} (CISA needs --attention cisa). Stops on SIGINT/SIGTERM.");
  std::string model_arg, host = "127.0.0.1", model_id, chat_template;
  int64_t port = 8080, parallel = 4, max_waiting = 64, prefill_chunk = 256, http_threads = 32;
  int64_t max_body_kib = 8192;
  p.add_string("--model", &model_arg,
               "model name (gemma3-270m, smollm2-135m) or GGUF path (or --synthetic NAME)");
  p.alias("-m", "--model");
  p.add_string("--host", &host, "address to listen on (default 127.0.0.1)");
  p.add_int("--port", &port, "port (default 8080; 0: any free port, printed at start)", {0, 65535});
  p.add_int("--parallel", &parallel,
            "requests decoded at once: KV sequences of --context tokens each (default 4)",
            {1, 1024});
  p.alias("--max-sequences", "--parallel");
  p.add_int("--max-waiting", &max_waiting,
            "requests queued beyond the running ones; more get 503 (default 64)", {0, 1 << 20});
  p.add_int("--prefill-chunk", &prefill_chunk,
            "prompt tokens fed per step beside the decoding requests (default 256; 0: whole "
            "prompts)",
            {0, 1 << 20});
  p.add_int("--http-threads", &http_threads, "connections served at once (default 32)", {1, 4096});
  p.add_int("--max-body-kib", &max_body_kib, "largest request body in KiB (default 8192)",
            {1, 1 << 20});
  p.add_string("--served-model-name", &model_id,
               "the model id of /v1/models and requests (default: the -m name or file stem)");
  p.add_choice("--chat-template", &chat_template, {"gemma3", "chatml"},
               "chat format when the GGUF has none (or to override it)");
  ModelCliOptions mo;
  add_model_options(p, &mo);
  add_synthetic_option(p, &mo, /*with_prompt_tokens=*/false);
  if (int rc = p.parse(argc, argv); rc >= 0) return rc;
  if (!mo.synthetic.empty() && !model_arg.empty())
    return fail("give either --model or --synthetic, not both", 2);
  if (mo.synthetic.empty() && model_arg.empty())
    return fail("give --model NAME|PATH (or --synthetic NAME)", 2);
  if (host != "127.0.0.1" && host != "localhost" && host != "::1")
    std::fprintf(stderr,
                 "cisa serve: warning: listening on %s, beyond this machine; the server "
                 "has no authentication\n",
                 host.c_str());

  std::string note;
  Result<std::unique_ptr<Model>> model = invalid_argument("no model");
  if (!mo.synthetic.empty()) {
    model = load_synthetic_for_serving(mo, static_cast<int>(parallel), &note);
  } else {
    auto path = resolve_model(model_arg);
    if (!path.ok()) return fail(path.status().message());
    model = load_for_serving(*path, mo, static_cast<int>(parallel), &note);
  }
  if (!model.ok()) return fail(model.status().message());

  server::ServerOptions so;
  so.host = host;
  so.port = static_cast<int>(port);
  so.model_id = !model_id.empty()       ? model_id
                : !mo.synthetic.empty() ? mo.synthetic + "-synthetic"
                                        : default_model_id(model_arg);
  so.http_threads = static_cast<int>(http_threads);
  so.max_body_bytes = max_body_kib * 1024;
  so.chat_template = chat_template;
  so.cisa_defaults = (*model)->options().attention.selection;
  so.scheduler = {.max_waiting = max_waiting, .prefill_chunk = prefill_chunk};

  // SIGINT/SIGTERM go to one thread that stops the server; every other thread blocks them.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that left is a failed write, not a dead server

  auto srv = server::Server::create(**model, so);
  if (!srv.ok()) return fail(srv.status().message());
  if (Status s = (*srv)->start(); !s.ok()) return fail(s.message());
  std::printf("cisa serve: listening on http://%s:%d (model %s: %s)\n", host.c_str(),
              (*srv)->port(), so.model_id.c_str(), note.c_str());
  std::fflush(stdout);
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "cisa serve: signal %d, stopping\n", sig);
    (*srv)->stop();
  });
  (*srv)->wait();
  stopper.join();
  return 0;
}

}  // namespace cisa::cli

#endif  // CISA_WITH_SERVER
