// matmul_vs_ggml — our quantised matmul beside ggml's own mul_mat (the CPU library inside the
// llama-cpp-python wheel) on the same random blocks, shapes of Gemma 3 270M and SmolLM2.
// Built and run by bench/scripts/matmul_vs_ggml.sh (not part of the CMake build: it links the
// wheel's libggml-cpu.so). ggml's few entry points are declared here by hand.
//
// Prints GFLOP/s for both, their ratio, and max|y_ours - y_ggml| / max|y_ggml| (the two
// quantise activations the same way for the K-quants, so those agree to ~1e-7).
// With 1 thread the times are the thread's CPU time (robust on a loaded machine); with more,
// wall time. Best of 7 repetitions of >= 0.15 s.
#include <time.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "cisa/model/quant.h"
extern "C" {
struct ggml_context;
struct ggml_tensor;
struct ggml_cgraph;
struct ggml_init_params {
  size_t mem_size;
  void* mem_buffer;
  bool no_alloc;
};
ggml_context* ggml_init(ggml_init_params);
void ggml_free(ggml_context*);
ggml_tensor* ggml_new_tensor_2d(ggml_context*, int type, int64_t ne0, int64_t ne1);
ggml_tensor* ggml_mul_mat(ggml_context*, ggml_tensor* a, ggml_tensor* b);
ggml_cgraph* ggml_new_graph(ggml_context*);
void ggml_build_forward_expand(ggml_cgraph*, ggml_tensor*);
int ggml_graph_compute_with_ctx(ggml_context*, ggml_cgraph*, int n_threads);
void* ggml_get_data(const ggml_tensor*);
size_t ggml_nbytes(const ggml_tensor*);
}
int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IONBF, 0);
  int threads = argc > 1 ? atoi(argv[1]) : 2;
  struct C {
    cisa::GgmlType t;
    int64_t m, k, n;
  } cs[] = {{cisa::GgmlType::Q5_0, 1024, 640, 1},    {cisa::GgmlType::Q5_0, 2048, 640, 1},
            {cisa::GgmlType::Q6_K, 640, 2048, 1},    {cisa::GgmlType::Q4_K, 640, 2048, 1},
            {cisa::GgmlType::Q4_K, 640, 1024, 1},    {cisa::GgmlType::Q8_0, 262144, 640, 1},
            {cisa::GgmlType::Q4_1, 1536, 576, 1},    {cisa::GgmlType::Q5_0, 1024, 640, 512},
            {cisa::GgmlType::Q5_0, 2048, 640, 512},  {cisa::GgmlType::Q6_K, 640, 2048, 512},
            {cisa::GgmlType::Q4_K, 640, 2048, 512},  {cisa::GgmlType::Q4_K, 640, 1024, 512},
            {cisa::GgmlType::Q8_0, 262144, 640, 16}, {cisa::GgmlType::Q4_1, 1536, 576, 512}};
  cisa::ThreadPool pool(threads);
  cisa::MatmulScratch scratch;
  for (auto c : cs) {
    const uint64_t rb = *cisa::ggml_row_bytes(c.t, c.k);
    std::vector<uint8_t> w(c.m * rb);
    std::mt19937 rng(1);
    for (auto& b : w) b = rng();
    const int64_t bb = cisa::ggml_block_bytes(c.t), nblk = w.size() / bb;
    uint16_t h = cisa::f32_to_f16(0.01f);
    for (int64_t i = 0; i < nblk; ++i) {
      std::memcpy(&w[i * bb + (c.t == cisa::GgmlType::Q6_K ? 208 : 0)], &h, 2);
      if (c.t == cisa::GgmlType::Q4_1 || c.t == cisa::GgmlType::Q4_K)
        std::memcpy(&w[i * bb + 2], &h, 2);
    }
    std::vector<float> x(c.n * c.k);
    for (auto& v : x) v = std::normal_distribution<float>()(rng);
    // ggml
    ggml_init_params ip{2 * (w.size() + x.size() * 4 + c.m * c.n * 4) + (512ull << 20), nullptr,
                        false};
    ggml_context* ctx = ggml_init(ip);
    ggml_tensor* A = ggml_new_tensor_2d(ctx, (int)c.t, c.k, c.m);
    ggml_tensor* B = ggml_new_tensor_2d(ctx, 0, c.k, c.n);
    std::memcpy(ggml_get_data(A), w.data(), w.size());
    std::memcpy(ggml_get_data(B), x.data(), x.size() * 4);
    ggml_tensor* Y = ggml_mul_mat(ctx, A, B);
    ggml_cgraph* g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, Y);
    std::vector<float> y(c.m * c.n);
    // Thread CPU time when single-threaded (robust on a loaded machine), else wall time.
    auto now = [&]() {
      if (threads == 1) {
        timespec t;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
        return t.tv_sec + 1e-9 * t.tv_nsec;
      }
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
    auto time_it = [&](auto fn) {
      std::vector<double> ts;
      fn();
      for (int r = 0; r < 7; ++r) {
        double t0 = now();
        int it = 0;
        do {
          fn();
          ++it;
        } while (now() - t0 < 0.15);
        ts.push_back((now() - t0) / it);
      }
      std::sort(ts.begin(), ts.end());
      return ts[0];
    };
    // A fresh small context per call holds the work buffer (compute_with_ctx allocates it anew each
    // time).
    static std::vector<uint8_t> wbuf(256u << 20);
    double tg = time_it([&] {
      ggml_context* wc = ggml_init(ggml_init_params{wbuf.size(), wbuf.data(), false});
      ggml_graph_compute_with_ctx(wc, g, threads);
      ggml_free(wc);
    });
    const cisa::WeightView v{c.t, c.m, c.k, rb, w.data()};
    double tc = time_it([&] { (void)cisa::matmul(v, x.data(), y.data(), c.n, pool, &scratch); });
    // agreement
    const float* yg = (const float*)ggml_get_data(Y);
    double md = 0, mx = 0;
    for (int64_t i = 0; i < c.m * c.n; ++i) {
      md = std::max(md, (double)std::fabs(yg[i] - y[i]));
      mx = std::max(mx, (double)std::fabs(yg[i]));
    }
    const double fl = 2.0 * c.m * c.k * c.n * 1e-9;
    std::printf(
        "%-5s %6ld x %5ld  n_tok %3ld | cisa %7.1f GFLOP/s | ggml %7.1f GFLOP/s | ratio %.2fx | "
        "max|diff|/max|y| %.1e\n",
        cisa::ggml_type_name(c.t), (long)c.m, (long)c.k, (long)c.n, fl / tc, fl / tg, tg / tc,
        md / mx);
    ggml_free(ctx);
  }
}
