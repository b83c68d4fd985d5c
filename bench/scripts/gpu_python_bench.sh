#!/usr/bin/env bash
# The Python package on the H200 device in one call (issue 16): the package built with the CUDA
# backend and its whole pytest suite (bench/scripts/gpu_python_session.sh, GPU tests included),
# the `cisa` CLI built beside it (in the background while the tests run), `cisa bench layer
# --backend cuda --json`, then bench/python/bench_torch_ops.py (the ops through PyTorch against
# that run, FlexAttention, gather-then-SDPA, transformers decode tokens/s) in the same call.
# Run from the repository root of the device's copy (torch, transformers, pytest preinstalled):
#
#   CISA_COMMIT=$(git rev-parse --short HEAD) TOTAL_S=500 bash bench/scripts/gpu_python_bench.sh
#
# Environment: TOTAL_S (default 520: the whole call), TEST_S (default 280: build + pytest),
# LAYER_ARGS (extra `cisa bench layer` options), BENCH_ARGS (extra bench_torch_ops.py options),
# PYTHON (default python3), SKIP_TESTS=1 (benchmark only), PYTEST_ARGS (passed on: which tests),
# NO_LAYER=1 (no CLI build, no `cisa bench layer`).
# $OUT gets at most 8 files (the device's limit): summary.log (every step), pytest.log,
# layer.json, torch_ops.json, bench.log, and logs.tar.gz (everything, build logs included).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-python-bench-out}
mkdir -p "$OUT"
W=$(mktemp -d /tmp/gpu_python_bench.XXXX)
t0=$(date +%s)
TOTAL_S=${TOTAL_S:-520}
TEST_S=${TEST_S:-280}
deadline=$((t0 + TOTAL_S - 15))
PY=${PYTHON:-python3}
COMMIT=${CISA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
log() { echo "[gpu_python_bench $(date +%H:%M:%S) +$(($(date +%s) - t0))s] $*" | tee -a "$OUT/summary.log"; }
left() { echo $((deadline - $(date +%s))); }
finish() {
  cp "$W"/session/pytest.log "$OUT/pytest.log" 2>/dev/null
  cat "$W"/session/session.log >>"$OUT/summary.log" 2>/dev/null
  tar -czf "$OUT/logs.tar.gz" -C "$W" --exclude=./cli . 2>/dev/null  # not the CLI's objects
  log "done in $(($(date +%s) - t0)) s"
}
trap finish EXIT

log "commit $COMMIT; $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)"
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)

# The CLI for `cisa bench layer`, built while the package builds and the tests run.
[ "${NO_LAYER:-0}" = 1 ] && mkdir -p "$W/cli" && echo "NO_LAYER=1" >"$W/cli_build.log"
[ "${NO_LAYER:-0}" = 1 ] || (
  cmake -S . -B "$W/cli" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCISA_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES=90a -DCISA_BUILD_BENCH=OFF \
    -DCISA_BUILD_TESTS=OFF -DCISA_BUILD_FUZZ=OFF -DCISA_NATIVE=OFF &&
    cmake --build "$W/cli" --target cisa -j "$(nproc)"
) >"$W/cli_build.log" 2>&1 &
cli_pid=$!
[ "${NO_LAYER:-0}" = 1 ] && cli_pid=0

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  log "package build + pytest (gpu_python_session.sh, limit ${TEST_S} s)"
  OUT="$W/session" TOTAL_S=$TEST_S PYTHON=$PY bash bench/scripts/gpu_python_session.sh \
    >"$W/session_stdout.log" 2>&1
  rc=$?
  log "gpu_python_session.sh rc=$rc: $(grep -E '[0-9]+ (passed|failed)' "$W/session/pytest.log" | tail -1)"
  grep -E "^(FAILED|ERROR)|SKIPPED" "$W/session/pytest.log" | head -20 | tee -a "$OUT/summary.log"
  grep -E "logits std|greedy tokens compared" "$W/session/pytest.log" | tee -a "$OUT/summary.log"
else
  log "SKIP_TESTS=1: building the package only"
  OUT="$W/session" TOTAL_S=120 PYTHON=$PY bash bench/scripts/gpu_python_session.sh \
    >"$W/session_stdout.log" 2>&1 || true
fi
# pip installs the module; the CMake fallback copies it into python/cisa (then PYTHONPATH).
if ! (cd /tmp && "$PY" -c "import cisa") 2>/dev/null; then
  export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! (cd /tmp && "$PY" -c "import cisa, sys; sys.exit(0 if cisa.HAS_CUDA else 1)") 2>/dev/null; then
  log "no cisa module with the CUDA backend: no benchmark"
  exit 1
fi

wait_s=$(( $(left) - 200 ))
[ "$wait_s" -lt 10 ] && wait_s=10
log "waiting for the CLI build (at most ${wait_s} s)"
for _ in $(seq "$wait_s"); do [ "$cli_pid" -gt 0 ] && kill -0 "$cli_pid" 2>/dev/null || break; sleep 1; done
if [ "$cli_pid" -gt 0 ] && kill -0 "$cli_pid" 2>/dev/null; then
  log "CLI build still running: stopped; no cisa bench layer comparison"
  kill "$cli_pid" 2>/dev/null
fi
[ "$cli_pid" -gt 0 ] && wait "$cli_pid" 2>/dev/null
CLI="$W/cli/cisa"
layer_json=""
if [ -x "$CLI" ]; then
  log "cisa bench layer --backend cuda --json ${LAYER_ARGS:-} (limit 150 s)"
  timeout 150 "$CLI" bench layer --backend cuda --json ${LAYER_ARGS:-} >"$OUT/layer.json" \
    2>"$W/layer_table.log"
  log "cisa bench layer rc=$?"
  cat "$W/layer_table.log" | tee -a "$OUT/summary.log"
  layer_json="$OUT/layer.json"
else
  log "no cisa CLI: $(tail -5 "$W/cli_build.log" | tr '\n' ' ')"
  grep -m5 -E "error" "$W/cli_build.log" | tee -a "$OUT/summary.log"
fi

bench_s=$(left)
if [ "$bench_s" -lt 40 ]; then log "no time left for bench_torch_ops.py"; exit 1; fi
log "bench_torch_ops.py (limit ${bench_s} s)"
cmd=("$PY" bench/python/bench_torch_ops.py --commit "$COMMIT" --out "$OUT/torch_ops.json"
     --time-limit $((bench_s - 15)))
[ -n "$layer_json" ] && cmd+=(--cisa-json "$layer_json")
# shellcheck disable=SC2206
cmd+=(${BENCH_ARGS:-})
log "${cmd[*]}"
PYTHONUNBUFFERED=1 timeout "$bench_s" "${cmd[@]}" >"$OUT/bench.log" 2>&1
log "bench_torch_ops.py rc=$?"
sed -n '/^geom /,$p' "$OUT/bench.log" | tee -a "$OUT/summary.log"
exit 0
