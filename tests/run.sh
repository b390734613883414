#!/usr/bin/env bash
# Builds lily and runs the whole test suite (CTest). Usage: tests/run.sh [--asan]
# With --asan, builds into build-asan with AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build
flags=()
if [ "${1:-}" = "--asan" ]; then
    dir=build-asan
    flags=(-DLILY_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo)
fi
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B "$dir" "${gen[@]}" "${flags[@]}" >/dev/null
cmake --build "$dir" -j"$(nproc)"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$dir" --output-on-failure -j"$(nproc)"
