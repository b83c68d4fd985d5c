// The Gemma 3 decoder layer (llama.cpp's llm_build_gemma3 and Hugging Face's Gemma3DecoderLayer):
//   h   = x + RMSNorm_post_attn( Attn( RMSNorm_attn(x) ) )      (q/k RMSNorm inside Attn)
//   out = h + RMSNorm_post_ffw( W_down( GELU_tanh(W_gate n) ⊙ W_up n ) ),  n = RMSNorm_ffn(h)
// Sliding-window layers attend to the last `sliding_window` positions with RoPE base 10,000;
// global layers attend to everything with the metadata's base.
#include "model_impl.h"

namespace cisa {

Status Model::Impl::layer_gemma3(int layer) {
  const LayerWeights& L = w.layers[static_cast<size_t>(layer)];
  const int64_t rows = st.rows;
  const int E = hp.n_embd;
  float* const x = st.x->f32();
  float* const xn = st.xn->f32();
  float* const o = st.o->f32();
  CISA_RETURN_IF_ERROR(start_layer(layer));
  CISA_RETURN_IF_ERROR(attention(layer));
  CISA_RETURN_IF_ERROR(be->rms_norm(o, L.post_attn_norm, o, rows, E, hp.rms_eps));
  CISA_RETURN_IF_ERROR(be->add_rms_norm(x, o, L.ffn_norm, xn, rows, E, hp.rms_eps));
  CISA_RETURN_IF_ERROR(mlp(layer));
  CISA_RETURN_IF_ERROR(be->rms_norm(o, L.post_ffn_norm, o, rows, E, hp.rms_eps));
  return finish_layer(layer);
}

}  // namespace cisa
