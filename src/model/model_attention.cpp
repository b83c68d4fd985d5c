// The two sub-blocks every supported architecture shares: self-attention on the paged KV cache
// (dense or CISA per layer) and the gated MLP. Both read st.xn and write st.o.
#include <algorithm>
#include <chrono>
#include <string>

#include "cisa/attention_llamacpp.h"
#include "cisa/selection.h"
#include "model_impl.h"
#include "model_ops.h"

namespace cisa {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A supplied selector's lists are checked for shape before anything indexes them (the traffic
// count below and attend(), which checks groups and page ownership itself).
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

Status Model::Impl::attention(int layer) {
  const LayerWeights& L = w.layers[static_cast<size_t>(layer)];
  const int64_t rows = st.rows;
  const int d = hp.head_dim, Hq = hp.n_head, Hkv = hp.n_head_kv, hg = hp.heads_per_group();
  const bool swa = hp.layer_swa[static_cast<size_t>(layer)];
  const bool cisa = layer_cisa[static_cast<size_t>(layer)];
  const bool tapped = tap && !swa;
  const bool want_index = cisa || tapped;  // a tap sees the index queries of dense layers too
  const int table = swa ? 1 : 0;
  const int half = d / 2;
  const bool llamacpp_numerics = opt.attention_numerics == AttentionNumerics::kLlamaCpp;

  CISA_RETURN_IF_ERROR(matmul(L.wq, st.xn.data(), st.q.data(), rows, pool, &mm));
  CISA_RETURN_IF_ERROR(matmul(L.wk, st.xn.data(), st.k.data(), rows, pool, &mm));
  CISA_RETURN_IF_ERROR(matmul(L.wv, st.xn.data(), st.v.data(), rows, pool, &mm));

  // CISA index queries, before the model's query post-processing: a supplied projection W̃ x,
  // or the mean of the group's projected query heads (= (mean of their W_q rows) x).
  if (want_index) {
    for (int g = 0; g < Hkv; ++g) {
      const float* wp = index_weights[static_cast<size_t>(layer)][static_cast<size_t>(g)];
      if (wp) {
        WeightView iw{.type = GgmlType::F32,
                      .n_rows = d,
                      .n_cols = hp.n_embd,
                      .row_bytes = static_cast<uint64_t>(hp.n_embd) * sizeof(float),
                      .data = reinterpret_cast<const uint8_t*>(wp)};
        CISA_RETURN_IF_ERROR(matmul(iw, st.xn.data(), st.proj.data(), rows, pool, &mm));
        for (int64_t r = 0; r < rows; ++r)
          std::copy(st.proj.begin() + r * d, st.proj.begin() + (r + 1) * d,
                    st.index_q.begin() + (r * Hkv + g) * d);
      } else {
        const float inv = 1.0f / static_cast<float>(hg);
        for (int64_t r = 0; r < rows; ++r) {
          float* dst = st.index_q.data() + (r * Hkv + g) * d;
          const float* src = st.q.data() + (r * Hq + g * hg) * d;
          for (int i = 0; i < d; ++i) {
            float s = 0.0f;
            for (int h = 0; h < hg; ++h) s += src[h * d + i];
            dst[i] = s * inv;
          }
        }
      }
    }
  }

  // q/k RMSNorm per head (Gemma), then RoPE at each row's position.
  const float* qn = hp.qk_norm ? L.q_norm.data() : nullptr;
  const float* kn = hp.qk_norm ? L.k_norm.data() : nullptr;
  for_rows(rows, [&](int64_t r) {
    const float* cs = st.rope_cos[table].data() + r * half;
    const float* sn = st.rope_sin[table].data() + r * half;
    for (int h = 0; h < Hq; ++h) {
      float* x = st.q.data() + (r * Hq + h) * d;
      if (qn) ops::rms_norm(x, qn, x, d, hp.rms_eps);
      ops::rope_apply(x, cs, sn, d, hp.rope_style);
      // (llama.cpp numerics round the query themselves, after Gemma's scaling: not twice.)
      if (opt.round_kv_f16 && !llamacpp_numerics) ops::round_to_f16(x, d);
    }
    for (int h = 0; h < Hkv; ++h) {
      float* x = st.k.data() + (r * Hkv + h) * d;
      if (kn) ops::rms_norm(x, kn, x, d, hp.rms_eps);
      ops::rope_apply(x, cs, sn, d, hp.rope_style);
      if (opt.round_kv_f16) {
        // llama.cpp's default cache holds K and V in f16, and its q·k product rounds the queries to
        // f16 as well; rounding the same values here reproduces those numerics (conformance tests).
        ops::round_to_f16(x, d);
        ops::round_to_f16(st.v.data() + (r * Hkv + h) * d, d);
      }
      if (want_index) {
        float* iq = st.index_q.data() + (r * Hkv + h) * d;
        if (qn) ops::rms_norm(iq, qn, iq, d, hp.rms_eps);
        ops::rope_apply(iq, cs, sn, d, hp.rope_style);
      }
    }
  });

  const auto t0 = std::chrono::steady_clock::now();
  int64_t row = 0;
  for (const BatchEntry& e : st.batch) {
    const size_t off = static_cast<size_t>(row * Hkv * d);
    CISA_RETURN_IF_ERROR(
        cache->append(layer, e.seq, e.count, st.k.data() + off, st.v.data() + off));
    row += e.count;
  }
  double tap_seconds = 0;  // kept out of the attention timings
  if (tapped) {
    const auto t_tap = std::chrono::steady_clock::now();
    CISA_RETURN_IF_ERROR(tap({.layer = layer,
                              .batch = st.batch,
                              .positions = st.pos,
                              .q = st.q.data(),
                              .index_q = st.index_q.data(),
                              .cache = cache.get()}));
    tap_seconds = seconds_since(t_tap);
  }

  const PageLists* lists = nullptr;
  if (swa) {
    if (!st.swa_planned) {
      CISA_RETURN_IF_ERROR(plan_dense(*cache, layer, st.batch, hp.sliding_window, &st.swa_lists));
      st.swa_planned = true;
    }
    lists = &st.swa_lists;
  } else {
    // The dense plan of global layers is the same for every global layer of a step.
    if (!st.global_planned) {
      CISA_RETURN_IF_ERROR(plan_dense(*cache, layer, st.batch, 0, &st.global_lists));
      st.global_planned = true;
    }
    lists = &st.global_lists;
    if (cisa) {
      // Planning: CISA's own top-k of index scores, or the selector the options supply (the
      // eval's oracle); either way attention below reads exactly the listed pages.
      if (opt.attention.selector) {
        CISA_RETURN_IF_ERROR(opt.attention.selector({.layer = layer,
                                                     .batch = st.batch,
                                                     .q = st.q.data(),
                                                     .num_q_heads = Hq,
                                                     .scale = hp.attn_scale,
                                                     .index_q = st.index_q.data(),
                                                     .selection = &opt.attention.selection,
                                                     .cache = cache.get(),
                                                     .pool = &pool},
                                                    &st.cisa_lists));
        CISA_RETURN_IF_ERROR(check_selector_lists(st.cisa_lists, Hkv));
      } else {
        CISA_RETURN_IF_ERROR(select_pages(*cache, layer, st.batch, st.index_q.data(),
                                          opt.attention.selection, &pool, &st.cisa_lists));
      }
      lists = &st.cisa_lists;
    }
    // Traffic per query position (SPEC §8): dense reads pages 0 … c(t); a CISA group's positions
    // each read their group's list.
    const int64_t B = cache->page_size();
    int64_t dense_pages = 0;
    for (int64_t r = 0; r < rows; ++r) dense_pages += st.pos[static_cast<size_t>(r)] / B + 1;
    dense_pages *= Hkv;
    int64_t read_pages = dense_pages;
    if (cisa) {
      // A position t of a group reads the group's pages up to its own page c(t) (later ones are
      // masked and skipped), so charge each position the list's chunks ≤ c(t).
      read_pages = 0;
      for (size_t i = 0; i < lists->groups.size(); ++i)
        for (int g = 0; g < Hkv; ++g) {
          const auto chunks = lists->list_chunks(static_cast<int64_t>(i), g);
          for (int64_t t = lists->groups[i].first; t <= lists->groups[i].last; ++t)
            read_pages +=
                std::upper_bound(chunks.begin(), chunks.end(), static_cast<int32_t>(t / B)) -
                chunks.begin();
        }
    }
    stats.global_pages_dense += dense_pages;
    stats.global_pages_read += read_pages;
  }
  if (llamacpp_numerics) {
    // llama.cpp's Gemma graphs multiply the queries by the attention scale before attention (and
    // then attend with scale 1); its Llama graphs scale the q·k products.
    const LlamaCppAttentionParams lp{.scale = hp.attn_scale,
                                     .sliding_window = swa ? hp.sliding_window : 0,
                                     .scale_queries = hp.arch == ModelArch::kGemma3};
    CISA_RETURN_IF_ERROR(attend_llamacpp(*cache, layer, st.batch, *lists, st.q.data(), Hq, lp,
                                         st.att.data(), pool));
  } else {
    const AttentionParams ap{.scale = hp.attn_scale,
                             .sliding_window = swa ? hp.sliding_window : 0};
    CISA_RETURN_IF_ERROR(attend(*cache, layer, st.batch, *lists, st.q.data(), Hq, ap,
                                st.att.data(), nullptr, pool, &aws));
  }
  const double dt = seconds_since(t0) - tap_seconds;
  stats.seconds_attention += dt;
  if (!swa) stats.seconds_global_attention += dt;

  return matmul(L.wo, st.att.data(), st.o.data(), rows, pool, &mm);
}

Status Model::Impl::mlp(int layer) {
  const LayerWeights& L = w.layers[static_cast<size_t>(layer)];
  const int64_t rows = st.rows, F = hp.n_ff;
  CISA_RETURN_IF_ERROR(matmul(L.gate, st.xn.data(), st.gate.data(), rows, pool, &mm));
  CISA_RETURN_IF_ERROR(matmul(L.up, st.xn.data(), st.up.data(), rows, pool, &mm));
  for_rows(rows, [&](int64_t r) {
    ops::gated_activation(hp.activation, st.gate.data() + r * F, st.up.data() + r * F,
                          st.gate.data() + r * F, F);
  });
  return matmul(L.down, st.gate.data(), st.o.data(), rows, pool, &mm);
}

void Model::Impl::norm_rows(const float* x, const std::vector<float>& wt, float* y, int64_t rows,
                            int n) {
  for_rows(rows, [&](int64_t r) { ops::rms_norm(x + r * n, wt.data(), y + r * n, n, hp.rms_eps); });
}

}  // namespace cisa
