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
# one clang-format process for the whole set: it names each file it would change
mapfile -d '' files < <(git ls-files -z -- 'src/*.[ch]' 'src/*.cu' 'src/*.cuh' 'tools/*.[ch]' \
    'tests/*.[ch]' 'bench/*.[ch]' 'bench/*.cu' 'include/*.h')
out=$("$cf" --style=file --dry-run -Werror "${files[@]}" 2>&1) && rc=0 || rc=$?
bad=$(printf '%s\n' "$out" | grep -oE '^[^:]+:[0-9]+:[0-9]+: error' | cut -d: -f1 | sort -u || true)
if [ "$rc" -ne 0 ] || [ -n "$bad" ]; then
    printf 'not formatted: %s\n' $bad
    echo "check_format: clang-format would change these files (run tools/format.sh)"
    exit 1
fi
echo "check_format: every file is formatted (${#files[@]} files)"
