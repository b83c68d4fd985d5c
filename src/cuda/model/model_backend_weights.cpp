// CudaBackend, weights: bf16 matrices on the device, bound from GGUF views (dequantised on the
// host in chunks) or filled with synthetic values, alone or stacked (bind_matrices: matrices that
// multiply one input share one allocation, so matmul_many runs them as one GEMM); norm gains.
#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cisa/core/bf16.h"
#include "cisa/cuda/backend.h"
#include "cisa/model/quant.h"
#include "model_backend_impl.h"

namespace cisa::cuda {
namespace {

// Host rows dequantised per upload in bind_matrix: about 8 MiB of bf16.
constexpr int64_t kBindChunkBytes = int64_t{8} << 20;
// Largest matrix side bind_matrix / random_matrix accept (cuBLASLt dimensions are int32).
constexpr int64_t kMaxMatrixSide = std::numeric_limits<int32_t>::max();

}  // namespace

Status CudaBackend::upload_weights(const WeightView& w, uint16_t* dst) {
  if (!w.data) return invalid_argument("cuda bind_matrix: null weight data");
  const int64_t n_cols = w.n_cols;
  // Rows are dequantised into one reused chunk and uploaded; the f32 row is the only other copy.
  const int64_t chunk_rows = std::clamp<int64_t>(kBindChunkBytes / (n_cols * 2), 1, w.n_rows);
  std::vector<float> row(static_cast<size_t>(n_cols));
  std::vector<uint16_t> chunk(static_cast<size_t>(chunk_rows * n_cols));
  for (int64_t r0 = 0; r0 < w.n_rows; r0 += chunk_rows) {
    const int64_t nr = std::min(chunk_rows, w.n_rows - r0);
    // The previous chunk's copy must have left `chunk` before it is overwritten.
    CISA_RETURN_IF_ERROR(synchronize());
    for (int64_t r = 0; r < nr; ++r) {
      CISA_RETURN_IF_ERROR(dequantize_row(w.type, w.row(r0 + r), row.data(), n_cols));
      uint16_t* out = chunk.data() + r * n_cols;
      for (int64_t c = 0; c < n_cols; ++c) out[c] = f32_to_bf16(row[static_cast<size_t>(c)]);
    }
    CISA_RETURN_IF_ERROR(check_cuda(
        cudaMemcpyAsync(dst + r0 * n_cols, chunk.data(), static_cast<size_t>(nr * n_cols) * 2,
                        cudaMemcpyHostToDevice, stream_),
        "cuda bind_matrix: upload"));
  }
  return synchronize();
}

Result<std::shared_ptr<DeviceMemory>> CudaBackend::allocate_stack(std::span<const int64_t> rows,
                                                                  int64_t cols, const char* op) {
  if (rows.empty()) return invalid_argument(std::string("cuda ") + op + ": no matrices");
  int64_t total = 0;
  for (const int64_t r : rows) {
    if (r <= 0 || cols <= 0 || r > kMaxMatrixSide || cols > kMaxMatrixSide)
      return invalid_argument(std::string("cuda ") + op + ": shape " + std::to_string(r) + " x " +
                              std::to_string(cols) + " is out of range");
    total += r;
  }
  if (total > kMaxMatrixSide)
    return invalid_argument(std::string("cuda ") + op + ": " + std::to_string(total) +
                            " stacked rows are more than a GEMM takes");
  CISA_ASSIGN_OR_RETURN(
      DeviceMemory mem,
      DeviceMemory::allocate(total * cols * 2, "weights " + std::to_string(total) + " x " +
                                                   std::to_string(cols) + " bf16"));
  return std::make_shared<DeviceMemory>(std::move(mem));
}

std::vector<BackendMatrix> CudaBackend::add_stack(std::shared_ptr<DeviceMemory> mem,
                                                  std::span<const int64_t> rows, int64_t cols) {
  std::vector<BackendMatrix> out;
  const int first = static_cast<int>(matrices_.size());
  int64_t offset = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    matrices_.push_back({.mem = mem,
                         .offset = offset,
                         .n_rows = rows[i],
                         .n_cols = cols,
                         .stack = first,
                         .stack_size = static_cast<int>(rows.size()),
                         .stack_pos = static_cast<int>(i)});
    offset += rows[i] * cols;
    weight_bytes_ += rows[i] * cols * 2;
    out.push_back({rows[i], cols, static_cast<int>(matrices_.size()) - 1});
  }
  return out;
}

Result<BackendMatrix> CudaBackend::bind_matrix(const WeightView& w) {
  CISA_ASSIGN_OR_RETURN(std::vector<BackendMatrix> m, bind_matrices({&w, 1}));
  return m[0];
}

