// cisa/cpu/kv_cache.h — the paged KV cache and its representative cache.
//
// A pool of fixed-size physical pages (B = page_size tokens each, 16 by default) shared by many
// sequences. Each sequence owns a block table mapping its logical pages (chunk j = positions
// jB … jB+B−1) to physical page IDs; physical pages of one sequence are in general not
// contiguous. One physical page ID addresses that page in every layer's pool. Per layer the pools
// are laid out so that one page of one KV group is contiguous:
//   K, V:           [num_pages][num_kv_heads][page_size][head_dim]   (f32 or bf16)
//   representative: [num_pages][num_kv_heads][rep_width]             (same dtype as K/V)
// where rep_width = head_dim for `mean` (SPEC §1: mean of the page's keys) and 2·head_dim for
// `quest` (per-channel min, then max) and `moment` (mean, then variance). A page's representative
// is written when its last token is written (the partial last page has none).
//
//   auto cache = *cisa::PagedKvCache::create({.num_layers = 2, .num_kv_heads = 1, .head_dim = 128,
//                                            .num_pages = 4096});
//   cisa::SeqId s = *cache->add_sequence();
//   CISA_RETURN_IF_ERROR(cache->reserve(s, n));            // room for n more tokens, all layers
//   for (int l = 0; l < 2; ++l)
//     // k, v: [n][num_kv_heads][head_dim]
//     CISA_RETURN_IF_ERROR(cache->append(l, s, n, k[l], v[l]));
//
// Every failing call returns a Status and leaves the cache unchanged and usable.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cisa/core/batch.h"
#include "cisa/core/page_table.h"
#include "cisa/core/plan.h"
#include "cisa/core/rep_quant.h"
#include "cisa/core/status.h"

namespace cisa {

enum class KvDtype { kF32, kBF16 };
// What a page's representative is (SPEC §1 is the mean; the others are for comparison):
//   kMean: the mean key;
//   kQuest: per-channel min and max (Quest's bound q·r = Σ_i max(q_i·min_i, q_i·max_i));
//   kMoment: the mean and the per-channel variance σ², scored as the log of a page's expected
//     attention weight if its keys were Gaussian with that diagonal covariance:
//     q·μ/√d + Σ_i q_i²σ_i²/(2d) (the mean alone is the first term, a lower bound by Jensen).
enum class RepKind { kMean, kQuest, kMoment };

// Values per representative: head_dim for kMean, 2·head_dim for the others (both caches use it).
inline int rep_width(RepKind r, int head_dim) {
  return r == RepKind::kMean ? head_dim : 2 * head_dim;
}

const char* kv_dtype_name(KvDtype d);
const char* rep_kind_name(RepKind r);
Result<KvDtype> parse_kv_dtype(const std::string& s);  // "f32" | "bf16"
Result<RepKind> parse_rep_kind(const std::string& s);  // "mean" | "quest" | "moment"

struct KvCacheConfig {
  int num_layers = 1;
  int num_kv_heads = 1;
  int head_dim = 128;     // multiple of 8
  int page_size = 16;     // tokens per page (B)
  int64_t num_pages = 0;  // pool capacity, in pages (each page spans all layers)
  KvDtype dtype = KvDtype::kF32;
  RepKind rep = RepKind::kMean;
  // kFp8 / kInt8 (kMean and kQuest only): each representative is rounded to 8 bits with its own
  // power-of-two scale (core/rep_quant.h) and stored dequantized in `dtype` (exact in f32 and
  // bf16), so selection sees what a cache of 1-byte representatives would hold. CPU cache only:
  // a study of quality before a device layout exists (docs/design.md).
  RepPrecision rep_precision = RepPrecision::kNative;
  // Layers that keep a representative cache (the global-attention layers). Empty: every layer.
  std::vector<bool> rep_layers;
};

// Bytes a cache with this configuration allocates (K, V and representatives, all layers).
int64_t kv_cache_bytes(const KvCacheConfig& config);

class PagedKvCache {
 public:
  static Result<std::unique_ptr<PagedKvCache>> create(const KvCacheConfig& config);
  // A cache over pools the caller owns, laid out as above: per layer one K, one V and one
  // representative pool (null for a layer without representatives). Nothing is allocated,
  // zeroed or freed for them; the caller keeps them alive while the cache is in use. Sequences
  // come from adopt_sequence (block tables made elsewhere, e.g. the Python bindings' tensors).
  static Result<std::unique_ptr<PagedKvCache>> wrap(const KvCacheConfig& config,
                                                    std::span<void* const> k,
                                                    std::span<void* const> v,
                                                    std::span<void* const> reps);

