// `cisa bench model`'s fixed-output protocol (bench_model_protocol.h, docs/bench-model.md):
// loading, the prompt prefill or random K/V fill, the T decode steps, and their timings. The
// roofline and the report are in bench_model_report.cpp.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_model_protocol.h"
#include "bench_model_report.h"
#include "cisa/core/membw.h"
#include "cisa/core/thread_pool.h"
#include "cisa/model/gguf.h"
#include "cisa/model/model.h"
#include "cisa/model/model_store.h"
#include "cisa/model/sampling.h"
#include "cisa/model/tokenizer.h"
#include "cli_common.h"
#ifdef CISA_WITH_CUDA_MODEL
#include "cisa/cuda/bandwidth.h"
#include "cisa/cuda/model_backend.h"
#endif

namespace cisa::cli {
namespace {

constexpr FailWith fail{"cisa bench model"};

// Decode steps of a run: T with random K/V, T - 1 after a prefill (which made the first token).
int64_t decode_steps(const ProtocolArgs& a) {
  return a.fill == "random" ? a.tokens : a.tokens - 1;
}

// Progress lines on stderr with an ETA: redrawn in place on a terminal, else one line every ~10 s
// (so a log file shows that a long fill is moving).
class Progress {
 public:
  explicit Progress(std::string label) : label_(std::move(label)) {}
  void update(int64_t done, int64_t total, const char* unit) {
    const double t = clock_.seconds();
    if (!tty_ && t - last_ < 10.0 && done < total) return;
    last_ = t;
    const double eta = done > 0 ? t * static_cast<double>(total - done) / done : 0.0;
    std::fprintf(stderr, "%s%s %lld/%lld %s, %.0f s, ETA %.0f s%s", tty_ ? "\r" : "",
                 label_.c_str(), static_cast<long long>(done), static_cast<long long>(total), unit,
                 t, eta, tty_ ? "   " : "\n");
    if (tty_ && done >= total) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  std::string label_;
  Stopwatch clock_;
  double last_ = -1e9;
  bool tty_ = isatty(STDERR_FILENO) != 0;
};

// The prompts: random ids for a synthetic model; for a GGUF model, the text (repeated as needed)
// tokenized once, request b starting 997·b tokens further in so the prompts differ.
Result<std::vector<std::vector<int32_t>>> make_prompts(const ProtocolArgs& a, int n_vocab) {
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(a.batch));
  if (!a.mo.synthetic.empty()) {
    for (int64_t b = 0; b < a.batch; ++b)
      prompts[static_cast<size_t>(b)] =
          random_tokens(a.context, n_vocab, static_cast<uint64_t>(a.seed) * 1000003 + b);
    return prompts;
  }
  std::string text;
  std::vector<std::string> files;
  if (!a.text_path.empty()) {
    files.push_back(a.text_path);
  } else {
    CISA_ASSIGN_OR_RETURN(std::string src, find_source_dir());
    files.push_back(src + "/README.md");
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(src + "/docs", ec))
      if (e.path().extension() == ".md") files.push_back(e.path().string());
    std::sort(files.begin() + 1, files.end());
  }
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) return not_found("--text: cannot read '" + f + "'");
    std::ostringstream ss;
    ss << in.rdbuf();
    text += ss.str() + "\n\n";
  }
  CISA_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(a.model_path));
  CISA_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_gguf(file));
  std::vector<int32_t> ids = tok.encode(text, /*add_bos=*/false);
  if (ids.size() < 64) return invalid_argument("the prompt text encodes to fewer than 64 tokens");
  const int64_t n = static_cast<int64_t>(ids.size());
  for (int64_t b = 0; b < a.batch; ++b) {
    auto& p = prompts[static_cast<size_t>(b)];
    if (tok.adds_bos()) p.push_back(tok.bos_id());
    for (int64_t i = static_cast<int64_t>(p.size()); i < a.context; ++i)
      p.push_back(ids[static_cast<size_t>((997 * b + i) % n)]);
  }
  return prompts;
}

