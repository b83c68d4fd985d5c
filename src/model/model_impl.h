// model_impl.h — the inside of cisa::Model: bound weights, the per-step state and the pieces
// the architecture files share. Not a public header.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "cisa/attention.h"
#include "cisa/batch.h"
#include "cisa/gguf.h"
#include "cisa/kv_cache.h"
#include "cisa/model.h"
#include "cisa/quant.h"
#include "cisa/thread_pool.h"
#include "cisa/tokenizer.h"

namespace cisa {

struct LayerWeights {
  WeightView wq, wk, wv, wo;  // [n_head·d][n_embd], [n_kv·d][n_embd] ×2, [n_embd][n_head·d]
  WeightView gate, up, down;  // [n_ff][n_embd] ×2, [n_embd][n_ff]
  std::vector<float> attn_norm, ffn_norm;            // [n_embd]
  std::vector<float> q_norm, k_norm;                 // [head_dim] (qk_norm only)
  std::vector<float> post_attn_norm, post_ffn_norm;  // [n_embd] (post_norms only)
};

struct ModelWeights {
  WeightView tok_embd;  // [n_vocab][n_embd]
  WeightView output;    // [n_vocab][n_embd]; the embeddings when tied
  std::vector<float> output_norm;
  std::vector<LayerWeights> layers;
  std::vector<std::vector<float>> f32_storage;  // the widened matrices (ModelOptions::weights_f32)
};

// model_hparams.cpp: the architecture's hyper-parameters from the metadata, checked.
Result<ModelHparams> read_hparams(const GgufFile& f);
// model_weights.cpp: every tensor the architecture needs, with its shape and type checked.
// f32: widen every quantised matrix to f32 at load (exact products, ~4x the memory).
Result<ModelWeights> bind_weights(const GgufFile& f, const ModelHparams& hp, bool f32);

// The rows of one forward step and their buffers (reused across steps).
struct StepState {
  std::vector<BatchEntry> batch;
  int64_t rows = 0;
  std::vector<int64_t> pos;                     // [rows] absolute positions
  std::vector<float> x;                         // [rows][n_embd] residual stream
  std::vector<float> xn;                        // [rows][n_embd] normalised input of a sub-block
  std::vector<float> q;                         // [rows][n_head][d]
  std::vector<float> k, v;                      // [rows][n_kv][d]
  std::vector<float> att;                       // [rows][n_head][d] attention output
  std::vector<float> o;                         // [rows][n_embd] sub-block output
  std::vector<float> gate, up;                  // [rows][n_ff]
  std::vector<float> index_q;                   // [rows][n_kv][d] CISA index queries
  std::vector<float> proj;                      // [rows][d] one supplied index projection's output
  std::vector<float> rope_cos[2], rope_sin[2];  // [rows][d/2]; 0: global base, 1: sliding base
  PageLists global_lists, swa_lists, cisa_lists;
  bool global_planned = false, swa_planned = false;
};

struct Model::Impl {
  explicit Impl(int threads) : pool(threads) {}

  std::optional<GgufFile> file;
  std::optional<Tokenizer> tok;
  ModelHparams hp;
  ModelOptions opt;
  ModelWeights w;
  int64_t context = 0;
  std::unique_ptr<PagedKvCache> cache;
  ThreadPool pool;
  MatmulScratch mm;
  AttentionWorkspace aws;
  StepState st;
  ForwardStats stats;
  std::vector<bool> layer_cisa;                          // per layer
  AttentionTap tap;                                      // calibration/diagnostics observer
  std::vector<std::vector<const float*>> index_weights;  // [layer][kv group] or nullptr

  // One step over st.batch (rows already embedded into st.x); model.cpp.
  Status run_layers();
  // st.xn → st.o: q/k/v projections, (q/k norm), RoPE, cache append, plan or selection,
  // attention, output projection; model_attention.cpp.
  Status attention(int layer);
  // st.xn → st.o: gated MLP; model_attention.cpp.
  Status mlp(int layer);
  // The architecture's layer, reading and updating st.x; model_gemma3.cpp, model_llama.cpp.
  Status layer_gemma3(int layer);
  Status layer_llama(int layer);

  // y[r] = rms_norm(x[r]) ⊙ w for rows of n values, threaded over rows.
  void norm_rows(const float* x, const std::vector<float>& w, float* y, int64_t rows, int n);
  // Threads fn(row) over rows when there are enough of them to pay for waking the pool.
  template <class F>
  void for_rows(int64_t rows, F&& fn) {
    if (rows < 8) {
      for (int64_t r = 0; r < rows; ++r) fn(r);
      return;
    }
    pool.parallel_for(rows, [&](int64_t r, int) { fn(r); });
  }
};

}  // namespace cisa
