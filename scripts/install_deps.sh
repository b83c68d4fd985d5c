#!/usr/bin/env bash
# Installs what building and testing cisa needs on a Debian machine (idempotent).
set -euo pipefail
need=()
for pkg in cmake ninja-build g++ libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev python3 clang clang-format bible-kjv \
           pkg-config libcpp-httplib-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The server tests (tests/server) drive `cisa serve` with the official openai client; they skip
# with a message when it cannot be installed.
if ! python3 -c "import openai" >/dev/null 2>&1; then
  python3 -m pip install -q openai >/dev/null 2>&1 ||
    python3 -m pip install -q --break-system-packages openai >/dev/null 2>&1 ||
    echo "warning: could not install the openai Python package; the server's client tests will skip"
fi
