// The Llama decoder layer (llama.cpp's llm_build_llama; SmolLM2 is one):
//   h   = x + Attn( RMSNorm_attn(x) )
//   out = h + W_down( SiLU(W_gate n) ⊙ W_up n ),  n = RMSNorm_ffn(h)
#include "model_impl.h"
#include "model_ops.h"

namespace cisa {

Status Model::Impl::layer_llama(int layer) {
  const LayerWeights& L = w.layers[static_cast<size_t>(layer)];
  const int64_t rows = st.rows;
  const int E = hp.n_embd;
  norm_rows(st.x.data(), L.attn_norm, st.xn.data(), rows, E);
  CISA_RETURN_IF_ERROR(attention(layer));
  for_rows(rows, [&](int64_t r) { ops::add_inplace(st.x.data() + r * E, st.o.data() + r * E, E); });
  norm_rows(st.x.data(), L.ffn_norm, st.xn.data(), rows, E);
  CISA_RETURN_IF_ERROR(mlp(layer));
  for_rows(rows, [&](int64_t r) { ops::add_inplace(st.x.data() + r * E, st.o.data() + r * E, E); });
  return Status::Ok();
}

}  // namespace cisa
