// Memory-side probe for decode scoring (issue 12's 2 x 1M step, issue 15's decode goal): the
// decode score kernel (src/cuda/score.cu, score_few_kernel) reads the representatives at
// 3.2-3.5 TB/s where a plain read reaches ~4.2. This program runs copies of its memory pattern
// (page IDs of a block's chunks staged first, 16-byte loads, D/8 lanes per chunk, one f32 dot
// product per chunk and KV head, scores written) in variants that change one thing at a time:
//   base   the kernel's shape: grid (chunk blocks, streams), a stream being one (sequence, KV head)
//   swap   grid (streams, chunk blocks): the KV heads of one page range run side by side
//   pipe   base, with the next round's loads issued before the current round's arithmetic
//   allkv  one block per (sequence, chunk block) scores every KV head: each page's
//          representatives (H x 256 bytes, adjacent in the [page][kv][d] layout) read at once
//   allkv+pipe, and block sizes of 512 / 1024 / 2048 chunks
// plus `read`, a grid-stride read of the same number of contiguous bytes (the ceiling).
// The same shapes on 1-byte representatives (docs/design.md "Representative precision"):
//   int8 / fp8   one byte a value ([page][kv][d], 128 bytes a representative at d = 128) and
//                one power-of-two exponent a representative in a second array ([page][kv]
//                int8), D/16 lanes per chunk with 16 values each; the score is the dot product
//                times 2^e. TB/s counts both arrays; the ratio to `base 512` on bf16 is the
//                scoring time 1-byte representatives would save.
//   int8 scale layouts (where the int8 scale lives; TB/s counts 128 code bytes and 4 scale
//                bytes a representative in each, so the rows compare as times):
//     f32        a 4-byte scale a representative in a second array [page][kv] (the CUDA cache's
//                layout, DeviceLayer::rep_scales)
//     row144     the f32 scale inside the row: [page][kv] rows of 144 bytes (128 codes, the
//                scale, 12 bytes of padding): 5 sectors a row as f32 reads, but adjacent ones
//     row160     the same in 160-byte rows (32-byte aligned: exactly 5 sectors a row)
//   int8 arithmetic (f32 scale array, 512 chunks a block):
//     i2f        each code through I2F (a quarter-rate instruction); the other int8 rows use it
//     magic      the kernels' conversion (src/cuda/rep_read.cuh): the byte spliced under 2^23's
//                exponent and the offset subtracted, then an FFMA: three instructions a code
//     dp4a       the query as three int8 digits (q/s ~ d1 + d2/256 + d3/65536) and one IDP4A a
//                digit and 4 codes: 0.75 instructions a code, integer sums converted at the end
//     u16        16 loads a lane in flight instead of 8 (more bytes in flight a warp)
//   int8 staging (the kernels' form: magic conversion, 1-byte exponent array, 512 chunks a
//                block, one KV head; `int8 magic exp8` is that form with register loads):
//     cpasync SC/NS  the block's representatives copied into a ring of NS shared-memory stages
//                of SC chunks by cp.async (16 bytes a copy, no registers held while in flight),
//                the arithmetic reading the stage NS - 1 stages behind the copies; the block's
//                page IDs and exponents read first. Asks whether int8 scoring waits on loads that
//                registers cannot keep in flight (ncu, H100: 69 % of DRAM bandwidth, 0.58
//                instructions issued a scheduler and cycle).
//
// Build: nvcc -O3 -std=c++17 -arch=sm_90a -cudart static bench/cuda/score_read_probe.cu \
//          -o score_read_probe       (or the CMake target score_read_probe)
// Run:   ./score_read_probe           prints one line per case and variant: median ms of 9 timed
//        runs (L2 emptied before each) and TB/s on the representative bytes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

