#!/usr/bin/env bash
# Quality gates on the trained model (models/tiny-trained): `lily eval` against the transformers
# float32 reference logits of its held-out slice (ref.bin, made by tools/train_tiny.py), for the
# CPU numeric paths. Bars (issue #31; BENCHMARKS.md "Quality gates"):
#   fp32 products (--precision exact), prefill:  mean KL <= 1e-4, top-1 >= 99.5 %,
#                                                                  |PPL delta| <= 0.5 %
#   default products (int16 codes on AVX-512 VNNI or AVX2), prefill and decode, and the fast ones
#   (int8 codes in the decode products):
#                                                                  mean KL <= 2e-3, top-1 >= 98 %,
#                                                                  |PPL delta| <= 0.5 %
# Usage: eval_gate.sh LILY_BIN
set -euo pipefail
lily=${1:?usage: eval_gate.sh LILY_BIN}
cd "$(dirname "$0")/../.."
m=models/tiny-trained
if [ ! -e "$m" ]; then
    echo "eval_gate: SKIP: $m is not installed yet (tools/train_tiny.py on the GPU machine, then" \
         "tools/install_tiny.sh)" >&2
    exit 77
fi
for f in config.json model.safetensors tokenizer.json eval_text.txt ref.bin; do
    [ -f "$m/$f" ] || { echo "eval_gate: $m/$f is missing" >&2; exit 1; }
done
fail=0
gate() { # name, model dir, env..., -- , eval args...
    local name=$1 dir=$2
    shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    echo "== $name"
    if ! env "${envs[@]}" "$lily" eval --model "$dir" --text "$m/eval_text.txt" --ref "$m/ref.bin" \
        --threads 2 "$@"; then
        echo "FAIL: $name" >&2
        fail=1
    fi
}
strict=(--max-mean-kl 1e-4 --min-top1 99.5 --max-ppl-delta 0.5)
default=(--max-mean-kl 2e-3 --min-top1 98 --max-ppl-delta 0.5)
gate "cpu fp32, prefill" "$m" X=1 -- --precision exact "${strict[@]}"
gate "cpu default, prefill" "$m" LILY_EVAL_GATE=1 -- "${default[@]}"
gate "cpu default, decode" "$m" LILY_EVAL_GATE=1 -- --mode decode "${default[@]}"
# The AVX2 kernel set (int16 products by vpmaddubsw / vpmaddwd), where the CPU has AVX2.
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    gate "cpu avx2 default, prefill" "$m" X=1 -- --cpu-isa avx2 "${default[@]}"
    gate "cpu avx2 default, decode" "$m" X=1 -- --cpu-isa avx2 --mode decode "${default[@]}"
fi
# FAST: int8 activations in the decode products (gemv_i8.h), on each kernel set that has them.
gate "cpu fast (int8 decode products), decode" "$m" X=1 -- --precision fast --mode decode \
    "${default[@]}"
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    gate "cpu avx2 fast (int8 decode products), decode" "$m" X=1 -- --cpu-isa avx2 \
        --precision fast --mode decode "${default[@]}"
fi
# The HF bf16 layout derived from the committed MLX files (dequantized, rounded to bf16).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$lily" convert --model "$m" --out "$tmp/hf" >/dev/null
gate "cpu fp32, HF bf16 layout (lily convert)" "$tmp/hf" X=1 -- --precision exact \
    "${default[@]}"
# The bars must be able to trip: an impossible bar on the same run has to fail.
if "$lily" eval --model "$m" --text "$m/eval_text.txt" --ref "$m/ref.bin" --threads 2 \
    --max-mean-kl 0 >/dev/null 2>&1; then
    echo "FAIL: a mean-KL bar of 0 was reported as met" >&2
    fail=1
fi
exit $fail