  const KvCacheConfig& config() const { return config_; }
  int page_size() const { return config_.page_size; }
  int head_dim() const { return config_.head_dim; }
  int num_kv_heads() const { return config_.num_kv_heads; }
  int num_layers() const { return config_.num_layers; }
  bool has_reps(int layer) const;
  int rep_width() const { return cisa::rep_width(config_.rep, head_dim()); }

  // ---- sequences (the bookkeeping is a PageTable, page_table.h) ----
  const PageTable& pages() const { return table_; }
  Result<SeqId> add_sequence() { return table_.add_sequence(); }
  // A sequence over pages whose K/V are already in the pools (PageTable::adopt_sequence).
  Result<SeqId> adopt_sequence(std::span<const int32_t> pages, int64_t tokens) {
    return table_.adopt_sequence(pages, tokens);
  }
  // Returns every page of the sequence to the pool; the id may be reused later.
  Status release_sequence(SeqId seq) { return table_.release_sequence(seq); }
  // Makes room for `n` more tokens after the sequence's current capacity use (allocates pages).
  // All or nothing: on a pool too small, nothing is allocated.
  Status reserve(SeqId seq, int64_t n) { return table_.reserve(seq, n); }
  // Writes K/V for the next `n` positions of one layer (positions tokens(layer, seq) …),
  // k, v: [n][num_kv_heads][head_dim] f32, converted to the storage dtype. Representatives of the
  // pages whose last slot this write fills are computed from the stored keys.
  Status append(int layer, SeqId seq, int64_t n, const float* k, const float* v);
  // Tokens written so far in one layer; length() is the minimum over layers.
  Result<int64_t> tokens(int layer, SeqId seq) const { return table_.tokens(layer, seq); }
  Result<int64_t> length(SeqId seq) const { return table_.length(seq); }
  bool has_sequence(SeqId seq) const { return table_.has_sequence(seq); }
  // Physical page IDs of the sequence's logical pages, in order.
  Result<std::span<const int32_t>> block_table(SeqId seq) const { return table_.block_table(seq); }
  // The sequence that owns a physical page, or -1 when the page is free.
  SeqId page_owner(int32_t page) const { return table_.page_owner(page); }
  int64_t free_pages() const { return table_.free_pages(); }
  int64_t num_pages() const { return config_.num_pages; }

  // Recomputes the representatives of the listed full pages of one layer from the keys stored
  // in them (as append does when a page fills). Errors for a layer without representatives and
  // a page ID out of range.
  Status update_reps(int layer, std::span<const int32_t> pages);

  // ---- raw page access (for attention and scoring kernels) ----
  // Element size of K/V/rep storage in bytes (4 for f32, 2 for bf16).
  int elem_bytes() const { return config_.dtype == KvDtype::kF32 ? 4 : 2; }
  // [page_size][head_dim] for one (layer, page, kv head).
  const void* k_page(int layer, int32_t page, int kv_head) const;
  const void* v_page(int layer, int32_t page, int kv_head) const;
  // [rep_width] for one (layer, page, kv head); only meaningful for a full page of a rep layer.
  const void* rep(int layer, int32_t page, int kv_head) const;
  // Base pointers of a layer's pools, for backends that index pages themselves.
  const void* k_pool(int layer) const { return k_[layer].get(); }
  const void* v_pool(int layer) const { return v_[layer].get(); }
  const void* rep_pool(int layer) const { return reps_[layer].get(); }

 private:
  struct FreeDeleter {
    bool owned = true;  // false: a pool of wrap()'s caller
    void operator()(void* p) const;
  };
  using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

  explicit PagedKvCache(const KvCacheConfig& config);
  void store_row(void* dst, const float* src) const;  // head_dim values
  void update_rep(int layer, int32_t page);
  int64_t page_stride() const;  // elements per page per layer (all KV heads)

  KvCacheConfig config_;
  std::vector<Buffer> k_, v_, reps_;
  PageTable table_;
};

// The core's plan functions (plan.h) over a CPU cache's page table and shape.
Status validate_batch(const PagedKvCache& cache, int layer, std::span<const BatchEntry> batch);
Status plan_dense(const PagedKvCache& cache, int layer, std::span<const BatchEntry> batch,
                  int64_t sliding_window, PageLists* out);
Status plan_query_groups(const PagedKvCache& cache, std::span<const BatchEntry> batch,
                         const SelectionParams& p, PageLists* out);

}  // namespace cisa
