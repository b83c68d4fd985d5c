// The generation loop (generate.h): requests wait, are admitted into a sequence, prefill and
// decode in shared forward calls, and finish; text streams through StopStringStream.
#include "cisa/model/generate.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <utility>

#include "model/unicode.h"

namespace cisa {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Strict enough for stop strings: every byte decodes and re-encodes to itself.
bool valid_utf8(std::string_view s) {
  std::string round;
  size_t pos = 0;
  while (pos < s.size()) unicode::append_utf8(round, unicode::decode_one(s, pos));
  return round == s;
}

// Models without a tokenizer (Model::load_synthetic) generate ids only.
const Tokenizer* tokenizer_of(const Model& model) {
  return model.has_tokenizer() ? &model.tokenizer() : nullptr;
}

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

// ---- StopStringStream ---------------------------------------------------------------------------

StopStringStream::StopStringStream(std::vector<std::string> stop_strings)
    : stops_(std::move(stop_strings)) {
  for (const std::string& s : stops_) longest_ = std::max(longest_, s.size());
}

std::string StopStringStream::push(std::string_view piece) {
  if (stopped_) return {};
  const size_t before = text_.size();
  text_ += utf8_.push(piece);
  // A new match ends in the new bytes, so it starts at most longest_ − 1 bytes before them.
  const size_t from = before >= longest_ ? before - longest_ + 1 : 0;
  size_t match = std::string::npos;
  for (const std::string& s : stops_) match = std::min(match, text_.find(s, from));
  if (match != std::string::npos) {
    stopped_ = true;
    text_.resize(match);
    utf8_.flush();
    std::string out = text_.substr(std::min(released_, text_.size()));
    released_ = text_.size();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string. Stop strings are
  // valid UTF-8, so such a suffix starts on a character boundary.
  size_t hold = 0;
  for (const std::string& s : stops_)
    for (size_t n = std::min(s.size() - 1, text_.size() - released_); n > hold; --n)
      if (text_.compare(text_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  const size_t end = text_.size() - hold;
  std::string out = text_.substr(released_, end - released_);
  released_ = end;
  return out;
}

std::string StopStringStream::finish() {
  if (stopped_) return {};
  text_ += utf8_.flush();
  std::string out = text_.substr(released_);
  released_ = text_.size();
  return out;
}

// ---- Generator ----------------------------------------------------------------------------------

namespace {

enum class Phase { kWaiting, kPrefill, kDecoding, kFinished };

struct Request {
  GenerationRequest req;
  GenerationResult res;
  std::optional<Sampler> sampler;
  StopStringStream text;
  Phase phase = Phase::kWaiting;
  SeqId seq = -1;
  size_t index = 0;        // what add() returned
  int64_t prefilled = 0;   // prompt tokens already in the sequence
  uint64_t last_step = 0;  // the step that last ran this request (attention-group fairness)
  int64_t limit = 0;       // generated tokens allowed: min(max_tokens, context − prompt)
  double t_added = 0;
  bool cancel_requested = false;
};

}  // namespace

struct Generator::State {
  Model& model;
  GenerationCallbacks cb;
  const Tokenizer* tok = nullptr;
  GeneratorOptions opt;
  std::map<size_t, Request> reqs;  // unfinished or not yet forgotten, by index; stable addresses
  size_t next_index = 0;
  uint64_t steps = 0;
  size_t running = 0;
  bool in_step = false;
  std::vector<SequenceInput> inputs;
  std::vector<Request*> order;   // the request of each input
  std::vector<char> has_output;  // per input: its last row has logits (not a middle chunk)
  std::vector<float> logits;
  std::vector<int32_t> greedy;  // a step whose every output row is greedy: the backend's argmax

  State(Model& m, GenerationCallbacks c, GeneratorOptions o)
      : model(m), cb(std::move(c)), tok(tokenizer_of(m)), opt(o) {}

  Request* find(size_t i) {
    auto it = reqs.find(i);
    return it == reqs.end() ? nullptr : &it->second;
  }

  // Ends a request: final text, sequence released, on_finish. Returns a release error.
  Status finish(size_t i, FinishReason why, const Status& error = Status::Ok()) {
    Request& r = reqs.at(i);
    if (r.phase == Phase::kFinished) return Status::Ok();
    Status rel = Status::Ok();
    if (r.seq >= 0) {
      if (auto t = model.sequence_traffic(r.seq); t.ok()) r.res.traffic = *t;
      rel = model.release_sequence(r.seq);
      r.seq = -1;
      --running;
    }
    r.phase = Phase::kFinished;
    r.res.finish = why;
    r.res.error = error;
    std::string tail = tok ? r.text.finish() : std::string();
    r.res.text = r.text.text();
    GenerationTimings& t = r.res.timings;
    t.decode_tokens_per_s = t.decode_seconds > 0 ? t.decode_steps / t.decode_seconds : 0;
    if (cb.on_finish) cb.on_finish(i, r.res, tail);
    return rel;
  }

  // After a sampled token: the reason it finishes the request, or kNone.
  FinishReason take_token(size_t i, int32_t token) {
    Request& r = reqs.at(i);
    r.res.tokens.push_back(token);
    FinishReason why = FinishReason::kNone;
    std::string released;
    const auto& stops = r.req.stop_tokens;
    if (std::find(stops.begin(), stops.end(), token) != stops.end()) {
      why = FinishReason::kStop;
    } else if (tok && !r.req.ignore_eos && tok->is_eog(token)) {
      why = FinishReason::kEos;
    } else if (tok) {
      released = r.text.push(tok->token_to_piece(token));
      if (r.text.stopped()) why = FinishReason::kStop;
    }
    if (why == FinishReason::kNone && static_cast<int64_t>(r.res.tokens.size()) >= r.limit)
      why = FinishReason::kLength;
    if (cb.on_token && !cb.on_token(GeneratedToken{i, token, released})) r.cancel_requested = true;
    if (why == FinishReason::kNone && r.cancel_requested) why = FinishReason::kCancelled;
    return why;
  }
};

Generator::Generator(Model& model, GenerationCallbacks callbacks, GeneratorOptions options)
    : s_(std::make_unique<State>(model, std::move(callbacks), options)) {}

Generator::~Generator() {
  for (auto& [i, r] : s_->reqs)
    if (r.seq >= 0) (void)s_->model.release_sequence(r.seq);
}

Status Generator::check(const Model& model, const GenerationRequest& request) {
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  const int64_t ctx = model.context();
  const int32_t vocab = model.hparams().n_vocab;
  if (n == 0) return invalid_argument("generate: the prompt is empty");
  if (n >= ctx)
    return out_of_range("generate: a prompt of " + std::to_string(n) +
                        " tokens leaves no room for a generated token in the context of " +
                        std::to_string(ctx) + " tokens");
  for (int32_t id : request.prompt)
    if (id < 0 || id >= vocab)
      return invalid_argument("generate: prompt token " + std::to_string(id) + " is outside [0, " +
                              std::to_string(vocab) + ")");
  if (request.max_tokens < 1)
    return invalid_argument("generate: max_tokens must be >= 1 (got " +
                            std::to_string(request.max_tokens) + ")");
  if (!request.stop_strings.empty() && !model.has_tokenizer())
    return invalid_argument("generate: stop strings need a tokenizer; this model has none");
  for (const std::string& s : request.stop_strings)
    if (s.empty() || !valid_utf8(s))
      return invalid_argument("generate: a stop string must be non-empty valid UTF-8");
  if (request.attention && request.attention->mode == AttentionMode::kCisa) {
    if (!model.has_cisa_layers())
      return failed_precondition(
          "generate: CISA attention asked for, but the model was loaded with dense attention");
    CISA_RETURN_IF_ERROR(validate_selection_params(request.attention->selection));
  }
  return validate_sampling_params(request.sampling);
}

Result<size_t> Generator::add(GenerationRequest request) {
  CISA_RETURN_IF_ERROR(check(s_->model, request));
  const int64_t n = static_cast<int64_t>(request.prompt.size());
  const int64_t ctx = s_->model.context();
  auto sampler = Sampler::create(request.sampling);
  if (!sampler.ok()) return sampler.status();

  const size_t index = s_->next_index++;
  Request& r = s_->reqs[index];
  r.index = index;
  r.sampler.emplace(std::move(*sampler));
  r.text = StopStringStream(request.stop_strings);
  r.limit = std::min(request.max_tokens, ctx - n);
  r.res.prompt_tokens = n;
  r.t_added = now_s();
  r.req = std::move(request);
  return index;
}

Status Generator::step() {
  State& s = *s_;
  if (s.in_step) return failed_precondition("generate: step() called from inside a callback");
  // Admit waiting requests, in order, into free sequences.
  const size_t slots = static_cast<size_t>(std::max(1, s.model.options().max_sequences));
  Status first_error = Status::Ok();
  for (auto& [i, r] : s.reqs) {
    if (s.running >= slots) break;
    if (r.phase != Phase::kWaiting) continue;
    auto seq = s.model.add_sequence();
    if (!seq.ok()) {
      (void)s.finish(i, FinishReason::kError, seq.status());
      if (first_error.ok()) first_error = seq.status();
      continue;
    }
    r.seq = *seq;
    r.phase = Phase::kPrefill;
    ++s.running;
  }
  // The attention group of this step: that of the running request that waited longest.
  const Request* oldest = nullptr;
  for (const auto& [i, r] : s.reqs)
    if ((r.phase == Phase::kPrefill || r.phase == Phase::kDecoding) &&
        (!oldest || r.last_step < oldest->last_step))
      oldest = &r;
  if (!oldest) return first_error;
  const std::optional<StepAttention> group = oldest->req.attention;
  // One input per running request of the group: one token of each decoding request first, then
  // prompts (whole, or chunks of at most prefill_chunk rows in all).
  s.inputs.clear();
  s.order.clear();
  s.has_output.clear();
  for (auto& [i, r] : s.reqs) {
    if (r.phase != Phase::kDecoding || !(r.req.attention == group)) continue;
    s.inputs.push_back({.seq = r.seq, .tokens = {&r.res.tokens.back(), 1}});
    s.order.push_back(&r);
    s.has_output.push_back(1);
  }
  int64_t prompt_rows = s.opt.prefill_chunk > 0 ? s.opt.prefill_chunk : INT64_MAX;
  bool any_prefill = false;
  for (auto& [i, r] : s.reqs) {
    if (prompt_rows <= 0) break;
    if (r.phase != Phase::kPrefill || !(r.req.attention == group)) continue;
    const int64_t n = static_cast<int64_t>(r.req.prompt.size());
    const int64_t c = std::min(prompt_rows, n - r.prefilled);
    const bool last = r.prefilled + c == n;
    s.inputs.push_back({.seq = r.seq,
                        .tokens = {r.req.prompt.data() + r.prefilled, static_cast<size_t>(c)},
                        .outputs = last ? OutputMode::kLast : OutputMode::kNone});
    s.order.push_back(&r);
    s.has_output.push_back(last ? 1 : 0);
    prompt_rows -= c;
    any_prefill = true;
  }
  ++s.steps;
  for (Request* r : s.order) r->last_step = s.steps;

  // When every row that yields a token is greedy, the backend picks the tokens itself (argmax,
  // the rule of Sampler's greedy path) and the logits never leave its memory.
  bool all_greedy = true;
  for (size_t k = 0; k < s.order.size(); ++k) {
    const SamplingParams& sp = s.order[k]->sampler->params();
    if (s.has_output[k] && !(sp.greedy || sp.temperature == 0.0f)) all_greedy = false;
  }
  const ForwardOutputs outs =
      all_greedy ? ForwardOutputs{.argmax = &s.greedy} : ForwardOutputs{.logits = &s.logits};
  const double t0 = now_s();
  Status fw = s.model.forward(s.inputs, outs, any_prefill ? s.cb.on_prefill_progress : ProgressFn{},
                              group ? &*group : nullptr);
  const double dt = now_s() - t0;
  if (!fw.ok()) {
    for (Request* r : s.order) (void)s.finish(r->index, FinishReason::kError, fw);
    return fw;
  }
  const size_t vocab = static_cast<size_t>(s.model.hparams().n_vocab);
  s.in_step = true;
  size_t out_row = 0;
  for (size_t k = 0; k < s.order.size(); ++k) {
    Request& r = *s.order[k];
    const bool output = s.has_output[k];
    const size_t row = output ? out_row++ : 0;
    if (r.phase == Phase::kFinished) continue;  // abort() from an earlier callback of this step
    GenerationTimings& t = r.res.timings;
    if (r.phase == Phase::kPrefill) {
      t.prefill_seconds += dt;
      r.prefilled += static_cast<int64_t>(s.inputs[k].tokens.size());
      if (!output) continue;  // a middle chunk of the prompt: no token yet
      r.phase = Phase::kDecoding;
    } else {
      t.decode_seconds += dt;
      ++t.decode_steps;
    }
    const size_t i = r.index;
    FinishReason why = FinishReason::kCancelled;
    if (!r.cancel_requested) {  // cancelled from an earlier request's callback in this step
      const int32_t next =
          all_greedy ? s.greedy[row] : r.sampler->sample({s.logits.data() + row * vocab, vocab});
      if (r.res.tokens.empty()) t.time_to_first_token = now_s() - r.t_added;
      why = s.take_token(i, next);
    }
    if (why != FinishReason::kNone) {
      Status rel = s.finish(i, why);
      if (first_error.ok() && !rel.ok()) first_error = rel;
    }
  }
  s.in_step = false;
  // Requests cancelled from a callback after their own turn in this step, or while waiting.
  for (auto& [i, r] : s.reqs)
    if (r.cancel_requested && r.phase != Phase::kFinished) {
      Status rel = s.finish(i, FinishReason::kCancelled);
      if (first_error.ok() && !rel.ok()) first_error = rel;
    }
  return first_error;
}

void Generator::cancel(size_t index) {
  Request* r = s_->find(index);
  if (!r) return;
  r->cancel_requested = true;
  if (!s_->in_step) (void)s_->finish(index, FinishReason::kCancelled);
}

void Generator::abort(const Status& why) {
  for (auto& [i, r] : s_->reqs) (void)s_->finish(i, FinishReason::kError, why);
}

void Generator::forget(size_t index) {
  auto it = s_->reqs.find(index);
  if (it != s_->reqs.end() && it->second.phase == Phase::kFinished) s_->reqs.erase(it);
}

bool Generator::done() const {
  for (const auto& [i, r] : s_->reqs)
    if (r.phase != Phase::kFinished) return false;
  return true;
}
size_t Generator::num_requests() const {
  return s_->next_index;
}
size_t Generator::num_waiting() const {
  size_t n = 0;
  for (const auto& [i, r] : s_->reqs) n += r.phase == Phase::kWaiting;
  return n;
}
size_t Generator::num_running() const {
  return s_->running;
}
const GenerationResult& Generator::result(size_t index) const {
  static const GenerationResult kForgotten;
  auto it = s_->reqs.find(index);
  return it == s_->reqs.end() ? kForgotten : it->second.res;
}
std::vector<GenerationResult> Generator::take_results() {
  std::vector<GenerationResult> out(s_->next_index);
  for (auto& [i, r] : s_->reqs) out[i] = std::move(r.res);
  return out;
}

// ---- generate -----------------------------------------------------------------------------------

Status generate(Model& model, std::span<const GenerationRequest> requests,
                std::vector<GenerationResult>* out, const GenerationCallbacks& callbacks) {
  if (!out) return invalid_argument("generate: no output vector given");
  Generator g(model, callbacks);
  for (const GenerationRequest& r : requests) CISA_RETURN_IF_ERROR(g.add(r).status());
  Status st = Status::Ok();
  while (!g.done()) {
    st = g.step();
    if (!st.ok()) {
      g.abort(st);
      break;
    }
  }
  *out = g.take_results();
  return st;
}

}  // namespace cisa
