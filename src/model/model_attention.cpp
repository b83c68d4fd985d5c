// The two sub-blocks every supported architecture shares: self-attention on the paged KV cache
// (dense or CISA per layer) and the gated MLP. Both read st.xn and write st.o.
#include <algorithm>
#include <chrono>
#include <string>

#include "cisa/core/plan.h"
#include "model_impl.h"

namespace cisa {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A supplied selector's lists are checked for shape before anything indexes them (the traffic
// count below and the backend's attend(), which checks groups and page ownership itself).
Status check_selector_lists(const PageLists& l, int num_kv_heads) {
  bool ok = l.num_kv_heads == num_kv_heads &&
            l.offsets.size() == static_cast<size_t>(l.num_lists() + 1) && l.offsets[0] == 0 &&
            l.offsets.back() == l.total_pages() && l.chunks.size() == l.pages.size();
  for (size_t i = 1; ok && i < l.offsets.size(); ++i) ok = l.offsets[i] >= l.offsets[i - 1];
  if (!ok)
    return invalid_argument(
        "page selector returned malformed page lists (KV heads, offsets or chunk array do not "
        "match)");
  return Status::Ok();
}

}  // namespace

// Traffic per query position (SPEC §8) of a global layer's step, into the step's stats and each
// sequence's totals: dense reads pages 0 … c(t); a CISA group's positions each read their group's
// list up to c(t) (later pages are masked and skipped).
void Model::Impl::count_traffic(PlanSlot slot, bool cisa, const SelectionParams& selection) {
  const int B = be->cache_config().page_size;
  const int64_t Hkv = hp.n_head_kv;
  int64_t dense_pages = 0, read_pages = 0;
  SequenceTraffic* t = nullptr;  // the current entry's (an entry's groups are adjacent)
  int32_t t_entry = -1;
  for (const QueryGroup& g : be->plan_groups(slot)) {
    const int64_t dense = pages_read_dense(g, B);
    const int64_t read = cisa ? pages_read(g, B, selection) : dense;
    dense_pages += dense;
    read_pages += read;
    if (g.entry != t_entry) {
      t = &seq_traffic[st.batch[static_cast<size_t>(g.entry)].seq];
      t_entry = g.entry;
    }
    t->global_pages_dense += dense * Hkv;
    t->global_pages_read += read * Hkv;
  }
  stats.global_pages_dense += dense_pages * Hkv;
  stats.global_pages_read += read_pages * Hkv;
}