int64_t memory_in_use(Model& m, int64_t device_total) {
  if (m.backend().kind() == BackendKind::kCuda) return device_total - m.backend().free_memory();
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // the process's peak resident set
}

// Writes L tokens of random K/V into every layer of every sequence through the backend, in
// chunks, layer by layer; representatives of full pages come with append_kv.
Status fill_random_cache(Model& m, const std::vector<SeqId>& seqs, int64_t L, uint64_t seed) {
  Backend& be = m.backend();
  const KvCacheConfig& kc = be.cache_config();
  const int64_t row = int64_t{kc.num_kv_heads} * kc.head_dim;
  const int64_t chunk =
      std::min<int64_t>(L, std::max<int64_t>(256, (int64_t{64} << 20) / (row * 4)));
  CISA_ASSIGN_OR_RETURN(auto k, be.allocate(chunk * row * 4, "random K"));
  CISA_ASSIGN_OR_RETURN(auto v, be.allocate(chunk * row * 4, "random V"));
  for (SeqId s : seqs) CISA_RETURN_IF_ERROR(be.reserve(s, L));
  Progress pr("fill random K/V");
  const int64_t total = static_cast<int64_t>(seqs.size()) * kc.num_layers * L;
  int64_t done = 0;
  for (int layer = 0; layer < kc.num_layers; ++layer) {
    for (size_t si = 0; si < seqs.size(); ++si) {
      for (int64_t t0 = 0; t0 < L; t0 += chunk) {
        const int64_t n = std::min(chunk, L - t0);
        const uint64_t sd = seed ^ (uint64_t(layer) << 40) ^ (uint64_t(si) << 32) ^ uint64_t(t0);
        CISA_RETURN_IF_ERROR(be.fill_random(k->f32(), n * row, 2 * sd + 1, 1.0f));
        CISA_RETURN_IF_ERROR(be.fill_random(v->f32(), n * row, 2 * sd + 2, 1.0f));
        const BatchEntry e{.seq = seqs[si], .first = t0, .count = static_cast<int32_t>(n)};
        CISA_RETURN_IF_ERROR(be.append_kv(layer, {&e, 1}, k->f32(), v->f32()));
        done += n;
      }
      pr.update(done, total, "token-layers");
    }
  }
  return be.synchronize();
}

