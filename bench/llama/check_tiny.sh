#!/usr/bin/env bash
# The GGUF writer against lily on the trained model: models/tiny-trained written by gguf_q4 as F32
# and as Q4_0, run by llama.cpp (node-llama-cpp's prebuilt CPU binaries, bench/llama/logits.mjs)
# over the held-out token ids of ref.bin, and compared with lily by `lily eval --ref` (KL(llama.cpp
# || lily), top-1). Bars: F32 mean KL <= 1e-4 and top-1 >= 99 % (measured 7.9e-6, 99.8 %: what is
# left is llama.cpp's F16 KV cache), Q4_0 mean KL <= 0.05 and top-1 >= 85 % (measured 0.0177,
# 91.8 %: the requantisation of MLX 4-bit to Q4_0). A wrong tensor layout, norm shift or GDN head
# order misses the F32 bar by orders of magnitude.
#   bash bench/llama/check_tiny.sh [build/lily] [build/gguf_q4]
# Exits 77 (skipped) when llama.cpp is not installed (bash bench/llama/setup.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
lily=${1:-$root/build/lily}
gguf=${2:-$root/build/gguf_q4}
m="$root/models/tiny-trained"
if [ ! -f "$root/bench/llama/node_modules/node-llama-cpp/package.json" ]; then
    echo "check_tiny.sh: skipped: llama.cpp not installed (bash bench/llama/setup.sh)"
    exit 77
fi
command -v node > /dev/null || { echo "check_tiny.sh: skipped: no node"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for spec in "f32 1e-4 99" "q4_0 0.05 85"; do
    read -r type kl top1 <<< "$spec"
    "$gguf" --model "$m" --out "$tmp/m.gguf" --type "$type" 2> "$tmp/gguf.log" ||
        { cat "$tmp/gguf.log" >&2; exit 1; }
    # 1 thread: ggml's spinning barriers make 2 threads crawl on a busy 2-core machine
    node "$root/bench/llama/logits.mjs" --model "$tmp/m.gguf" --ref "$m/ref.bin" \
        --out "$tmp/llama.bin" --threads 1 2> /dev/null
    echo "== $type: lily against llama.cpp (bars: mean KL <= $kl, top-1 >= $top1 %)"
    "$lily" eval --model "$m" --text "$m/eval_text.txt" --ref "$tmp/llama.bin" --threads 1 \
        --max-mean-kl "$kl" --min-top1 "$top1"
done
