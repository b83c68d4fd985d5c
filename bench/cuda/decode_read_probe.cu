// Memory-side probe for paged dense decode (issue 6, docs/cuda-notes.md): how fast does this GPU
// stream the K/V pages of one dense decode step when nothing else happens? Our decode kernel
// (src/cuda/attention.cu) reads ~4.1 TB/s where cuDNN and FlashAttention read 4.25-4.56 TB/s on
// contiguous tensors; this program separates the memory side (page layout, pipeline shape, blocks
// per SM) from the arithmetic by running copy-only versions of the kernel's pipeline.
//
// Build (here or on the device):
//   nvcc -O3 -std=c++17 -arch=sm_90a -cudart static -Isrc
//        bench/cuda/decode_read_probe.cu -o decode_read_probe      (one command)
// Run: ./decode_read_probe [geometry ...]
//   (default: 4:1 32:1 32:2; 1,048,576-token histories, d = 128)
// Prints one line per variant: milliseconds (median of 7 after 2 warm-ups) and TB/s on the
// bytes the variant must read (every K and V byte of every page once).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/common.cuh"

namespace {

using cisa::cuda::dev::cp_async16;
using cisa::cuda::dev::cp_async_commit;
using cisa::cuda::dev::cp_async_wait;

constexpr int kB = 16, kD = 128, kLD = kD + 8;  // padded shared rows, as attention.cu
constexpr int64_t kPageElems = kB * kD;         // one page of one KV head: 4 KB of bf16
constexpr int64_t kPagesPerSeq = (1 << 20) / kB;

struct Task {
  int32_t seq, kv, page0, page1;
};

// Element offset of page `phys`, KV head `kv`. Separate pools (the engine's layout): K and V
// each [page][kv head][16][d]. Adjacent: one pool [page][kv head][K, V][16][d].
__device__ __forceinline__ int64_t page_off(int64_t phys, int kv, int kvh, bool adj) {
  return (phys * kvh + kv) * (adj ? 2 : 1) * kPageElems;
}

// The decode kernel's copy pipeline without its arithmetic: ST stages of TP pages (K and V),
// cp.async.cg 16 B per piece, wait_group(ST − 2) + one block barrier per tile, optional spin of
// `spin` cycles per tile standing in for the MMAs and softmax.
// SWZ: unpadded rows with 16-byte chunks XOR-swizzled inside 128-byte groups (attention.cu since
// v9) instead of rows padded by 16 bytes (v1–v8).
template <int ST, int TP, int THREADS, bool SWZ = false>
__global__ void __launch_bounds__(THREADS)
    paged_copy_kernel(const uint16_t* __restrict__ k, const uint16_t* __restrict__ v,
                      const int32_t* __restrict__ table, const Task* tasks, int kvh, bool adj,
                      int spin, uint32_t* sink) {
  extern __shared__ __align__(128) uint16_t smem[];
  constexpr int NT = TP * kB;
  constexpr int LD = SWZ ? kD : kLD;
  uint16_t* ks = smem;
  uint16_t* vs = smem + ST * NT * LD;
  const Task t = tasks[blockIdx.x];
  const int32_t* tab = table + static_cast<int64_t>(t.seq) * kPagesPerSeq + t.page0;
  const int n_pages = t.page1 - t.page0;
  const int n_tiles = (n_pages + TP - 1) / TP;
  auto load = [&](int stage, int tile) {
    constexpr int CPR = kD / 8;
#pragma unroll
    for (int e = threadIdx.x; e < NT * CPR; e += THREADS) {
      const int tok = e / CPR, c8 = (e % CPR) * 8;
      const int pi = tile * TP + tok / kB;
      const bool ok = pi < n_pages;
      const int64_t base =
          page_off(ok ? __ldg(tab + pi) : 0, t.kv, kvh, adj) + (tok % kB) * kD + c8;
      const int so = (stage * NT + tok) * LD + (SWZ ? ((c8 / 8) ^ (tok & 7)) * 8 : c8);
      cp_async16(ks + so, k + base, ok ? 16 : 0);
      cp_async16(vs + so, adj ? k + base + kPageElems : v + base, ok ? 16 : 0);
    }
  };
  uint32_t acc = 0;
#pragma unroll
  for (int p = 0; p < ST - 1; ++p) {
    if (p < n_tiles) load(p, p);
    cp_async_commit();
  }
  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<ST - 2>();
    __syncthreads();
    if (it + ST - 1 < n_tiles) load((it + ST - 1) % ST, it + ST - 1);
    cp_async_commit();
    const int stage = it % ST;
    acc ^= ks[(stage * NT + threadIdx.x % NT) * LD] ^ vs[(stage * NT + threadIdx.x % NT) * LD + 8];
    if (spin > 0) {
      const long long s0 = clock64();
      while (clock64() - s0 < spin) {
      }
    }
  }
  cp_async_wait<0>();
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;  // keeps the reads
}

