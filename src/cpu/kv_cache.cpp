// The paged KV cache: page pool, block tables, K/V storage and the representative cache.
#include "cisa/cpu/kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include <sys/mman.h>

#include "cisa/core/bf16.h"

namespace cisa {

const char* kv_dtype_name(KvDtype d) {
  return d == KvDtype::kF32 ? "f32" : "bf16";
}
const char* rep_kind_name(RepKind r) {
  return r == RepKind::kMean ? "mean" : r == RepKind::kQuest ? "quest" : "moment";
}

Result<KvDtype> parse_kv_dtype(const std::string& s) {
  if (s == "f32") return KvDtype::kF32;
  if (s == "bf16") return KvDtype::kBF16;
  return invalid_argument("unknown KV dtype '" + s + "' (expected f32 or bf16)");
}

Result<RepKind> parse_rep_kind(const std::string& s) {
  if (s == "mean") return RepKind::kMean;
  if (s == "quest") return RepKind::kQuest;
  if (s == "moment") return RepKind::kMoment;
  return invalid_argument("unknown representative '" + s + "' (expected mean or quest)");
}

void PagedKvCache::FreeDeleter::operator()(void* p) const {
  if (owned) std::free(p);
}

namespace {

int64_t elem_size(KvDtype d) {
  return d == KvDtype::kF32 ? 4 : 2;
}

Status validate_config(const KvCacheConfig& c) {
  if (c.num_layers <= 0)
    return invalid_argument("num_layers must be positive (got " + std::to_string(c.num_layers) +
                            ")");
  if (c.num_kv_heads <= 0)
    return invalid_argument("num_kv_heads must be positive (got " + std::to_string(c.num_kv_heads) +
                            ")");
  if (c.head_dim <= 0 || c.head_dim % 8 != 0)
    return invalid_argument("head_dim must be a positive multiple of 8 (got " +
                            std::to_string(c.head_dim) + ")");
  if (c.page_size <= 0)
    return invalid_argument("page_size must be positive (got " + std::to_string(c.page_size) + ")");
  if (c.num_pages <= 0)
    return invalid_argument("num_pages must be positive (got " + std::to_string(c.num_pages) + ")");
  if (c.num_pages > std::numeric_limits<int32_t>::max())
    return invalid_argument("num_pages must fit in 32 bits (got " + std::to_string(c.num_pages) +
                            ")");
  if (!c.rep_layers.empty() && static_cast<int>(c.rep_layers.size()) != c.num_layers)
    return invalid_argument("rep_layers has " + std::to_string(c.rep_layers.size()) +
                            " entries but the cache has " + std::to_string(c.num_layers) +
                            " layers");
  if (c.rep_precision != RepPrecision::kNative && c.rep == RepKind::kMoment)
    return invalid_argument(std::string("representative precision ") +
                            rep_precision_name(c.rep_precision) +
                            " needs mean or quest representatives (a moment representative's "
                            "mean and variance would share one scale)");
  return Status::Ok();
}

}  // namespace

int64_t kv_cache_bytes(const KvCacheConfig& c) {
  const int64_t es = elem_size(c.dtype);
  const int64_t kv = 2 * c.num_pages * c.num_kv_heads * c.page_size * c.head_dim * es;
  const int64_t rep_w = rep_width(c.rep, c.head_dim);
  int64_t rep_layers = c.num_layers;
  if (!c.rep_layers.empty())
    rep_layers = std::count(c.rep_layers.begin(), c.rep_layers.end(), true);
  return kv * c.num_layers + rep_layers * c.num_pages * c.num_kv_heads * rep_w * es;
}

PagedKvCache::PagedKvCache(const KvCacheConfig& config)
    : config_(config), table_(config.num_layers, config.page_size, config.num_pages) {}

Result<std::unique_ptr<PagedKvCache>> PagedKvCache::create(const KvCacheConfig& config) {
  CISA_RETURN_IF_ERROR(validate_config(config));
  std::unique_ptr<PagedKvCache> cache(new (std::nothrow) PagedKvCache(config));
  if (!cache) return resource_exhausted("cannot allocate the KV cache object");
  const int64_t es = elem_size(config.dtype);
  const int64_t kv_bytes = config.num_pages * cache->page_stride() * es;
  const int64_t rep_bytes = config.num_pages * config.num_kv_heads * cache->rep_width() * es;
  auto alloc = [](int64_t bytes) -> Buffer {
    // 2 MiB aligned and advised as huge pages: selected pages are scattered over the pool, and
    // with 4 KiB pages nearly every one of them would cost a TLB miss. Zero-filled so that
    // never-written slots hold finite values.
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t size = static_cast<size_t>((bytes + kHuge - 1) / kHuge * kHuge);
    Buffer b(static_cast<uint8_t*>(std::aligned_alloc(kHuge, size)));
    if (!b) return b;
#ifdef MADV_HUGEPAGE
    madvise(b.get(), size, MADV_HUGEPAGE);  // a hint: failure only costs speed
#endif
    std::memset(b.get(), 0, size);
    return b;
  };
  for (int l = 0; l < config.num_layers; ++l) {
    Buffer k = alloc(kv_bytes), v = alloc(kv_bytes);
    Buffer r = cache->has_reps(l) ? alloc(rep_bytes) : Buffer();
    if (!k || !v || (cache->has_reps(l) && !r))
      return resource_exhausted("cannot allocate the KV cache: " +
                                std::to_string(kv_cache_bytes(config) >> 20) + " MiB requested");
    cache->k_.push_back(std::move(k));
    cache->v_.push_back(std::move(v));
    cache->reps_.push_back(std::move(r));
  }
  return cache;
}

Result<std::unique_ptr<PagedKvCache>> PagedKvCache::wrap(const KvCacheConfig& config,
                                                         std::span<void* const> k,
                                                         std::span<void* const> v,
                                                         std::span<void* const> reps) {
  CISA_RETURN_IF_ERROR(validate_config(config));
  const auto layers = static_cast<size_t>(config.num_layers);
  if (k.size() != layers || v.size() != layers || reps.size() != layers)
    return invalid_argument("wrap: " + std::to_string(config.num_layers) +
                            " layers need as many K, V and representative pools (got " +
                            std::to_string(k.size()) + ", " + std::to_string(v.size()) + ", " +
                            std::to_string(reps.size()) + ")");
  std::unique_ptr<PagedKvCache> cache(new (std::nothrow) PagedKvCache(config));
  if (!cache) return resource_exhausted("cannot allocate the KV cache object");
  for (size_t l = 0; l < layers; ++l) {
    const bool want_reps = cache->has_reps(static_cast<int>(l));
    if (!k[l] || !v[l] || (want_reps && !reps[l]))
      return invalid_argument("wrap: layer " + std::to_string(l) + " has a null pool");
    cache->k_.emplace_back(static_cast<uint8_t*>(k[l]), FreeDeleter{false});
    cache->v_.emplace_back(static_cast<uint8_t*>(v[l]), FreeDeleter{false});
    cache->reps_.emplace_back(want_reps ? static_cast<uint8_t*>(reps[l]) : nullptr,
                              FreeDeleter{false});
  }
  return cache;
}

Status PagedKvCache::update_reps(int layer, std::span<const int32_t> pages) {
  if (layer < 0 || layer >= config_.num_layers)
    return out_of_range("update_reps: layer " + std::to_string(layer) + " out of range [0, " +
                        std::to_string(config_.num_layers) + ")");
  if (!has_reps(layer))
    return failed_precondition("update_reps: layer " + std::to_string(layer) +
                               " keeps no representatives");
  for (size_t i = 0; i < pages.size(); ++i)
    if (pages[i] < 0 || pages[i] >= config_.num_pages)
      return out_of_range("update_reps: page ID " + std::to_string(pages[i]) + " (entry " +
                          std::to_string(i) + ") is out of range [0, " +
                          std::to_string(config_.num_pages) + ")");
  for (int32_t p : pages) update_rep(layer, p);
  return Status::Ok();
}

bool PagedKvCache::has_reps(int layer) const {
  return config_.rep_layers.empty() || config_.rep_layers[static_cast<size_t>(layer)];
}

int64_t PagedKvCache::page_stride() const {
  return static_cast<int64_t>(config_.num_kv_heads) * config_.page_size * config_.head_dim;
}

void PagedKvCache::store_row(void* dst, const float* src) const {
  const int d = config_.head_dim;
  if (config_.dtype == KvDtype::kF32) {
    std::copy(src, src + d, static_cast<float*>(dst));
  } else {
    auto* h = static_cast<uint16_t*>(dst);
    for (int i = 0; i < d; ++i) h[i] = f32_to_bf16(src[i]);
  }
}

Status PagedKvCache::append(int layer, SeqId seq, int64_t n, const float* k, const float* v) {
  if (n > 0 && (!k || !v)) return invalid_argument("append: null K or V pointer");
  CISA_ASSIGN_OR_RETURN(const int64_t w, table_.tokens(layer, seq));  // checks seq and layer
  // Checks n against the reserved room; records the write, done below, before the copy.
  CISA_RETURN_IF_ERROR(table_.mark_written(layer, seq, n));
  const std::span<const int32_t> pages = *table_.block_table(seq);
  const int64_t B = config_.page_size, d = config_.head_dim, H = config_.num_kv_heads;
  const int64_t es = elem_size(config_.dtype);
  uint8_t* kb = k_[static_cast<size_t>(layer)].get();
  uint8_t* vb = v_[static_cast<size_t>(layer)].get();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t pos = w + i;
    const int64_t page = pages[static_cast<size_t>(pos / B)];
    const int64_t slot = pos % B;
    for (int64_t g = 0; g < H; ++g) {
      const int64_t off = ((page * H + g) * B + slot) * d * es;
      store_row(kb + off, k + (i * H + g) * d);
      store_row(vb + off, v + (i * H + g) * d);
    }
    if (slot == B - 1 && has_reps(layer)) update_rep(layer, static_cast<int32_t>(page));
  }
  return Status::Ok();
}

