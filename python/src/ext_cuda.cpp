// cisa._C's CUDA ops on the Hopper backend (cuda/backend.h), built with -DCISA_PY_CUDA=ON.
// Data pointers are device memory (bf16 K/V and representatives, q bf16, index_q and outputs
// f32); the batch and the block tables are checked on the host first (the same adopt_sequence
// and validate_batch as the CPU path), and the block tables' device copy is the caller's tensor.
// cisa_ext.cpp registers them (register_cuda).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "cisa/cuda/backend.h"
#include "ext_common.h"

namespace cisa_py {
namespace {

struct CudaPlan {
  cisa::cuda::Plan plan;
  std::vector<int64_t> offsets;
  bool dense = true;
  int64_t rows = 0;
  int rep = 0;  // the representative kind the plan was made for (CacheArgs::rep)
};

cisa::cuda::DeviceLayer device_layer(const CacheArgs& c) {
  if (!c.bf16) throw std::invalid_argument("cisa: the CUDA backend needs bfloat16 K/V");
  return {.k = ptr<const uint16_t>(c.k),
          .v = ptr<const uint16_t>(c.v),
          .reps = ptr<uint16_t>(c.reps),
          .num_pages = c.num_pages,
          .num_kv_heads = c.num_kv_heads,
          .head_dim = c.head_dim,
          .page_size = c.page_size,
          .rep = rep_kind(c.rep)};
}

// The backend's plan of a batch already checked on the host (check_batch_on_host).
void cuda_plan_checked(CudaPlan& cp, const CacheArgs& c, const BatchArgs& b,
                       std::span<const BatchEntry> batch, uintptr_t device_tables, int num_q_heads,
                       bool dense, int64_t sliding_window, int64_t budget, int64_t window,
                       int64_t qshare, int64_t sink_pages, bool qshare_last, const char* op) {
  cp.offsets.resize(static_cast<size_t>(b.num_seqs + 1));
  for (int64_t s = 0; s <= b.num_seqs; ++s) cp.offsets[static_cast<size_t>(s)] = s * b.max_pages;
  const cisa::cuda::DeviceBlockTables tables{ptr<const int32_t>(device_tables), cp.offsets};
  cp.dense = dense;
  cp.rep = c.rep;
  cp.rows = 0;
  for (const auto& e : batch) cp.rows += e.count;
  if (dense)
    raise_if_error(cisa::cuda::plan_dense(device_layer(c), tables, batch, num_q_heads,
                                          sliding_window, &cp.plan),
                   op);
  else
    raise_if_error(cisa::cuda::plan_sparse(
                       device_layer(c), tables, batch, num_q_heads,
                       selection_params(budget, window, qshare, sink_pages, qshare_last), &cp.plan),
                   op);
}

// The host checks of the CPU path (adopt_all's and validate_batch's, each page once), then the
// backend's plan.
void cuda_plan(CudaPlan& cp, const CacheArgs& c, const BatchArgs& b, uintptr_t device_tables,
               int num_q_heads, bool dense, int64_t sliding_window, int64_t budget, int64_t window,
               int64_t qshare, int64_t sink_pages, bool qshare_last, const std::string& op_name) {
  const char* op = op_name.c_str();
  if (c.page_size <= 0)
    throw std::invalid_argument(std::string("cisa.") + op + ": page_size must be positive");
  check_tables(b, c.num_pages, c.page_size, op);
  const std::vector<BatchEntry> batch = read_entries(b);
  check_positions(b, batch, op);
  cuda_plan_checked(cp, c, b, batch, device_tables, num_q_heads, dense, sliding_window, budget,
                    window, qshare, sink_pages, qshare_last, op);
}

// The CUDA wrapper's plan in one pass over the block tables: plan_groups' host plan (the
// wrapper's num_kv_heads and page_size, which must be the layer's; pages checked against
// min(num_pages, the layer's pages)) and the backend's plan of the same checked batch.
std::tuple<Tensor1<int64_t>, Tensor1<int64_t>, int64_t, int64_t> cuda_plan_groups(
    CudaPlan& cp, const CacheArgs& c, const BatchArgs& b, uintptr_t device_tables,
    int64_t num_pages, int num_kv_heads, int page_size, int num_q_heads, bool dense,
    int64_t sliding_window, int64_t budget, int64_t window, int64_t qshare, int64_t sink_pages,
    bool qshare_last) {
  if (num_kv_heads != c.num_kv_heads || page_size != c.page_size)
    throw std::invalid_argument("cisa.plan: the wrapper's num_kv_heads and page_size (" +
                                std::to_string(num_kv_heads) + ", " + std::to_string(page_size) +
                                ") must be k_cache's (" + std::to_string(c.num_kv_heads) + ", " +
                                std::to_string(c.page_size) + ")");
  HostPlan h = plan_host(b, std::min(num_pages, c.num_pages), num_kv_heads, page_size, dense,
                         sliding_window, budget, window, qshare, sink_pages, qshare_last, "plan");
  cuda_plan_checked(cp, c, b, h.batch, device_tables, num_q_heads, dense, sliding_window, budget,
                    window, qshare, sink_pages, qshare_last, "plan");
  const int64_t total = h.total(), lists = h.num_lists();
  return {to_tensor(std::move(h.groups)), to_tensor(std::move(h.offsets)), total, lists};
}

// A sparse plan over block tables the caller built on the device (concatenated, CSR `offsets`)
// for the single-purpose plans of the chunk_scores and topk ops: no host check of page IDs (the
// caller checks the pages that are read), no unions, no fused selection.
void cuda_plan_raw(CudaPlan& cp, const CacheArgs& c, uintptr_t device_tables,
                   const std::vector<int64_t>& offsets,
                   const std::vector<std::tuple<int64_t, int64_t, int64_t>>& entries,
                   int64_t budget, int64_t window, int64_t sink_pages, const std::string& op_name) {
  const char* op = op_name.c_str();
  std::vector<BatchEntry> batch;
  cp.rows = 0;
  for (const auto& [s, f, n] : entries) {
    batch.push_back({static_cast<cisa::SeqId>(s), f, static_cast<int32_t>(n)});
    cp.rows += n;
  }
  cp.offsets = offsets;
  cp.dense = false;
  cp.rep = c.rep;
  const cisa::cuda::DeviceBlockTables tables{ptr<const int32_t>(device_tables), cp.offsets};
  cisa::cuda::PlanOptions options;
  options.group_unions = false;
  options.fused_select_cluster = 0;
  raise_if_error(cisa::cuda::plan_sparse(device_layer(c), tables, batch, c.num_kv_heads,
                                         selection_params(budget, window, 1, sink_pages, false),
                                         &cp.plan, options),
                 op);
}

// One selection stage (0 setup, 1 scores, 2 top-k), launched on the stream.
void cuda_select_stage(const CudaPlan& cp, const CacheArgs& c, uintptr_t index_q, int stage,
                       uintptr_t stream, const std::string& op) {
  if (stage < 0 || stage > 2) throw std::invalid_argument("cisa: unknown selection stage");
  raise_if_error(
      cisa::cuda::run_select_stage(cp.plan, device_layer(c), ptr<const float>(index_q),
                                   static_cast<cisa::cuda::SelectStage>(stage), ptr<void>(stream)),
      op.c_str());
}

// Attention of a plan whose lists run_select wrote, launched on the stream.
void cuda_attend(const CudaPlan& cp, const CacheArgs& c, uintptr_t q, float scale, uintptr_t out,
                 uintptr_t lse, uintptr_t stream) {
  raise_if_error(cisa::cuda::run_attention(cp.plan, device_layer(c), ptr<const uint16_t>(q), scale,
                                           ptr<float>(out), lse ? ptr<float>(lse) : nullptr,
                                           ptr<void>(stream)),
                 "paged_attention");
}

// Replaces a plan's scores (download_scores' layout) by the caller's device f32 scores.
void cuda_upload_scores(const CudaPlan& cp, uintptr_t scores, int64_t n, uintptr_t stream) {
  raise_if_error(cisa::cuda::upload_scores(cp.plan, ptr<const float>(scores), n, ptr<void>(stream)),
                 "topk");
}

// The scores of a plan's selecting lists and their offsets (synchronous copy).
std::tuple<std::vector<float>, std::vector<int64_t>> cuda_download_scores(const CudaPlan& cp) {
  std::vector<float> scores;
  std::vector<int64_t> offsets;
  raise_if_error(cisa::cuda::download_scores(cp.plan, &scores, &offsets), "chunk_scores");
  return {scores, offsets};
}

void cuda_run(const CudaPlan& cp, const CacheArgs& c, uintptr_t index_q, uintptr_t q, float scale,
              uintptr_t out, uintptr_t lse, uintptr_t stream) {
  if (c.rep != cp.rep)
    throw std::invalid_argument("cisa.cuda_run: the plan was made for another representative kind");
  const cisa::cuda::DeviceLayer layer = device_layer(c);
  // Every plan runs the selection step: it writes the lists' fixed parts (a dense plan's whole
  // lists) on the device; index_q is read only by sparse plans.
  raise_if_error(
      cisa::cuda::run_select(cp.plan, layer, ptr<const float>(index_q), ptr<void>(stream)), "run");
  raise_if_error(
      cisa::cuda::run_attention(cp.plan, layer, ptr<const uint16_t>(q), scale, ptr<float>(out),
                                lse ? ptr<float>(lse) : nullptr, ptr<void>(stream)),
      "run");
}

void cuda_update_reps(const CacheArgs& c, uintptr_t pages, int64_t n, uintptr_t stream) {
  raise_if_error(
      cisa::cuda::run_update_reps(device_layer(c), ptr<const int32_t>(pages), n, ptr<void>(stream)),
      "update_representatives");
}

std::tuple<PlanTuple, int64_t> cuda_page_lists(const CudaPlan& cp) {
  PageLists lists;
  raise_if_error(cisa::cuda::download_page_lists(cp.plan, &lists), "page_lists");
  int64_t read = 0;
  raise_if_error(cisa::cuda::count_read_pages(cp.plan, &read), "page_lists");
  return {to_tuple(lists), read};
}

}  // namespace

void register_cuda(nb::module_& m) {
  nb::class_<CudaPlan>(m, "CudaPlan")
      .def(nb::init<>())
      .def_ro("rows", &CudaPlan::rows)
      .def_ro("dense", &CudaPlan::dense)
      .def_ro("rep", &CudaPlan::rep);
  m.def("cuda_plan", &cuda_plan);
  m.def("cuda_plan_groups", &cuda_plan_groups);
  m.def("cuda_plan_raw", &cuda_plan_raw);
  m.def("cuda_select_stage", &cuda_select_stage);
  m.def("cuda_attend", &cuda_attend);
  m.def("cuda_upload_scores", &cuda_upload_scores);
  m.def("cuda_download_scores", &cuda_download_scores);
  m.def("cuda_run", &cuda_run);
  m.def("cuda_update_reps", &cuda_update_reps);
  m.def("cuda_page_lists", &cuda_page_lists);
  m.def("cuda_device_available", []() {
    std::string why;
    const bool ok = cisa::cuda::device_available(&why);
    return std::make_tuple(ok, why);
  });
}

}  // namespace cisa_py