// Loads the model for `mo`, warms up, then runs the protocol once.
Status run_protocol(const ProtocolArgs& a, const ModelCliOptions& mo,
                    const std::vector<std::vector<int32_t>>& prompts,
                    const std::vector<IndexProjection>& index, int64_t device_total,
                    ProtocolRun* out) {
  CISA_ASSIGN_OR_RETURN(ModelOptions mopt, to_model_options(mo));
  mopt.context = (a.context + a.tokens + 1 + 15) / 16 * 16;
  mopt.max_sequences = static_cast<int>(a.batch);
  if (mopt.attention.mode == AttentionMode::kCisa) mopt.attention.index = index;
  const Stopwatch load_clock;
  std::unique_ptr<Model> loaded;
  if (!mo.synthetic.empty()) {
    CISA_ASSIGN_OR_RETURN(loaded, Model::load_synthetic(mo.synthetic, mopt, synthetic_layers(mo)));
  } else {
    CISA_ASSIGN_OR_RETURN(loaded, Model::load(a.model_path, mopt));
  }
  Model& m = *loaded;
  out->load_s = load_clock.seconds();
  const int V = m.hparams().n_vocab;
  const size_t B = static_cast<size_t>(a.batch);
  std::vector<SequenceInput> in(B);
  std::vector<int32_t> next(B);
  std::vector<SeqId> seqs(B);
  {  // warm-up at the batch size (GEMM plans, buffers), on sequences that are then dropped
    const std::vector<int32_t> w = random_tokens(17, V, 7);
    for (size_t b = 0; b < B; ++b) {
      CISA_ASSIGN_OR_RETURN(seqs[b], m.add_sequence());
      in[b] = {.seq = seqs[b], .tokens = {w.data(), 16}};
    }
    CISA_RETURN_IF_ERROR(m.forward(in, ForwardOutputs{.argmax = &next}));
    for (int i = 0; i < 2; ++i) {
      for (size_t b = 0; b < B; ++b) in[b].tokens = {w.data() + 16, 1};
      CISA_RETURN_IF_ERROR(m.forward(in, ForwardOutputs{.argmax = &next}));
    }
    for (SeqId s : seqs) CISA_RETURN_IF_ERROR(m.release_sequence(s));
  }
  for (size_t b = 0; b < B; ++b) {
    CISA_ASSIGN_OR_RETURN(seqs[b], m.add_sequence());
  }
  m.reset_stats();
  out->peak_memory = memory_in_use(m, device_total);
  const bool random_fill = a.fill == "random";
  if (random_fill) {
    const Stopwatch clock;
    CISA_RETURN_IF_ERROR(fill_random_cache(m, seqs, a.context, static_cast<uint64_t>(a.seed)));
    out->fill_s = clock.seconds();
    next = random_tokens(a.batch, V, static_cast<uint64_t>(a.seed) + 99);
  } else {
    for (size_t b = 0; b < B; ++b) in[b] = {.seq = seqs[b], .tokens = prompts[b]};
    Progress pr(std::string("prefill ") + mo.attention);
    const Stopwatch clock;
    // The first generated token of every request, greedy on the backend.
    CISA_RETURN_IF_ERROR(
        m.forward(in, ForwardOutputs{.argmax = &next},
                  [&](int64_t done, int64_t total) { pr.update(done, total, "tokens"); }));
    out->ttft_s = clock.seconds();
  }
  out->prefill = m.stats();
  out->peak_memory = std::max(out->peak_memory, memory_in_use(m, device_total));
  // Decode: every request generates exactly T tokens (the prompt's prefill made the first).
  // Greedy on the backend: only the B token ids leave it (ForwardOutputs::argmax).
  const int64_t steps = decode_steps(a);
  Progress pr(std::string("decode ") + mo.attention);
  std::vector<int32_t> greedy(B);
  for (int64_t i = 0; i < steps; ++i) {
    for (size_t b = 0; b < B; ++b) in[b] = {.seq = seqs[b], .tokens = {&next[b], 1}};
    [[maybe_unused]] const bool profiled = i == a.profile_step;
#ifdef CISA_WITH_CUDA_MODEL
    if (profiled) CISA_RETURN_IF_ERROR(cuda::set_profiler_capture(true));
#endif
    const Stopwatch clock;
    CISA_RETURN_IF_ERROR(m.forward(in, ForwardOutputs{.argmax = &greedy}));  // EOS never checked
#ifdef CISA_WITH_CUDA_MODEL
    if (profiled) CISA_RETURN_IF_ERROR(cuda::set_profiler_capture(false));
#endif
    next.swap(greedy);
    out->step_s.push_back(clock.seconds());
    pr.update(i + 1, steps, "steps");
  }
  out->total = m.stats();
  out->peak_memory = std::max(out->peak_memory, memory_in_use(m, device_total));
  out->attention = attention_summary(m, out->prefill, out->total);
  out->hp = m.hparams();
  out->options = m.options();
  out->cache = m.backend().cache_config();
  out->weight_bytes = m.backend().weight_bytes();
  out->backend = m.backend().description();
  out->graphs = m.backend().step_graph_stats();
#ifdef CISA_WITH_CUDA_MODEL
  if (auto g = cuda::gemm_choices(m.backend()); g.ok()) out->gemm_choices = std::move(*g);
#endif
  out->threads = m.num_threads();
  return Status::Ok();
}

}  // namespace

