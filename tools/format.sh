#!/usr/bin/env bash
# Formats every C, CUDA and header file of the tree in place with clang-format and the repository's
# .clang-format (tests/scripts/check_format.sh checks the same set in CI).
set -euo pipefail
cd "$(dirname "$0")/.."
cf=$(command -v clang-format || command -v clang-format-14)
git ls-files -z -- 'src/*.[ch]' 'src/*.cu' 'src/*.cuh' 'tools/*.[ch]' 'tests/*.[ch]' \
    'bench/*.[ch]' 'bench/*.cu' 'include/*.h' | xargs -0 "$cf" --style=file -i
