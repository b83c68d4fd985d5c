// The CPU backend of the model runtime (backend.h): host memory, the reference kernels.
//
// Every operation runs the code the model ran before the backend seam existed: quant.h matmul on
// the GGUF blocks (or on f32 matrices), model_ops.h's per-row loops threaded over rows, the
// PagedKvCache, select_pages, plan_dense, attend and attend_llamacpp. Backend memory is host
// memory, so a pointer from allocate() is an ordinary host pointer.
//
// Planning is lazy here: plan() records the batch and the spec (and, for a CISA slot, cuts the
// query groups), and a dense slot's page lists are built by the first attend() that uses it, after
// that layer's K/V are written (plan_dense checks them), then shared by every later layer.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cisa/core/backend.h"
#include "cisa/core/bf16.h"
#include "cisa/core/thread_pool.h"
#include "cisa/cpu/attention.h"
#include "cisa/cpu/attention_llamacpp.h"
#include "cisa/cpu/selection.h"
#include "cisa/model/sampling.h"
#include "model/model_ops.h"

namespace cisa {
namespace {

// One value of the backends' shared generator (splitmix64 of seed and index, four 16-bit
// uniforms summed, centred and scaled to unit variance): the CUDA fill uses the same formula,
// so a synthetic model holds the same weights on either backend (up to the device's rounding).
float random_value(uint64_t seed, uint64_t i, float scale) {
  uint64_t x = seed * 0x100000001b3ull + i + 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  float s = 0.0f;
  for (int j = 0; j < 4; ++j)
    s += static_cast<float>((x >> (16 * j)) & 0xffffu) * (1.0f / 65536.0f);
  return (s - 2.0f) * 1.7320508f * scale;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

class CpuBuffer final : public BackendBuffer {
 public:
  CpuBuffer(void* p, int64_t bytes) : p_(p), bytes_(bytes) {}
  void* data() override { return p_.get(); }
  int64_t bytes() const override { return bytes_; }

 private:
  std::unique_ptr<void, FreeDeleter> p_;
  int64_t bytes_;
};

struct Slot {
  bool planned = false;    // plan() ran for this step
  bool has_lists = false;  // lists hold the step's pages (dense: built; CISA: for lists_layer)
  int lists_layer = -1;    // CISA: the layer select() ran for; −2 after set_page_lists
  PlanSpec spec;
  std::vector<BatchEntry> batch;
  PageLists lists;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, bool bf16_matmul) : pool_(threads), bf16_matmul_(bf16_matmul) {}

  BackendKind kind() const override { return BackendKind::kCpu; }
  std::string description() const override {
    return std::string("cpu (") + matmul_isa() + ", " + std::to_string(pool_.num_threads()) +
           " threads)";
  }

  Result<std::unique_ptr<BackendBuffer>> allocate(int64_t bytes, const char* what) override {
    if (bytes < 0) return invalid_argument(std::string("allocate ") + what + ": negative size");
    const int64_t rounded = (std::max<int64_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, static_cast<size_t>(rounded));
    if (!p)
      return resource_exhausted(std::string("cannot allocate ") + std::to_string(bytes) +
                                " bytes of host memory for " + what);
    return std::unique_ptr<BackendBuffer>(new CpuBuffer(p, bytes));
  }
  Status upload(void* dst, const void* src, int64_t bytes) override {
    return copy(dst, src, bytes, "upload");
  }
  Status download(void* dst, const void* src, int64_t bytes) override {
    return copy(dst, src, bytes, "download");
  }
  Status synchronize() override { return Status::Ok(); }
  // MemAvailable of /proc/meminfo (free memory plus what the page cache can give back), else the
  // free pages sysconf reports.
  int64_t free_memory() const override {
    if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
      char line[256];
      long long kb = -1;
      while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
      std::fclose(f);
      if (kb >= 0) return static_cast<int64_t>(kb) * 1024;
    }
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? int64_t{pages} * page : 0;
  }

