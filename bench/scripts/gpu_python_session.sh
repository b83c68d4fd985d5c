#!/usr/bin/env bash
# The Python package (python/, docs/python.md) built with the CUDA backend and its whole pytest
# suite on the H200 device, in one call of at most 540 s. Run from the repository root of the
# device's copy of the working tree (torch, transformers and pytest preinstalled, no network):
#
#   bash bench/scripts/gpu_python_session.sh
#
# Build: `pip install --no-build-isolation ./python -C cmake.define.CISA_PY_CUDA=ON` (spelled
# --config-settings=, which older pips take too) where the image has scikit-build-core and
# nanobind; where pip is unavailable for that (no scikit-build-core) or fails, the same CMake project is built directly (cmake -S python, as docs/python.md describes),
# its module copied into python/cisa/ and the tests run with PYTHONPATH=python. cpp-httplib is not
# needed: the package links cisa_core (and cisa_cuda), and `cisa serve` is only configured when the
# library is found (the root CMakeLists.txt, quietly). nlohmann-json is needed (it is on the image).
# Then `pytest -q python/tests` (the GPU tests in python/tests/test_gpu.py and
# test_gpu_transformers.py must run, not skip).
# Environment: PYTHON (default python3), JOBS (default nproc), TOTAL_S (default 540), BUILD_WITH
# (auto: pip where it can, else CMake; pip; cmake), BUILD_DIR (the CMake build's folder),
# PYTEST_ARGS (default python/tests: what pytest runs).
# Results under $OUT: session.log (steps, versions, times), build.log (the whole build output) and
# build_tail.log, pytest.log, junit.xml, nvidia-smi.txt. Exit status: 0 when the build succeeded, the
# module has the CUDA backend, pytest passed and no GPU test skipped (4 when some did).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-python-out}
mkdir -p "$OUT"
t0=$(date +%s)
TOTAL_S=${TOTAL_S:-540}
deadline=$((t0 + TOTAL_S - 10))  # 10 s kept for collecting the logs
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
log() { echo "[gpu_python $(date +%H:%M:%S) +$(($(date +%s) - t0))s] $*" | tee -a "$OUT/session.log"; }
left() { echo $((deadline - $(date +%s))); }
build_failed() {  # $1: what failed; the tail of the build log goes to stdout and build_tail.log
  log "$1"
  tail -60 "$OUT/build.log" | tee "$OUT/build_tail.log"
  grep -nE "error|Error|FAILED" "$OUT/build.log" | head -30 | tee -a "$OUT/build_tail.log"
}

if [ ! -f python/CMakeLists.txt ] || [ ! -f python/pyproject.toml ]; then
  log "run this from the repository root (python/CMakeLists.txt not found in $PWD)"
  exit 2
fi
{ nvidia-smi; } >"$OUT/nvidia-smi.txt" 2>&1 || true
head -15 "$OUT/nvidia-smi.txt"

NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
if [ -z "$NVCC" ]; then log "no nvcc (PATH or /usr/local/cuda/bin): cannot build the CUDA backend"; exit 2; fi
nvcc_dir=$(dirname "$NVCC")
export PATH="$nvcc_dir:$PATH"
{
  echo "python: $("$PY" --version 2>&1) at $(command -v "$PY")"
  echo "nvcc: $("$NVCC" --version | tail -1)"
  echo "cmake: $(cmake --version | head -1)"
  echo "ninja: $(ninja --version 2>/dev/null || echo none)"
  "$PY" - <<'EOF' 2>&1
import importlib
for m in ("torch", "transformers", "pytest", "nanobind", "scikit_build_core", "numpy"):
    try:
        mod = importlib.import_module(m)
        print(f"{m}: {getattr(mod, '__version__', '?')}")
    except Exception as e:  # noqa: BLE001
        print(f"{m}: missing ({type(e).__name__}: {e})")
import torch
print("torch.cuda:", torch.version.cuda, "available:", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
} | tee -a "$OUT/session.log"

export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1  # a system Python (PEP 668)
build_s=$(( $(left) - 170 ))  # what the build may take; at least ~160 s stay for the tests
[ "$build_s" -gt 360 ] && build_s=360
: >"$OUT/build.log"
mode=none
BUILD_WITH=${BUILD_WITH:-auto}
if [ "$BUILD_WITH" = cmake ]; then
  log "BUILD_WITH=cmake: plain CMake build"
elif [ "$BUILD_WITH" = pip ] || "$PY" -c "import scikit_build_core, nanobind" 2>/dev/null; then
  log "building with pip (scikit-build-core), CISA_PY_CUDA=ON, $JOBS jobs, limit ${build_s} s"
  if timeout "$build_s" "$PY" -m pip install -v --no-build-isolation --no-deps --no-index \
      --config-settings=cmake.define.CISA_PY_CUDA=ON \
      --config-settings="cmake.define.CMAKE_CUDA_COMPILER=$NVCC" ./python \
      >>"$OUT/build.log" 2>&1; then
    mode=pip
  else
    build_failed "pip install failed or timed out (rc=$?); trying the plain CMake build"
    build_s=$(( $(left) - 170 ))
  fi
else
  log "scikit-build-core or nanobind missing: plain CMake build instead of pip"
fi

if [ "$mode" = none ]; then
  nb_dir=$("$PY" -m nanobind --cmake_dir 2>/dev/null)
  if [ -z "$nb_dir" ]; then log "nanobind is not installed: cannot build the module"; exit 1; fi
  gen=""; command -v ninja >/dev/null && gen="-G Ninja"
  B=${BUILD_DIR:-/tmp/cisa_python_cuda_build}
  if [ "$build_s" -lt 60 ]; then build_failed "no time left for the CMake build"; exit 1; fi
  log "building with CMake into $B, CISA_PY_CUDA=ON, $JOBS jobs, limit ${build_s} s"
  if timeout "$build_s" bash -c "cmake -S python -B '$B' $gen -DCMAKE_BUILD_TYPE=Release \
        -DCISA_PY_CUDA=ON -DCMAKE_CUDA_COMPILER='$NVCC' -DPython_EXECUTABLE='$(command -v "$PY")' \
        -Dnanobind_DIR='$nb_dir' && cmake --build '$B' -j $JOBS" >>"$OUT/build.log" 2>&1; then
    so=$(find "$B" -maxdepth 1 -name '_C*.so' | head -1)
    if [ -z "$so" ]; then build_failed "the CMake build made no _C*.so"; exit 1; fi
    rm -f python/cisa/_C*.so
    if ! cp "$so" python/cisa/; then log "cannot copy $so into python/cisa"; exit 1; fi
    export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
    mode=cmake
  else
    build_failed "the CMake build failed or timed out (rc=$?)"
    exit 1
  fi
fi
tail -5 "$OUT/build.log" >"$OUT/build_tail.log"
log "built ($mode)"

# The tests must see this build's module (from python/tests, not the repository's python/cisa
# unless the CMake fallback put it there).
if ! (cd "$OUT" && "$PY" -c "import cisa, sys; print('cisa from', cisa.__file__, 'HAS_CUDA', cisa.HAS_CUDA); sys.exit(0 if cisa.HAS_CUDA else 3)") \
    2>&1 | tee -a "$OUT/session.log"; then
  log "the installed cisa has no CUDA backend or does not import"
  exit 1
fi

test_s=$(left)
if [ "$test_s" -lt 30 ]; then log "no time left for the tests"; exit 1; fi
log "pytest -q python/tests (limit ${test_s} s)"
# -rsP: skip reasons, and what passed tests printed (test_gpu_transformers.py's logit bounds).
timeout "$test_s" "$PY" -m pytest -q -rsP --durations=15 -p no:cacheprovider \
  --junitxml="$OUT/junit.xml" ${PYTEST_ARGS:-python/tests} >"$OUT/pytest.log" 2>&1
rc=$?
tail -60 "$OUT/pytest.log"
case $rc in
  0) log "pytest passed" ;;
  124) log "pytest timed out after ${test_s} s" ;;
  5) log "pytest collected no tests" ;;
  *) log "pytest failed (rc=$rc)" ;;
esac
# -rs lines: "SKIPPED [n] python/tests/test_gpu.py:LINE: reason".
gpu_skips=$(grep -oE "SKIPPED \[[0-9]+\] [^ ]*test_gpu\.py" "$OUT/pytest.log" |
  sed -E 's/SKIPPED \[([0-9]+)\].*/\1/' | awk '{s += $1} END {print s + 0}')
# With PYTEST_ARGS naming other tests only, test_gpu.py did not run: no skip expected there.
expect_gpu=1
if [ -n "${PYTEST_ARGS:-}" ] && ! echo " $PYTEST_ARGS " | grep -qE " python/tests/? |test_gpu\.py"; then
  expect_gpu=0
fi
log "tests of test_gpu.py skipped: $gpu_skips (expected $expect_gpu; 1: the check of a build without CUDA)"
tf_skips=$(grep -oE "SKIPPED \[[0-9]+\] [^ ]*test_gpu_transformers\.py" "$OUT/pytest.log" |
  sed -E 's/SKIPPED \[([0-9]+)\].*/\1/' | awk '{s += $1} END {print s + 0}')
log "tests of test_gpu_transformers.py skipped: $tf_skips (expected 0)"
if [ "$rc" -eq 0 ] && { [ "$gpu_skips" -ne "$expect_gpu" ] || [ "$tf_skips" -ne 0 ]; }; then
  log "error: GPU tests were skipped (their reasons are in pytest.log's summary)"
  rc=4
fi
log "done in $(($(date +%s) - t0)) s"
exit $rc
