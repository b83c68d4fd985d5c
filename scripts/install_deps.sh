#!/usr/bin/env bash
# Installs what building and testing cisa needs on a Debian machine (idempotent).
set -euo pipefail
need=()
for pkg in cmake ninja-build g++ libgtest-dev libgmock-dev libbenchmark-dev python3 clang bible-kjv; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "installing: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