  // ---- weights ----
  Result<BackendMatrix> bind_matrix(const WeightView& w) override {
    if (!ggml_type_is_supported(w.type))
      return unimplemented(std::string("bind_matrix: type ") + ggml_type_name(w.type) +
                           " is not supported");
    if (w.n_rows <= 0 || w.n_cols <= 0 || !w.data)
      return invalid_argument("bind_matrix: empty matrix");
    if (bf16_matmul_) return bind_rounded(w);
    views_.push_back(w);
    return BackendMatrix{w.n_rows, w.n_cols, static_cast<int>(views_.size() - 1)};
  }
  Result<BackendMatrix> random_matrix(int64_t rows, int64_t cols, uint64_t seed,
                                      float scale) override {
    if (rows <= 0 || cols <= 0) return invalid_argument("random_matrix: empty shape");
    const int64_t bytes = rows * cols * static_cast<int64_t>(sizeof(float));
    if (bytes > free_memory())
      return resource_exhausted("random_matrix: " + std::to_string(rows) + " x " +
                                std::to_string(cols) + " f32 needs " + std::to_string(bytes) +
                                " bytes, more than the host's free memory");
    std::vector<float>& m = owned_.emplace_back(static_cast<size_t>(rows * cols));
    float* p = m.data();
    pool_.parallel_for(rows, [&](int64_t r, int) {
      for (int64_t c = 0; c < cols; ++c)
        p[r * cols + c] = random_value(seed, static_cast<uint64_t>(r * cols + c), scale);
    });
    owned_bytes_ += bytes;
    return bind_matrix(WeightView::f32(p, rows, cols));
  }
  Result<BackendMatrix> bind_owned_matrix(std::vector<float> values, int64_t n_rows,
                                          int64_t n_cols) override {
    if (n_rows <= 0 || n_cols <= 0 || values.size() != static_cast<size_t>(n_rows * n_cols))
      return invalid_argument("bind_owned_matrix: " + std::to_string(values.size()) +
                              " values for a " + std::to_string(n_rows) + " x " +
                              std::to_string(n_cols) + " matrix");
    const WeightView w = WeightView::f32(values.data(), n_rows, n_cols);
    if (bf16_matmul_) return bind_rounded(w);  // a rounded copy; `values` go with this call
    owned_.push_back(std::move(values));       // the buffer moves, the view stays valid
    owned_bytes_ += n_rows * n_cols * static_cast<int64_t>(sizeof(float));
    return bind_matrix(w);
  }
  Status read_matrix_rows(const BackendMatrix& m, int64_t first_row, int64_t rows,
                          float* host_out) override {
    CISA_ASSIGN_OR_RETURN(const WeightView* w, view(m, "read_matrix_rows"));
    if (first_row < 0 || rows < 0 || first_row > w->n_rows - rows)
      return out_of_range("read_matrix_rows: rows [" + std::to_string(first_row) + ", " +
                          std::to_string(first_row + rows) + ") outside the matrix's " +
                          std::to_string(w->n_rows));
    if (rows > 0 && !host_out) return invalid_argument("read_matrix_rows: null output");
    for (int64_t r = 0; r < rows; ++r)
      CISA_RETURN_IF_ERROR(
          dequantize_row(w->type, w->row(first_row + r), host_out + r * w->n_cols, w->n_cols));
    return Status::Ok();
  }
  Result<const float*> bind_vector(std::span<const float> v) override {
    owned_.emplace_back(v.begin(), v.end());
    owned_bytes_ += static_cast<int64_t>(v.size() * sizeof(float));
    return static_cast<const float*>(owned_.back().data());
  }
  int64_t weight_bytes() const override {
    int64_t b = owned_bytes_;  // random matrices and gains; views of the file count as mapped
    for (const WeightView& w : views_) b += static_cast<int64_t>(w.row_bytes) * w.n_rows;
    return b;
  }

