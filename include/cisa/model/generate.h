// cisa/model/generate.h — the generation loop: prompts in, sampled tokens and text out, for any
// number of requests batched on one Model. `cisa run`, `cisa eval` and a server all drive this.
//
//   cisa::GenerationRequest r{.prompt = model->tokenizer().encode("Once upon a time", true),
//                             .max_tokens = 32, .sampling = {.greedy = true}};
//   std::vector<cisa::GenerationResult> out;
//   cisa::GenerationCallbacks cb{.on_token = [](const cisa::GeneratedToken& t) {
//     std::fwrite(t.text.data(), 1, t.text.size(), stdout);   // streamed, whole UTF-8 characters
//     return true;                                            // false cancels the request
//   }};
//   CISA_RETURN_IF_ERROR(cisa::generate(*model, {&r, 1}, &out, cb));
//   // out[0].tokens, out[0].text, out[0].finish, out[0].timings
//
// Batching. Every request runs in its own sequence of the model's KV cache. One step is ONE
// Model::forward call: one token of every request already decoding and the prompts of requests
// admitted earlier — whole (forward cuts them into blocks of prefill_block rows), or with
// GeneratorOptions::prefill_chunk at most that many prompt rows per step, the rest in later
// steps — sequences of different lengths side by side. Requests carrying different attention
// settings (GenerationRequest::attention) never share a step: each step serves the settings of
// the running request that has waited longest. A finished request drops out and its sequence is
// released at once, so a waiting request can take it in the next step. At most
// ModelOptions::max_sequences requests run at once (the KV cache holds that many full-context
// sequences, so a running request never runs out of pages); the rest wait in the order they were
// added.
//
// Context. A prompt must leave room for one generated token (prompt < context(), else add() fails
// with kOutOfRange before any work). Prompt and output together never exceed context(): a request
// whose max_tokens would go beyond it finishes early with FinishReason::kLength, as llama.cpp's
// server ends a slot whose context is full.
//
// Finishing. In this order after each sampled token: a stop token id (kStop), an end-of-generation
// token of the tokenizer unless ignore_eos (kEos), a stop string appearing in the text (kStop),
// max_tokens or the context (kLength). The finishing token is kept in `tokens`; the text of
// EOS/stop tokens is not added, and text is cut before a matched stop string. Stop strings are
// held back from the stream while they might still match, so streamed text never contains them.
//
// Models without a tokenizer (synthetic ones) generate token ids only: no text, no end-of-
// generation detection, and stop strings are rejected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cisa/core/status.h"
#include "cisa/model/model.h"
#include "cisa/model/sampling.h"
#include "cisa/model/tokenizer.h"

namespace cisa {

enum class FinishReason { kNone, kLength, kEos, kStop, kCancelled, kError };
// "none" (still running or waiting), "length", "eos", "stop", "cancelled", "error".
const char* finish_reason_name(FinishReason r);

struct GenerationRequest {
  std::vector<int32_t> prompt;       // token ids, at least one
  int64_t max_tokens = 16;           // ≥ 1; the context may end the request earlier (kLength)
  SamplingParams sampling;           // each request draws from its own seeded generator
  bool ignore_eos = false;           // keep going after an end-of-generation token
  std::vector<int32_t> stop_tokens;  // finish with kStop when one is sampled
  std::vector<std::string> stop_strings;  // non-empty valid UTF-8; need a tokenizer
  // This request's attention (model.h StepAttention); empty: the model's own. A step runs only
  // requests of equal attention, so requests of different settings take turns.
  std::optional<StepAttention> attention;
};

struct GeneratorOptions {
  // Prompt rows one step feeds in all (chunked prefill): a long prompt then enters in chunks beside
  // the decoding requests, which get a token every step instead of waiting for the whole prefill.
  // 0: every admitted prompt whole in its first step.
  int64_t prefill_chunk = 0;
};

// Seconds on a steady clock.
struct GenerationTimings {
  double time_to_first_token = 0;  // from add() to the first sampled token (waiting included)
  double prefill_seconds = 0;      // the forward call that ran the prompt
  double decode_seconds = 0;       // the forward calls that ran generated tokens
  int64_t decode_steps = 0;        // those calls (tokens − 1 unless cancelled or failed)
  double decode_tokens_per_s = 0;  // decode_steps / decode_seconds (0 without decode steps)
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated ids, the finishing EOS / stop token included
  std::string text;             // their text, as described above (empty without a tokenizer)
  FinishReason finish = FinishReason::kNone;
  Status error;  // why, when finish is kError
  int64_t prompt_tokens = 0;
  GenerationTimings timings;
  // Global-layer K/V pages this request's rows read, and dense's count for them (its prompt and
  // generated tokens; Model::sequence_traffic when its sequence is released).
  SequenceTraffic traffic;
};

// One sampled token as the stream sees it.
struct GeneratedToken {
  size_t request = 0;  // the index add() returned (the position in generate()'s span)
  int32_t token = -1;
  std::string_view text;  // text this token releases: whole UTF-8 characters, maybe empty
};

struct GenerationCallbacks {
  // Every sampled token, in order per request. Returning false cancels the request: it finishes
  // with kCancelled after this token (whatever the token would have finished it with otherwise).
  std::function<bool(const GeneratedToken&)> on_token;
  // Once per request when it finishes. `tail` is what the stream held back and never released
  // (an incomplete UTF-8 character, a partial stop-string match); it is the end of result.text.
  std::function<void(size_t request, const GenerationResult& result, std::string_view tail)>
      on_finish;
  // Rows done / total of each forward call that runs prompts (Model::forward's progress).
  ProgressFn on_prefill_progress;
};

// The text side of one request: joins token pieces into whole UTF-8 characters and finds stop
// strings, holding back text that could be the start of one. Exposed for tests and servers that
// stream text of their own.
class StopStringStream {
 public:
  explicit StopStringStream(std::vector<std::string> stop_strings = {});
  // Adds a token's bytes; returns the text that is now certain: whole characters, none of it part
  // of a stop string. After a match returns what precedes the match and ignores later pushes.
  std::string push(std::string_view piece);
  // At the end of the stream: what was held back (empty after a match).
  std::string finish();
  bool stopped() const { return stopped_; }
  // Everything so far, cut before a matched stop string; includes held-back text.
  const std::string& text() const { return text_; }

