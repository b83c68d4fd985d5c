// Row-level pieces shared by the attention kernels (attention.cu, attention_wgmma.cu,
// attention_wgmma_ws.cu): the online-softmax step of the wgmma kernels and the epilogue that
// normalises a thread's two rows and writes them (output + LSE, or a split-KV partial).
//
// Fragment layout (mma.m16n8k16 and wgmma accumulators alike): thread (gr = lane / 4, tq = lane %
// 4) holds rows gr and gr + 8 of its 16-row slice; value e (0–3) of 8-column chunk j sits at row gr
// + 8·(e >> 1), column 8j + 2tq + (e & 1). Arrays are flattened as x[4j + e].
#pragma once

#include <climits>
#include <cstdint>

#include "attention.cuh"
#include "common.cuh"

namespace cisa::cuda::detail {

constexpr float kAttnLog2e = 1.4426950408889634f;
constexpr float kAttnLn2 = 0.6931471805599453f;

// Union tasks (AttnTask::members > 0), as both union kernels read them (attention.cu's mma.sync
// kernel and attention_wgmma_ws.cu's paired tiles). Warp w takes member w's list, t.list + this
// offset; a warp past the last member takes the last member's, masks every page and writes nothing.
__device__ __forceinline__ int union_member_offset(const AttnTask& t, int w) {
  return min(w, t.members - 1) * t.stride;
}
// The rows a warp attends: all of its member's in a union task (≤ 16), else the task's row tile.
__device__ __forceinline__ int task_rows(const AttnTask& t, const ListDesc& L, bool uni, int hg) {
  return uni ? (L.last_pos - L.first_pos + 1) * hg : t.rows;
}
// The last query position of a task: a union's last member's last one (members ascend), else the
// last row of the task's tile in its list L. Pages that start after it serve no row.
__device__ __forceinline__ int32_t task_last_pos(const AttentionArgs& a, const AttnTask& t,
                                                 const ListDesc& L, bool uni, int hg) {
  return uni ? a.lists[t.list + union_member_offset(t, t.members - 1)].last_pos
             : L.first_pos + (t.row0 + t.rows - 1) / hg;
}

// Query rows of one thread: rows r = row_base + gr + 8h (h = 0, 1) of the task's tile (rows past
// `rows` repeat its last row and are never written), their absolute positions, and Q as the
// bf16 A fragments of the 16-channel k-steps (the same registers serve mma.sync and wgmma). From
// a.q (bf16), or from a.q_f32 where set, rounded here as f32_to_bf16 rounds (the same registers).
template <int D>
__device__ __forceinline__ void load_q_rows(const AttentionArgs& a, const ListDesc& L, int row0,
                                            int row_base, int rows, int gr, int tq,
                                            int32_t (&pos)[2], uint32_t (&qf)[D / 16][4]) {
  const int hg = a.num_q_heads / a.num_kv_heads;
  int64_t qo[2];  // element offsets of the two rows
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = min(row_base + gr + 8 * h, rows - 1);
    const int lr = row0 + r, p = lr / hg, head = L.kv * hg + lr % hg;
    pos[h] = L.first_pos + p;
    qo[h] = ((L.q_row + p) * a.num_q_heads + head) * static_cast<int64_t>(D);
  }
  if (a.q_f32) {
    const auto word = [&](int h, int c) {  // channels c, c + 1 of row h as one bf16 pair
      const float2 v = *reinterpret_cast<const float2*>(a.q_f32 + qo[h] + c);
      return uint32_t{dev::f32_to_bf16(v.x)} | uint32_t{dev::f32_to_bf16(v.y)} << 16;
    };
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      qf[kk][0] = word(0, kk * 16 + tq * 2);
      qf[kk][1] = word(1, kk * 16 + tq * 2);
      qf[kk][2] = word(0, kk * 16 + 8 + tq * 2);
      qf[kk][3] = word(1, kk * 16 + 8 + tq * 2);
    }
    return;
  }
  const uint16_t* qp[2] = {a.q + qo[0], a.q + qo[1]};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    qf[kk][0] = *reinterpret_cast<const uint32_t*>(qp[0] + kk * 16 + tq * 2);
    qf[kk][1] = *reinterpret_cast<const uint32_t*>(qp[1] + kk * 16 + tq * 2);
    qf[kk][2] = *reinterpret_cast<const uint32_t*>(qp[0] + kk * 16 + 8 + tq * 2);
    qf[kk][3] = *reinterpret_cast<const uint32_t*>(qp[1] + kk * 16 + 8 + tq * 2);
  }
}