  // ---- operations ----
  Status embed(const BackendMatrix& table, const int32_t* tokens, int64_t rows, float scale,
               float* x) override {
    CISA_ASSIGN_OR_RETURN(const WeightView* w, view(table, "embed"));
    for (int64_t r = 0; r < rows; ++r)
      if (tokens[r] < 0 || tokens[r] >= w->n_rows)
        return out_of_range("embed: token " + std::to_string(tokens[r]) + " outside [0, " +
                            std::to_string(w->n_rows) + ")");
    const int64_t E = w->n_cols;
    for_rows(rows, [&](int64_t r) {
      float* xr = x + r * E;
      (void)dequantize_row(w->type, w->row(tokens[r]), xr, E);  // type checked at bind
      if (scale != 1.0f)
        for (int64_t i = 0; i < E; ++i) xr[i] *= scale;
    });
    return Status::Ok();
  }
  Status matmul(const BackendMatrix& m, const float* x, float* y, int64_t rows,
                int64_t ldy) override {
    CISA_ASSIGN_OR_RETURN(const WeightView* w, view(m, "matmul"));
    if (bf16_matmul_ && rows > 0) {
      // The input as the CUDA backend's GEMM sees it: rounded to bf16.
      const size_t n = static_cast<size_t>(rows * w->n_cols);
      rounded_input_.resize(n);
      for (size_t i = 0; i < n; ++i) rounded_input_[i] = bf16_to_f32(f32_to_bf16(x[i]));
      x = rounded_input_.data();
    }
    return cisa::matmul(*w, x, y, rows, pool_, &mm_, 0, ldy);
  }
  Status rms_norm(const float* x, const float* w, float* y, int64_t rows, int n,
                  float eps) override {
    if (n <= 0) return invalid_argument("rms_norm: n must be positive");
    for_rows(rows, [&](int64_t r) { ops::rms_norm(x + r * n, w, y + r * n, n, eps); });
    return Status::Ok();
  }
  Status rope(float* x, int64_t rows, int heads, int d, const float* cos, const float* sin,
              RopeStyle style) override {
    if (d <= 0 || d % 2 != 0 || heads <= 0)
      return invalid_argument("rope: head_dim must be positive and even, heads positive");
    const int half = d / 2;
    for_rows(rows, [&](int64_t r) {
      for (int h = 0; h < heads; ++h)
        ops::rope_apply(x + (r * heads + h) * d, cos + r * half, sin + r * half, d, style);
    });
    return Status::Ok();
  }
  Status gated_activation(Activation act, const float* gate, const float* up, float* out,
                          int64_t rows, int64_t n) override {
    for_rows(rows, [&](int64_t r) {
      ops::gated_activation(act, gate + r * n, up + r * n, out + r * n, n);
    });
    return Status::Ok();
  }
  Status add(float* y, const float* x, int64_t n) override {
    for_chunks(n, [&](int64_t i0, int64_t len) { ops::add_inplace(y + i0, x + i0, len); });
    return Status::Ok();
  }
  Status round_f16(float* x, int64_t n) override {
    for_chunks(n, [&](int64_t i0, int64_t len) { ops::round_to_f16(x + i0, len); });
    return Status::Ok();
  }
  Status mean_heads(const float* q, int64_t rows, int hq, int hkv, int d, float* out) override {
    if (hkv <= 0 || hq % hkv != 0)
      return invalid_argument("mean_heads: " + std::to_string(hq) +
                              " query heads do not split into " + std::to_string(hkv) +
                              " KV groups");
    const int hg = hq / hkv;
    const float inv = 1.0f / static_cast<float>(hg);
    for_rows(rows, [&](int64_t r) {
      for (int g = 0; g < hkv; ++g) {
        const float* src = q + (r * hq + g * hg) * d;
        float* dst = out + (r * hkv + g) * d;
        for (int i = 0; i < d; ++i) {
          float s = 0.0f;
          for (int h = 0; h < hg; ++h) s += src[h * d + i];
          dst[i] = s * inv;
        }
      }
    });
    return Status::Ok();
  }
  Status fill_random(float* x, int64_t n, uint64_t seed, float scale) override {
    for_chunks(n, [&](int64_t i0, int64_t len) {
      for (int64_t i = i0; i < i0 + len; ++i)
        x[i] = random_value(seed, static_cast<uint64_t>(i), scale);
    });
    return Status::Ok();
  }
  Status gather_rows(const float* x, std::span<const int64_t> rows, int64_t width,
                     float* out) override {
    for (size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] < 0) return invalid_argument("gather_rows: negative row index");
      std::memcpy(out + static_cast<int64_t>(i) * width, x + rows[i] * width,
                  static_cast<size_t>(width) * sizeof(float));
    }
    return Status::Ok();
  }
  Status argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out) override {
    if (rows < 0 || n < 0) return invalid_argument("argmax_rows: negative rows or width");
    if (rows == 0) return Status::Ok();
    if (!x || !out) return invalid_argument("argmax_rows: null input or output");
    for (int64_t r = 0; r < rows; ++r) out[r] = argmax({x + r * n, static_cast<size_t>(n)});
    return Status::Ok();
  }

  // ---- cache ----
  Status create_cache(const KvCacheConfig& config) override {
    CISA_ASSIGN_OR_RETURN(cache_, PagedKvCache::create(config));
    reuse_.clear();  // selections of the old cache's sequences
    return Status::Ok();
  }
  const KvCacheConfig& cache_config() const override {
    static const KvCacheConfig kNone;
    return cache_ ? cache_->config() : kNone;
  }
  const PageTable& pages() const override {
    static const PageTable kNone;
    return cache_ ? cache_->pages() : kNone;
  }
  Result<SeqId> add_sequence() override {
    CISA_RETURN_IF_ERROR(need_cache("add_sequence"));
    return cache_->add_sequence();
  }
  Status release_sequence(SeqId seq) override {
    CISA_RETURN_IF_ERROR(need_cache("release_sequence"));
    CISA_RETURN_IF_ERROR(cache_->release_sequence(seq));
    reuse_.release(seq);  // its SeqId may be handed out again
    return Status::Ok();
  }
  Status reserve(SeqId seq, int64_t n) override {
    CISA_RETURN_IF_ERROR(need_cache("reserve"));
    return cache_->reserve(seq, n);
  }
  Status append_kv(int layer, std::span<const BatchEntry> batch, const float* k,
                   const float* v) override {
    CISA_RETURN_IF_ERROR(need_cache("append_kv"));
    const int64_t row_values = int64_t{cache_->num_kv_heads()} * cache_->head_dim();
    int64_t row = 0;
    for (const BatchEntry& e : batch) {
      CISA_RETURN_IF_ERROR(
          cache_->append(layer, e.seq, e.count, k + row * row_values, v + row * row_values));
      row += e.count;
    }
    return Status::Ok();
  }

  // ---- attention ----
  Status plan(PlanSlot s, std::span<const BatchEntry> batch, const PlanSpec& spec) override {
    CISA_RETURN_IF_ERROR(need_cache("plan"));
    if (spec.sliding_window < 0) return invalid_argument("plan: sliding_window must be >= 0");
    Slot& sl = slot(s);
    sl.planned = sl.has_lists = false;
    sl.lists_layer = -1;
    sl.spec = spec;
    sl.batch.assign(batch.begin(), batch.end());
    sl.lists.clear();
    if (spec.kind == PlanKind::kCisa) {
      CISA_RETURN_IF_ERROR(validate_selection_params(spec.selection));
      CISA_RETURN_IF_ERROR(
          plan_query_groups(cache_->page_size(), batch, spec.selection, &sl.lists));
    }
    sl.planned = true;
    return Status::Ok();
  }
  const std::vector<QueryGroup>& plan_groups(PlanSlot s) const override {
    return slots_[static_cast<int>(s)].lists.groups;
  }
  Status select(PlanSlot s, int layer, const float* index_q) override {
    Slot& sl = slot(s);
    if (!sl.planned || sl.spec.kind != PlanKind::kCisa)
      return failed_precondition("select: the slot has no CISA plan for this step");
    CISA_RETURN_IF_ERROR(select_pages(*cache_, layer, sl.batch, index_q, sl.spec.selection, &pool_,
                                      &sl.lists, &sel_ws_, &reuse_));
    sl.has_lists = true;
    sl.lists_layer = layer;
    return Status::Ok();
  }
  Status set_page_lists(PlanSlot s, const PageLists& lists) override {
    Slot& sl = slot(s);
    if (!sl.planned) return failed_precondition("set_page_lists: the slot is not planned");
    sl.lists = lists;
    sl.has_lists = true;
    sl.lists_layer = -2;
    return Status::Ok();
  }
  Status page_lists(PlanSlot s, PageLists* out) override {
    if (!out) return invalid_argument("page_lists: null output");
    const Slot& sl = slot(s);
    if (!sl.planned || !sl.has_lists)
      return failed_precondition("page_lists: the slot has no page lists for this step");
    *out = sl.lists;
    return Status::Ok();
  }
  Status attend(PlanSlot s, int layer, const float* q, int num_q_heads, const AttendParams& p,
                float* out) override {
    Slot& sl = slot(s);
    if (!sl.planned) return failed_precondition("attend: the slot is not planned for this step");
    if (sl.spec.kind == PlanKind::kDense && !sl.has_lists) {
      CISA_RETURN_IF_ERROR(plan_dense(*cache_, layer, sl.batch, sl.spec.sliding_window, &sl.lists));
      sl.has_lists = true;
    }
    if (sl.spec.kind == PlanKind::kCisa &&
        !(sl.has_lists && (sl.lists_layer == layer || sl.lists_layer == -2)))
      return failed_precondition("attend: no page lists selected for layer " +
                                 std::to_string(layer));
    if (p.numerics == AttentionNumerics::kLlamaCpp) {
      const LlamaCppAttentionParams lp{
          .scale = p.scale, .sliding_window = p.sliding_window, .scale_queries = p.scale_queries};
      return attend_llamacpp(*cache_, layer, sl.batch, sl.lists, q, num_q_heads, lp, out, pool_);
    }
    const AttentionParams ap{.scale = p.scale, .sliding_window = p.sliding_window};
    return cisa::attend(*cache_, layer, sl.batch, sl.lists, q, num_q_heads, ap, out, nullptr, pool_,
                        &aws_);
  }

  SelectionReuseStats selection_reuse_stats() const override { return reuse_.stats; }

  const PagedKvCache* cpu_cache() const override { return cache_.get(); }
  ThreadPool* cpu_pool() override { return &pool_; }

 private:
  static Status copy(void* dst, const void* src, int64_t bytes, const char* what) {
    if (bytes < 0) return invalid_argument(std::string(what) + ": negative size");
    if (bytes > 0 && (!dst || !src)) return invalid_argument(std::string(what) + ": null pointer");
    if (bytes > 0 && dst != src) std::memmove(dst, src, static_cast<size_t>(bytes));
    return Status::Ok();
  }
  // bf16_matmul: an owned f32 copy of the matrix with every value rounded to bf16 (any stored
  // type widened first, as the CUDA backend's upload does), bound in its place.
  Result<BackendMatrix> bind_rounded(const WeightView& w) {
    const int64_t bytes = w.n_rows * w.n_cols * static_cast<int64_t>(sizeof(float));
    if (bytes > free_memory())
      return resource_exhausted("bind_matrix: a bf16-rounded copy of " + std::to_string(w.n_rows) +
                                " x " + std::to_string(w.n_cols) + " needs " +
                                std::to_string(bytes) + " bytes, more than the host's free memory");
    std::vector<float>& m = owned_.emplace_back(static_cast<size_t>(w.n_rows * w.n_cols));
    float* p = m.data();
    for (int64_t r = 0; r < w.n_rows; ++r) {
      float* row = p + r * w.n_cols;
      CISA_RETURN_IF_ERROR(dequantize_row(w.type, w.row(r), row, w.n_cols));
      for (int64_t c = 0; c < w.n_cols; ++c) row[c] = bf16_to_f32(f32_to_bf16(row[c]));
    }
    owned_bytes_ += bytes;
    views_.push_back(WeightView::f32(p, w.n_rows, w.n_cols));
    return BackendMatrix{w.n_rows, w.n_cols, static_cast<int>(views_.size() - 1)};
  }
  Result<const WeightView*> view(const BackendMatrix& m, const char* what) const {
    if (m.id < 0 || static_cast<size_t>(m.id) >= views_.size())
      return invalid_argument(std::string(what) + ": matrix id " + std::to_string(m.id) +
                              " is not bound to this backend");
    return &views_[static_cast<size_t>(m.id)];
  }
  Status need_cache(const char* what) const {
    if (!cache_) return failed_precondition(std::string(what) + ": create_cache was not called");
    return Status::Ok();
  }
  Slot& slot(PlanSlot s) { return slots_[static_cast<int>(s)]; }

  // Threads fn(row) over rows when there are enough of them to pay for waking the pool.
  template <class F>
  void for_rows(int64_t rows, F&& fn) {
    if (rows < 8) {
      for (int64_t r = 0; r < rows; ++r) fn(r);
      return;
    }
    pool_.parallel_for(rows, [&](int64_t r, int) { fn(r); });
  }
  // fn(first, count) over chunks of a flat array of n values.
  template <class F>
  void for_chunks(int64_t n, F&& fn) {
    constexpr int64_t kChunk = 16384;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    for_rows(chunks, [&](int64_t c) { fn(c * kChunk, std::min(kChunk, n - c * kChunk)); });
  }

  ThreadPool pool_;
  MatmulScratch mm_;
  AttentionWorkspace aws_;
  SelectionWorkspace sel_ws_;
  SelectionReuse reuse_;  // selection reuse: per sequence, CISA layer and KV group
  std::unique_ptr<PagedKvCache> cache_;
  bool bf16_matmul_ = false;          // BackendOptions::bf16_matmul
  std::vector<float> rounded_input_;  // bf16_matmul: the current product's rounded input
  std::vector<WeightView> views_;
  std::vector<std::vector<float>> owned_;  // random matrices and gains (stable addresses)
  int64_t owned_bytes_ = 0;
  Slot slots_[3];
};

}  // namespace

