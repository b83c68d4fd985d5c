// cisa/cuda/reuse_state.h — the device state of selection reuse across decode steps (plain
// structs, no C++20 and no CUDA includes, so the kernels include it too). See cisa/cuda/backend.h
// (run_select) and docs/design.md "Selection reuse across decode steps".
#pragma once

#include <cstdint>

namespace cisa::cuda {

struct ReuseInfo {
  int64_t selected_at;                 // position a0 of the row whose top-k chose S; −1: no state
  int64_t last_used;                   // position of the last decode row whose list held S
  int64_t budget, window, sink_pages;  // the parameters S was chosen under
  // The check `mass`: u0, the index query's softmax mass outside S over the eligible chunks at
  // a0 (core/plan.h); 0 for a selection made under another check, as on the CPU backend.
  double unselected_mass;
};
struct ReuseState {
  int32_t* chunks = nullptr;  // device int32 [slots][k_stride], S ascending
  ReuseInfo* info = nullptr;  // device [slots]
  int64_t* stats = nullptr;   // device int64 [4]: SelectionReuseStats' selected, reused,
                              // checked, reselected (added to)
  int64_t num_seq_slots = 0;
  int32_t num_layer_slots = 0;
  int32_t layer_slot = 0;  // the layer run_select selects for
  int32_t k_stride = 0;    // the largest budget the state holds
  // Repeat the selection this step already made for layer_slot (a re-plan of the same step):
  // every decode row whose S was used at its own position takes S again; no state changes and
  // nothing is counted.
  bool repeat = false;
};

}  // namespace cisa::cuda
