// cisa/cuda/model_backend.h — the CUDA implementation of cisa::Backend (backend.h): a whole model
// on one GPU. Weights are bf16 on the device (GGUF tensors are dequantised at load), activations
// f32, the paged KV cache bf16 pools per layer in the layout of cuda/backend.h's DeviceLayer, and
// attention the Hopper path of cuda/backend.h (plan_dense / plan_sparse / run_select /
// run_attention). Every operation is enqueued on the backend's one stream; download() and
// synchronize() wait for it. docs/cuda-model.md describes what runs where.
//
// No CUDA types appear here: the header builds in any translation unit of the project.
//
//   CISA_ASSIGN_OR_RETURN(std::unique_ptr<cisa::Backend> be,
//                         cisa::cuda::make_model_backend({.device = 0}));
//   CISA_RETURN_IF_ERROR(be->create_cache({.num_layers = 18, .num_kv_heads = 1, .head_dim = 256,
//                                          .num_pages = 4096, .dtype = cisa::KvDtype::kBF16}));
//   ... the model drives *be as it drives the CPU backend ...
//   cisa::PageLists lists;                                  // tests: what select() chose
//   CISA_RETURN_IF_ERROR(be->page_lists(cisa::PlanSlot::kCisa, &lists));
//
// Limits (each a clear Status): bf16 K/V only, page size 16, head_dim 64/128/256; the llama.cpp
// attention numerics and host page lists (Backend::set_page_lists) are CPU-only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cisa/core/backend.h"
#include "cisa/core/batch.h"
#include "cisa/core/status.h"

namespace cisa::cuda {

// A backend on device `options.device` (unavailable without a usable device of compute
// capability 9.0 or later; `options.threads` is unused).
Result<std::unique_ptr<Backend>> make_model_backend(const BackendOptions& options);

// Turns a CUDA backend's step graphs (BackendOptions::step_graphs) on or off from its next step;
// off also drops the graphs it holds. Tests compare both ways on one backend (same GEMM
// algorithms, so results must be bit for bit the same). invalid_argument when `backend` is not a
// CUDA model backend, failed_precondition inside a step.
Status set_step_graphs(Backend& backend, bool on);

// What a CUDA backend's GEMM chose for each matrix-product shape it has run (Gemm::describe: the
// kernel, its median time and the runner-up's), one line per shape, for benchmark reports.
// invalid_argument when `backend` is not a CUDA model backend.
Result<std::vector<std::string>> gemm_choices(const Backend& backend);

}  // namespace cisa::cuda