// The same pages read straight into registers (16-byte non-caching loads, TP pages of K and V
// per step all in flight), no shared memory.
template <int TP, int THREADS>
__global__ void __launch_bounds__(THREADS)
    paged_ldg_kernel(const uint16_t* __restrict__ k, const uint16_t* __restrict__ v,
                     const int32_t* __restrict__ table, const Task* tasks, int kvh, bool adj,
                     uint32_t* sink) {
  constexpr int PIECES = TP * kB * kD / 8;  // 16-byte pieces of K (and of V) per step
  static_assert(PIECES % THREADS == 0, "whole steps");
  const Task t = tasks[blockIdx.x];
  const int32_t* tab = table + static_cast<int64_t>(t.seq) * kPagesPerSeq + t.page0;
  const int n_pages = t.page1 - t.page0;
  uint32_t acc = 0;
  for (int p0 = 0; p0 < n_pages; p0 += TP) {
    uint4 r[2 * PIECES / THREADS];
#pragma unroll
    for (int j = 0; j < PIECES / THREADS; ++j) {
      const int e = threadIdx.x + j * THREADS;
      const int pi = p0 + e / (kB * kD / 8);
      const int64_t base = page_off(pi < n_pages ? __ldg(tab + pi) : __ldg(tab), t.kv, kvh, adj) +
                           (e % (kB * kD / 8)) * 8;
      const uint16_t* kp = k + base;
      const uint16_t* vp = adj ? k + base + kPageElems : v + base;
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(r[2 * j].x), "=r"(r[2 * j].y), "=r"(r[2 * j].z), "=r"(r[2 * j].w)
                   : "l"(kp));
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(r[2 * j + 1].x), "=r"(r[2 * j + 1].y), "=r"(r[2 * j + 1].z),
                     "=r"(r[2 * j + 1].w)
                   : "l"(vp));
    }
#pragma unroll
    for (int j = 0; j < 2 * PIECES / THREADS; ++j) acc ^= r[j].x ^ r[j].y ^ r[j].z ^ r[j].w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

// Read ceiling: every byte of [p, p + n) once, grid-stride, 8 independent 16-byte loads per thread.
__global__ void flat_read_kernel(const uint4* __restrict__ p, int64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 7 * stride < n; i += 8 * stride) {
    uint4 r[8];
#pragma unroll
    for (int j = 0; j < 8; ++j)
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(r[j].x), "=r"(r[j].y), "=r"(r[j].z), "=r"(r[j].w)
                   : "l"(p + i + j * stride));
#pragma unroll
    for (int j = 0; j < 8; ++j) acc ^= r[j].x ^ r[j].y ^ r[j].z ^ r[j].w;
  }
  for (; i < n; i += stride) acc ^= p[i].x;
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

__global__ void fill_kernel(uint32_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 0x9e3779b1u ^ seed;
    x ^= x >> 15;
    x *= 0x2c1b3c6du;
    x ^= x >> 12;
    p[i] = x & 0xbfffbfffu;  // random bf16 pairs, never inf/NaN exponents of all ones
  }
}

#define CHECK(x)                                                                               \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

