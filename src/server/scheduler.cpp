// The scheduler thread (scheduler.h): admission, cancellation and one Generator step per loop.
#include "server/scheduler.h"

#include <algorithm>
#include <unordered_map>
#include <vector>

namespace cisa::server {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

RequestOutcome outcome_of(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return RequestOutcome::kLength;
    case FinishReason::kEos:
    case FinishReason::kStop:
      return RequestOutcome::kStop;
    case FinishReason::kCancelled:
      return RequestOutcome::kCancelled;
    default:
      return RequestOutcome::kError;
  }
}

}  // namespace

bool RequestStream::wait(std::chrono::milliseconds timeout, std::string* text,
                         std::vector<int32_t>* ids) {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, timeout,
               [&] { return finished_ || !pending_.empty() || (ids && !pending_ids_.empty()); });
  *text += pending_;
  pending_.clear();
  if (ids) ids->insert(ids->end(), pending_ids_.begin(), pending_ids_.end());
  pending_ids_.clear();
  return finished_;
}

int64_t RequestStream::tokens_so_far() const {
  std::lock_guard<std::mutex> lk(mu_);
  return tokens_;
}

Scheduler::Scheduler(Model& model, SchedulerOptions options, Metrics* metrics)
    : model_(model), opt_(options), metrics_(metrics) {
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  stop();
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<std::shared_ptr<RequestStream>> Scheduler::submit(GenerationRequest request) {
  CISA_RETURN_IF_ERROR(Generator::check(model_, request));
  auto stream = std::make_shared<RequestStream>();
  stream->t_submit = now_s();
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) return unavailable("the server is shutting down");
    // Requests not holding a sequence yet, against the queue and the sequences still free.
    const int64_t queued = static_cast<int64_t>(incoming_.size()) + waiting_.load();
    const int64_t free_slots =
        std::max<int64_t>(0, model_.options().max_sequences - running_.load());
    if (queued >= opt_.max_waiting + free_slots)
      return resource_exhausted("the server's queue is full (" + std::to_string(queued) +
                                " requests waiting; --max-waiting " +
                                std::to_string(opt_.max_waiting) + "); retry later");
    incoming_.emplace_back(std::move(request), stream);
  }
  if (metrics_) metrics_->add_prompt_tokens(prompt);
  cv_.notify_all();
  return stream;
}

void Scheduler::loop() {
  std::unordered_map<size_t, std::shared_ptr<RequestStream>> active;
  std::vector<size_t> ended;
  GenerationCallbacks cb;
  cb.on_token = [&](const GeneratedToken& t) {
    RequestStream& s = *active.at(t.request);
    const double now = now_s();
    if (metrics_) {
      if (s.t_last == 0) {
        metrics_->observe_ttft(now - s.t_submit);
      } else {
        metrics_->observe_itl(now - s.t_last);
      }
      metrics_->add_generated_tokens(1);
    }
    s.t_last = now;
    {
      std::lock_guard<std::mutex> lk(s.mu_);
      s.pending_ += t.text;
      s.pending_ids_.push_back(t.token);
      ++s.tokens_;
    }
    s.cv_.notify_all();
    return !s.cancelled();
  };
  cb.on_finish = [&](size_t i, const GenerationResult& r, std::string_view tail) {
    RequestStream& s = *active.at(i);
    {
      std::lock_guard<std::mutex> lk(s.mu_);
      s.pending_ += tail;
      s.result_ = r;
      s.finished_ = true;
    }
    s.cv_.notify_all();
    if (metrics_) metrics_->count_request(outcome_of(r.finish));
    ended.push_back(i);
  };
  Generator gen(model_, cb, {.prefill_chunk = opt_.prefill_chunk});
  publish(gen);

  for (;;) {
    {
      // New requests enter the generator under the lock, so submit() always counts them.
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !incoming_.empty() || !gen.done(); });
      if (stopping_) break;
      for (auto& [req, stream] : incoming_) {
        auto idx = gen.add(std::move(req));
        if (!idx.ok()) {  // submit() checked already; the same checks cannot fail here
          std::lock_guard<std::mutex> slk(stream->mu_);
          stream->result_.finish = FinishReason::kError;
          stream->result_.error = idx.status();
          stream->finished_ = true;
          stream->cv_.notify_all();
          continue;
        }
        active.emplace(*idx, stream);
      }
      incoming_.clear();
      waiting_ = static_cast<int64_t>(gen.num_waiting());
    }
    for (auto& [i, s] : active)
      if (s->cancelled()) gen.cancel(i);
    // A forward error has ended the requests of its step with kError (their clients get a 500 or
    // an error event); the rest go on.
    (void)gen.step();
    for (size_t i : ended) {
      active.erase(i);
      gen.forget(i);
    }
    ended.clear();
    publish(gen);
  }
  const Status bye = unavailable("the server is shutting down");
  gen.abort(bye);
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [req, stream] : incoming_) {
    std::lock_guard<std::mutex> slk(stream->mu_);
    stream->result_.finish = FinishReason::kError;
    stream->result_.error = bye;
    stream->finished_ = true;
    stream->cv_.notify_all();
  }
  incoming_.clear();
}

void Scheduler::publish(const Generator& gen) {
  waiting_ = static_cast<int64_t>(gen.num_waiting());
  running_ = static_cast<int64_t>(gen.num_running());
  if (!metrics_) return;
  const PageTable& pages = model_.backend().pages();
  const ForwardStats& st = model_.stats();
  SchedulerGauges g;
  g.running = static_cast<int64_t>(gen.num_running());
  {
    std::lock_guard<std::mutex> lk(mu_);
    g.waiting = waiting_.load() + static_cast<int64_t>(incoming_.size());
  }
  g.kv_pages_free = pages.free_pages();
  g.kv_pages_used = pages.num_pages() - g.kv_pages_free;
  g.global_pages_read = st.global_pages_read;
  g.global_pages_dense = st.global_pages_dense;
  metrics_->set_gauges(g);
}

}  // namespace cisa::server