// Representative of one full page: per KV head, the mean (or per-channel min and max, or the
// mean and the population variance) of the page's stored keys, accumulated in double and rounded
// to the storage dtype.
void PagedKvCache::update_rep(int layer, int32_t page) {
  const int B = config_.page_size, d = config_.head_dim, H = config_.num_kv_heads;
  const int rw = rep_width();
  std::vector<double> acc(static_cast<size_t>(rw));
  std::vector<float> row(static_cast<size_t>(rw));
  uint8_t* rb = reps_[static_cast<size_t>(layer)].get();
  for (int g = 0; g < H; ++g) {
    const void* kp = k_page(layer, page, g);
    auto key = [&](int s, int i) -> float {
      return config_.dtype == KvDtype::kF32
                 ? static_cast<const float*>(kp)[s * d + i]
                 : bf16_to_f32(static_cast<const uint16_t*>(kp)[s * d + i]);
    };
    if (config_.rep == RepKind::kMean) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int s = 0; s < B; ++s)
        for (int i = 0; i < d; ++i) acc[static_cast<size_t>(i)] += key(s, i);
      for (int i = 0; i < d; ++i)
        row[static_cast<size_t>(i)] = static_cast<float>(acc[static_cast<size_t>(i)] / B);
    } else if (config_.rep == RepKind::kMoment) {
      for (int i = 0; i < d; ++i) {
        double sum = 0, sq = 0;
        for (int s = 0; s < B; ++s) sum += key(s, i);
        const double mean = sum / B;
        for (int s = 0; s < B; ++s) sq += (key(s, i) - mean) * (key(s, i) - mean);
        row[static_cast<size_t>(i)] = static_cast<float>(mean);
        row[static_cast<size_t>(d + i)] = static_cast<float>(sq / B);
      }
    } else {
      for (int i = 0; i < d; ++i) {
        float lo = key(0, i), hi = lo;
        for (int s = 1; s < B; ++s) {
          lo = std::min(lo, key(s, i));
          hi = std::max(hi, key(s, i));
        }
        row[static_cast<size_t>(i)] = lo;
        row[static_cast<size_t>(d + i)] = hi;
      }
    }
    quantize_rep(config_.rep_precision, row);
    void* dst = rb + (static_cast<int64_t>(page) * H + g) * rw * elem_size(config_.dtype);
    if (config_.dtype == KvDtype::kF32) {
      std::copy(row.begin(), row.end(), static_cast<float*>(dst));
    } else {
      auto* h = static_cast<uint16_t*>(dst);
      for (int i = 0; i < rw; ++i) h[i] = f32_to_bf16(row[static_cast<size_t>(i)]);
    }
  }
}

