#!/usr/bin/env bash
# One GPU session on the device machine: build the CUDA backend, run the GPU tests, then the
# one-layer benchmark and its PyTorch anchors. Everything it writes lands under $OUT.
#
#   bench/scripts/gpu_session.sh [tests|cisa|bench|all]      (default: all)
#
# tests: build + GPU tests; cisa: tests + `cisa bench layer` (no PyTorch anchors); bench: the
# benchmark and anchors without tests; all: everything. Decode-only A/B runs of several binaries
# (with decode anchors and ncu): bench/scripts/gpu_decode_probe.sh.
#
# Build: an explicit CMake configure of only the targets this needs (cisa_cuda, the GPU tests,
# the cisa CLI), sm_90a, Release, in build/gpu-session. Options (environment): CISA_PREBUILT,
# AB_GEOMETRY, AB_PREBUILT, STOP_ON_TEST_FAIL, ANCHOR_ARGS (see where each is used below).
set -uo pipefail
mode=${1:-all}
case "$mode" in tests | cisa | bench | all) ;; *) echo "gpu_session.sh: unknown mode '$mode' (tests, cisa, bench or all; decode A/B runs: bench/scripts/gpu_decode_probe.sh)" >&2; exit 2 ;; esac
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
log() { echo "[gpu_session $(date +%H:%M:%S)] $*" | tee -a "$OUT/session.log"; }

log "mode=$mode commit=${CISA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee -a "$OUT/session.log"

if [ -n "${CISA_PREBUILT:-}" ]; then
  # Binaries built on the development machine (same sources, nvcc -arch sm_90a, static cudart):
  # saves the device-side build and does not depend on the rest of the tree compiling there.
  log "prebuilt binaries from $CISA_PREBUILT"
  mkdir -p build/gpu-session/tests
  cp "$CISA_PREBUILT"/cisa build/gpu-session/cisa &&
    cp "$CISA_PREBUILT"/cuda_select_test "$CISA_PREBUILT"/cuda_attention_test \
       "$CISA_PREBUILT"/cuda_decode_attention_test build/gpu-session/tests/ ||
    { log "prebuilt binaries missing"; exit 1; }
else
  log "configure + build"
  cmake -S . -B build/gpu-session -G Ninja -DCMAKE_BUILD_TYPE=Release -DCISA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DCISA_BUILD_BENCH=OFF -DCISA_NATIVE=OFF >"$OUT/build.log" 2>&1 &&
    ninja -C build/gpu-session -j16 cisa_cuda cuda_select_test cuda_attention_test cuda_decode_attention_test >>"$OUT/build.log" 2>&1
  rc=$?
  tail -3 "$OUT/build.log"
  if [ $rc -ne 0 ]; then log "BUILD FAILED"; grep -E "error" "$OUT/build.log" | head -20; exit 1; fi
  if [ "$mode" != tests ]; then
    ninja -C build/gpu-session -j16 cisa >>"$OUT/build.log" 2>&1 || { log "cisa CLI build failed"; grep error "$OUT/build.log" | head; }
  fi
fi

# The attention kernels' instructions: the wgmma kernel must show HGMMA (not only HMMA).
if command -v cuobjdump >/dev/null; then
  cuobjdump --dump-sass build/gpu-session/tests/cuda_attention_test 2>/dev/null >"$OUT/sass.txt"
  log "SASS: $(grep -c HGMMA "$OUT/sass.txt") HGMMA, $(grep -c HMMA "$OUT/sass.txt") HMMA instructions"
  rm -f "$OUT/sass.txt"
fi

if [ "$mode" != bench ]; then
  log "GPU tests"
  for t in cuda_select_test cuda_attention_test cuda_decode_attention_test; do
    ./build/gpu-session/tests/$t >"$OUT/$t.log" 2>&1
    echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$t.log" | tr '\n' ' ')" | tee -a "$OUT/session.log"
    grep -B3 -A12 "Failure" "$OUT/$t.log" | head -60
    grep -q '^\[  PASSED ' "$OUT/$t.log" && ! grep -q '^\[  FAILED ' "$OUT/$t.log" || tests_failed=1
  done
  # STOP_ON_TEST_FAIL=1: no benchmark after a failed test (saves device time).
  if [ -n "${STOP_ON_TEST_FAIL:-}" ] && [ -n "${tests_failed:-}" ]; then log "tests failed: stopping"; exit 1; fi
fi

if [ "$mode" != tests ]; then
  log "benchmark (cisa bench layer) + anchors"
  scratch=/tmp/cisa-bench
  mkdir -p $scratch
  ./build/gpu-session/cisa bench layer --backend cuda --json --dump-lists "$scratch" \
    >"$OUT/layer_cisa.json" 2>"$OUT/layer_cisa.log"
  log "cisa bench rc=$?"
  tail -40 "$OUT/layer_cisa.log"
  # AB_GEOMETRY=4:1 (or all, …): the same benchmark again with every attention launch on the
  # mma.sync kernel (--attention-kernel mma), for a same-session comparison with wgmma.
  if [ -n "${AB_GEOMETRY:-}" ]; then
    ./build/gpu-session/cisa bench layer --backend cuda --json --geometry "$AB_GEOMETRY" --attention-kernel mma \
      >"$OUT/layer_cisa_mma.json" 2>"$OUT/layer_cisa_mma.log"
    log "cisa bench (mma.sync) rc=$?"
    tail -14 "$OUT/layer_cisa_mma.log"
  fi
  # AB_PREBUILT=dir (with AB_PREBUILT_GEOMETRY, default 4:1): the same benchmark with the cisa
  # binary of an earlier build, for a same-session comparison of a change outside attention.
  if [ -n "${AB_PREBUILT:-}" ]; then
    "$AB_PREBUILT"/cisa bench layer --backend cuda --json --geometry "${AB_PREBUILT_GEOMETRY:-4:1}" \
      >"$OUT/layer_cisa_prev.json" 2>"$OUT/layer_cisa_prev.log"
    log "cisa bench (binary from $AB_PREBUILT) rc=$?"
    tail -14 "$OUT/layer_cisa_prev.log"
  fi
  if [ "$mode" = cisa ]; then log "done (no anchors in mode cisa)"; exit 0; fi
  # ANCHOR_ARGS: extra options of bench/python/anchors_layer.py (e.g. --no-flex --gather-geometries 4:1
  # when device time is short).
  PYTHONUNBUFFERED=1 python3 bench/python/anchors_layer.py --commit "${CISA_COMMIT:-unknown}" --lists "$scratch" --cisa "$OUT/layer_cisa.json" \
    --out "$OUT/layer_results.json" ${ANCHOR_ARGS:-} 2>&1 | tee "$OUT/anchors.log" | tail -60
  log "anchors rc=${PIPESTATUS[0]}"
fi
log "done"
