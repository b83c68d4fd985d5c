// Selection diagnostics of SPEC §9 on real activations: one dense pass with an attention tap that
// records the queries of sampled positions and the index queries around them, then, per global
// layer, KV group and position, the dense mass CISA's pages capture against the oracle and a
// recency-only choice, QShare retention and mass lost, overlap across lags, and the window's worth.
#include <algorithm>
#include <cmath>
#include <string>

#include "activations.h"
#include "cisa/core/checked.h"
#include "cisa/core/diagnostics.h"
#include "cisa/core/rep_quant.h"
#include "cisa/core/thread_pool.h"
#include "cisa/cpu/selection.h"
#include "cisa/model/gguf.h"
#include "cisa/model/indexer.h"
#include "cisa/model/tokenizer.h"

namespace cisa {
namespace {

// s_j = q·r_j / √d for chunks [0, end).
std::vector<double> index_scores(const float* q, const std::vector<float>& reps, int d,
                                 int64_t end) {
  std::vector<double> s(static_cast<size_t>(end));
  const double inv = 1.0 / std::sqrt(static_cast<double>(d));
  for (int64_t j = 0; j < end; ++j) {
    const float* r = reps.data() + j * d;
    double dot = 0;
    for (int i = 0; i < d; ++i) dot += static_cast<double>(q[i]) * r[i];
    s[static_cast<size_t>(j)] = dot * inv;
  }
  return s;
}

struct Sample {
  double cisa = 0, oracle = 0, recency = 0, window = 0, extra_oracle = 0, extra_index = 0;
  std::vector<double> retention, lost, overlap;
  double fp8_mass = 0, int8_mass = 0, fp8_overlap = 0, int8_overlap = 0;
};

// The representatives of one (layer, KV group), chunk after chunk, each rounded by quantize_rep.
std::vector<float> rounded_reps(std::vector<float> reps, int d, RepPrecision p) {
  for (size_t j = 0; j + static_cast<size_t>(d) <= reps.size(); j += static_cast<size_t>(d))
    quantize_rep(p, std::span<float>(reps.data() + j, static_cast<size_t>(d)));
  return reps;
}

}  // namespace

Result<DiagnoseReport> diagnose_model(const std::string& model_path, const std::string& text,
                                      const Indexer* indexer, const DiagnoseOptions& o) {
  if (o.budget < 1 || o.window < 0 || o.sink_pages < 0 || o.positions < 1)
    return invalid_argument(
        "diagnose: budget and positions must be >= 1, window and sink pages >= 0");
  CISA_RETURN_IF_ERROR(validate_selection_params(
      {.budget = o.budget, .window = o.window, .qshare = 1, .sink_pages = o.sink_pages}));
  if (o.qshare.empty() || o.lags.empty())
    return invalid_argument("diagnose: give at least one QShare size and one lag");
  for (int64_t g : o.qshare)
    if (g < 1 || g > 4096) return invalid_argument("diagnose: QShare sizes must be in [1, 4096]");
  for (int64_t l : o.lags)
    if (l < 1 || l > 65536) return invalid_argument("diagnose: lags must be in [1, 65536]");
  const int64_t gmax = *std::max_element(o.qshare.begin(), o.qshare.end());
  const int64_t lmax = *std::max_element(o.lags.begin(), o.lags.end());
  constexpr int B = 16;

  DiagnoseReport rep;
  std::vector<int32_t> ids;
  ModelHparams hp;
  ModelOptions mo;
  mo.threads = o.threads;
  mo.prefill_block = o.prefill_block;
  mo.kv_dtype = KvDtype::kF32;
  {
    CISA_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(model_path));
    CISA_ASSIGN_OR_RETURN(rep.model, model_identity(file));
    CISA_ASSIGN_OR_RETURN(hp, read_model_hparams(file));
    CISA_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_gguf(file));
    ids = tok.encode(text, true);
    const int64_t cap =
        o.max_tokens > 0 ? std::min<int64_t>(o.max_tokens, hp.n_ctx_train) : hp.n_ctx_train;
    if (static_cast<int64_t>(ids.size()) > cap) ids.resize(static_cast<size_t>(cap));
    if (indexer) {
      CISA_RETURN_IF_ERROR(check_indexer_matches(*indexer, rep.model));
      // The indexer's projections need CISA layers; a budget above every eligible count keeps
      // their attention on the dense path (no selection runs), so the activations are dense ones.
      std::vector<bool> layers(static_cast<size_t>(hp.n_layer));
      for (int l = 0; l < hp.n_layer; ++l) layers[static_cast<size_t>(l)] = hp.is_global(l);
      mo.attention.mode = AttentionMode::kCisa;
      mo.attention.selection = {
          .budget = static_cast<int64_t>(ids.size()) / B + 1, .window = 0, .qshare = 1};
      CISA_ASSIGN_OR_RETURN(mo.attention.index, indexer_projections(*indexer, file, hp, layers));
      rep.calibrated = true;
    }
  }
  const int64_t n = static_cast<int64_t>(ids.size());
  rep.tokens = n;
  mo.context = n;

  // t − G_max + 1 must have |E| ≥ 4k, and t + lag_max must exist: the text needs
  // (W' + sinks + 4k)·B + lag_max + 1 tokens, W' = W + ⌈G_max / B⌉. Computed with overflow checks
  // before anything is sized from these numbers.
  CalibSettings s{.budget = o.budget, .window = 0, .sink_pages = o.sink_pages, .page_size = B};
  int64_t need = 0;
  const bool fits = checked_add(o.window, (gmax + B - 1) / B, &s.window) &&
                    checked_mul(4, o.budget, &need) && checked_add(need, s.window, &need) &&
                    checked_add(need, o.sink_pages, &need) && checked_mul(need, B, &need) &&
                    checked_add(need, lmax + 1, &need);
  if (!fits || need > n)
    return invalid_argument("diagnose: the text has " + std::to_string(n) +
                            " tokens; positions with k = " + std::to_string(o.budget) +
                            ", W = " + std::to_string(o.window) + " and " +
                            std::to_string(o.sink_pages) + " sink pages need at least " +
                            (fits ? std::to_string(need) : std::string("2^63")));
  const std::vector<int64_t> pos = sample_positions(n - lmax, o.positions, s, o.seed);
  if (pos.empty())
    return invalid_argument("diagnose: the text has " + std::to_string(n) +
                            " tokens; positions need at least " + std::to_string(need));
  rep.positions = static_cast<int64_t>(pos.size());
  std::vector<int64_t> index_pos;
  for (int64_t t : pos) {
    for (int64_t a = t - gmax + 1; a <= t; ++a) index_pos.push_back(a);
    for (int64_t l : o.lags) index_pos.push_back(t + l);
  }
  std::sort(index_pos.begin(), index_pos.end());
  index_pos.erase(std::unique(index_pos.begin(), index_pos.end()), index_pos.end());

  CISA_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::load(model_path, mo));
  calib::QueryRecorder rec(hp, pos, index_pos);
  model->set_attention_tap(rec.tap());
  CISA_ASSIGN_OR_RETURN(SeqId seq, model->add_sequence());
  SequenceInput in{.seq = seq, .tokens = ids, .outputs = OutputMode::kNone};
  CISA_RETURN_IF_ERROR(model->forward({&in, 1}, nullptr, [&](int64_t done, int64_t total) {
    if (o.progress) o.progress(done, total);
  }));
  model->set_attention_tap({});

  if (!model->cpu_cache())
    return failed_precondition("diagnose reads the KV cache on the host: it needs the CPU backend");
  const PagedKvCache& cache = *model->cpu_cache();
  CISA_ASSIGN_OR_RETURN(std::span<const int32_t> bt, cache.block_table(seq));
  std::vector<int> layers;
  for (int l = 0; l < hp.n_layer; ++l)
    if (hp.is_global(l)) layers.push_back(l);
  const int d = hp.head_dim, hg = hp.heads_per_group(), Hkv = hp.n_head_kv;
  const size_t n_groups = layers.size() * static_cast<size_t>(Hkv);
  ThreadPool pool(model->num_threads());
  // Each group's representatives, and the same as an 8-bit cache would hold them
  // (docs/design.md, "Representative precision").
  std::vector<std::vector<float>> reps(n_groups), reps_fp8(n_groups), reps_int8(n_groups);
  pool.parallel_for(static_cast<int64_t>(n_groups), [&](int64_t gi, int) {
    const auto i = static_cast<size_t>(gi);
    reps[i] = calib::chunk_representatives(cache, layers[i / size_t(Hkv)], bt,
                                           static_cast<int>(gi % Hkv), n / B);
    reps_fp8[i] = rounded_reps(reps[i], d, RepPrecision::kFp8);
    reps_int8[i] = rounded_reps(reps[i], d, RepPrecision::kInt8);
  });

  const int64_t k = o.budget, W = o.window, sinks = o.sink_pages;
  const int64_t n_tasks = static_cast<int64_t>(pos.size() * n_groups);
  std::vector<Sample> samples(static_cast<size_t>(n_tasks));
  pool.parallel_for(n_tasks, [&](int64_t task, int) {
    const size_t pi = static_cast<size_t>(task) / n_groups,
                 gi = static_cast<size_t>(task) % n_groups;
    const int l = layers[gi / static_cast<size_t>(Hkv)];
    const int g = static_cast<int>(gi % static_cast<size_t>(Hkv));
    const int64_t t = pos[pi], ct = t / B;
    const std::vector<float>& r = reps[gi];
    const std::vector<double> mass = calib::dense_chunk_mass(
        cache, l, bt, g, rec.q(l, t) + static_cast<size_t>(g * hg * d), hg, t, hp.attn_scale);
    auto iq = [&](int64_t p) { return rec.index_q(l, p) + static_cast<size_t>(g * d); };
    // The pages a group {a … t} attends: sinks, its selection, and c(a) − W … c(t).
    auto attended = [&](const std::vector<int32_t>& sel, int64_t a) {
      std::vector<int32_t> pages(sel);
      for (int64_t j = 0; j < sinks; ++j) pages.push_back(static_cast<int32_t>(j));
      for (int64_t j = std::max<int64_t>(0, a / B - W); j <= ct; ++j)
        pages.push_back(static_cast<int32_t>(j));
      return captured_mass(mass, pages);
    };
    auto select_from = [&](const std::vector<float>& reps_of, const float* q, int64_t a) {
      const int64_t end = a / B - W;
      return oracle_topk(index_scores(q, reps_of, d, end), sinks, end, k);
    };
    auto select = [&](const float* q, int64_t a) { return select_from(r, q, a); };
    Sample& sm = samples[static_cast<size_t>(task)];
    const std::vector<int32_t> own = select(iq(t), t);
    sm.cisa = attended(own, t);
    const std::vector<int32_t> own_fp8 = select_from(reps_fp8[gi], iq(t), t),
                               own_int8 = select_from(reps_int8[gi], iq(t), t);
    sm.fp8_mass = attended(own_fp8, t);
    sm.int8_mass = attended(own_int8, t);
    sm.fp8_overlap = selection_overlap(own, own_fp8);
    sm.int8_overlap = selection_overlap(own, own_int8);
    sm.oracle = attended(oracle_topk(mass, sinks, ct - W, k), t);
    std::vector<int32_t> recent;
    for (int64_t j = std::max(sinks, ct - W - k); j < ct - W; ++j)
      recent.push_back(static_cast<int32_t>(j));
    sm.recency = attended(recent, t);
    for (int64_t G : o.qshare) {
      const int64_t a = t - G + 1;
      std::vector<float> qbar(static_cast<size_t>(d), 0.0f);
      for (int64_t p = a; p <= t; ++p)
        for (int i = 0; i < d; ++i)
          qbar[static_cast<size_t>(i)] += iq(p)[i] / static_cast<float>(G);
      const std::vector<int32_t> shared = select(qbar.data(), a);
      sm.retention.push_back(qshare_retention(shared, own, k));
      sm.lost.push_back(sm.cisa - attended(shared, a));
    }
    for (int64_t lag : o.lags)
      sm.overlap.push_back(selection_overlap(own, select(iq(t + lag), t + lag)));
    const WindowTradeoff wt = window_tradeoff(mass, own, ct - W, ct - W, ct);
    sm.window = wt.window_mass;
    sm.extra_oracle = wt.extra_mass;
    // The next W chunks by index score after the top-k.
    const std::vector<int32_t> wider =
        oracle_topk(index_scores(iq(t), r, d, ct - W), sinks, ct - W, k + W);
    sm.extra_index = captured_mass(mass, wider) - captured_mass(mass, own);
  });

  for (size_t li = 0; li < layers.size(); ++li) {
    LayerDiagnostics ld;
    ld.layer = layers[li];
    ld.qshare_retention.assign(o.qshare.size(), 0.0);
    ld.qshare_mass_lost.assign(o.qshare.size(), 0.0);
    ld.overlap.assign(o.lags.size(), 0.0);
    ld.group_cisa_mass.assign(static_cast<size_t>(Hkv), 0.0);
    ld.group_oracle_mass.assign(static_cast<size_t>(Hkv), 0.0);
    std::vector<int64_t> group_samples(static_cast<size_t>(Hkv), 0);
    for (int64_t task = 0; task < n_tasks; ++task) {
      if ((static_cast<size_t>(task) % n_groups) / static_cast<size_t>(Hkv) != li) continue;
      const Sample& sm = samples[static_cast<size_t>(task)];
      ld.samples += 1;
      ld.cisa_mass += sm.cisa;
      ld.oracle_mass += sm.oracle;
      const size_t g = (static_cast<size_t>(task) % n_groups) % static_cast<size_t>(Hkv);
      ld.group_cisa_mass[g] += sm.cisa;
      ld.group_oracle_mass[g] += sm.oracle;
      group_samples[g] += 1;
      ld.recency_mass += sm.recency;
      ld.window_mass += sm.window;
      ld.extra_mass_oracle += sm.extra_oracle;
      ld.extra_mass_index += sm.extra_index;
      ld.fp8_mass += sm.fp8_mass;
      ld.int8_mass += sm.int8_mass;
      ld.fp8_overlap += sm.fp8_overlap;
      ld.int8_overlap += sm.int8_overlap;
      for (size_t i = 0; i < o.qshare.size(); ++i) {
        ld.qshare_retention[i] += sm.retention[i];
        ld.qshare_mass_lost[i] += sm.lost[i];
      }
      for (size_t i = 0; i < o.lags.size(); ++i) ld.overlap[i] += sm.overlap[i];
    }
    const double m = ld.samples > 0 ? 1.0 / static_cast<double>(ld.samples) : 0.0;
    for (double* v :
         {&ld.cisa_mass, &ld.oracle_mass, &ld.recency_mass, &ld.window_mass, &ld.extra_mass_oracle,
          &ld.extra_mass_index, &ld.fp8_mass, &ld.int8_mass, &ld.fp8_overlap, &ld.int8_overlap})
      *v *= m;
    for (double& v : ld.qshare_retention) v *= m;
    for (double& v : ld.qshare_mass_lost) v *= m;
    for (double& v : ld.overlap) v *= m;
    for (size_t g = 0; g < group_samples.size(); ++g) {
      const double mg = group_samples[g] > 0 ? 1.0 / static_cast<double>(group_samples[g]) : 0.0;
      ld.group_cisa_mass[g] *= mg;
      ld.group_oracle_mass[g] *= mg;
    }
    rep.layers.push_back(std::move(ld));
  }
  return rep;
}

}  // namespace cisa
