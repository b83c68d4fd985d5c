// cisa bench serve — a load generator for OpenAI-compatible servers (`cisa serve`, llama.cpp's,
// vLLM's): N streamed requests at a concurrency limit and/or a Poisson request rate, prompts of
// random token ids of a fixed length (exact prompt lengths, no tokenizer needed) or lines of a
// file, a fixed output length with EOS ignored ("ignore_eos": true; --honor-eos lets requests end
// at EOS and reports their mean length, the verbosity measure). Reports request and token
// throughput and mean / median / p99 of TTFT, TPOT (time per output token after the first), ITL
// (between stream chunks) and end-to-end latency, as text or --json. Loopback targets only unless
// --allow-remote. --extra-body adds fields to every request (e.g. `cisa serve`'s per-request
// {"attention": "dense"}). A chunk counts as output when it carries text, or token ids
// (choices[0].token_ids: what `cisa serve` streams for a model without a tokenizer).
#ifdef CISA_WITH_SERVER

#include <httplib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_args.h"
#include "commands.h"

namespace cisa::cli {
namespace {

// "<command>: <message>" on stderr; the exit status (1: the work failed, 2: bad command line).
int fail(const std::string& msg, int status = 1) {
  std::fprintf(stderr, "cisa bench serve: %s\n", msg.c_str());
  return status;
}
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Outcome {
  bool ok = false;
  std::string error;
  double ttft = 0, e2e = 0;  // seconds from sending
  std::vector<double> itl;   // seconds between stream chunks after the first
  int64_t prompt_tokens = 0, output_tokens = 0;
};

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Numpy's default (linear) percentile; 0 for no values.
double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

json summary(const std::vector<double>& v_s) {
  double sum = 0;
  for (double x : v_s) sum += x;
  const double mean = v_s.empty() ? 0 : sum / static_cast<double>(v_s.size());
  return {{"mean_ms", mean * 1e3},
          {"median_ms", percentile(v_s, 50) * 1e3},
          {"p99_ms", percentile(v_s, 99) * 1e3}};
}

// One streamed request; SSE events are read as they arrive.
Outcome run_one(httplib::Client& cli, const std::string& path, const json& body, double timeout) {
  Outcome o;
  const auto t0 = Clock::now();
  std::string buf, error_body;
  double last = -1;
  bool done = false;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    size_t end;
    while ((end = buf.find("\n\n")) != std::string::npos) {
      std::string event = buf.substr(0, end);
      buf.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;  // comments (keep-alive)
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      json j = json::parse(payload, nullptr, false);
      if (j.is_discarded()) {
        o.error = "a stream event is not JSON";
        return false;
      }
      if (j.contains("error")) {
        o.error = j["error"].value("message", "error event");
        return false;
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        o.prompt_tokens = j["usage"].value("prompt_tokens", int64_t{0});
        o.output_tokens = j["usage"].value("completion_tokens", int64_t{0});
      }
      if (!j.contains("choices") || j["choices"].empty()) continue;
      const json& c = j["choices"][0];
      std::string text;
      if (c.contains("text") && c["text"].is_string()) text = c["text"];
      if (c.contains("delta") && c["delta"].contains("content") &&
          c["delta"]["content"].is_string())
        text = c["delta"]["content"];
      const bool ids =
          c.contains("token_ids") && c["token_ids"].is_array() && !c["token_ids"].empty();
      if (text.empty() && !ids) continue;
      const double t = since(t0);
      if (last < 0) {
        o.ttft = t;
      } else {
        o.itl.push_back(t - last);
      }
      last = t;
    }
    if (since(t0) > timeout) {
      o.error = "timed out";
      return false;
    }
    return true;
  };
  auto res = cli.send(req);
  o.e2e = since(t0);
  if (!res) {
    if (o.error.empty()) o.error = "HTTP error: " + httplib::to_string(res.error());
    return o;
  }
  if (res->status != 200) {
    json j = json::parse(buf, nullptr, false);
    o.error =
        "HTTP " + std::to_string(res->status) +
        (!j.is_discarded() && j.contains("error") ? ": " + j["error"].value("message", "") : "");
    return o;
  }
  if (!done && o.error.empty()) o.error = "the stream ended without [DONE]";
  o.ok = o.error.empty() && last >= 0;
  if (o.ok && o.output_tokens == 0) o.error = "no usage in the stream", o.ok = false;
  return o;
}

bool loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

int bench_serve(int argc, char** argv) {
  ArgParser p("cisa bench serve",
              "Load generator for an OpenAI-compatible server: throughput and TTFT / TPOT / ITL / "
              "end-to-end latency of N streamed requests.");
  std::string host = "127.0.0.1", model, endpoint = "completions", prompt_file, extra_body_arg;
  int64_t port = 8080, num_prompts = 64, concurrency = 4, input_len = 128, output_len = 64;
  int64_t min_token_id = 1000, max_token_id = 9999;
  int64_t seed = 0, timeout = 600;
  double rate = 0;
  bool json_out = false, allow_remote = false, quiet = false, honor_eos = false;
  p.add_string("--host", &host, "server address (default 127.0.0.1)");
  p.add_int("--port", &port, "server port (default 8080)", {1, 65535});
  p.add_string("--model", &model, "model id to request (default: the first of /v1/models)");
  p.add_choice("--endpoint", &endpoint, {"completions", "chat"},
               "/v1/completions (token-id prompts) or /v1/chat/completions (default completions)");
  p.add_int("--num-prompts", &num_prompts, "requests to send (default 64)", {1, 1 << 20});
  p.add_int("--concurrency", &concurrency, "requests in flight at most (default 4)", {1, 4096});
  p.add_double("--request-rate", &rate,
               "Poisson arrivals per second (default 0: as fast as --concurrency allows)",
               DoubleRange{0, 1e6});
  p.add_int("--input-len", &input_len, "random prompt length in tokens (default 128)",
            {1, 1 << 24});
  p.add_int("--output-len", &output_len,
            "tokens to generate, EOS ignored (default 64; with --honor-eos, the most)",
            {1, 1 << 24});
  p.add_flag("--honor-eos", &honor_eos,
             "stop a request at the model's end of sequence (\"ignore_eos\": false), to measure "
             "output lengths (verbosity) rather than a fixed-output load");
  p.add_string("--prompt-file", &prompt_file, "prompts, one per line (instead of random tokens)");
  p.add_int("--min-token-id", &min_token_id, "random prompts: smallest token id (default 1000)",
            {0, INT32_MAX});
  p.add_int("--max-token-id", &max_token_id, "random prompts: largest token id (default 9999)",
            {0, INT32_MAX});
  p.add_string("--extra-body", &extra_body_arg,
               "a JSON object merged into every request body, e.g. '{\"attention\": \"dense\"}'");
  p.add_int("--seed", &seed, "random prompts and arrivals (default 0)");
  p.add_int("--timeout", &timeout, "seconds a request may take (default 600)", {1, 86400});
  p.add_flag("--allow-remote", &allow_remote, "allow a target that is not this machine");
  p.add_flag("--json", &json_out, "print one JSON document");
  p.add_flag("--quiet", &quiet, "no progress bar");
  if (int rc = p.parse(argc, argv); rc >= 0) return rc;
  if (!loopback(host) && !allow_remote)
    return fail("refusing to load " + host + ", which is not this machine (--allow-remote)", 2);
  if (endpoint == "chat" && prompt_file.empty())
    return fail("--endpoint chat needs --prompt-file (chat messages are text)", 2);
  if (min_token_id > max_token_id) return fail("--min-token-id is above --max-token-id", 2);
  json extra_body = json::object();
  if (!extra_body_arg.empty()) {
    extra_body = json::parse(extra_body_arg, nullptr, false);
    if (extra_body.is_discarded() || !extra_body.is_object())
      return fail("--extra-body must be a JSON object", 2);
  }

  std::vector<std::string> lines;
  if (!prompt_file.empty()) {
    auto text = read_input_file(prompt_file, "--prompt-file");
    if (!text.ok()) return fail(text.status().message());
    std::istringstream in(*text);
    for (std::string l; std::getline(in, l);)
      if (!l.empty()) lines.push_back(l);
    if (lines.empty()) return fail("--prompt-file has no non-empty line");
  }
  httplib::Client probe(host, static_cast<int>(port));
  probe.set_connection_timeout(5, 0);
  if (model.empty()) {
    auto r = probe.Get("/v1/models");
    if (!r || r->status != 200)
      return fail("cannot list the server's models at " + host + ":" + std::to_string(port) +
                  (r ? " (HTTP " + std::to_string(r->status) + ")"
                     : " (" + httplib::to_string(r.error()) + ")"));
    json j = json::parse(r->body, nullptr, false);
    if (j.is_discarded() || !j.contains("data") || j["data"].empty())
      return fail("/v1/models lists no model");
    model = j["data"][0].value("id", "");
  }

  // Requests and their arrival times.
  std::mt19937_64 rng(static_cast<uint64_t>(seed));
  std::vector<json> bodies;
  for (int64_t i = 0; i < num_prompts; ++i) {
    json b = {{"model", model},           {"max_tokens", output_len},
              {"ignore_eos", !honor_eos}, {"temperature", 0},
              {"stream", true},           {"stream_options", {{"include_usage", true}}}};
    if (!lines.empty()) {
      const std::string& text = lines[static_cast<size_t>(i) % lines.size()];
      if (endpoint == "chat") {
        b["messages"] = json::array({{{"role", "user"}, {"content", text}}});
      } else {
        b["prompt"] = text;
      }
    } else {
      // By default ids in [1000, 10000): ordinary tokens in both supported vocabularies, none
      // special.
      std::uniform_int_distribution<int> id(static_cast<int>(min_token_id),
                                            static_cast<int>(max_token_id));
      std::vector<int> ids(static_cast<size_t>(input_len));
      for (int& t : ids) t = id(rng);
      b["prompt"] = ids;
    }
    b.update(extra_body);
    bodies.push_back(std::move(b));
  }
  std::vector<double> arrival(bodies.size(), 0);
  if (rate > 0) {
    std::exponential_distribution<double> gap(rate);
    double t = 0;
    for (double& a : arrival) a = (t += gap(rng));
  }
  const std::string path = endpoint == "chat" ? "/v1/chat/completions" : "/v1/completions";

  std::vector<Outcome> out(bodies.size());
  std::atomic<size_t> next{0}, finished{0};
  std::mutex print_mu;
  const bool bar = !quiet && isatty(STDERR_FILENO);
  const auto t_start = Clock::now();
  auto worker = [&] {
    httplib::Client cli(host, static_cast<int>(port));
    cli.set_connection_timeout(5, 0);
    cli.set_read_timeout(static_cast<time_t>(timeout), 0);
    for (size_t i; (i = next.fetch_add(1)) < bodies.size();) {
      const double wait = arrival[i] - since(t_start);
      if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      out[i] = run_one(cli, path, bodies[i], static_cast<double>(timeout));
      const size_t n = ++finished;
      if (bar) {
        std::lock_guard<std::mutex> lk(print_mu);
        const int w = 30, f = static_cast<int>(w * n / bodies.size());
        std::fprintf(stderr, "\rbench serve [%s%s] %zu/%zu requests", std::string(f, '#').c_str(),
                     std::string(w - f, '.').c_str(), n, bodies.size());
      }
    }
  };
  std::vector<std::thread> threads;
  for (int64_t c = 0; c < std::min<int64_t>(concurrency, num_prompts); ++c)
    threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  const double duration = since(t_start);
  if (bar) std::fputc('\n', stderr);

  int64_t ok = 0, in_tokens = 0, out_tokens = 0;
  std::vector<double> ttft, tpot, itl, e2e;
  std::string first_error;
  for (const Outcome& o : out) {
    if (!o.ok) {
      if (first_error.empty()) first_error = o.error;
      continue;
    }
    ++ok;
    in_tokens += o.prompt_tokens;
    out_tokens += o.output_tokens;
    ttft.push_back(o.ttft);
    e2e.push_back(o.e2e);
    if (o.output_tokens > 1) tpot.push_back((o.e2e - o.ttft) / double(o.output_tokens - 1));
    itl.insert(itl.end(), o.itl.begin(), o.itl.end());
  }
  const int64_t failed = static_cast<int64_t>(out.size()) - ok;
  json r = {{"host", host},
            {"port", port},
            {"model", model},
            {"endpoint", path},
            {"num_prompts", num_prompts},
            {"concurrency", concurrency},
            {"request_rate", rate},
            {"input_len", lines.empty() ? json(input_len) : json("from " + prompt_file)},
            {"output_len", output_len},
            {"honor_eos", honor_eos},
            {"extra_body", extra_body},
            {"successful_requests", ok},
            {"failed_requests", failed},
            {"duration_s", duration},
            {"total_input_tokens", in_tokens},
            {"total_output_tokens", out_tokens},
            {"mean_output_tokens", ok > 0 ? double(out_tokens) / double(ok) : 0.0},
            {"request_throughput", ok / duration},
            {"output_throughput", out_tokens / duration},
            {"total_token_throughput", (in_tokens + out_tokens) / duration},
            {"ttft", summary(ttft)},
            {"tpot", summary(tpot)},
            {"itl", summary(itl)},
            {"e2el", summary(e2e)}};
  if (!first_error.empty()) r["first_error"] = first_error;
  if (json_out) {
    std::printf("%s\n", r.dump(2).c_str());
  } else {
    std::printf("---------------- cisa bench serve ----------------\n");
    std::printf("%-34s %lld\n", "successful requests:", static_cast<long long>(ok));
    std::printf("%-34s %lld%s%s\n", "failed requests:", static_cast<long long>(failed),
                first_error.empty() ? "" : "  first: ", first_error.c_str());
    std::printf("%-34s %lld (concurrency), %g (req/s, 0 = unlimited)\n",
                "limits:", static_cast<long long>(concurrency), rate);
    std::printf("%-34s %.2f\n", "duration (s):", duration);
    std::printf("%-34s %lld\n", "total input tokens:", static_cast<long long>(in_tokens));
    std::printf("%-34s %lld\n", "total generated tokens:", static_cast<long long>(out_tokens));
    std::printf("%-34s %.2f%s\n", "mean generated tokens per request:",
                ok > 0 ? double(out_tokens) / double(ok) : 0.0,
                honor_eos ? " (EOS honoured)" : " (EOS ignored)");
    std::printf("%-34s %.2f\n", "request throughput (req/s):", ok / duration);
    std::printf("%-34s %.2f\n", "output token throughput (tok/s):", out_tokens / duration);
    std::printf("%-34s %.2f\n",
                "total token throughput (tok/s):", (in_tokens + out_tokens) / duration);
    for (const char* k : {"ttft", "tpot", "itl", "e2el"})
      std::printf("%-6s mean %9.2f  median %9.2f  p99 %9.2f  (ms)\n", k,
                  r[k]["mean_ms"].get<double>(), r[k]["median_ms"].get<double>(),
                  r[k]["p99_ms"].get<double>());
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace cisa::cli

#endif  // CISA_WITH_SERVER
