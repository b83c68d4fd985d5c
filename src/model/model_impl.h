// model_impl.h — the inside of cisa::Model: weights bound to the backend, the per-step state and
// the pieces the architecture files share. Not a public header.
//
// Everything a layer touches lives in the backend's memory (backend.h): matrices are
// BackendMatrix handles, norm gains backend f32 vectors, activations BackendBuffers. The layer
// code only calls backend operations; host work is limited to cutting steps, RoPE angle tables
// (computed here, uploaded), page selectors and taps (CPU backend only) and the traffic counts.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "cisa/core/backend.h"
#include "cisa/core/batch.h"
#include "cisa/model/gguf.h"
#include "cisa/model/model.h"
#include "cisa/model/tokenizer.h"

namespace cisa {

struct LayerWeights {
  BackendMatrix wq, wk, wv, wo;  // [n_head·d][n_embd], [n_kv·d][n_embd] ×2, [n_embd][n_head·d]
  BackendMatrix gate, up, down;  // [n_ff][n_embd] ×2, [n_embd][n_ff]
  const float* attn_norm = nullptr;       // backend f32 [n_embd]
  const float* ffn_norm = nullptr;        // backend f32 [n_embd]
  const float* q_norm = nullptr;          // backend f32 [head_dim] (qk_norm only)
  const float* k_norm = nullptr;          // backend f32 [head_dim] (qk_norm only)
  const float* post_attn_norm = nullptr;  // backend f32 [n_embd] (post_norms only)
  const float* post_ffn_norm = nullptr;   // backend f32 [n_embd] (post_norms only)
};

struct ModelWeights {
  BackendMatrix tok_embd;              // [n_vocab][n_embd]
  BackendMatrix output;                // [n_vocab][n_embd]; the embeddings when tied
  const float* output_norm = nullptr;  // backend f32 [n_embd]
  std::vector<LayerWeights> layers;
  // Host f32 copies of the widened matrices (ModelOptions::weights_f32); the CPU backend's views
  // point into them.
  std::vector<std::vector<float>> f32_storage;
};

// model.cpp: bounds of every option (threads, context, sequences, block, selection).
Status validate_model_options(const ModelOptions& o);
// model_hparams.cpp: the architecture's hyper-parameters from the metadata, checked.
Result<ModelHparams> read_hparams(const GgufFile& f);
// model_weights.cpp: every tensor the architecture needs, with its shape and type checked, bound
// to the backend. f32: widen every quantised matrix to f32 at load (exact products, ~4x memory).
Result<ModelWeights> bind_weights(const GgufFile& f, const ModelHparams& hp, bool f32, Backend& be);
// model_synthetic.cpp: random weights of a synthetic model's shape (synthetic_hparams, model.h).
Result<ModelWeights> random_weights(const ModelHparams& hp, Backend& be);

using BufferPtr = std::unique_ptr<BackendBuffer>;

// The rows of one forward step and their buffers (backend memory unless marked host; grown, never
// shrunk, across steps).
struct StepState {
  std::vector<BatchEntry> batch;  // host
  int64_t rows = 0;
  std::vector<int64_t> pos;               // host [rows] absolute positions
  std::vector<int32_t> tokens;            // host [rows]
  std::vector<float> host_cos, host_sin;  // host [rows][d/2], one table at a time
  BufferPtr token_ids;                    // int32 [rows]
  BufferPtr x;                            // [rows][n_embd] residual stream
  BufferPtr xn;                           // [rows][n_embd] normalised input of a sub-block
  BufferPtr q;                            // [rows][n_head][d]
  BufferPtr k, v;                         // [rows][n_kv][d]
  BufferPtr att;                          // [rows][n_head][d] attention output
  BufferPtr o;                            // [rows][n_embd] sub-block output
  BufferPtr gate, up;                     // [rows][n_ff]
  BufferPtr index_q;                      // [rows][n_kv][d] CISA index queries
  BufferPtr rope_cos[2], rope_sin[2];     // [rows][d/2]; 0: global base, 1: sliding base
  BufferPtr xo;              // [outputs][n_embd] final-normed rows whose logits are wanted
  BufferPtr logits;          // [outputs][n_vocab] (unless the CPU writes the caller's vector)
  BufferPtr argmax;          // int32 [outputs]: greedy tokens (ForwardOutputs::argmax)
  PageLists selector_lists;  // host: a PageSelector's output
  bool xn_ready = false;     // xn holds the next layer's attention input (finish_layer)
};

// model_memory.cpp: refuses, before anything is allocated, a model whose weights copies, KV
// cache (context x max_sequences) and step activations exceed the backend's free memory.
// weights_in_file: the weights are a GGUF's (the CPU backend multiplies them in place).
Status admit_model_memory(const ModelHparams& h, const ModelOptions& o, int64_t context,
                          Backend& be, bool weights_in_file);

struct Model::Impl {
  std::optional<GgufFile> file;
  std::optional<Tokenizer> tok;
  ModelHparams hp;
  ModelOptions opt;
  ModelWeights w;
  int64_t context = 0;
  std::unique_ptr<Backend> be;
  StepState st;
  ForwardStats stats;
  std::unordered_map<SeqId, SequenceTraffic> seq_traffic;  // per held sequence, since added
  std::vector<bool> layer_cisa;                            // per layer
  std::vector<int64_t> layer_budgets;             // this step's per-layer budgets (empty: uniform)
  const StepAttention* call_attention = nullptr;  // forward()'s override, during the call
  AttentionTap tap;                               // calibration/diagnostics observer
  // Per layer: the index projections of its KV groups stacked, [num_kv_heads · head_dim] rows
  // of n_embd (group g: the calibrated W̃_g, else the mean of the group's W_q head blocks); id −1
  // where the layer runs no CISA (a tap's index queries there are the mean of the query heads).
  std::vector<BackendMatrix> index_m;  // bound with bind_owned_matrix: the backend keeps them

  // model.cpp: the backend the options ask for, checked against what the options need of it.
  Status make_backend();
  // model.cpp: which layers run CISA, the supplied index projections, and the KV cache.
  Status setup_attention_and_cache();
  // model.cpp: index_m from the supplied projections (checked by the caller) and the weights.
  Status bind_index_projections(const std::vector<std::vector<const IndexProjection*>>& supplied);
  // One step over st.batch (rows already embedded into st.x); model.cpp.
  Status run_layers();
  // st.xn → st.o: q/k/v projections, (q/k norm), RoPE, cache append, plan or selection,
  // attention, output projection; model_attention.cpp.
  Status attention(int layer);
  // A global layer's pages read and dense pages for this step (SPEC §8), into stats and
  // seq_traffic.
  void count_traffic(PlanSlot slot, bool cisa, const SelectionParams& selection);
  // st.xn → st.o: gated MLP; model_attention.cpp.
  Status mlp(int layer);
  // The architecture's layer, reading and updating st.x; model_gemma3.cpp, model_llama.cpp.
  Status layer_gemma3(int layer);
  Status layer_llama(int layer);
  // A layer's first and last operations: RMSNorm_attn(x) → xn, unless the layer before left it
  // there; the residual add x += o, fused with the next layer's RMSNorm_attn where one follows
  // (add_rms_norm computes the same sums as add then rms_norm on every backend, and saves a
  // launch per layer on the GPU).
  Status start_layer(int layer);
  Status finish_layer(int layer);
};

// Grows `b` to at least `bytes` (contents are not kept).
Status ensure_buffer(Backend& be, BufferPtr& b, int64_t bytes, const char* what);

}  // namespace cisa
