// Shared by the parts of the cisa._C module (cisa_ext.cpp registers them): the argument structs
// the Python side fills, the errors it sees, and the host-side checks and planning every op runs
// before it reaches the engine (ext_cpu.cpp) or the Hopper backend (ext_cuda.cpp).
//
// nanobind turns std::out_of_range into IndexError, std::invalid_argument into ValueError and
// std::bad_alloc into MemoryError.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "cisa/core/batch.h"
#include "cisa/core/plan.h"
#include "cisa/core/status.h"
#include "cisa/cpu/kv_cache.h"

namespace cisa_py {

namespace nb = nanobind;

using cisa::BatchEntry;
using cisa::PageLists;
using cisa::Status;
using cisa::StatusCode;

struct IndexErrorEx : std::out_of_range {
  using std::out_of_range::out_of_range;
};

// Throws the exception for a failed status, its message prefixed by "cisa.<op>: ".
void raise_if_error(const Status& s, const char* op);

template <class T>
T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

// The representative kinds the bindings expose (kv_cache.h's RepKind): 0 mean, 1 quest.
cisa::RepKind rep_kind(int rep);

struct CacheArgs {
  uintptr_t k = 0, v = 0, reps = 0;  // reps may be 0 (no representatives read)
  bool bf16 = false;
  int64_t num_pages = 0;
  int num_kv_heads = 0, page_size = 0, head_dim = 0;
  int rep = 0;  // representative kind: 0 mean ([head_dim] per page), 1 quest ([2 * head_dim])
};

// The batch: block tables int32 [num_seqs][max_pages], seq_lens int64 [num_seqs] and entries
// int64 [num_entries][3] (seq, first, count), all host memory.
struct BatchArgs {
  uintptr_t tables = 0;
  int64_t num_seqs = 0, max_pages = 0;
  uintptr_t lens = 0;
  uintptr_t entries = 0;
  int64_t num_entries = 0;
};

// The entries as BatchEntry, each sequence index and count checked.
std::vector<BatchEntry> read_entries(const BatchArgs& b);

// Sequence s's page count ceil(len / page_size), checked: len not negative and the pages within
// the block table's columns (ValueError naming the op otherwise).
int64_t row_pages(const BatchArgs& b, int64_t s, int page_size, const char* op);

// The selection parameters, validated (ValueError otherwise).
cisa::SelectionParams selection_params(int64_t budget, int64_t window, int64_t qshare,
                                       int64_t sink_pages, bool qshare_last);

// The page lists of a plan as flat host vectors: groups [G][5] (entry, first, last, row, dense),
// offsets [L + 1], pages and chunks [total], num_selected [L].
using PlanTuple = std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int32_t>,
                             std::vector<int32_t>, std::vector<int32_t>>;

PlanTuple to_tuple(const PageLists& l);

// adopt_all's checks without a PageTable (ext_common.cpp says how).
void check_tables(const BatchArgs& b, int64_t num_pages, int page_size, const char* op);

// validate_batch's checks against seq_lens, with its messages.
void check_positions(const BatchArgs& b, std::span<const BatchEntry> batch, const char* op);

// A plan's host part: the query groups [G][5] (entry, first, last, row, dense), the list offsets
// [L + 1] (list i * num_kv_heads + g: group i's for KV group g) and the batch they came from.
struct HostPlan {
  std::vector<int64_t> groups, offsets;
  std::vector<BatchEntry> batch;
  bool dense = false;
  int64_t total() const { return offsets.back(); }
  int64_t num_lists() const { return static_cast<int64_t>(offsets.size()) - 1; }
};

// Every check of the engine's path (adopt_all, read_entries, validate_batch, the parameters),
// each once, and the groups and list sizes; no page list is written.
HostPlan plan_host(const BatchArgs& b, int64_t num_pages, int num_kv_heads, int page_size,
                   bool dense, int64_t sliding_window, int64_t budget, int64_t window,
                   int64_t qshare, int64_t sink_pages, bool qshare_last, const char* op);

// A vector handed to torch without a copy (DLPack; the tensor owns the vector).
template <class T>
using Tensor1 = nb::ndarray<nb::pytorch, T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

template <class T>
Tensor1<T> to_tensor(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  if (heap->empty()) heap->reserve(1);  // a non-null data pointer for an empty tensor
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return Tensor1<T>(heap->data(), {heap->size()}, owner);
}

}  // namespace cisa_py
