#!/usr/bin/env bash
# Runs every libFuzzer target tests/fuzz/fuzz_<name>.c for SECONDS (default 30) on a copy of its
# seed corpus tests/fuzz/corpus/<name>/ (the tree is never written). Builds them first with clang
# in build-fuzz (-DLILY_FUZZ=ON). Exits non-zero if any target fails to build or finds a crash,
# leak or timeout; the reproducer is kept under build-fuzz/artifacts/<target>/.
# Usage: tests/fuzz/run.sh [SECONDS]
set -u
secs=${1:-30}
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${FUZZ_BUILD:-$root/build-fuzz}
cd "$root" || exit 1

if ! command -v clang >/dev/null; then
    echo "clang not found"
    exit 1
fi
CC=clang cmake -S "$root" -B "$build" -G Ninja -DLILY_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    >"$build.cmake.log" 2>&1 || { cat "$build.cmake.log"; exit 1; }

targets=()
for src in tests/fuzz/fuzz_*.c; do
    [ -e "$src" ] || continue
    targets+=("$(basename "$src" .c)")
done
if [ ${#targets[@]} -eq 0 ]; then
    echo "no fuzz targets"
    exit 1
fi
ninja -C "$build" "${targets[@]}" || exit 1

work=$(mktemp -d /tmp/lily_fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
failed=()
for t in "${targets[@]}"; do
    corpus="tests/fuzz/corpus/${t#fuzz_}"
    mkdir -p "$work/$t/corpus" "$build/artifacts/$t"
    if [ -d "$corpus" ]; then
        cp -r "$corpus"/. "$work/$t/corpus/"
    fi
    echo "== $t: ${secs}s, $(ls "$work/$t/corpus" | wc -l) seed inputs"
    if "$build/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$build/artifacts/$t/" "$work/$t/corpus" >"$work/$t.log" 2>&1; then
        grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$work/$t.log" | tail -n 2
    else
        tail -n 40 "$work/$t.log"
        echo "FAIL $t: reproducer(s) in $build/artifacts/$t/"
        failed+=("$t")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzzing found problems in: ${failed[*]}"
    exit 1
fi
echo "all ${#targets[@]} fuzz targets ran ${secs}s without findings"