Result<std::vector<BackendMatrix>> Backend::bind_matrices(std::span<const WeightView> ws) {
  for (const WeightView& w : ws)
    if (w.n_cols != ws[0].n_cols)
      return invalid_argument("bind_matrices: matrices of " + std::to_string(ws[0].n_cols) +
                              " and " + std::to_string(w.n_cols) + " columns (one input width)");
  std::vector<BackendMatrix> out;
  for (const WeightView& w : ws) {
    CISA_ASSIGN_OR_RETURN(BackendMatrix m, bind_matrix(w));
    out.push_back(m);
  }
  return out;
}

Result<std::vector<BackendMatrix>> Backend::random_matrices(std::span<const int64_t> rows,
                                                            int64_t cols, uint64_t first_seed,
                                                            float scale) {
  std::vector<BackendMatrix> out;
  for (size_t i = 0; i < rows.size(); ++i) {
    CISA_ASSIGN_OR_RETURN(BackendMatrix m, random_matrix(rows[i], cols, first_seed + i, scale));
    out.push_back(m);
  }
  return out;
}

Status Backend::matmul_many(std::span<const BackendMatrix> ws, const float* x,
                            std::span<float* const> ys, int64_t rows) {
  if (ws.size() != ys.size())
    return invalid_argument("matmul_many: " + std::to_string(ws.size()) + " matrices but " +
                            std::to_string(ys.size()) + " outputs");
  for (const BackendMatrix& w : ws)
    if (w.n_cols != ws[0].n_cols)
      return invalid_argument("matmul_many: matrices of " + std::to_string(ws[0].n_cols) + " and " +
                              std::to_string(w.n_cols) + " columns (one input width)");
  for (size_t i = 0; i < ws.size(); ++i) CISA_RETURN_IF_ERROR(matmul(ws[i], x, ys[i], rows));
  return Status::Ok();
}

