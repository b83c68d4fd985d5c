// Binds the GGUF tensors an architecture needs, checking each one's presence, shape and type,
// to the backend: matrices are bound from views into the mapped file (the CPU keeps them
// quantised), norm gains are widened to floats and copied into backend memory.
#include <string>

#include "model_impl.h"

namespace cisa {
namespace {

std::string dims(int64_t a, int64_t b) {
  std::string s = "[";
  s.append(std::to_string(a)).append(", ").append(std::to_string(b)).append("]");
  return s;
}

// A matrix with `cols` inputs (ne0) and `rows` outputs (ne1); widened to f32 into `store` when
// it is non-null.
Result<WeightView> matrix_view(const GgufFile& f, const std::string& name, int64_t cols,
                               int64_t rows, std::vector<std::vector<float>>* store) {
  const GgufTensor* t = f.find_tensor(name);
  if (!t) return data_loss("model file is missing tensor '" + name + "'");
  if (t->n_dims != 2 || t->ne[0] != cols || t->ne[1] != rows)
    return data_loss("tensor '" + name + "' has shape " + t->shape_string() + ", expected " +
                     dims(cols, rows));
  if (!ggml_type_is_supported(t->type))
    return unimplemented("tensor '" + name + "' has type " + ggml_type_name(t->type) +
                         ", which is not supported");
  CISA_ASSIGN_OR_RETURN(WeightView w, WeightView::of(*t));
  if (!store || w.type == GgmlType::F32) return w;
  std::vector<float>& buf = store->emplace_back(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    CISA_RETURN_IF_ERROR(dequantize_row(w.type, w.row(r), buf.data() + r * cols, cols));
  return WeightView::f32(buf.data(), rows, cols);
}

Result<BackendMatrix> matrix(const GgufFile& f, const std::string& name, int64_t cols, int64_t rows,
                             std::vector<std::vector<float>>* store, Backend& be) {
  CISA_ASSIGN_OR_RETURN(WeightView w, matrix_view(f, name, cols, rows, store));
  return be.bind_matrix(w);
}

// A vector of n gains, any float or quantised type widened to f32, in backend memory.
Result<const float*> vec(const GgufFile& f, const std::string& name, int64_t n, Backend& be) {
  const GgufTensor* t = f.find_tensor(name);
  if (!t) return data_loss("model file is missing tensor '" + name + "'");
  if (t->n_elements != n || t->ne[0] != n)
    return data_loss("tensor '" + name + "' has shape " + t->shape_string() + ", expected [" +
                     std::to_string(n) + "]");
  if (!ggml_type_is_supported(t->type))
    return unimplemented("tensor '" + name + "' has type " + ggml_type_name(t->type) +
                         ", which is not supported");
  std::vector<float> out(static_cast<size_t>(n));
  CISA_RETURN_IF_ERROR(dequantize_row(t->type, t->data, out.data(), n));
  return be.bind_vector(out);
}

}  // namespace

Result<ModelWeights> bind_weights(const GgufFile& f, const ModelHparams& hp, bool f32,
                                  Backend& be) {
  ModelWeights w;
  std::vector<std::vector<float>>* st = f32 ? &w.f32_storage : nullptr;
  const int64_t E = hp.n_embd, F = hp.n_ff, Dq = int64_t{hp.n_head} * hp.head_dim,
                Dkv = int64_t{hp.n_head_kv} * hp.head_dim;
  CISA_ASSIGN_OR_RETURN(w.tok_embd, matrix(f, "token_embd.weight", E, hp.n_vocab, st, be));
  if (hp.tied_output) {
    w.output = w.tok_embd;
  } else {
    CISA_ASSIGN_OR_RETURN(w.output, matrix(f, "output.weight", E, hp.n_vocab, st, be));
  }
  CISA_ASSIGN_OR_RETURN(w.output_norm, vec(f, "output_norm.weight", E, be));
  w.layers.resize(static_cast<size_t>(hp.n_layer));
  for (int l = 0; l < hp.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    // q/k/v and gate/up multiply one input each: bound together (Backend::bind_matrices).
    CISA_ASSIGN_OR_RETURN(const WeightView vq, matrix_view(f, p + "attn_q.weight", E, Dq, st));
    CISA_ASSIGN_OR_RETURN(const WeightView vk, matrix_view(f, p + "attn_k.weight", E, Dkv, st));
    CISA_ASSIGN_OR_RETURN(const WeightView vv, matrix_view(f, p + "attn_v.weight", E, Dkv, st));
    CISA_ASSIGN_OR_RETURN(std::vector<BackendMatrix> qkv,
                          be.bind_matrices(std::vector<WeightView>{vq, vk, vv}));
    L.wq = qkv[0];
    L.wk = qkv[1];
    L.wv = qkv[2];
    CISA_ASSIGN_OR_RETURN(L.wo, matrix(f, p + "attn_output.weight", Dq, E, st, be));
    CISA_ASSIGN_OR_RETURN(const WeightView vg, matrix_view(f, p + "ffn_gate.weight", E, F, st));
    CISA_ASSIGN_OR_RETURN(const WeightView vu, matrix_view(f, p + "ffn_up.weight", E, F, st));
    CISA_ASSIGN_OR_RETURN(std::vector<BackendMatrix> gu,
                          be.bind_matrices(std::vector<WeightView>{vg, vu}));
    L.gate = gu[0];
    L.up = gu[1];
    CISA_ASSIGN_OR_RETURN(L.down, matrix(f, p + "ffn_down.weight", F, E, st, be));
    CISA_ASSIGN_OR_RETURN(L.attn_norm, vec(f, p + "attn_norm.weight", E, be));
    CISA_ASSIGN_OR_RETURN(L.ffn_norm, vec(f, p + "ffn_norm.weight", E, be));
    if (hp.qk_norm) {
      CISA_ASSIGN_OR_RETURN(L.q_norm, vec(f, p + "attn_q_norm.weight", hp.head_dim, be));
      CISA_ASSIGN_OR_RETURN(L.k_norm, vec(f, p + "attn_k_norm.weight", hp.head_dim, be));
    }
    if (hp.post_norms) {
      CISA_ASSIGN_OR_RETURN(L.post_attn_norm, vec(f, p + "post_attention_norm.weight", E, be));
      CISA_ASSIGN_OR_RETURN(L.post_ffn_norm, vec(f, p + "post_ffw_norm.weight", E, be));
    }
  }
  return w;
}

}  // namespace cisa