namespace {

constexpr int kD = 128, kThreads = 256;

// The representatives' element: bf16 (the caches' today), or one byte with a scale.
// kInt8 converts with I2F; kInt8M with the kernels' magic-number splice; kInt8D with IDP4A.
enum class Elem { kBf16, kInt8, kFp8, kInt8M, kInt8D };
// Where a 1-byte representative's scale lives: a 1-byte exponent array, a f32 array, or a f32 at
// byte kD of a longer row.
enum class Scale { kExp8, kF32, kRow144, kRow160 };
template <Scale S>
constexpr int kRowBytes = S == Scale::kRow144   ? 144
                          : S == Scale::kRow160 ? 160
                                                : kD;
template <Elem E>
constexpr int kBytes = E == Elem::kBf16 ? 2 : 1;
template <Elem E>
constexpr int kLanesPerChunk = kD* kBytes<E> / 16;  // 16 bytes a lane

#define CHECK(x)                                                                              \
  do {                                                                                        \
    const cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

// Two E4M3 values (low byte first) to f32, through the hardware's f16x2 conversion (sm_89+).
__device__ __forceinline__ void e4m3x2_to_f32(uint16_t v, float* lo, float* hi) {
  asm("{\n .reg .b32 h;\n .reg .b16 a, b;\n cvt.rn.f16x2.e4m3x2 h, %2;\n mov.b32 {a, b}, h;\n"
      " cvt.f32.f16 %0, a;\n cvt.f32.f16 %1, b;\n}"
      : "=f"(*lo), "=f"(*hi)
      : "h"(v));
}

// 16 bytes of 1-byte values against 16 query values.
template <Elem E>
__device__ __forceinline__ float dot16(const uint4& w, const float* q) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  float acc = 0.0f;
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    if constexpr (E == Elem::kInt8) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        acc = fmaf(q[4 * h + j], static_cast<float>(static_cast<int8_t>(ws[h] >> (8 * j))), acc);
    } else if constexpr (E == Elem::kInt8M) {
      const uint32_t u = ws[h] ^ 0x80808080u;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        acc = fmaf(q[4 * h + j],
                   __uint_as_float(__byte_perm(u, 0x4b000000u, 0x7440 + j)) - 8388736.0f, acc);
    } else {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        float lo, hi;
        e4m3x2_to_f32(static_cast<uint16_t>(ws[h] >> (16 * j)), &lo, &hi);
        acc = fmaf(q[4 * h + 2 * j], lo, acc);
        acc = fmaf(q[4 * h + 2 * j + 1], hi, acc);
      }
    }
  }
  return acc;
}

// 16 codes against the query's three int8 digits (4 words each, digit k scaled by 256^-k).
__device__ __forceinline__ float dot16_dp4a(const uint4& w, const int* qd) {
  const int ws[4] = {static_cast<int>(w.x), static_cast<int>(w.y), static_cast<int>(w.z),
                     static_cast<int>(w.w)};
  int a0 = 0, a1 = 0, a2 = 0;
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    a0 = __dp4a(ws[h], qd[h], a0);
    a1 = __dp4a(ws[h], qd[4 + h], a1);
    a2 = __dp4a(ws[h], qd[8 + h], a2);
  }
  return static_cast<float>(a0) + static_cast<float>(a1) * (1.0f / 256.0f) +
         static_cast<float>(a2) * (1.0f / 65536.0f);
}

__device__ __forceinline__ float dot8(const uint4& w, const float* q) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  float acc = 0.0f;
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    acc = fmaf(q[2 * h], __uint_as_float(ws[h] << 16), acc);
    acc = fmaf(q[2 * h + 1], __uint_as_float(ws[h] & 0xffff0000u), acc);
  }
  return acc;
}

// Segments of one block: ALLKV: (chunk, kv) pairs, kv fastest, over H KV heads; else one KV head
// (`kv0`). A warp-wide load covers 2 segments (D = 128); lane group grp = lane / 16 takes segment
// 2j + grp of load slot j. U slots per round, PIPE: the next round's slots loaded before the
// current round's arithmetic.
template <int NCB, int H, bool ALLKV, bool SWAP, bool PIPE, Elem E, Scale S = Scale::kExp8,
          int U = 8>
