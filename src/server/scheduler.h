// server/scheduler.h — continuous batching for the server: one thread owns the Model and a
// Generator; HTTP threads submit requests and read each one's text from its own stream.
//
//   cisa::server::Scheduler sched(*model, {.max_waiting = 64, .prefill_chunk = 256}, &metrics);
//   auto s = sched.submit(std::move(request));        // errors: 400-class checks, queue full
//   std::string text;
//   while (!(*s)->wait(std::chrono::milliseconds(100), &text)) {
//     send(text); text.clear();                        // whole UTF-8 characters, stops held back
//     if (client_gone) (*s)->cancel();                 // its sequence is freed at the next step
//   }
//   const cisa::GenerationResult& r = (*s)->result();  // finish reason, tokens, timings
//
// Every loop the scheduler moves newly submitted requests into the Generator (they wait there
// for a free sequence: the KV cache holds max_sequences full-context sequences, so admitted
// requests never run out of pages), cancels those whose client left, runs one step (decode rows
// of every running request beside at most prefill_chunk prompt rows), and publishes gauges. A
// forward error ends only the requests of that step (kError); the server keeps serving.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cisa/core/status.h"
#include "cisa/model/generate.h"
#include "cisa/model/model.h"
#include "server/metrics.h"

namespace cisa::server {

struct SchedulerOptions {
  int64_t max_waiting = 64;     // requests queued beyond the running ones; more: kResourceExhausted
  int64_t prefill_chunk = 256;  // prompt rows per step (GeneratorOptions::prefill_chunk)
};

// One request's channel between the scheduler thread and an HTTP thread.
class RequestStream {
 public:
  // Waits up to `timeout` for text or the end. Appends released text to *text and returns true
  // once the request has finished (result() is then final and every byte of text delivered).
  // With `ids`, also wakes for new tokens and appends their ids to *ids (a model without a
  // tokenizer releases no text, so its streams send ids).
  bool wait(std::chrono::milliseconds timeout, std::string* text,
            std::vector<int32_t>* ids = nullptr);
  // Ends the request at the scheduler's next loop (kCancelled); its sequence is released.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  // Valid once wait() returned true.
  const GenerationResult& result() const { return result_; }
  int64_t tokens_so_far() const;

 private:
  friend class Scheduler;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string pending_;
  std::vector<int32_t> pending_ids_;
  int64_t tokens_ = 0;
  bool finished_ = false;
  GenerationResult result_;
  std::atomic<bool> cancelled_{false};
  // Scheduler thread only.
  double t_submit = 0, t_last = 0;
};

class Scheduler {
 public:
  Scheduler(Model& model, SchedulerOptions options, Metrics* metrics);
  ~Scheduler();  // stop()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Checks the request (Generator::check: empty prompt, prompt not shorter than the context, bad
  // token ids, sampling, stop strings, attention) and queues it. kResourceExhausted when
  // max_waiting requests already wait; kUnavailable after stop().
  Result<std::shared_ptr<RequestStream>> submit(GenerationRequest request);
  // Ends every request (kError, "server shutting down") and joins the thread.
  void stop();

 private:
  void loop();
  void publish(const Generator& gen);

  Model& model_;
  SchedulerOptions opt_;
  Metrics* metrics_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<GenerationRequest, std::shared_ptr<RequestStream>>> incoming_;
  std::atomic<int64_t> waiting_{0};  // in the generator, not yet running (published each loop)
  std::atomic<int64_t> running_{0};  // holding a sequence (published each loop)
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace cisa::server
