// cisa._C — the CPU engine (include/cisa/cpu/) and, built with -DCISA_PY_CUDA=ON, the Hopper
// backend, bound for the Python package over raw pointers. This file defines the module and its
// argument classes; the ops are in ext_cpu.cpp and ext_cuda.cpp, the shared checks in
// ext_common.h.
//
// The Python side (cisa/ops.py) checks every tensor's dtype, device, shape and contiguity and
// passes data pointers and sizes; this module wraps the caller's K/V and representative tensors
// in a PagedKvCache view (PagedKvCache::wrap, nothing copied), adopts the block tables as
// sequences (which checks every page ID), and calls the engine: plan.h's rules, select_pages,
// score_chunks, select_topk and attend. Errors come back as Python exceptions carrying the
// engine's message: ValueError for malformed input, IndexError for an index out of range.
// No torch headers: the module only sees pointers.
#include <nanobind/nanobind.h>

#include "ext_common.h"

namespace cisa_py {
void register_cpu(nb::module_& m);
#ifdef CISA_PY_WITH_CUDA
void register_cuda(nb::module_& m);
#endif
}  // namespace cisa_py

using cisa_py::BatchArgs;
using cisa_py::CacheArgs;
namespace nb = nanobind;

NB_MODULE(_C, m) {
  m.doc() = "cisa's CPU engine over raw pointers (use the torch ops in cisa.ops)";
  nb::class_<CacheArgs>(m, "CacheArgs")
      .def(nb::init<>())
      .def_rw("k", &CacheArgs::k)
      .def_rw("v", &CacheArgs::v)
      .def_rw("reps", &CacheArgs::reps)
      .def_rw("bf16", &CacheArgs::bf16)
      .def_rw("num_pages", &CacheArgs::num_pages)
      .def_rw("num_kv_heads", &CacheArgs::num_kv_heads)
      .def_rw("page_size", &CacheArgs::page_size)
      .def_rw("head_dim", &CacheArgs::head_dim)
      .def_rw("rep", &CacheArgs::rep);
  nb::class_<BatchArgs>(m, "BatchArgs")
      .def(nb::init<>())
      .def_rw("tables", &BatchArgs::tables)
      .def_rw("num_seqs", &BatchArgs::num_seqs)
      .def_rw("max_pages", &BatchArgs::max_pages)
      .def_rw("lens", &BatchArgs::lens)
      .def_rw("entries", &BatchArgs::entries)
      .def_rw("num_entries", &BatchArgs::num_entries);
  cisa_py::register_cpu(m);
#ifdef CISA_PY_WITH_CUDA
  cisa_py::register_cuda(m);
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
}
