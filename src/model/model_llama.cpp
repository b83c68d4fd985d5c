// The Llama decoder layer (llama.cpp's llm_build_llama; SmolLM2 is one):
//   h   = x + Attn( RMSNorm_attn(x) )
//   out = h + W_down( SiLU(W_gate n) ⊙ W_up n ),  n = RMSNorm_ffn(h)
#include "model_impl.h"

namespace cisa {

Status Model::Impl::layer_llama(int layer) {
  const LayerWeights& L = w.layers[static_cast<size_t>(layer)];
  const int64_t rows = st.rows;
  const int E = hp.n_embd;
  float* const x = st.x->f32();
  float* const xn = st.xn->f32();
  CISA_RETURN_IF_ERROR(start_layer(layer));
  CISA_RETURN_IF_ERROR(attention(layer));
  CISA_RETURN_IF_ERROR(be->add_rms_norm(x, st.o->f32(), L.ffn_norm, xn, rows, E, hp.rms_eps));
  CISA_RETURN_IF_ERROR(mlp(layer));
  return finish_layer(layer);
}

}  // namespace cisa