 private:
  std::vector<std::string> stops_;
  size_t longest_ = 0;  // length of the longest stop string
  Utf8StreamBuffer utf8_;
  std::string text_;     // complete characters received (cut at a match)
  size_t released_ = 0;  // bytes of text_ returned by push()
  bool stopped_ = false;
};

// The stepping interface (continuous batching): add requests at any time, call step() until
// done(). Sequences still held are released by the destructor.
//
//   cisa::Generator g(*model, callbacks);
//   CISA_ASSIGN_OR_RETURN(size_t a, g.add(request_a));
//   while (!g.done()) {
//     CISA_RETURN_IF_ERROR(g.step());
//     if (more_arrived) CISA_RETURN_IF_ERROR(g.add(request_b).status());
//   }
//   const cisa::GenerationResult& ra = g.result(a);
class Generator {
 public:
  explicit Generator(Model& model, GenerationCallbacks callbacks = {},
                     GeneratorOptions options = {});
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Checks a request and queues it; returns its index (0, 1, … in order of adding). Errors
  // (kInvalidArgument, kOutOfRange for a prompt without room in the context) add nothing.
  Result<size_t> add(GenerationRequest request);
  // The checks add() makes, without adding: a server calls this on its HTTP threads (it only
  // reads the model's shape, context and tokenizer, which never change).
  static Status check(const Model& model, const GenerationRequest& request);
  // One forward call over the admitted prompts and decoding requests, then one sampled token for
  // each. A forward error finishes every request of the step with kError (sequences released) and
  // is returned; other requests are unaffected. Does nothing when there is nothing to run.
  Status step();
  // Finishes a waiting or running request now with kCancelled (no effect once finished). From
  // inside on_token, return false instead.
  void cancel(size_t index);
  // Finishes every unfinished request with kError carrying `why`.
  void abort(const Status& why);

  // Drops a finished request's result and text (a long-running server calls this once it has
  // delivered them); result(index) is then an empty result. No effect on unfinished requests.
  void forget(size_t index);

  bool done() const;                                   // nothing waiting or running
  size_t num_requests() const;                         // added so far
  size_t num_running() const;                          // holding a sequence
  size_t num_waiting() const;                          // added, not yet holding a sequence
  const GenerationResult& result(size_t index) const;  // index < num_requests()
  std::vector<GenerationResult> take_results();        // moves every result out (by index)

  struct State;

 private:
  std::unique_ptr<State> s_;
};

// Runs every request to its end (a loop over Generator). Requests are all checked before any work;
// a bad one returns its error with `out` untouched. A forward error returns that error with `out`
// filled: the requests it hit and those not finished yet carry kError.
Status generate(Model& model, std::span<const GenerationRequest> requests,
                std::vector<GenerationResult>* out, const GenerationCallbacks& callbacks = {});

}  // namespace cisa
