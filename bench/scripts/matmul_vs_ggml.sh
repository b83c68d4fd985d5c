#!/usr/bin/env bash
# Builds bench/matmul_vs_ggml.cpp against our matmul sources and the libggml-cpu.so shipped in
# the llama-cpp-python wheel (pip install llama-cpp-python), then runs it.
#   bench/scripts/matmul_vs_ggml.sh [threads]     (default 1: CPU-time comparison of one core)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
lib=$(python3 -c "import llama_cpp, os; print(os.path.join(os.path.dirname(llama_cpp.__file__), 'lib'))")
out=${TMPDIR:-/tmp}/cisa_matmul_vs_ggml
cd "$root"
g++ -std=c++20 -O3 -march=native -Iinclude -Isrc \
  src/model/gguf_types.cpp src/model/quant_dequant.cpp src/model/quant_dot_scalar.cpp \
  src/model/quant_dot_avx2.cpp src/model/quant_dot_avx2_k.cpp src/model/matmul.cpp \
  src/core/status.cpp src/core/thread_pool.cpp bench/matmul_vs_ggml.cpp \
  -o "$out" -L"$lib" -lggml-cpu -lggml-base -Wl,-rpath,"$lib" -lpthread
threads=${1:-1}
OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=$threads "$out" "$threads"