__device__ __forceinline__ void score_probe(const uint8_t* __restrict__ reps,
                                            const void* __restrict__ scales,
                                            const int32_t* __restrict__ tables,
                                            int64_t pages_per_seq, const float* __restrict__ qs,
                                            float* __restrict__ scores) {
  constexpr int LPC = kLanesPerChunk<E>, VPL = 16 / kBytes<E>;  // values a lane
  constexpr int WARPS = kThreads / 32, CPL = 32 / LPC;
  constexpr int KVS = ALLKV ? H : 1;  // KV heads a block scores
  constexpr int SEGS = NCB * KVS;
  constexpr int PER_ROUND = WARPS * U * CPL;
  static_assert(SEGS % PER_ROUND == 0, "whole rounds");
  constexpr int QN = ALLKV ? (H >= CPL ? H / CPL : 1) : 1;  // queries a lane holds
  __shared__ int32_t page_s[NCB];
  const int cb = SWAP ? blockIdx.y : blockIdx.x, st = SWAP ? blockIdx.x : blockIdx.y;
  const int seq = ALLKV ? st : st / H, kv0 = ALLKV ? 0 : st % H;
  const int64_t c0 = static_cast<int64_t>(cb) * NCB;
  const int32_t* table = tables + seq * pages_per_seq + c0;
  for (int i = threadIdx.x; i < NCB; i += kThreads) page_s[i] = table[i];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane % LPC, grp = lane / LPC;
  float q[QN][VPL];
#pragma unroll
  for (int m = 0; m < QN; ++m) {
    const int kv = ALLKV ? (grp + m * CPL) % H : kv0;
#pragma unroll
    for (int i = 0; i < VPL; ++i) q[m][i] = qs[(seq * H + kv) * kD + sub * VPL + i];
  }
  // kInt8D: the lane's query values as three int8 digits of q/s (s = 1 here: the probe times
  // the arithmetic, not the rounding), packed 4 a word: qd[4k + h] holds digit k of values
  // 4h..4h+3.
  int qd[12] = {};
  if constexpr (E == Elem::kInt8D) {
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      float r = q[0][i];
#pragma unroll
      for (int k = 0; k < 3; ++k) {
        const int d = max(-127, min(127, __float2int_rn(r)));
        r = (r - static_cast<float>(d)) * 256.0f;
        qd[4 * k + i / 4] |= (d & 0xff) << (8 * (i % 4));
      }
    }
  }
  __syncthreads();
  auto seg_of = [&](int r0, int u) { return r0 + (warp * U + u) * CPL + grp; };
  constexpr int64_t RB = E == Elem::kBf16 ? kD * 2 : kRowBytes<S>;  // row stride, bytes
  auto load = [&](uint4* buf, float* sbuf, int r0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int e = seg_of(r0, u);
      const int c = e / KVS, kv = ALLKV ? e % KVS : kv0;
      const int64_t rep = static_cast<int64_t>(page_s[c]) * H + kv;
      const uint8_t* row = reps + rep * RB;
      buf[u] = __ldg(reinterpret_cast<const uint4*>(row) + sub);
      if constexpr (E == Elem::kBf16)
        sbuf[u] = 1.0f;
      else if constexpr (S == Scale::kExp8)
        sbuf[u] = __int_as_float((__ldg(static_cast<const int8_t*>(scales) + rep) + 127) << 23);
      else if constexpr (S == Scale::kF32)
        sbuf[u] = __ldg(static_cast<const float*>(scales) + rep);
      else
        sbuf[u] = __ldg(reinterpret_cast<const float*>(row + kD));
    }
  };
  auto consume = [&](const uint4* buf, const float* sbuf, int r0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int e = seg_of(r0, u);
      const int c = e / KVS, kv = ALLKV ? e % KVS : kv0;
      // kv = (CPL·u + grp) % H = grp + CPL·m: query m of the lane
      const float* qm = q[ALLKV && H >= CPL ? ((u * CPL) % H) / CPL : 0];
      float acc;
      if constexpr (E == Elem::kBf16)
        acc = dot8(buf[u], qm);
      else if constexpr (E == Elem::kInt8D)
        acc = dot16_dp4a(buf[u], qd);
      else
        acc = dot16<E>(buf[u], qm);
#pragma unroll
      for (int o = LPC / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
      if constexpr (E != Elem::kBf16) acc *= sbuf[u];
      if (sub == 0) scores[(static_cast<int64_t>(seq) * H + kv) * pages_per_seq + c0 + c] = acc;
    }
  };
  uint4 a[U], b[U];
  float ea[U] = {}, eb[U] = {};
  load(a, ea, 0);
  for (int r0 = 0; r0 < SEGS; r0 += PER_ROUND) {
    if (PIPE) {
      if (r0 + PER_ROUND < SEGS) load(b, eb, r0 + PER_ROUND);
      consume(a, ea, r0);
#pragma unroll
      for (int u = 0; u < U; ++u) a[u] = b[u], ea[u] = eb[u];
    } else {
      if (r0 != 0) load(a, ea, r0);
      consume(a, ea, r0);
    }
  }
}