Result<std::vector<BackendMatrix>> CudaBackend::bind_matrices(std::span<const WeightView> ws) {
  std::vector<int64_t> rows;
  for (const WeightView& w : ws) {
    if (!w.data) return invalid_argument("cuda bind_matrix: null weight data");
    if (w.n_cols != ws[0].n_cols)
      return invalid_argument("cuda bind_matrices: matrices of " + std::to_string(ws[0].n_cols) +
                              " and " + std::to_string(w.n_cols) + " columns");
    rows.push_back(w.n_rows);
  }
  const int64_t cols = ws.empty() ? 0 : ws[0].n_cols;
  CISA_ASSIGN_OR_RETURN(std::shared_ptr<DeviceMemory> mem,
                        allocate_stack(rows, cols, "bind_matrix"));
  int64_t offset = 0;
  for (const WeightView& w : ws) {
    CISA_RETURN_IF_ERROR(upload_weights(w, mem->as<uint16_t>() + offset));
    offset += w.n_rows * cols;
  }
  return add_stack(std::move(mem), rows, cols);
}

Result<BackendMatrix> CudaBackend::random_matrix(int64_t rows, int64_t cols, uint64_t seed,
                                                 float scale) {
  CISA_ASSIGN_OR_RETURN(std::vector<BackendMatrix> m,
                        random_matrices({&rows, 1}, cols, seed, scale));
  return m[0];
}

Result<std::vector<BackendMatrix>> CudaBackend::random_matrices(std::span<const int64_t> rows,
                                                                int64_t cols, uint64_t first_seed,
                                                                float scale) {
  CISA_ASSIGN_OR_RETURN(std::shared_ptr<DeviceMemory> mem,
                        allocate_stack(rows, cols, "random_matrix"));
  int64_t offset = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    CISA_RETURN_IF_ERROR(fill_random_bf16(mem->as<uint16_t>() + offset, rows[i] * cols,
                                          first_seed + i, scale, stream_));
    offset += rows[i] * cols;
  }
  return add_stack(std::move(mem), rows, cols);
}

Result<BackendMatrix> CudaBackend::bind_owned_matrix(std::vector<float> values, int64_t n_rows,
                                                     int64_t n_cols) {
  if (n_rows <= 0 || n_cols <= 0 || values.size() != static_cast<size_t>(n_rows * n_cols))
    return invalid_argument("cuda bind_owned_matrix: " + std::to_string(values.size()) +
                            " values for a " + std::to_string(n_rows) + " x " +
                            std::to_string(n_cols) + " matrix");
  // Uploaded (bind_matrix waits for the copies); the host values are freed on return.
  return bind_matrix(WeightView::f32(values.data(), n_rows, n_cols));
}

Status CudaBackend::read_matrix_rows(const BackendMatrix& m, int64_t first_row, int64_t rows,
                                     float* host_out) {
  CISA_ASSIGN_OR_RETURN(const DeviceMatrix* d, find_matrix(m, "read_matrix_rows"));
  if (first_row < 0 || rows < 0 || first_row > d->n_rows - rows)
    return out_of_range("cuda read_matrix_rows: rows [" + std::to_string(first_row) + ", " +
                        std::to_string(first_row + rows) + ") outside the matrix's " +
                        std::to_string(d->n_rows));
  if (rows == 0) return Status::Ok();
  if (!host_out) return invalid_argument("cuda read_matrix_rows: null output");
  std::vector<uint16_t> bf(static_cast<size_t>(rows * d->n_cols));
  CISA_RETURN_IF_ERROR(download(bf.data(), d->data() + first_row * d->n_cols,
                                static_cast<int64_t>(bf.size() * sizeof(uint16_t))));
  for (size_t i = 0; i < bf.size(); ++i) host_out[i] = bf16_to_f32(bf[i]);
  return Status::Ok();
}

Result<const float*> CudaBackend::bind_vector(std::span<const float> host_values) {
  if (host_values.empty()) return invalid_argument("cuda bind_vector: empty vector");
  const auto bytes = static_cast<int64_t>(host_values.size_bytes());
  CISA_ASSIGN_OR_RETURN(DeviceMemory mem, DeviceMemory::allocate(bytes, "weight vector"));
  CISA_RETURN_IF_ERROR(upload(mem.get(), host_values.data(), bytes));
  weight_bytes_ += bytes;
  vectors_.push_back(std::move(mem));
  return static_cast<const float*>(vectors_.back().get());
}

Result<const CudaBackend::DeviceMatrix*> CudaBackend::find_matrix(const BackendMatrix& m,
                                                                  const char* op) const {
  if (m.id < 0 || static_cast<size_t>(m.id) >= matrices_.size())
    return invalid_argument(std::string("cuda ") + op + ": matrix id " + std::to_string(m.id) +
                            " is not bound to this backend");
  const DeviceMatrix& d = matrices_[static_cast<size_t>(m.id)];
  if (d.n_rows != m.n_rows || d.n_cols != m.n_cols)
    return invalid_argument(std::string("cuda ") + op + ": matrix " + std::to_string(m.id) +
                            " is " + std::to_string(d.n_rows) + " x " + std::to_string(d.n_cols) +
                            ", not " + std::to_string(m.n_rows) + " x " + std::to_string(m.n_cols));
  return &d;
}

}  // namespace cisa::cuda
