// model_ops.h — the element-wise and per-row pieces of the transformer layers: RMSNorm, RoPE,
// gated activations. Plain loops over raw pointers; the model threads them over rows.
#pragma once

#include <cstdint>

#include "cisa/model.h"

namespace cisa::ops {

// y = x / sqrt(mean(x²) + eps) ⊙ w over n values (the sum of squares in double, as llama.cpp
// does). w may be nullptr (no gain). x and y may alias.
void rms_norm(const float* x, const float* w, float* y, int n, float eps);

// RoPE angles for positions pos[0..n_pos): θ_{p,i} = p · base^(−2i/n_rot), i < n_rot/2, evaluated
// in double. cos_out, sin_out: [n_pos][n_rot/2].
void rope_table(const int64_t* pos, int64_t n_pos, int n_rot, double base, float* cos_out,
                float* sin_out);

// Rotates one head vector x[0..n_rot) in place by the angles of one position (cs, sn: [n_rot/2]).
// NEOX: (x_i, x_{i+n_rot/2}) → (x_i cos − x_{i+h} sin, x_i sin + x_{i+h} cos);
// NORM: the same on (x_{2i}, x_{2i+1}).
void rope_apply(float* x, const float* cs, const float* sn, int n_rot, RopeStyle style);

// GELU with the tanh approximation: 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))), evaluated as
// x · σ(2u) with a vectorisable exp (relative error ~1e-6).
float gelu_tanh(float x);
// SiLU: x / (1 + e^(−x)), same exp.
float silu(float x);
// out[i] = act(gate[i]) · up[i]; out may alias gate or up.
void gated_activation(Activation act, const float* gate, const float* up, float* out, int64_t n);

// x[i] = the IEEE half-precision value nearest to x[i] (round to nearest even), as a float.
void round_to_f16(float* x, int64_t n);

// y[i] += x[i].
void add_inplace(float* y, const float* x, int64_t n);

}  // namespace cisa::ops