Status Backend::rope_many(std::span<float* const> xs, std::span<const int> heads, int64_t rows,
                          int d, const float* cos, const float* sin, RopeStyle style) {
  if (xs.size() != heads.size())
    return invalid_argument("rope_many: " + std::to_string(xs.size()) + " tensors but " +
                            std::to_string(heads.size()) + " head counts");
  for (size_t i = 0; i < xs.size(); ++i)
    CISA_RETURN_IF_ERROR(rope(xs[i], rows, heads[i], d, cos, sin, style));
  return Status::Ok();
}

Status Backend::gated_matmul(const BackendMatrix& gate, const BackendMatrix& up, Activation act,
                             const float* x, float* out, float* up_scratch, int64_t rows) {
  if (gate.n_rows != up.n_rows || gate.n_cols != up.n_cols)
    return invalid_argument("gated_matmul: gate is " + std::to_string(gate.n_rows) + " x " +
                            std::to_string(gate.n_cols) + " but up is " +
                            std::to_string(up.n_rows) + " x " + std::to_string(up.n_cols));
  const BackendMatrix ws[2] = {gate, up};
  float* const ys[2] = {out, up_scratch};
  CISA_RETURN_IF_ERROR(matmul_many(ws, x, ys, rows));
  return gated_activation(act, out, up_scratch, out, rows, gate.n_rows);
}