int bench_model_protocol(const ProtocolArgs& a) {
  if (a.batch < 1 || a.batch > 4096) return fail("--batch must be in [1, 4096]");
  if (a.tokens < 1) return fail("--tokens must be >= 1");
  if (a.fill != "prompt" && a.fill != "random") return fail("--fill must be prompt or random");
  if (a.context < 1) return fail("--context must be >= 1");
  if (a.profile_step >= 0 && a.mo.backend != "cuda")
    return fail("--profile-step needs --backend cuda");
  if (a.profile_step < -1 || a.profile_step >= decode_steps(a))
    return fail("--profile-step must be a decode step in [0, " + std::to_string(decode_steps(a)) +
                ") (--tokens with --fill random, --tokens - 1 after a prefill)");
  ModelCliOptions mo = a.mo;
  ModelHparams hp;
  std::vector<IndexProjection> index;
  if (!mo.synthetic.empty()) {
    if (!mo.indexer.empty())
      return fail("--indexer: an indexer is calibrated for a model file; --synthetic " +
                  mo.synthetic + " has none (drop --indexer)");
    auto h = synthetic_hparams(mo.synthetic, synthetic_layers(mo));
    if (!h.ok()) return fail("--synthetic: " + h.status().message());
    hp = *h;
  } else {
    auto f = GgufFile::open(a.model_path);
    if (!f.ok()) return fail(f.status().message());
    auto h = read_model_hparams(*f);
    if (!h.ok()) return fail(h.status().message());
    hp = *h;
    if (!mo.indexer.empty()) {
      if (mo.attention != "cisa") return fail("--indexer needs --attention cisa");
      auto p = load_index_projections(mo.indexer, *f, hp, static_cast<int>(mo.dense_layers));
      if (!p.ok()) return fail(p.status().message());
      index = std::move(*p);
    }
  }
  scale_cisa_defaults(&mo, hp.n_ctx_train);
  if (auto check = to_model_options(mo); !check.ok()) return fail(check.status().message());
  auto prompts = make_prompts(a, hp.n_vocab);
  if (!prompts.ok()) return fail(prompts.status().message());

  // The ceiling, measured before any model holds device memory.
  ProtocolReport rep;
  rep.args = &a;
  rep.options = mo;
  if (mo.backend == "cuda") {
#ifdef CISA_WITH_CUDA_MODEL
    auto facts = cuda::device_facts(0);
    if (!facts.ok()) return fail(facts.status().message());
    rep.device = facts->name;
    rep.device_memory = facts->total_memory;
    rep.driver_api = facts->driver_api;
    rep.runtime_api = facts->runtime_api;
    auto bw = cuda::measure_copy_bandwidth(a.bandwidth_mib << 20);
    if (!bw.ok()) return fail(bw.status().message());
    rep.bandwidth_gb_s = bw->gb_per_s;
    rep.bandwidth_kind = "device-to-device cudaMemcpy, bytes read + written, median of 20";
    rep.bandwidth_bytes = bw->bytes;
#endif
  }
  if (mo.attention == "cisa") {
    ModelCliOptions dense = mo;
    dense.attention = "dense";
    rep.runs.push_back({.mode = "dense"});
    if (Status s = run_protocol(a, dense, *prompts, index, rep.device_memory, &rep.runs.back());
        !s.ok())
      return fail("dense: " + s.message());
  }
  rep.runs.push_back({.mode = mo.attention});
  if (Status s = run_protocol(a, mo, *prompts, index, rep.device_memory, &rep.runs.back()); !s.ok())
    return fail(mo.attention + ": " + s.message());
  if (mo.backend != "cuda") {  // after the runs, so their peak RSS does not include its buffer
    ThreadPool pool(static_cast<int>(mo.threads));
    rep.bandwidth_gb_s = measure_read_bandwidth(pool, a.bandwidth_mib << 20, 5);
    rep.bandwidth_kind = "host memory read (membw.h), best of 5";
    rep.bandwidth_bytes = a.bandwidth_mib << 20;
  }
  return print_protocol_report(rep);
}

}  // namespace cisa::cli
