// The Gemma 3 decoder layer (llama.cpp's llm_build_gemma3 and Hugging Face's Gemma3DecoderLayer):
//   h   = x + RMSNorm_post_attn( Attn( RMSNorm_attn(x) ) )      (q/k RMSNorm inside Attn)
//   out = h + RMSNorm_post_ffw( W_down( GELU_tanh(W_gate n) ⊙ W_up n ) ),  n = RMSNorm_ffn(h)
// Sliding-window layers attend to the last `sliding_window` positions with RoPE base 10,000;
// global layers attend to everything with the metadata's base.
#include "model_impl.h"
#include "model_ops.h"

namespace cisa {

Status Model::Impl::layer_gemma3(int layer) {
  const LayerWeights& L = w.layers[static_cast<size_t>(layer)];
  const int64_t rows = st.rows;
  const int E = hp.n_embd;
  norm_rows(st.x.data(), L.attn_norm, st.xn.data(), rows, E);
  CISA_RETURN_IF_ERROR(attention(layer));
  for_rows(rows, [&](int64_t r) {
    float* o = st.o.data() + r * E;
    ops::rms_norm(o, L.post_attn_norm.data(), o, E, hp.rms_eps);
    ops::add_inplace(st.x.data() + r * E, o, E);
  });
  norm_rows(st.x.data(), L.ffn_norm, st.xn.data(), rows, E);
  CISA_RETURN_IF_ERROR(mlp(layer));
  for_rows(rows, [&](int64_t r) {
    float* o = st.o.data() + r * E;
    ops::rms_norm(o, L.post_ffn_norm.data(), o, E, hp.rms_eps);
    ops::add_inplace(st.x.data() + r * E, o, E);
  });
  return Status::Ok();
}

}  // namespace cisa