Status Backend::add_rms_norm(float* x, const float* o, const float* w, float* xn, int64_t rows,
                             int n, float eps) {
  CISA_RETURN_IF_ERROR(add(x, o, rows * n));
  return rms_norm(x, w, xn, rows, n, eps);
}

Status Backend::argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out) {
  if (rows < 0 || n < 0) return invalid_argument("argmax_rows: negative rows or width");
  if (rows == 0) return Status::Ok();
  if (!x || !out) return invalid_argument("argmax_rows: null input or output");
  std::vector<float> host(static_cast<size_t>(rows * n));
  CISA_RETURN_IF_ERROR(download(host.data(), x, rows * n * int64_t{sizeof(float)}));
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    ids[static_cast<size_t>(r)] = argmax({host.data() + r * n, static_cast<size_t>(n)});
  return upload(out, ids.data(), rows * int64_t{sizeof(int32_t)});
}

const char* backend_kind_name(BackendKind k) {
  return k == BackendKind::kCpu ? "cpu" : "cuda";
}

Result<BackendKind> parse_backend_kind(const std::string& s) {
  if (s == "cpu") return BackendKind::kCpu;
  if (s == "cuda") return BackendKind::kCuda;
  return invalid_argument("unknown backend '" + s + "' (expected cpu or cuda)");
}

Result<std::unique_ptr<Backend>> make_cpu_backend(const BackendOptions& options) {
  if (options.threads < 0)
    return invalid_argument("threads must be >= 0 (got " + std::to_string(options.threads) + ")");
  if (options.batch_invariant)
    return invalid_argument(
        "batch_invariant (--batch-invariant) is a CUDA backend mode: the CPU backend's attention "
        "splits and 8-bit activations depend on the step's other sequences");
  if (options.mixed_tiles)
    return invalid_argument(
        "mixed_tiles (--mixed-tiles) is a CUDA backend option: the CPU backend has no attention "
        "tiles");
  return std::unique_ptr<Backend>(new CpuBackend(options.threads, options.bf16_matmul));
}

}  // namespace cisa
