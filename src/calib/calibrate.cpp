// Calibration on a real model (SPEC §6): one dense pass per document with an attention tap that
// records the queries of the sampled positions, then, from the filled KV cache, the target p
// (dense chunk mass over E_t), the representatives, and every candidate's scores.
#include <algorithm>
#include <array>
#include <string>

#include "activations.h"
#include "cisa/core/thread_pool.h"
#include "cisa/model/gguf.h"
#include "cisa/model/indexer.h"
#include "cisa/model/tokenizer.h"
#include "index_fit.h"

namespace cisa {

Result<Indexer> calibrate_indexer(const std::string& model_path, std::span<const CalibText> texts,
                                  const CalibrateOptions& o) {
  const CalibSettings& cs = o.settings;
  if (cs.budget < 1)
    return invalid_argument("calibration budget k must be >= 1 (got " + std::to_string(cs.budget) +
                            ")");
  if (cs.window < 0 || cs.sink_pages < 0)
    return invalid_argument("calibration window and sink pages must be >= 0");
  if (cs.positions < 1) return invalid_argument("positions per document must be >= 1");
  if (cs.page_size != 16) return invalid_argument("calibration runs on the model's 16-token pages");
  if (texts.empty()) return invalid_argument("no calibration documents");

  Indexer idx;
  std::vector<std::vector<int32_t>> docs;
  int64_t context = 0;
  ModelHparams hp;
  {
    CISA_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(model_path));
    CISA_ASSIGN_OR_RETURN(idx.model, model_identity(file));
    CISA_ASSIGN_OR_RETURN(hp, read_model_hparams(file));
    CISA_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::from_gguf(file));
    const int64_t cap =
        o.max_tokens > 0 ? std::min<int64_t>(o.max_tokens, hp.n_ctx_train) : hp.n_ctx_train;
    for (const CalibText& t : texts) {
      std::vector<int32_t> ids = tok.encode(t.text, true);
      if (static_cast<int64_t>(ids.size()) > cap) ids.resize(static_cast<size_t>(cap));
      context = std::max<int64_t>(context, static_cast<int64_t>(ids.size()));
      idx.settings.documents.push_back(
          {.name = t.name,
           .tokens = static_cast<int64_t>(ids.size()),
           .content_hash =
               fnv1a64({reinterpret_cast<const uint8_t*>(t.text.data()), t.text.size()})});
      docs.push_back(std::move(ids));
    }
  }
  idx.settings.budget = cs.budget;
  idx.settings.window = cs.window;
  idx.settings.sink_pages = cs.sink_pages;
  idx.settings.page_size = cs.page_size;
  idx.settings.positions = cs.positions;
  idx.settings.seed = cs.seed;
  idx.settings.criterion = cs.criterion;

  // Positions per document, decided before any work so the total is known for progress.
  std::vector<std::vector<int64_t>> positions;
  int64_t total_positions = 0, total_tokens = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    positions.push_back(sample_positions(static_cast<int64_t>(docs[i].size()), cs.positions, cs,
                                         cs.seed + 1000003 * i));
    total_positions += static_cast<int64_t>(positions.back().size());
    total_tokens += static_cast<int64_t>(docs[i].size());
  }
  if (total_positions == 0)
    return invalid_argument(
        "no document is long enough: positions need c(t) - W - sinks >= 4k, i.e. at least " +
        std::to_string((cs.window + cs.sink_pages + 4 * cs.budget) * cs.page_size + 1) +
        " tokens (longest has " + std::to_string(context) + ")");

  ModelOptions mo;
  mo.threads = o.threads;
  mo.context = context;
  mo.prefill_block = o.prefill_block;
  mo.kv_dtype = KvDtype::kF32;
  CISA_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::load(model_path, mo));
  ThreadPool pool(model->num_threads());

  const int hg = hp.heads_per_group(), d = hp.head_dim, B = static_cast<int>(cs.page_size);
  if (cs.fit && hp.qk_norm)
    return failed_precondition(
        "the fitted index query needs a model without q/k norms (its mix of heads does not commute "
        "with a per-head RMSNorm); calibrate this model without --fit");
  idx.settings.fit = cs.fit;
  idx.settings.fit_ridge = cs.fit_ridge;
  std::vector<int> layers;
  for (int l = 0; l < hp.n_layer; ++l)
    if (hp.is_global(l)) layers.push_back(l);
  std::vector<GroupAccumulator> acc;
  for (int l : layers)
    for (int g = 0; g < hp.n_head_kv; ++g) {
      std::vector<int> heads;
      for (int c = 0; c < hg; ++c) heads.push_back(g * hg + c);
      heads.push_back(kMeanCandidate);
      if (cs.fit) heads.push_back(kFitCandidate);
      acc.emplace_back(l, g, heads);
    }
  const size_t n_groups = acc.size();

  // Pass 1, per document: the dense pass, then per (position, layer, group) the target mass over
  // E_t and the candidates' queries; the representatives are kept per document and group. The
  // scores wait for pass 2, since the fitted candidate needs every position first.
  struct Sample {
    size_t doc = 0, group = 0;
    int fold = 0;              // cross-fit half: the position's index within its document, mod 2
    int64_t first = 0;         // E_t = [first, first + mass.size())
    std::vector<double> mass;  // over E_t
    std::vector<float> cand;   // [h_g + 1][d]: the heads after RoPE, then the mean
  };
  std::vector<Sample> samples;
  std::vector<std::vector<std::vector<float>>> doc_reps(docs.size());  // [doc][group]
  int64_t tokens_before = 0;
  for (size_t di = 0; di < docs.size(); ++di) {
    const std::vector<int64_t>& pos = positions[di];
    const int64_t n = static_cast<int64_t>(docs[di].size());
    if (pos.empty()) {
      tokens_before += n;
      continue;
    }
    calib::QueryRecorder rec(hp, pos, pos);
    model->set_attention_tap(rec.tap());
    CISA_ASSIGN_OR_RETURN(SeqId seq, model->add_sequence());
    SequenceInput in{.seq = seq, .tokens = docs[di], .outputs = OutputMode::kNone};
    Status s = model->forward({&in, 1}, nullptr, [&](int64_t done, int64_t) {
      if (o.progress)
        o.progress({.document = static_cast<int>(di),
                    .documents = static_cast<int>(docs.size()),
                    .tokens_done = tokens_before + done,
                    .tokens_total = total_tokens,
                    .stage = "prefill"});
    });
    model->set_attention_tap({});
    if (!s.ok()) {
      (void)model->release_sequence(seq);
      return s;
    }
    if (o.progress)
      o.progress({.document = static_cast<int>(di),
                  .documents = static_cast<int>(docs.size()),
                  .tokens_done = tokens_before + n,
                  .tokens_total = total_tokens,
                  .stage = "score"});

    // Representatives of every full chunk the sampled positions can see, per (layer, group).
    if (!model->cpu_cache())
      return failed_precondition(
          "the calibration reads the KV cache on the host: it needs the CPU "
          "backend");
    const PagedKvCache& cache = *model->cpu_cache();
    CISA_ASSIGN_OR_RETURN(std::span<const int32_t> bt, cache.block_table(seq));
    const int64_t max_eligible = pos.back() / B - cs.window;
    std::vector<std::vector<float>>& reps = doc_reps[di];
    reps.resize(n_groups);
    pool.parallel_for(static_cast<int64_t>(n_groups), [&](int64_t gi, int) {
      const int l = layers[static_cast<size_t>(gi) / static_cast<size_t>(hp.n_head_kv)];
      const int g = static_cast<int>(gi % hp.n_head_kv);
      reps[static_cast<size_t>(gi)] = calib::chunk_representatives(cache, l, bt, g, max_eligible);
    });

    // One task per (position, layer, group), each filling its own slot.
    const size_t base = samples.size();
    samples.resize(base + pos.size() * n_groups);
    pool.parallel_for(static_cast<int64_t>(pos.size() * n_groups), [&](int64_t task, int) {
      const size_t pi = static_cast<size_t>(task) / n_groups,
                   gi = static_cast<size_t>(task) % n_groups;
      const int l = layers[gi / static_cast<size_t>(hp.n_head_kv)];
      const int g = static_cast<int>(gi % static_cast<size_t>(hp.n_head_kv));
      const int64_t t = pos[pi];
      const int64_t first = cs.sink_pages,
                    n_eligible = t / B - cs.window - first;  // E_t = [first, first + n)
      const float* q = rec.q(l, t) + static_cast<size_t>(g * hg * d);
      Sample& smp = samples[base + static_cast<size_t>(task)];
      smp = {.doc = di, .group = gi, .fold = static_cast<int>(pi % 2), .first = first};
      smp.mass = calib::dense_chunk_mass(cache, l, bt, g, q, hg, t, hp.attn_scale);
      smp.mass.resize(static_cast<size_t>(first + n_eligible));
      smp.mass.erase(smp.mass.begin(), smp.mass.begin() + first);
      // Candidates: the group's heads' post-processed queries, then the mean candidate.
      smp.cand.assign(q, q + static_cast<size_t>(hg * d));
      const float* iq = rec.index_q(l, t) + static_cast<size_t>(g * d);
      smp.cand.insert(smp.cand.end(), iq, iq + d);
    });
    CISA_RETURN_IF_ERROR(model->release_sequence(seq));
    tokens_before += n;
  }
  auto reps_of = [&](const Sample& smp) {
    const std::vector<float>& r = doc_reps[smp.doc][smp.group];
    return std::span<const float>(r.data() + smp.first * d, smp.mass.size() * size_t(d));
  };

  // The fitted candidate: per group, one fit per half of the positions (each half is scored by the
  // other's fit) and one over all of them (the coefficients kept).
  std::vector<std::array<std::vector<float>, 2>> fold_mix(cs.fit ? n_groups : 0);
  std::vector<std::vector<float>> group_mix(cs.fit ? n_groups : 0);
  if (cs.fit) {
    std::vector<Status> errors(n_groups);
    pool.parallel_for(static_cast<int64_t>(n_groups), [&](int64_t gi, int) {
      calib::MixFit half[2] = {{hg, d, hp.rope_style}, {hg, d, hp.rope_style}};
      for (const Sample& smp : samples) {
        if (smp.group != static_cast<size_t>(gi)) continue;
        Status st = half[smp.fold].add(smp.mass, reps_of(smp), smp.cand.data());
        if (!st.ok()) {
          errors[static_cast<size_t>(gi)] = st;
          return;
        }
      }
      for (int f = 0; f < 2; ++f) {
        // A half with no positions of its own is scored by the whole fit (its other half's).
        const calib::MixFit& other = half[half[1 - f].positions() > 0 ? 1 - f : f];
        auto m = other.solve(cs.fit_ridge);
        if (!m.ok()) {
          errors[static_cast<size_t>(gi)] = m.status();
          return;
        }
        fold_mix[static_cast<size_t>(gi)][static_cast<size_t>(f)] = std::move(*m);
      }
      half[0].merge(half[1]);
      auto all = half[0].solve(cs.fit_ridge);
      if (!all.ok()) {
        errors[static_cast<size_t>(gi)] = all.status();
        return;
      }
      group_mix[static_cast<size_t>(gi)] = std::move(*all);
    });
    for (const Status& st : errors) CISA_RETURN_IF_ERROR(st);
  }

  // Pass 2: every candidate's scores; results land in fixed slots and are summed in order.
  std::vector<Result<PositionScores>> results(samples.size(),
                                              Status(StatusCode::kInternal, "not run"));
  std::vector<std::vector<float>> cand(static_cast<size_t>(pool.num_threads()));
  pool.parallel_for(static_cast<int64_t>(samples.size()), [&](int64_t i, int thread) {
    const Sample& smp = samples[static_cast<size_t>(i)];
    std::vector<float>& c = cand[static_cast<size_t>(thread)];
    c = smp.cand;
    if (cs.fit) {
      c.resize(c.size() + static_cast<size_t>(d));
      calib::apply_mix(fold_mix[smp.group][static_cast<size_t>(smp.fold)], smp.cand.data(), hg, d,
                       hp.rope_style, c.data() + static_cast<size_t>((hg + 1) * d));
    }
    results[static_cast<size_t>(i)] = score_position(smp.mass, reps_of(smp), c, d, cs.budget);
  });
  for (size_t i = 0; i < samples.size(); ++i) {
    const Result<PositionScores>& r = results[i];
    if (!r.ok())
      return Status(r.status().code(),
                    "document '" + texts[samples[i].doc].name + "': " + r.status().message());
    acc[samples[i].group].add(*r);
  }
  for (size_t gi = 0; gi < n_groups; ++gi) {
    idx.groups.push_back(acc[gi].result(cs.criterion));
    if (cs.fit) idx.groups.back().mix = std::move(group_mix[gi]);
  }
  return idx;
}

}  // namespace cisa
