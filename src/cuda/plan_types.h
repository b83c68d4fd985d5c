// Launch metadata shared by the host plan (plan_build.cpp, plan_attention.cpp) and the kernels
// (*.cu): plain structs with no CUDA types, copied to the device as arrays.
#pragma once

#include <cstdint>

namespace cisa::cuda::detail {

// One page list = one (query group, KV group). Its pages are written in this order:
//   chunks [pre_begin, pre_end)          dense range (dense list) or sink pages (sparse list)
//   k chunks selected from [elig_begin, elig_end), ascending (sparse list only)
//   chunks [post_begin, post_end)        window as seen from the group's first position + tail
struct ListDesc {
  int64_t table_begin;          // offset of the sequence's block table in DeviceBlockTables::pages
  int64_t out_begin;            // offset of the list in the page/chunk arrays
  int64_t score_begin;          // offset of its scores (sparse lists)
  int64_t q_row;                // packed query row of the group's first position
  int32_t first_pos, last_pos;  // absolute positions of the group's first and last query
  int32_t kv;                   // KV group
  int32_t pre_begin, pre_end;
  int32_t elig_begin, elig_end;
  int32_t post_begin, post_end;
  int32_t k;                     // chunks chosen by top-k (0: dense list)
  int32_t qbar_row0, qbar_row1;  // packed rows averaged into the index query (inclusive)
  int32_t window;                // sliding window in tokens (dense plans), 0: none
  int32_t reuse_seq;             // selection reuse: the sequence's state slot; −1: not a decode
                                 // row that may keep a selection (reuse.cuh)
};

// The representatives the scoring kernels read (rep_read.cuh): bf16 values, or int8 codes with
// one scale exponent byte per representative (RepPrecision::kInt8). Both
// [num_pages][num_kv_heads][rep_width].
// The exponent bytes: e in [kRepExpMin, 127] (core/rep_quant.h's kMinRepScaleExp: 2^e is a
// normal f32), or kRepExpNaN for a representative without an 8-bit form (scores NaN).
constexpr int kRepExpMin = -126;
constexpr int8_t kRepExpNaN = -128;
struct RepArgs {
  const uint8_t* data = nullptr;  // bf16 (2 bytes a value) or int8 codes (1 byte)
  const int8_t* exps = nullptr;   // int8: e of the scale 2^e per (page, KV head); bf16: unused
  bool int8 = false;
};

// All selecting lists of one (batch entry, KV group): their eligible ranges share a start and
// grow with the group, so one pass over the representatives scores all of them.
struct ScoreStream {
  int64_t table_begin;
  int32_t first_list;   // index of the first list of the stream
  int32_t num_lists;    // lists first_list, first_list + list_stride, …
  int32_t list_stride;  // num_kv_heads (lists are group-major, KV group inner)
  int32_t kv;
  int32_t elig_begin, elig_end_max;
};

// One thread block of attention: a row tile of one list over a range of its pages, or (members
// > 0) a union task: warp w takes all rows of list `list + w·stride` (w < members) over the
// union of the members' pages (UnionDesc), each page tagged with the members that chose it.
struct AttnTask {
  int32_t list;
  int32_t row0, rows;    // rows [row0, row0 + rows) of the list (row = position·h_g + head)
  int32_t members;       // 0: one list; 1–4: union task
  int64_t page0, page1;  // absolute offsets into the page array (union: into the union arrays;
                         // page1 is the capacity, the kernel reads the true size)
  int64_t partial;       // −1: writes the output; else first row of its partial slot
  int32_t union_id, stride;
  int32_t merge;  // its MergeTask (split-KV partials), else −1; read by fused-merge launches
};

// KV-outer work unit of small query groups (v3): up to kUnionGroups consecutive QShare groups of
// one (entry, KV group) whose rows fit one warp. Their page lists are merged into one ascending
// list with a member bit mask per page, so a page chosen by several groups is read once.
struct UnionDesc {
  int64_t table_begin;
  int64_t out_begin;  // offset in the union arrays; capacity = Σ member list sizes
  int32_t first_list, members, stride;
  int32_t max_chunk;  // largest chunk a member list can hold
};

// Merges the split-KV partials of one (list, row tile): split s, row r is partial row
// partial + s·rows + r.
struct MergeTask {
  int32_t list, row0, rows, splits;
  int64_t partial;
};

}  // namespace cisa::cuda::detail