template <int NCB, int H, bool ALLKV, bool SWAP, bool PIPE>
__global__ void __launch_bounds__(kThreads)
    score_probe_kernel(const uint8_t* __restrict__ reps, const int32_t* __restrict__ tables,
                       int64_t pages_per_seq, const float* __restrict__ qs,
                       float* __restrict__ scores) {
  score_probe<NCB, H, ALLKV, SWAP, PIPE, Elem::kBf16>(reps, nullptr, tables, pages_per_seq, qs,
                                                      scores);
}

// The 1-byte variants: min. blocks 1 lets ptxas take the registers the fp8 conversion needs
// (with the bf16 kernel's bounds it spills at H = 1).
template <int NCB, int H, bool ALLKV, bool SWAP, bool PIPE, Elem E, Scale S, int U>
__global__ void __launch_bounds__(kThreads, 1)
    score_probe_byte_kernel(const uint8_t* __restrict__ reps, const void* __restrict__ scales,
                            const int32_t* __restrict__ tables, int64_t pages_per_seq,
                            const float* __restrict__ qs, float* __restrict__ scores) {
  score_probe<NCB, H, ALLKV, SWAP, PIPE, E, S, U>(reps, scales, tables, pages_per_seq, qs, scores);
}

__global__ void read_kernel(const uint4* __restrict__ p, int64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

struct Case {
  const char* name;
  int seqs, heads;
  bool random_tables;
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// One KV head (H = 1), int8 codes with the magic conversion and the 1-byte exponent array: the
// block's NCB chunks in NCB / SC stages, copied NS - 1 stages ahead into a shared ring.
template <int NCB, int SC, int NS>
__global__ void __launch_bounds__(kThreads)
    score_cpasync_kernel(const uint8_t* __restrict__ reps, const int8_t* __restrict__ exps,
                         const int32_t* __restrict__ tables, int64_t pages_per_seq,
                         const float* __restrict__ qs, float* __restrict__ scores) {
  constexpr int LPC = kLanesPerChunk<Elem::kInt8M>, CPL = 32 / LPC, WARPS = kThreads / 32;
  constexpr int STAGES = NCB / SC, COPIES = SC * LPC / kThreads, CPW = SC / WARPS;
  static_assert(SC * LPC % kThreads == 0 && CPW % CPL == 0, "whole copies and loads");
  __shared__ int32_t page_s[NCB];
  __shared__ int32_t ex_s[NCB];
  extern __shared__ uint4 ring[];  // NS stages of SC chunks x LPC 16-byte pieces
  const int seq = blockIdx.y;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * NCB;
  const int32_t* table = tables + seq * pages_per_seq + c0;
  for (int i = threadIdx.x; i < NCB; i += kThreads) {
    const int32_t page = __ldg(table + i);
    page_s[i] = page;
    ex_s[i] = __ldg(exps + page);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane % LPC, grp = lane / LPC;
  float q[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) q[i] = qs[seq * kD + sub * 16 + i];
  __syncthreads();
  const auto issue = [&](int s) {
    if (s < STAGES) {
      uint4* dst = ring + (s % NS) * SC * LPC;
#pragma unroll
      for (int j = 0; j < COPIES; ++j) {
        const int e = j * kThreads + static_cast<int>(threadIdx.x);
        const int32_t page = page_s[s * SC + e / LPC];
        cp_async16(dst + e, reps + static_cast<int64_t>(page) * kD + (e % LPC) * 16);
      }
    }
    cp_async_commit();  // empty groups too: the count of groups behind stays NS - 2
  };
#pragma unroll
  for (int s = 0; s < NS - 1; ++s) issue(s);
#pragma unroll 1
  for (int s = 0; s < STAGES; ++s) {
    cp_async_wait<NS - 2>();
    __syncthreads();  // stage s landed for every thread; stage s - 1's slot is free
    issue(s + NS - 1);
    const uint4* buf = ring + (s % NS) * SC * LPC;
#pragma unroll
    for (int u = 0; u < CPW / CPL; ++u) {
      const int c = warp * CPW + u * CPL + grp;
      float acc = dot16<Elem::kInt8M>(buf[c * LPC + sub], q);
#pragma unroll
      for (int o = LPC / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
      if (sub == 0)
        scores[seq * pages_per_seq + c0 + s * SC + c] =
            acc * __int_as_float((ex_s[s * SC + c] + 127) << 23);
    }
  }
}

template <int NCB, int SC, int NS>
void launch_cpasync(const Case& c, int64_t pages, const uint8_t* reps, const int8_t* exps,
                    const int32_t* tables, const float* q, float* scores) {
  constexpr int smem = NS * SC * kD;
  static bool attr = false;
  if (!attr) {
    CHECK(cudaFuncSetAttribute(score_cpasync_kernel<NCB, SC, NS>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr = true;
  }
  score_cpasync_kernel<NCB, SC, NS>
      <<<dim3(static_cast<unsigned>(pages / NCB), c.seqs), kThreads, smem>>>(reps, exps, tables,
                                                                             pages, q, scores);
}

template <int NCB, int H, bool ALLKV, bool SWAP, bool PIPE, Elem E = Elem::kBf16,
          Scale S = Scale::kExp8, int U = 8>
void launch(const Case& c, int64_t pages, const uint8_t* reps, const void* scales,
            const int32_t* tables, const float* q, float* scores) {
  const int cbs = static_cast<int>(pages / NCB), streams = ALLKV ? c.seqs : c.seqs * H;
  const dim3 grid = SWAP ? dim3(streams, cbs) : dim3(cbs, streams);
  if constexpr (E == Elem::kBf16)
    score_probe_kernel<NCB, H, ALLKV, SWAP, PIPE>
        <<<grid, kThreads>>>(reps, tables, pages, q, scores);
  else
    score_probe_byte_kernel<NCB, H, ALLKV, SWAP, PIPE, E, S, U>
        <<<grid, kThreads>>>(reps, scales, tables, pages, q, scores);
}

template <int H>
void run_case(const Case& c) {
  const int64_t pages = int64_t{1} << 16;  // 1,048,576 tokens a sequence
  const int64_t pool = pages * c.seqs;
  const size_t rep_bytes = static_cast<size_t>(pool) * H * kD * 2;
  const size_t byte_reps = static_cast<size_t>(pool) * H * kD, exp_bytes = pool * H;
  const size_t row_bytes = static_cast<size_t>(pool) * H * kRowBytes<Scale::kRow160>;
  uint8_t* reps;
  uint8_t* reps8;  // 1-byte representatives (room for the longest rows) and their scales
  int8_t* exps;
  float* scales;
  int32_t* tables;
  float *q, *scores;
  uint32_t* sink;
  char* flush;
  const size_t flush_bytes = size_t{512} << 20;
  CHECK(cudaMalloc(&reps, rep_bytes));
  CHECK(cudaMalloc(&reps8, row_bytes));
  CHECK(cudaMalloc(&exps, exp_bytes));
  CHECK(cudaMalloc(&scales, exp_bytes * 4));
  CHECK(cudaMemset(reps8, 0x3a, row_bytes));  // int8 58, E4M3 1.25; an in-row scale 7.1e-4
  CHECK(cudaMemset(exps, 0, exp_bytes));
  CHECK(cudaMemset(scales, 0, exp_bytes * 4));
  CHECK(cudaMalloc(&tables, pool * 4));
  CHECK(cudaMalloc(&q, static_cast<size_t>(c.seqs) * H * kD * 4));
  CHECK(cudaMalloc(&scores, static_cast<size_t>(pool) * H * 4));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMalloc(&flush, flush_bytes));
  CHECK(cudaMemset(reps, 0x3f, rep_bytes));
  CHECK(cudaMemset(q, 0, static_cast<size_t>(c.seqs) * H * kD * 4));
  std::vector<int32_t> perm(static_cast<size_t>(pool));
  std::iota(perm.begin(), perm.end(), 0);
  if (c.random_tables) std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  CHECK(cudaMemcpy(tables, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice));
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaMemset(flush, 1, flush_bytes));
  CHECK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  const auto time = [&](const char* variant, auto&& fn, size_t bytes) {
    std::vector<float> ms;
    for (int it = 0; it < 11; ++it) {
      // L2 emptied of the representatives by reading other bytes (clean lines: a memset here
      // would leave ~50 MB of dirty lines whose write-back the timed kernel would pay for).
      read_kernel<<<4 * sms, 512>>>(reinterpret_cast<const uint4*>(flush),
                                    static_cast<int64_t>(flush_bytes / 16), sink);
      CHECK(cudaEventRecord(e0));
      fn();
      CHECK(cudaEventRecord(e1));
      CHECK(cudaEventSynchronize(e1));
      CHECK(cudaGetLastError());
      float t = 0;
      CHECK(cudaEventElapsedTime(&t, e0, e1));
      if (it >= 2) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double m = ms[ms.size() / 2];
    std::printf("%-26s %-16s %8.4f ms %6.2f TB/s\n", c.name, variant, m, bytes / m / 1e9);
  };
  const auto bf16 = [&](const char* variant, auto&& fn) { time(variant, fn, rep_bytes); };
  const auto byte8 = [&](const char* variant, auto&& fn) {
    time(variant, fn, byte_reps + exp_bytes);
  };
  bf16("read", [&] {
    read_kernel<<<4 * sms, 512>>>(reinterpret_cast<const uint4*>(reps),
                                  static_cast<int64_t>(rep_bytes / 16), sink);
  });
  byte8("int8 read", [&] {
    read_kernel<<<4 * sms, 512>>>(reinterpret_cast<const uint4*>(reps8),
                                  static_cast<int64_t>(byte_reps / 16), sink);
  });
  byte8("int8 base 512", [&] {
    launch<512, H, false, false, false, Elem::kInt8>(c, pages, reps8, exps, tables, q, scores);
  });
  byte8("fp8 base 512", [&] {
    launch<512, H, false, false, false, Elem::kFp8>(c, pages, reps8, exps, tables, q, scores);
  });
  byte8("int8 pipe 512", [&] {
    launch<512, H, false, false, true, Elem::kInt8>(c, pages, reps8, exps, tables, q, scores);
  });
  byte8("int8 base 1024", [&] {
    launch<1024, H, false, false, false, Elem::kInt8>(c, pages, reps8, exps, tables, q, scores);
  });
  const auto scaled = [&](const char* variant, auto&& fn) {
    time(variant, fn, byte_reps + exp_bytes * 4);
  };
  scaled("int8 f32 512", [&] {
    launch<512, H, false, false, false, Elem::kInt8, Scale::kF32>(c, pages, reps8, scales, tables,
                                                                  q, scores);
  });
  scaled("int8 row144 512", [&] {
    launch<512, H, false, false, false, Elem::kInt8, Scale::kRow144>(c, pages, reps8, nullptr,
                                                                     tables, q, scores);
  });
  scaled("int8 row160 512", [&] {
    launch<512, H, false, false, false, Elem::kInt8, Scale::kRow160>(c, pages, reps8, nullptr,
                                                                     tables, q, scores);
  });
  scaled("int8 magic 512", [&] {
    launch<512, H, false, false, false, Elem::kInt8M, Scale::kF32>(c, pages, reps8, scales, tables,
                                                                   q, scores);
  });
  byte8("int8 magic exp8 512", [&] {
    launch<512, H, false, false, false, Elem::kInt8M>(c, pages, reps8, exps, tables, q, scores);
  });
  if constexpr (H == 1) {
    byte8("cpasync 64/4",
          [&] { launch_cpasync<512, 64, 4>(c, pages, reps8, exps, tables, q, scores); });
    byte8("cpasync 128/3",
          [&] { launch_cpasync<512, 128, 3>(c, pages, reps8, exps, tables, q, scores); });
    byte8("cpasync 128/4",
          [&] { launch_cpasync<512, 128, 4>(c, pages, reps8, exps, tables, q, scores); });
    byte8("cpasync 32/8",
          [&] { launch_cpasync<512, 32, 8>(c, pages, reps8, exps, tables, q, scores); });
    byte8("cpasync 1024 128/4",
          [&] { launch_cpasync<1024, 128, 4>(c, pages, reps8, exps, tables, q, scores); });
  }
  scaled("int8 dp4a 512", [&] {
    launch<512, H, false, false, false, Elem::kInt8D, Scale::kF32>(c, pages, reps8, scales, tables,
                                                                   q, scores);
  });
  scaled("magic u16 512", [&] {
    launch<512, H, false, false, false, Elem::kInt8M, Scale::kF32, 16>(c, pages, reps8, scales,
                                                                       tables, q, scores);
  });
  scaled("magic r144 u16", [&] {
    launch<512, H, false, false, false, Elem::kInt8M, Scale::kRow144, 16>(c, pages, reps8, nullptr,
                                                                          tables, q, scores);
  });
  scaled("dp4a u16 512", [&] {
    launch<512, H, false, false, false, Elem::kInt8D, Scale::kF32, 16>(c, pages, reps8, scales,
                                                                       tables, q, scores);
  });
  bf16("base 512",
       [&] { launch<512, H, false, false, false>(c, pages, reps, nullptr, tables, q, scores); });
  bf16("swap 512",
       [&] { launch<512, H, false, true, false>(c, pages, reps, nullptr, tables, q, scores); });
  bf16("pipe 512",
       [&] { launch<512, H, false, false, true>(c, pages, reps, nullptr, tables, q, scores); });
  bf16("pipe 2048",
       [&] { launch<2048, H, false, false, true>(c, pages, reps, nullptr, tables, q, scores); });
  bf16("swap+pipe 512",
       [&] { launch<512, H, false, true, true>(c, pages, reps, nullptr, tables, q, scores); });
  if constexpr (H > 1) {
    bf16("allkv 512",
         [&] { launch<512, H, true, false, false>(c, pages, reps, nullptr, tables, q, scores); });
    bf16("allkv+pipe 512",
         [&] { launch<512, H, true, false, true>(c, pages, reps, nullptr, tables, q, scores); });
    bf16("allkv+pipe 256",
         [&] { launch<256, H, true, false, true>(c, pages, reps, nullptr, tables, q, scores); });
    bf16("allkv+pipe 1024",
         [&] { launch<1024, H, true, false, true>(c, pages, reps, nullptr, tables, q, scores); });
  }
  CHECK(cudaFree(reps));
  CHECK(cudaFree(reps8));
  CHECK(cudaFree(exps));
  CHECK(cudaFree(scales));
  CHECK(cudaFree(tables));
  CHECK(cudaFree(q));
  CHECK(cudaFree(scores));
  CHECK(cudaFree(sink));
  CHECK(cudaFree(flush));
}

}  // namespace

int main() {
  cudaDeviceProp p{};
  CHECK(cudaGetDeviceProperties(&p, 0));
  std::printf("%s, %d SMs; 65,536 pages (1M tokens) a sequence, d = 128\n", p.name,
              p.multiProcessorCount);
  run_case<4>({"2 seq x 4 KV, pool order", 2, 4, false});
  run_case<4>({"2 seq x 4 KV, random pages", 2, 4, true});
  run_case<1>({"16 seq x 1 KV, random pages", 16, 1, true});
  run_case<1>({"16 seq x 1 KV, pool order", 16, 1, false});
  run_case<2>({"16 seq x 2 KV, random pages", 16, 2, true});
  return 0;
}