const void* PagedKvCache::k_page(int layer, int32_t page, int kv_head) const {
  const int64_t off = (static_cast<int64_t>(page) * config_.num_kv_heads + kv_head) *
                      config_.page_size * config_.head_dim;
  return k_[static_cast<size_t>(layer)].get() + off * elem_size(config_.dtype);
}

const void* PagedKvCache::v_page(int layer, int32_t page, int kv_head) const {
  const int64_t off = (static_cast<int64_t>(page) * config_.num_kv_heads + kv_head) *
                      config_.page_size * config_.head_dim;
  return v_[static_cast<size_t>(layer)].get() + off * elem_size(config_.dtype);
}

const void* PagedKvCache::rep(int layer, int32_t page, int kv_head) const {
  const int64_t off = (static_cast<int64_t>(page) * config_.num_kv_heads + kv_head) * rep_width();
  return reps_[static_cast<size_t>(layer)].get() + off * elem_size(config_.dtype);
}

Status validate_batch(const PagedKvCache& cache, int layer, std::span<const BatchEntry> batch) {
  return validate_batch(cache.pages(), layer, batch);
}

Status plan_dense(const PagedKvCache& cache, int layer, std::span<const BatchEntry> batch,
                  int64_t sliding_window, PageLists* out) {
  return plan_dense(cache.pages(), cache.num_kv_heads(), layer, batch, sliding_window, out);
}

Status plan_query_groups(const PagedKvCache& cache, std::span<const BatchEntry> batch,
                         const SelectionParams& p, PageLists* out) {
  return plan_query_groups(cache.page_size(), batch, p, out);
}

}  // namespace cisa
