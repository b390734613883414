#!/usr/bin/env bash
# CUDA backend check for the GPU machine: parity tests, compute-sanitizer, and the 35B-A3B
# benchmark, in one call.
#
#   bash bench/gpu_check.sh prepare   # here (no GPU needed): build with nvcc, pack the
#                                     # binaries and the shared libraries they need into
#                                     # .devcarry/cuda.tar.xz (git-ignored)
#   bash bench/gpu_check.sh run       # on the GPU machine, with .devcarry carried: unpack, run
#                                     # every tests/parity binary, memcheck + racecheck the
#                                     # kernel tests, then the 35B benchmark; logs go to $OUT
#
# The GPU machine has nvcc and cmake but not the -dev packages lily_core links (cJSON, PCRE2,
# utf8proc), so the binaries are built here (Debian 12, glibc 2.36: they run on newer glibcs)
# and carried with copies of those libraries. Stages can be skipped: GPU_CHECK_SKIP="sanitizer
# bench lily". GPU_CHECK_BENCH_DIR picks where the synthetic 35B checkpoint is written (local
# disk, ~19.5 GB; default /tmp/lily35b).
set -u
mode=${1:-run}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
carry=.devcarry
skip=" ${GPU_CHECK_SKIP:-} "

if [ "$mode" = prepare ]; then
    set -e
    export PATH=/usr/local/cuda/bin:$PATH
    cmake -S . -B build-cuda -G Ninja -DLILY_CUDA=ON -DLILY_SERVER=OFF \
        -DCMAKE_CUDA_ARCHITECTURES=90a >/dev/null
    targets=$(cd tests/parity && ls test_*.c | sed 's/\.c$//')
    ninja -C build-cuda $targets
    ninja -C build-cuda lily || echo "note: the lily binary did not build; the benchmark will use test_cuda_bench only"
    rm -rf "$carry/pack" && mkdir -p "$carry/pack/bin" "$carry/pack/lib"
    for t in $targets; do cp build-cuda/$t "$carry/pack/bin/"; done
    [ -x build-cuda/lily ] && cp build-cuda/lily "$carry/pack/bin/"
    strip "$carry"/pack/bin/*
    # the non-system shared libraries the binaries need
    for b in "$carry"/pack/bin/*; do
        ldd "$b" | awk '/=> \//{print $3}' | grep -E 'cjson|pcre2|utf8proc|microhttpd' || true
    done | sort -u | while read -r so; do cp -L "$so" "$carry/pack/lib/"; done
    git rev-parse --short HEAD >"$carry/pack/commit"
    git status --short -- src/backend/cuda tests/parity >>"$carry/pack/commit"
    tar -C "$carry/pack" -cJf "$carry/cuda.tar.xz" .
    rm -rf "$carry/pack"
    ls -la "$carry/cuda.tar.xz"
    exit 0
fi

[ "$mode" = run ] || { echo "usage: $0 prepare|run" >&2; exit 2; }
out=${OUT:-$root/gpu_check_out}
mkdir -p "$out"
log="$out/gpu_check.log"
work=/tmp/lily_gpu_check
rm -rf "$work" && mkdir -p "$work/logs"
logs=$work/logs # per-test logs, packed into $OUT/logs.tgz at the end ($OUT returns <= 8 files)
tar -C "$work" -xJf "$carry/cuda.tar.xz"
export LD_LIBRARY_PATH="$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec > >(tee -a "$log") 2>&1
echo "== gpu_check $(date -u +%FT%TZ), built from $(head -1 "$work/commit")"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true

echo "== parity tests"
pass=0 fail=0 skipped=0
for t in "$work"/bin/test_*; do
    name=$(basename "$t")
    [ "$name" = test_cuda_bench ] && continue
    start=$(date +%s%N)
    timeout 300 "$t" >"$logs/$name.log" 2>&1
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    case $rc in
    0) pass=$((pass + 1)); st=PASS ;;
    77) skipped=$((skipped + 1)); st=SKIP ;;
    *) fail=$((fail + 1)); st="FAIL($rc)" ;;
    esac
    printf '%-24s %-9s %7dms  %s\n' "$name" "$st" "$ms" "$(tail -1 "$logs/$name.log")"
    [ "$st" = PASS ] || grep -E '^FAIL' "$logs/$name.log" | head -20
done
echo "parity: $pass passed, $fail failed, $skipped skipped"

if [[ $skip != *" sanitizer "* ]] && command -v compute-sanitizer >/dev/null; then
    echo "== compute-sanitizer"
    # bounded: a sanitizer slows kernels 10-100x; errors print as they are found
    for run in memcheck:gemv memcheck:gdn memcheck:gemm memcheck:attn memcheck:moe \
        racecheck:gemm racecheck:attn racecheck:moe; do
        tool=${run%:*} t=${run#*:}
        {
            timeout ${GPU_CHECK_SAN_S:-40} compute-sanitizer --tool $tool --error-exitcode 3 \
                "$work/bin/test_cuda_$t" >"$logs/san_${tool}_$t.log" 2>&1
            rc=$?
            printf '%-10s %-6s rc=%d  %s\n' $tool $t $rc \
                "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/san_${tool}_$t.log" | tail -1)"
        }
    done
fi

if [[ $skip != *" bench "* ]]; then
    echo "== 35B-A3B benchmark"
    export LILY_CUDA_BENCH_DIR=${GPU_CHECK_BENCH_DIR:-/tmp/lily35b}
    mkdir -p "$LILY_CUDA_BENCH_DIR"
    timeout 420 "$work/bin/test_cuda_bench" 2>&1 | tee "$logs/bench.log"
    if [[ $skip != *" lily "* ]] && [ -x "$work/bin/lily" ]; then
        echo "== lily bench"
        timeout 200 "$work/bin/lily" bench --model "$LILY_CUDA_BENCH_DIR" --backend cuda \
            --prefill 4K --decode 4K --gen 32 2>&1 | tail -20
    fi
fi
echo "== done $(date -u +%FT%TZ)"
tar -C "$work" -czf "$out/logs.tgz" logs
