#!/usr/bin/env bash
# The test command: configure, build with warnings as errors, and run every test suite.
# GPU tests skip themselves without a GPU; golden tests need the models (`cisa pull`) and skip,
# saying so, when a model is absent. Usage: scripts/test.sh [preset]   (default: ci)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-ci}"
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
ctest --preset "$preset" -j "$(nproc)"
