// CudaBackend, part 2: the paged KV cache on the device.
//
// Per layer, bf16 pools in the layout of cuda/backend.h's DeviceLayer (and of kv_cache.h):
//   K, V:            [num_pages][num_kv_heads][16][head_dim]
//   representatives: [num_pages][num_kv_heads][rep_width]   (rep layers only)
// A PageTable (page_table.h) keeps sequences, block tables and the free list on the host, so
// page IDs are handed out exactly as the CPU cache hands them out. The attention planner reads
// block tables from device memory as CSR over the live sequences (SeqId order); the mirror is
// uploaded again whenever PageTable::version() moves.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "model_backend_impl.h"
#include "model_ops.cuh"

namespace cisa::cuda {
namespace {

constexpr int kPageSize = 16;  // the attention kernels' page tile

Status validate_config(const KvCacheConfig& c) {
  if (c.dtype != KvDtype::kBF16)
    return unimplemented(
        std::string("cuda create_cache: K/V dtype ") + kv_dtype_name(c.dtype) +
        " is not supported (the device cache holds bf16: set KvCacheConfig::dtype to bf16)");
  if (c.page_size != kPageSize)
    return unimplemented("cuda create_cache: page_size " + std::to_string(c.page_size) +
                         " is not supported (the kernels need 16)");
  if (c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256)
    return unimplemented("cuda create_cache: head_dim " + std::to_string(c.head_dim) +
                         " is not supported (64, 128 or 256)");
  if (c.num_layers <= 0) return invalid_argument("cuda create_cache: num_layers must be positive");
  if (c.num_kv_heads <= 0)
    return invalid_argument("cuda create_cache: num_kv_heads must be positive");
  if (c.num_pages <= 0 || c.num_pages > std::numeric_limits<int32_t>::max())
    return invalid_argument("cuda create_cache: num_pages must be in [1, 2^31) (got " +
                            std::to_string(c.num_pages) + ")");
  if (!c.rep_layers.empty() && c.rep_layers.size() != static_cast<size_t>(c.num_layers))
    return invalid_argument("cuda create_cache: rep_layers has " +
                            std::to_string(c.rep_layers.size()) + " entries for " +
                            std::to_string(c.num_layers) + " layers");
  return Status::Ok();
}

std::string gib(double bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

Status CudaBackend::require_cache(const char* op) const {
  if (!has_cache_)
    return failed_precondition(std::string("cuda ") + op + ": create_cache was not called");
  return Status::Ok();
}

bool CudaBackend::layer_has_reps(int layer) const {
  return config_.rep_layers.empty() || config_.rep_layers[static_cast<size_t>(layer)];
}

DeviceLayer CudaBackend::device_layer(int layer) const {
  const LayerPools& p = pools_[static_cast<size_t>(layer)];
  return DeviceLayer{.k = p.k.as<uint16_t>(),
                     .v = p.v.as<uint16_t>(),
                     .reps = layer_has_reps(layer) ? p.reps.get() : nullptr,
                     .num_pages = config_.num_pages,
                     .num_kv_heads = config_.num_kv_heads,
                     .head_dim = config_.head_dim,
                     .page_size = kPageSize,
                     .rep = config_.rep,
                     .rep_exps = layer_has_reps(layer) ? p.rep_exps.as<int8_t>() : nullptr,
                     .rep_precision = config_.rep_precision};
}

Status CudaBackend::create_cache(const KvCacheConfig& config) {
  CISA_RETURN_IF_ERROR(validate_config(config));
  if (config.rep == RepKind::kMoment)
    return unimplemented(
        "cuda: moment representatives (mean and variance) are implemented on the CPU backend only");
  if (config.rep_precision == RepPrecision::kFp8)
    return unimplemented(
        "cuda: fp8 representatives are implemented on the CPU backend only (use int8: the same "
        "quality in docs/eval/results.md, and a cheaper conversion in the scoring kernels)");
  const bool int8 = config.rep_precision == RepPrecision::kInt8;
  // Sizes in double first: a configuration too large for int64 byte counts is just too large.
  // int8 representatives: one byte a value and one scale exponent byte per (page, KV head).
  const int rep_width = cisa::rep_width(config.rep, config.head_dim);
  const double kv_d =
      static_cast<double>(config.num_pages) * config.num_kv_heads * kPageSize * config.head_dim * 2;
  const double exp_d = int8 ? static_cast<double>(config.num_pages) * config.num_kv_heads : 0;
  const double rep_d =
      static_cast<double>(config.num_pages) * config.num_kv_heads * rep_width * (int8 ? 1 : 2) +
      exp_d;
  double needed = 0;
  for (int l = 0; l < config.num_layers; ++l)
    needed +=
        2 * kv_d +
        (config.rep_layers.empty() || config.rep_layers[static_cast<size_t>(l)] ? rep_d : 0.0);
  // The old cache (if any) goes first: its memory counts as free for the new one.
  CISA_RETURN_IF_ERROR(synchronize());
  for (Slot& s : slots_) s.planned = false;
  CISA_RETURN_IF_ERROR(reset_reuse(-1));  // selections of the old cache's sequences
  pools_.clear();
  has_cache_ = false;
  mirrored_ = false;
  const int64_t free_now = free_memory();
  if (needed > static_cast<double>(free_now))
    return resource_exhausted("cuda create_cache: " + std::to_string(config.num_pages) +
                              " pages x " + std::to_string(config.num_layers) + " layers need " +
                              gib(needed) + " (" +
                              std::to_string(static_cast<uint64_t>(std::min(needed, 1.8e19))) +
                              " bytes) of device memory; " + gib(static_cast<double>(free_now)) +
                              " (" + std::to_string(free_now) + " bytes) free");
  const auto kv_bytes = static_cast<int64_t>(kv_d), exp_bytes = static_cast<int64_t>(exp_d),
             rep_bytes = static_cast<int64_t>(rep_d) - exp_bytes;  // ≤ free: exact
  std::vector<LayerPools> pools(static_cast<size_t>(config.num_layers));
  for (int l = 0; l < config.num_layers; ++l) {
    LayerPools& p = pools[static_cast<size_t>(l)];
    const std::string what = "KV cache layer " + std::to_string(l);
    CISA_ASSIGN_OR_RETURN(p.k, DeviceMemory::allocate(kv_bytes, what + " keys"));
    CISA_ASSIGN_OR_RETURN(p.v, DeviceMemory::allocate(kv_bytes, what + " values"));
    // Zeros, not garbage: masked positions of a partial page are multiplied by 0, and 0 · NaN
    // would not be 0.
    CISA_RETURN_IF_ERROR(
        check_cuda(cudaMemsetAsync(p.k.get(), 0, static_cast<size_t>(kv_bytes), stream_), what));
    CISA_RETURN_IF_ERROR(
        check_cuda(cudaMemsetAsync(p.v.get(), 0, static_cast<size_t>(kv_bytes), stream_), what));
    if (config.rep_layers.empty() || config.rep_layers[static_cast<size_t>(l)]) {
      CISA_ASSIGN_OR_RETURN(p.reps, DeviceMemory::allocate(rep_bytes, what + " representatives"));
      CISA_RETURN_IF_ERROR(check_cuda(
          cudaMemsetAsync(p.reps.get(), 0, static_cast<size_t>(rep_bytes), stream_), what));
      if (int8) {
        CISA_ASSIGN_OR_RETURN(p.rep_exps, DeviceMemory::allocate(
                                              exp_bytes, what + " representative scale exponents"));
        CISA_RETURN_IF_ERROR(check_cuda(
            cudaMemsetAsync(p.rep_exps.get(), 0, static_cast<size_t>(exp_bytes), stream_), what));
      }
    }
  }
  // The block-table mirror at its largest (every page in some sequence's table), allocated once:
  // its address never changes, so plans and step graphs that name it stay valid.
  DeviceMemory tables;
  CISA_ASSIGN_OR_RETURN(tables, DeviceMemory::allocate(config.num_pages * int64_t{sizeof(int32_t)},
                                                       "device block tables"));
  CISA_RETURN_IF_ERROR(synchronize());
  d_tables_ = std::move(tables);
  pools_ = std::move(pools);
  config_ = config;
  table_ = PageTable(config.num_layers, kPageSize, config.num_pages);
  has_cache_ = true;
  return Status::Ok();
}

Result<SeqId> CudaBackend::add_sequence() {
  CISA_RETURN_IF_ERROR(require_cache("add_sequence"));
  return table_.add_sequence();
}

Status CudaBackend::release_sequence(SeqId seq) {
  CISA_RETURN_IF_ERROR(require_cache("release_sequence"));
  CISA_RETURN_IF_ERROR(table_.release_sequence(seq));
  return reset_reuse(seq);  // its SeqId may be handed out again
}

Status CudaBackend::reserve(SeqId seq, int64_t n) {
  CISA_RETURN_IF_ERROR(require_cache("reserve"));
  return table_.reserve(seq, n);
}

Status CudaBackend::sync_block_tables() {
  if (mirrored_ && mirrored_version_ == table_.version()) return Status::Ok();
  const std::vector<SeqId> live = table_.sequences();
  h_tables_.clear();
  h_offsets_.assign(1, 0);
  seq_row_.clear();
  for (SeqId s : live) {
    CISA_ASSIGN_OR_RETURN(std::span<const int32_t> pages, table_.block_table(s));
    if (static_cast<size_t>(s) >= seq_row_.size()) seq_row_.resize(static_cast<size_t>(s) + 1, -1);
    seq_row_[static_cast<size_t>(s)] = static_cast<int32_t>(h_offsets_.size()) - 1;
    h_tables_.insert(h_tables_.end(), pages.begin(), pages.end());
    h_offsets_.push_back(static_cast<int64_t>(h_tables_.size()));
  }
  const auto bytes = static_cast<int64_t>(h_tables_.size() * sizeof(int32_t));
  mirrored_ = false;  // until the upload below succeeds
  CISA_RETURN_IF_ERROR(d_tables_.reserve(bytes, "device block tables", stream_));
  if (bytes > 0)
    CISA_RETURN_IF_ERROR(stage_upload(d_tables_.get(), h_tables_.data(), bytes, "block tables"));
  mirrored_ = true;
  mirrored_version_ = table_.version();
  ++mirror_generation_;
  return Status::Ok();
}

Status CudaBackend::append_kv(int layer, std::span<const BatchEntry> batch, const float* k,
                              const float* v) {
  CISA_RETURN_IF_ERROR(require_cache("append_kv"));
  if (layer < 0 || layer >= config_.num_layers)
    return out_of_range("cuda append_kv: layer " + std::to_string(layer) + " outside [0, " +
                        std::to_string(config_.num_layers) + ")");
  // Every check first, so a failing call writes nothing: each entry's rows follow its sequence's
  // tokens of this layer (and the rows of earlier entries of the same sequence in this batch).
  h_slots_.clear();
  h_full_pages_.clear();
  std::vector<std::pair<SeqId, int64_t>> pending;  // tokens this call adds per sequence
  const bool reps = layer_has_reps(layer);
  for (size_t e = 0; e < batch.size(); ++e) {
    const BatchEntry& b = batch[e];
    const std::string where = "cuda append_kv: batch entry " + std::to_string(e) + ": ";
    if (b.count < 0) return invalid_argument(where + "negative count");
    CISA_ASSIGN_OR_RETURN(const int64_t written,
                          table_.tokens(layer, b.seq));  // checks the sequence
    auto it = std::find_if(pending.begin(), pending.end(),
                           [&](const auto& p) { return p.first == b.seq; });
    if (it == pending.end()) {
      pending.emplace_back(b.seq, 0);
      it = std::prev(pending.end());
    }
    const int64_t w = written + it->second;
    CISA_ASSIGN_OR_RETURN(const int64_t capacity, table_.reserved(b.seq));
    if (w + b.count > capacity)
      return resource_exhausted(where + "sequence " + std::to_string(b.seq) + " has room for " +
                                std::to_string(capacity) + " tokens; writing " +
                                std::to_string(b.count) + " after " + std::to_string(w) +
                                " needs reserve() first");
    CISA_ASSIGN_OR_RETURN(std::span<const int32_t> pages, table_.block_table(b.seq));
    for (int64_t i = 0; i < b.count; ++i) {
      const int64_t pos = w + i;
      const int32_t page = pages[static_cast<size_t>(pos / kPageSize)];
      h_slots_.push_back(int64_t{page} * kPageSize + pos % kPageSize);
      if (reps && pos % kPageSize == kPageSize - 1) h_full_pages_.push_back(page);
    }
    it->second += b.count;
  }
  const auto rows = static_cast<int64_t>(h_slots_.size());
  if (rows == 0) return Status::Ok();
  if (!k || !v) return invalid_argument("cuda append_kv: null K or V pointer");
  // The slots and filled pages begin_step uploaded for the step, when this layer's are those
  // (every layer of a step that appends once per layer); else this call uploads its own.
  const int32_t* d_full = nullptr;
  const int64_t* d_slots = nullptr;
  const auto n_full = static_cast<int64_t>(h_full_pages_.size());
  if (step_ready_ && h_slots_ == step_slots_ && (!reps || h_full_pages_ == step_full_pages_)) {
    d_slots = d_step_.as<int64_t>();
    d_full = reinterpret_cast<const int32_t*>(d_step_.as<uint8_t>() + step_pages_offset_);
  } else {
    CISA_RETURN_IF_ERROR(d_slots_.reserve(rows * 8, "append_kv token slots", stream_));
    CISA_RETURN_IF_ERROR(stage_upload(d_slots_.get(), h_slots_.data(), rows * 8, "append_kv"));
    d_slots = d_slots_.as<int64_t>();
    if (n_full > 0) {
      CISA_RETURN_IF_ERROR(d_full_pages_.reserve(n_full * 4, "append_kv filled pages", stream_));
      CISA_RETURN_IF_ERROR(
          stage_upload(d_full_pages_.get(), h_full_pages_.data(), n_full * 4, "append_kv"));
      d_full = d_full_pages_.as<int32_t>();
    }
  }
  LayerPools& p = pools_[static_cast<size_t>(layer)];
  // The pools and the representatives' precision too (a new cache may reuse the old addresses).
  if (!graph_skip(10, {arg(k), arg(v), arg(d_slots), arg(rows), arg(int64_t{layer}), arg(d_full),
                       arg(n_full), arg(p.k.get()), arg(p.reps.get()), arg(p.rep_exps.get()),
                       arg(static_cast<int64_t>(config_.rep_precision))})) {
    CISA_RETURN_IF_ERROR(launched(
        detail::launch_append_kv(k, v, d_slots, rows, config_.num_kv_heads, config_.head_dim,
                                 p.k.as<uint16_t>(), p.v.as<uint16_t>(), stream_),
        "append_kv"));
    if (n_full > 0)
      CISA_RETURN_IF_ERROR(run_update_reps(device_layer(layer), d_full, n_full, stream_));
  }
  for (const auto& [seq, n] : pending) CISA_RETURN_IF_ERROR(table_.mark_written(layer, seq, n));
  return Status::Ok();
}

}  // namespace cisa::cuda
