// Calibration on a real model (SPEC §6): one dense pass per document with an attention tap that
// records the queries of the sampled positions, then, from the filled KV cache, the target p
// (dense chunk mass over E_t), the representatives, and every candidate's scores.
#include <algorithm>
#include <string>

#include "activations.h"
#include "cisa/core/thread_pool.h"
#include "cisa/model/gguf.h"
#include "cisa/model/indexer.h"
#include "cisa/model/tokenizer.h"

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
  std::vector<int> layers;
  for (int l = 0; l < hp.n_layer; ++l)
    if (hp.is_global(l)) layers.push_back(l);
  std::vector<GroupAccumulator> acc;
  for (int l : layers)
    for (int g = 0; g < hp.n_head_kv; ++g) {
      std::vector<int> heads;
      for (int c = 0; c < hg; ++c) heads.push_back(g * hg + c);
      heads.push_back(-1);
      acc.emplace_back(l, g, heads);
    }
  const size_t n_groups = acc.size();

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
    std::vector<std::vector<float>> reps(n_groups);
    pool.parallel_for(static_cast<int64_t>(n_groups), [&](int64_t gi, int) {
      const int l = layers[static_cast<size_t>(gi) / static_cast<size_t>(hp.n_head_kv)];
      const int g = static_cast<int>(gi % hp.n_head_kv);
      reps[static_cast<size_t>(gi)] = calib::chunk_representatives(cache, l, bt, g, max_eligible);
    });

    // One task per (position, layer, group); results land in fixed slots and are summed in order.
    const int64_t n_tasks = static_cast<int64_t>(pos.size() * n_groups);
    std::vector<Result<PositionScores>> results(static_cast<size_t>(n_tasks),
                                                Status(StatusCode::kInternal, "not run"));
    std::vector<std::vector<float>> cand(static_cast<size_t>(pool.num_threads()));
    pool.parallel_for(n_tasks, [&](int64_t task, int thread) {
      const size_t pi = static_cast<size_t>(task) / n_groups,
                   gi = static_cast<size_t>(task) % n_groups;
      const int l = layers[gi / static_cast<size_t>(hp.n_head_kv)];
      const int g = static_cast<int>(gi % static_cast<size_t>(hp.n_head_kv));
      const int64_t t = pos[pi];
      const int64_t first = cs.sink_pages,
                    n_eligible = t / B - cs.window - first;  // E_t = [first, first + n)
      const float* q = rec.q(l, t) + static_cast<size_t>(g * hg * d);
      std::vector<double> mass = calib::dense_chunk_mass(cache, l, bt, g, q, hg, t, hp.attn_scale);
      mass.resize(static_cast<size_t>(first + n_eligible));
      mass.erase(mass.begin(), mass.begin() + first);
      // Candidates: the group's heads' post-processed queries, then the mean candidate.
      std::vector<float>& c = cand[static_cast<size_t>(thread)];
      c.assign(q, q + static_cast<size_t>(hg * d));
      const float* iq = rec.index_q(l, t) + static_cast<size_t>(g * d);
      c.insert(c.end(), iq, iq + d);
      const std::vector<float>& r = reps[gi];
      results[static_cast<size_t>(task)] = score_position(
          mass, std::span<const float>(r.data() + first * d, static_cast<size_t>(n_eligible * d)),
          c, d, cs.budget);
    });
    for (int64_t task = 0; task < n_tasks; ++task) {
      const Result<PositionScores>& r = results[static_cast<size_t>(task)];
      if (!r.ok()) {
        (void)model->release_sequence(seq);
        return Status(r.status().code(),
                      "document '" + texts[di].name + "': " + r.status().message());
      }
      acc[static_cast<size_t>(task) % n_groups].add(*r);
    }
    CISA_RETURN_IF_ERROR(model->release_sequence(seq));
    tokens_before += n;
  }
  for (const GroupAccumulator& a : acc) idx.groups.push_back(a.result(cs.criterion));
  return idx;
}

}  // namespace cisa
