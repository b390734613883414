#!/usr/bin/env bash
# The format check: every C, CUDA and header file in src/, tools/, tests/, bench/ and include/ is
# as clang-format (the repository's .clang-format) writes it. Fix with tools/format.sh.
# Usage: bash tests/scripts/check_format.sh [LILY_BIN (unused)]   (exit 77 without clang-format)
set -euo pipefail
cd "$(dirname "$0")/../.."
cf=$(command -v clang-format || command -v clang-format-14 || true)
if [ -z "$cf" ]; then
    echo "check_format: SKIP: clang-format is not installed (Debian: clang-format)" >&2
    exit 77
fi
bad=0
while IFS= read -r -d '' f; do
    if ! "$cf" --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
        echo "not formatted: $f"
        bad=$((bad + 1))
    fi
done < <(git ls-files -z -- 'src/*.[ch]' 'src/*.cu' 'src/*.cuh' 'tools/*.[ch]' 'tests/*.[ch]' \
    'bench/*.[ch]' 'bench/*.cu' 'include/*.h')
if [ "$bad" -ne 0 ]; then
    echo "check_format: $bad file(s) differ from clang-format's output (run tools/format.sh)"
    exit 1
fi
echo "check_format: every file is formatted"
