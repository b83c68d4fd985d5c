// Memory admission for Model::load and load_synthetic: what a model will allocate on its backend
// (weights the backend copies, the KV cache, a forward step's activations), checked against the
// backend's free memory before anything is allocated, so that a model too large for the machine
// is a clear error instead of an out-of-memory kill or a half-built model.
#include <algorithm>
#include <cstdio>
#include <string>

#include "model_impl.h"

namespace cisa {
namespace {

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(int64_t{1} << 30));
  return buf;
}

// Elements of every matrix the architecture multiplies, embeddings and output included.
double matrix_elements(const ModelHparams& h) {
  const double E = h.n_embd, d = h.head_dim, F = h.n_ff;
  const double attn =
      (double(h.n_head) * d + 2.0 * double(h.n_head_kv) * d) * E + E * double(h.n_head) * d;
  const double mlp = 3.0 * F * E;
  const double vocab = double(h.n_vocab) * E * (h.tied_output ? 1.0 : 2.0);
  return double(h.n_layer) * (attn + mlp) + vocab;
}

}  // namespace

Status admit_model_memory(const ModelHparams& h, const ModelOptions& o, int64_t context,
                          Backend& be, bool weights_in_file) {
  // Weights: the CPU backend multiplies the GGUF blocks in place (file-backed pages), or widens
  // them to f32 (weights_f32; bf16_matmul: rounded f32 copies, twice with both); the CUDA backend
  // holds bf16 copies; synthetic weights are made in backend memory (f32 on the CPU, bf16 on CUDA).
  const bool cpu = be.kind() == BackendKind::kCpu;
  double weight_bytes = 0;
  if (!cpu)
    weight_bytes = 2.0 * matrix_elements(h);
  else if (o.weights_f32 || o.bf16_matmul || !weights_in_file)
    weight_bytes = 4.0 * matrix_elements(h) * (o.weights_f32 && o.bf16_matmul ? 2 : 1);
  // CISA's index projections (Model::Impl::index_m): one n_head_kv · head_dim × n_embd matrix per
  // layer at most, f32 on the CPU, bf16 on CUDA (counted for every layer: an upper bound).
  if (o.attention.mode == AttentionMode::kCisa)
    weight_bytes += (cpu ? 4.0 : 2.0) * h.n_layer * h.n_head_kv * h.head_dim * double(h.n_embd);
  // KV cache: every layer's K and V pools plus the representatives of CISA layers, at full
  // context for max_sequences sequences (as setup_attention_and_cache sizes it).
  const double pages = double((context + 15) / 16) * o.max_sequences;
  const double elem = o.kv_dtype == KvDtype::kF32 ? 4.0 : 2.0;
  const double kv_bytes = pages * h.n_layer * h.n_head_kv * (2.0 * 16 + 2.0) * h.head_dim * elem;
  // One step's activations: the residual stream and its sub-block buffers, q/k/v, attention
  // output and the MLP's two n_ff rows, all f32, for prefill_block rows; plus the logits of as
  // many rows (a generous bound on the rows whose logits a step returns).
  const double rows = o.prefill_block;
  const double act_bytes = 4.0 * rows *
                               (4.0 * h.n_embd + 2.0 * h.n_head * h.head_dim +
                                3.0 * h.n_head_kv * h.head_dim + 2.0 * h.n_ff) +
                           4.0 * std::min<double>(rows, 64.0 * o.max_sequences) * h.n_vocab;
  const double need = weight_bytes + kv_bytes + act_bytes;
  const double free = static_cast<double>(be.free_memory());
  if (free > 0 && need > free)
    return resource_exhausted("the model needs about " + gib(need) + " of " + be.description() +
                              " memory (weights " + gib(weight_bytes) + ", KV cache " +
                              gib(kv_bytes) + " for " + std::to_string(o.max_sequences) +
                              " sequence(s) of " + std::to_string(context) +
                              " tokens, activations " + gib(act_bytes) + ") but " + gib(free) +
                              " are free: lower --context or the number of sequences");
  return Status::Ok();
}

}  // namespace cisa
