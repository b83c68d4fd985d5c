// model_ops.h — the element-wise and per-row pieces of the transformer layers: RMSNorm, RoPE,
// gated activations. Plain loops over raw pointers; the model threads them over rows.
#pragma once

#include <cstdint>

#include "cisa/model/model.h"

namespace cisa::ops {

// Every operation here rounds as llama.cpp's CPU backend does (the conformance tests compare
// logits with its): the same f32 operations in the same order, fused multiply-adds where its
// build has them, and its f16 lookup table for GELU.

// y = x / sqrt(mean(x²) + eps) ⊙ w over n values (squares in f32, summed in double, as llama.cpp
// does). w may be nullptr (no gain). x and y may alias.
void rms_norm(const float* x, const float* w, float* y, int n, float eps);

// RoPE angles for positions pos[0..n_pos): θ_{p,i} = p · base^(−2i/n_rot), i < n_rot/2, formed
// as llama.cpp forms them, by the f32 recurrence θ_{i+1} = θ_i · powf(base, −2/n_rot) from
// θ_0 = p (rounding drift included), then cosf/sinf. cos_out, sin_out: [n_pos][n_rot/2].
void rope_table(const int64_t* pos, int64_t n_pos, int n_rot, double base, float* cos_out,
                float* sin_out);

// Rotates one head vector x[0..n_rot) in place by the angles of one position (cs, sn: [n_rot/2]).
// NEOX: (x_i, x_{i+n_rot/2}) → (x_i cos − x_{i+h} sin, x_i sin + x_{i+h} cos);
// NORM: the same on (x_{2i}, x_{2i+1}). Each output is one fused multiply-add and one product,
// fma(x_i, cos, −x_{i+h} sin) and fma(x_i, sin, x_{i+h} cos), as llama.cpp's build computes them.
void rope_apply(float* x, const float* cs, const float* sn, int n_rot, RopeStyle style);

// GELU with the tanh approximation: 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))), evaluated as
// x · σ(2u) with a vectorisable exp (relative error ~1e-6). A reference; the model uses:
float gelu_tanh(float x);
// llama.cpp's GELU: x rounded to f16, GELU of that from a table of f16 results (0 for x ≤ −10,
// x for x ≥ 10). Relative error vs gelu_tanh(x) up to ~1e-3 (two f16 roundings).
float gelu_tanh_f16(float x);
// SiLU: x / (1 + e^(−x)) with e^x computed as llama.cpp's AVX-512 ggml_v_expf (~1.5 ulp).
float silu(float x);
// out[i] = act(gate[i]) · up[i] with act = gelu_tanh_f16 or silu; out may alias gate or up.
void gated_activation(Activation act, const float* gate, const float* up, float* out, int64_t n);

// x[i] = the IEEE half-precision value nearest to x[i] (round to nearest even), as a float.
void round_to_f16(float* x, int64_t n);

// y[i] += x[i].
void add_inplace(float* y, const float* x, int64_t n);

}  // namespace cisa::ops