// One online-softmax step over a tile of NT scores per row (raw q·k in s[NT / 2], pages of
// kPageSize tokens whose first positions are cstart[page]; INT_MAX / 2 marks a page past the
// task or, in a union task, a page the warp's member did not choose). Masks by absolute position
// (causal, optional window), folds the positive scale into the exponent (sl2 = scale · log2 e: one
// FFMA + EX2 per score), updates the running maximum m (log2 units, scaled) and sum l, leaves the
// weights P (f32) in s and O's factor in corr. MASKED: pages may be masked mid-tile (union tasks).
template <int NT, int B, bool MASKED = false>
__device__ __forceinline__ void wg_softmax_step(float (&s)[NT / 2], const int32_t (&cstart)[NT / B],
                                                const int32_t (&pos)[2], int32_t window, float sl2,
                                                int tq, float (&m)[2], float (&l)[2],
                                                float (&corr)[2]) {
  constexpr int NP = NT / B;
  float mx[2] = {-INFINITY, -INFINITY};
  // Pages ascend, so the last start is the largest. In a union task a page the member did not
  // choose (INT_MAX / 2) can sit anywhere in the tile: where every chosen page is wholly visible
  // (the usual case deep in the history, and most union tiles hold such a page), those pages are
  // masked whole, one test a page, instead of position by position.
  const int32_t clast = cstart[NP - 1];
  bool chosen_visible = false;
  if constexpr (MASKED) {
    int32_t cmax = INT_MIN / 2;
#pragma unroll
    for (int p = 0; p < NP; ++p) cmax = cstart[p] == INT_MAX / 2 ? cmax : max(cmax, cstart[p]);
    chosen_visible = window == 0 && cmax + B - 1 <= pos[0];
  }
  const bool all_visible = !MASKED && window == 0 && clast + B - 1 <= pos[0];  // pos[0] ≤ pos[1]
  if (chosen_visible) {
#pragma unroll
    for (int j = 0; j < NT / 8; ++j) {
      const bool chosen = cstart[j * 8 / B] != INT_MAX / 2;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[4 * j + e] = chosen ? s[4 * j + e] : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[4 * j + e]);
      }
    }
  } else if (all_visible) {
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
  } else {
#pragma unroll
    for (int j = 0; j < NT / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e >> 1;
        const int32_t sp = cstart[j * 8 / B] + (j * 8) % B + tq * 2 + (e & 1);
        const bool vis = sp <= pos[h] && (window == 0 || sp > pos[h] - window);
        s[4 * j + e] = vis ? s[4 * j + e] : -INFINITY;
        mx[h] = fmaxf(mx[h], s[4 * j + e]);
      }
  }
  float nbase[2];  // −(running maximum), in log2 units
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    const float m_new = fmaxf(m[h], mx[h] * sl2);
    nbase[h] = m_new == -INFINITY ? 0.0f : -m_new;
    corr[h] = dev::fast_exp2(m[h] + nbase[h]);
    l[h] *= corr[h];
    m[h] = m_new;
  }
#pragma unroll
  for (int i = 0; i < NT / 2; ++i) {
    s[i] = dev::fast_exp2(fmaf(s[i], sl2, nbase[(i >> 1) & 1]));
    l[(i >> 1) & 1] += s[i];
  }
}

// O rows to the new maximum, then P (f32) packed as the bf16 A operand of P·V: k-step kt =
// tokens 16kt … 16kt + 15 = chunks 2kt, 2kt + 1.
template <int D, int NT>
__device__ __forceinline__ void wg_rescale_pack(float (&o)[D / 2], const float (&corr)[2],
                                                const float (&s)[NT / 2],
                                                uint32_t (&pa)[NT / 16][4]) {
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    o[4 * j + 0] *= corr[0];
    o[4 * j + 1] *= corr[0];
    o[4 * j + 2] *= corr[1];
    o[4 * j + 3] *= corr[1];
  }
#pragma unroll
  for (int kt = 0; kt < NT / 16; ++kt) {
    pa[kt][0] = dev::pack_bf16x2(s[8 * kt + 0], s[8 * kt + 1]);
    pa[kt][1] = dev::pack_bf16x2(s[8 * kt + 2], s[8 * kt + 3]);
    pa[kt][2] = dev::pack_bf16x2(s[8 * kt + 4], s[8 * kt + 5]);
    pa[kt][3] = dev::pack_bf16x2(s[8 * kt + 6], s[8 * kt + 7]);
  }
}

// Epilogue of one thread: sums l over the row's quad, then for each of its rows r = row_base +
// gr + 8h below `rows` writes O / l (and the LSE, natural log) to the output, or to the task's
// split-KV partial slot. m is in log2 units. o is flattened as o[4j + e] (D / 2 values).
template <int D>
__device__ __forceinline__ void store_rows(const AttentionArgs& a, const ListDesc& L, int task,
                                           int row0, int row_base, int rows, int gr, int tq,
                                           const float* o, const float (&m)[2], float (&l)[2]) {
  const int hg = a.num_q_heads / a.num_kv_heads;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row_base + gr + 8 * h;
    if (r >= rows) continue;
    const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
    const float lse = l[h] > 0.0f ? (m[h] + log2f(l[h])) * kAttnLn2 : -INFINITY;
    const int lr = row0 + r, p = lr / hg, head = L.kv * hg + lr % hg;
    float* dst;
    // Re-read here rather than kept live through the main loop (registers).
    const int64_t partial = __ldg(&a.tasks[task].partial);
    if (partial < 0) {
      const int64_t hr = (L.q_row + p) * a.num_q_heads + head;
      dst = a.out + hr * D;
      if (a.lse && tq == 0) a.lse[hr] = lse;
    } else {
      dst = a.partial_out + (partial + r) * D;
      if (tq == 0) a.partial_lse[partial + r] = lse;
    }
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<float2*>(dst + j * 8 + tq * 2) =
          make_float2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
  }
}

}  // namespace cisa::cuda::detail
