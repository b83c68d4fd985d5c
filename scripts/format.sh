#!/usr/bin/env bash
# clang-format (Debian's clang-format 14, .clang-format at the root) over every tracked C++ and
# CUDA file. `scripts/format.sh` rewrites them; `scripts/format.sh --check` changes nothing and
# fails, naming each file that differs, as CI does.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format.sh: clang-format not found (apt-get install clang-format)" >&2; exit 2; }
mapfile -t files < <(git ls-files -- '*.h' '*.cpp' '*.cu' '*.cuh' '*.cc')
if [ "${1:-}" = --check ]; then
  bad=()
  for f in "${files[@]}"; do
    clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if ((${#bad[@]})); then
    printf 'not clang-formatted: %s\n' "${bad[@]}" >&2
    echo "format.sh: ${#bad[@]} file(s) differ from .clang-format; run scripts/format.sh" >&2
    exit 1
  fi
  echo "format.sh: ${#files[@]} files clang-formatted"
else
  clang-format -i "${files[@]}"
fi