template <class F>
double median_ms(F&& launch) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) launch();
  CHECK(cudaGetLastError());
  std::vector<float> t;
  for (int i = 0; i < 7; ++i) {
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CHECK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

struct Geometry {
  std::string name;
  int seqs, kvh;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<Geometry> geos;
  const std::vector<Geometry> all = {{"4:1", 16, 1}, {"32:1", 32, 1}, {"32:2", 16, 2}};
  for (int i = 1; i < argc; ++i)
    for (const auto& g : all)
      if (g.name == argv[i]) geos.push_back(g);
  if (geos.empty()) geos = all;
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("device %s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);

  // One pool of 2 × 8.6 GB serves every geometry: separate layout = K first half, V second half.
  int64_t max_elems = 0;
  for (const auto& g : all)
    max_elems = std::max<int64_t>(max_elems, g.seqs * kPagesPerSeq * g.kvh * kPageElems);
  uint16_t* pool = nullptr;
  uint32_t* sink = nullptr;
  CHECK(cudaMalloc(&pool, 2 * max_elems * 2));
  CHECK(cudaMalloc(&sink, 1 << 20));
  fill_kernel<<<4 * sms, 256>>>(reinterpret_cast<uint32_t*>(pool), max_elems, 12345u);
  CHECK(cudaDeviceSynchronize());
  int32_t* table = nullptr;
  Task* tasks = nullptr;
  CHECK(cudaMalloc(&table, 32 * kPagesPerSeq * 4));
  CHECK(cudaMalloc(&tasks, 64 * 1024 * sizeof(Task)));

  std::printf("%-5s %-44s %8s %7s %5s\n", "geom", "variant", "ms", "TB/s", "occ");
  std::mt19937 rng(7);
  for (const auto& g : geos) {
    const int64_t P = g.seqs * kPagesPerSeq;  // pages in the pool for this geometry
    const double bytes = 2.0 * P * g.kvh * kPageElems * 2;
    const int lists = g.seqs * g.kvh;
    std::vector<int32_t> perm(static_cast<size_t>(P)), iota(static_cast<size_t>(P));
    std::iota(iota.begin(), iota.end(), 0);
    perm = iota;
    std::shuffle(perm.begin(), perm.end(), rng);
    auto row = [&](const std::string& what, double ms, int occ) {
      std::printf("%-5s %-44s %8.3f %7.3f %5d\n", g.name.c_str(), what.c_str(), ms,
                  bytes / (ms * 1e-3) / 1e12, occ);
      std::fflush(stdout);
    };
    {
      const int64_t n = static_cast<int64_t>(bytes / 16);
      for (int bps : {4, 8}) {
        const double ms = median_ms([&] {
          flat_read_kernel<<<sms * bps, 512>>>(reinterpret_cast<const uint4*>(pool), n, sink);
        });
        row("flat read, " + std::to_string(bps) + " x 512 threads/SM", ms, bps);
      }
    }
    // Tasks: lists × splits, splits = ⌊SMs · bps / lists⌋ (the engine's one-wave decode rule).
    auto make_tasks = [&](int bps) {
      const int splits = std::max(1, sms * bps / lists);
      std::vector<Task> ts;
      for (int s = 0; s < g.seqs; ++s)
        for (int kv = 0; kv < g.kvh; ++kv)
          for (int sp = 0; sp < splits; ++sp)
            ts.push_back({s, kv, static_cast<int32_t>(kPagesPerSeq * sp / splits),
                          static_cast<int32_t>(kPagesPerSeq * (sp + 1) / splits)});
      CHECK(cudaMemcpy(tasks, ts.data(), ts.size() * sizeof(Task), cudaMemcpyHostToDevice));
      return static_cast<int>(ts.size());
    };
    for (const bool contiguous : {false, true}) {
      CHECK(cudaMemcpy(table, (contiguous ? iota : perm).data(), P * 4, cudaMemcpyHostToDevice));
      const std::string order = contiguous ? "pool order" : "random";
      for (const bool adj : {false, true}) {
        const uint16_t* k = pool;
        const uint16_t* v = pool + max_elems;
        const std::string lay = std::string(adj ? "K|V adjacent" : "K, V pools") + ", " + order;
        auto copy = [&](auto kernel, int st, int tp, int threads, int bps, int spin,
                        const std::string& name, bool swz = false) {
          const size_t smem = sizeof(uint16_t) * 2 * st * tp * kB * (swz ? kD : kLD);
          CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(smem)));
          int occ = 0;
          CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, threads, smem));
          const int n = make_tasks(bps);
          const double ms = median_ms(
              [&] { kernel<<<n, threads, smem>>>(k, v, table, tasks, g.kvh, adj, spin, sink); });
          row(name + ", " + lay, ms, occ);
        };
        copy(paged_copy_kernel<3, 4, 128>, 3, 4, 128, 2, 0, "cp.async 3x4pg 2/SM");
        copy(paged_copy_kernel<3, 4, 128, true>, 3, 4, 128, 2, 0, "cp.async 3x4pg 2/SM swizzled",
             true);
        if (adj || contiguous) continue;  // the rest on the engine's layout only
        copy(paged_copy_kernel<3, 4, 128>, 3, 4, 128, 2, 1200, "cp.async 3x4pg 2/SM spin1200");
        copy(paged_copy_kernel<3, 4, 128>, 3, 4, 128, 4, 0, "cp.async 3x4pg 4 tasks/SM");
        copy(paged_copy_kernel<4, 4, 128>, 4, 4, 128, 1, 0, "cp.async 4x4pg 1/SM");
        copy(paged_copy_kernel<6, 2, 128>, 6, 2, 128, 2, 0, "cp.async 6x2pg 2/SM");
        copy(paged_copy_kernel<3, 2, 128>, 3, 2, 128, 4, 0, "cp.async 3x2pg 4/SM");
        copy(paged_copy_kernel<2, 8, 256>, 2, 8, 256, 1, 0, "cp.async 2x8pg 256thr 1/SM");
        copy(paged_copy_kernel<3, 4, 256>, 3, 4, 256, 2, 0, "cp.async 3x4pg 256thr 2/SM");
        for (int bps : {2, 4, 8}) {
          const int n = make_tasks(bps);
          const double ms = median_ms(
              [&] { paged_ldg_kernel<4, 128><<<n, 128>>>(k, v, table, tasks, g.kvh, adj, sink); });
          row("ldg 4pg/step 128thr " + std::to_string(bps) + " tasks/SM, " + lay, ms, bps);
        }
      }
    }
  }
  CHECK(cudaFree(pool));
  return 0;
}