Status Model::Impl::attention(int layer) {
  const LayerWeights& L = w.layers[static_cast<size_t>(layer)];
  const int64_t rows = st.rows;
  const int d = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv;
  const bool swa = hp.layer_swa[static_cast<size_t>(layer)];
  // A forward() call's StepAttention may run the CISA layers dense, or with its own selection.
  const bool cisa = layer_cisa[static_cast<size_t>(layer)] &&
                    !(call_attention && call_attention->mode == AttentionMode::kDense);
  SelectionParams selection =
      call_attention && cisa ? call_attention->selection : opt.attention.selection;
  // Adaptive budgets: this layer's share of the step's total, planned for this layer alone.
  const bool own_budget = cisa && !layer_budgets.empty();
  if (own_budget) selection.budget = layer_budgets[static_cast<size_t>(layer)];
  const bool tapped = tap && !swa;
  const bool want_index = cisa || tapped;  // a tap sees the index queries of dense layers too
  const int table = swa ? 1 : 0;
  const bool llamacpp_numerics = opt.attention_numerics == AttentionNumerics::kLlamaCpp;
  float* const q = st.q->f32();
  float* const k = st.k->f32();
  float* const v = st.v->f32();
  float* const iq = st.index_q->f32();
  const float* const xn = st.xn->f32();

  const float* cs = st.rope_cos[table]->f32();
  const float* sn = st.rope_sin[table]->f32();
  const BackendMatrix& index_proj = index_m[static_cast<size_t>(layer)];
  const PlanSlot slot = swa ? PlanSlot::kSliding : cisa ? PlanSlot::kCisa : PlanSlot::kGlobal;

  // CISA index queries, before the model's query post-processing: the layer's stacked index
  // projections W̃ x (index_m), or, in a layer without them (a tapped dense layer), the mean of
  // each group's projected query heads.
  auto index_queries_from_projection = [&]() -> Status {
    return be->matmul(index_proj, xn, iq, rows);
  };
  // The selection of this layer's pages: CISA's own top-k of index scores, or the selector the
  // options supply (the eval's oracle); either way attention reads exactly the listed pages.
  double select_seconds = 0;
  auto select_pages = [&]() -> Status {
    const auto t_sel = std::chrono::steady_clock::now();
    if (own_budget)
      CISA_RETURN_IF_ERROR(
          be->plan(slot, st.batch, {.kind = PlanKind::kCisa, .selection = selection}));
    if (opt.attention.selector) {
      CISA_RETURN_IF_ERROR(opt.attention.selector({.layer = layer,
                                                   .batch = st.batch,
                                                   .q = q,
                                                   .num_q_heads = Hq,
                                                   .scale = hp.attn_scale,
                                                   .index_q = iq,
                                                   .selection = &selection,
                                                   .cache = be->cpu_cache(),
                                                   .pool = be->cpu_pool()},
                                                  &st.selector_lists));
      CISA_RETURN_IF_ERROR(check_selector_lists(st.selector_lists, Hkv));
      CISA_RETURN_IF_ERROR(be->set_page_lists(slot, st.selector_lists));
    } else {
      // (Selection reuse's counters are read around the whole step, model.cpp: on the GPU they
      // live on the device.)
      CISA_RETURN_IF_ERROR(be->select(slot, layer, iq));
    }
    select_seconds += seconds_since(t_sel);
    if (opt.attention.page_list_observer) {
      CISA_RETURN_IF_ERROR(be->page_lists(slot, &st.selector_lists));
      CISA_RETURN_IF_ERROR(opt.attention.page_list_observer(layer, st.selector_lists));
    }
    return Status::Ok();
  };

  // Early selection: in a decode step (one query row per sequence) every eligible chunk was
  // written before this step (validate_selection_batch), so the index queries come from the
  // layer's input alone and the pages are chosen before q, k and v exist. A backend may then run
  // the selection's tail beside the q/k/v products, RoPE and the cache append (the CUDA backend
  // runs top-k on a second stream). Not with a selector or a tap, which read q or the cache.
  const bool early = cisa && opt.attention.early_selection && index_proj.id >= 0 &&
                     !opt.attention.selector && !tapped &&
                     rows == static_cast<int64_t>(st.batch.size());
  if (early) {
    CISA_RETURN_IF_ERROR(index_queries_from_projection());
    if (hp.qk_norm) CISA_RETURN_IF_ERROR(be->rms_norm(iq, L.q_norm, iq, rows * Hkv, d, hp.rms_eps));
    CISA_RETURN_IF_ERROR(be->rope(iq, rows, Hkv, d, cs, sn, hp.rope_style));
    CISA_RETURN_IF_ERROR(select_pages());
  }
  const bool late_index = want_index && !early;

  const BackendMatrix qkv_w[3] = {L.wq, L.wk, L.wv};
  float* const qkv_y[3] = {q, k, v};
  CISA_RETURN_IF_ERROR(be->matmul_many(qkv_w, xn, qkv_y, rows));
  if (late_index) {
    if (index_proj.id >= 0)
      CISA_RETURN_IF_ERROR(index_queries_from_projection());
    else
      CISA_RETURN_IF_ERROR(be->mean_heads(q, rows, Hq, Hkv, d, iq));
  }

  // q/k RMSNorm per head (Gemma), then RoPE at each row's position.
  if (hp.qk_norm) {
    CISA_RETURN_IF_ERROR(be->rms_norm(q, L.q_norm, q, rows * Hq, d, hp.rms_eps));
    CISA_RETURN_IF_ERROR(be->rms_norm(k, L.k_norm, k, rows * Hkv, d, hp.rms_eps));
    if (late_index) CISA_RETURN_IF_ERROR(be->rms_norm(iq, L.q_norm, iq, rows * Hkv, d, hp.rms_eps));
  }
  // One rotation of q, k and the index queries (the same positions).
  float* const rotated[3] = {q, k, iq};
  const int rotated_heads[3] = {Hq, Hkv, Hkv};
  const size_t n_rotated = late_index ? 3 : 2;
  CISA_RETURN_IF_ERROR(be->rope_many({rotated, n_rotated}, {rotated_heads, n_rotated}, rows, d, cs,
                                     sn, hp.rope_style));
  if (opt.round_kv_f16) {
    // llama.cpp's default cache holds K and V in f16, and its q·k product rounds the queries to
    // f16 as well; rounding the same values here reproduces those numerics (conformance tests).
    // (llama.cpp numerics round the query themselves, after Gemma's scaling: not twice.)
    if (!llamacpp_numerics) CISA_RETURN_IF_ERROR(be->round_f16(q, rows * Hq * d));
    CISA_RETURN_IF_ERROR(be->round_f16(k, rows * Hkv * d));
    CISA_RETURN_IF_ERROR(be->round_f16(v, rows * Hkv * d));
  }

  const auto t0 = std::chrono::steady_clock::now();
  CISA_RETURN_IF_ERROR(be->append_kv(layer, st.batch, k, v));
  double tap_seconds = 0;  // kept out of the attention timings
  if (tapped) {
    const auto t_tap = std::chrono::steady_clock::now();
    CISA_RETURN_IF_ERROR(tap({.layer = layer,
                              .batch = st.batch,
                              .positions = st.pos,
                              .q = q,
                              .index_q = iq,
                              .cache = be->cpu_cache()}));
    tap_seconds = seconds_since(t_tap);
  }
  if (cisa && !early) CISA_RETURN_IF_ERROR(select_pages());
  // llama.cpp's Gemma graphs multiply the queries by the attention scale before attention (and
  // then attend with scale 1); its Llama graphs scale the q·k products.
  const AttendParams ap{.scale = hp.attn_scale,
                        .sliding_window = swa ? hp.sliding_window : 0,
                        .numerics = opt.attention_numerics,
                        .scale_queries = llamacpp_numerics && hp.arch == ModelArch::kGemma3};
  CISA_RETURN_IF_ERROR(be->attend(slot, layer, q, Hq, ap, st.att->f32()));
  if (!swa) count_traffic(slot, cisa, selection);
  // (An early selection's time counts as attention too; the late one is inside [t0, now).)
  const double dt = seconds_since(t0) - tap_seconds + (early ? select_seconds : 0.0);
  stats.seconds_attention += dt;
  if (!swa) stats.seconds_global_attention += dt;

  return be->matmul(L.wo, st.att->f32(), st.o->f32(), rows);
}

Status Model::Impl::mlp(int layer) {
  const LayerWeights& L = w.layers[static_cast<size_t>(layer)];
  const int64_t rows = st.rows;
  float* const gate = st.gate->f32();
  CISA_RETURN_IF_ERROR(
      be->gated_matmul(L.gate, L.up, hp.activation, st.xn->f32(), gate, st.up->f32(), rows));
  return be->matmul(L.down, gate, st.o->f32(), rows);
}

}  // namespace cisa
