#!/usr/bin/env bash
# Corrupted checkpoints: `lily info --model` must exit non-zero with a message naming the file
# and/or tensor at fault, and exit 0 on the intact model. Checkpoints come from `lily mkmodel`
# (tiny preset); header edits keep the header length so the damage reaches the intended check.
# Usage: bash tests/scripts/badckpt.sh path/to/lily
set -u
lily=${1:-${LILY_BIN:-}}
if [ -z "$lily" ] || [ ! -x "$lily" ]; then
    echo "no lily binary given; skipping"
    exit 77
fi
tmp=$(mktemp -d /tmp/lily_badckpt.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0

ok() { echo "PASS $*"; pass=$((pass + 1)); }
bad() { echo "FAIL $*"; fail=$((fail + 1)); }

# expect_fail NAME DIR PATTERN...: info exits non-zero and stderr contains every pattern.
expect_fail() {
    local name=$1 dir=$2
    shift 2
    local out rc
    out=$("$lily" info --model "$dir" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -eq 0 ]; then
        bad "$name: exit 0 on a corrupt checkpoint"
        return
    fi
    if [ $rc -gt 2 ]; then
        bad "$name: exit $rc (crash?): $out"
        return
    fi
    for p in "$@"; do
        if ! grep -qF -- "$p" <<<"$out"; then
            bad "$name: message lacks '$p': $out"
            return
        fi
    done
    ok "$name: $out"
}

# patch FILE OLD NEW: overwrite the first occurrence of OLD with NEW (same length) in place.
patch() {
    local file=$1 old=$2 new=$3 off
    if [ ${#old} -ne ${#new} ]; then
        echo "patch: length mismatch" >&2
        return 1
    fi
    off=$(grep -obUaF -m1 -- "$old" "$file" | head -n1 | cut -d: -f1)
    if [ -z "$off" ]; then
        echo "patch: '$old' not found in $file" >&2
        return 1
    fi
    printf '%s' "$new" | dd of="$file" bs=1 seek="$off" conv=notrunc status=none
}

fresh() { # fresh NAME [mkmodel args]: a copy of the intact model (per layout)
    local name=$1 src=$tmp/base-hf
    shift
    [ "${1:-}" = mlx ] && src=$tmp/base-mlx
    rm -rf "$tmp/$name"
    cp -r "$src" "$tmp/$name"
    echo "$tmp/$name"
}

if ! "$lily" mkmodel --out "$tmp/base-hf" --preset tiny --seed 5 --quiet ||
    ! "$lily" mkmodel --out "$tmp/base-mlx" --preset tiny --layout mlx4 --seed 5 --quiet ||
    ! "$lily" mkmodel --out "$tmp/base-sharded" --preset tiny --seed 5 --shard-size 300K --quiet; then
    echo "FAIL mkmodel could not build the test checkpoints"
    exit 1
fi

for d in base-hf base-mlx base-sharded; do
    if "$lily" info --model "$tmp/$d" >"$tmp/info.txt" 2>&1; then
        ok "intact $d loads ($(grep -c . "$tmp/info.txt") lines of info)"
    else
        bad "intact $d: $(cat "$tmp/info.txt")"
    fi
done

st=model.safetensors
P=model.language_model.layers

d=$(fresh truncated)
truncate -s 600000 "$d/$st"
expect_fail "shard truncated to 600000 bytes" "$d" "$st" "beyond the data section"

d=$(fresh truncated-header)
truncate -s 100 "$d/$st"
expect_fail "shard truncated inside the header" "$d" "$st" "past the end"

d=$(fresh short)
truncate -s 5 "$d/$st"
expect_fail "5-byte shard" "$d" "$st" "truncated"

d=$(fresh shape)
patch "$d/$st" '"shape":[512,64]' '"shape":[64,512]'
expect_fail "embedding shape flipped in the header" "$d" "$st" "embed_tokens.weight" "[64, 512]" \
    "expected [*, 64]"

d=$(fresh shape2)
patch "$d/$st" "\"$P.1.linear_attn.in_proj_z.weight\":{\"dtype\":\"BF16\",\"shape\":[128,64]" \
    "\"$P.1.linear_attn.in_proj_z.weight\":{\"dtype\":\"BF16\",\"shape\":[64,128]"
expect_fail "in_proj_z shape flipped" "$d" "$st" "in_proj_z.weight" "shape [64, 128], expected [128, 64]"

d=$(fresh dtype)
patch "$d/$st" "\"$P.0.linear_attn.A_log\":{\"dtype\":\"F32\"" "\"$P.0.linear_attn.A_log\":{\"dtype\":\"I32\""
expect_fail "A_log dtype changed to I32" "$d" "$st" "A_log" "dtype I32"

d=$(fresh dtype2)
patch "$d/$st" "\"$P.3.self_attn.o_proj.weight\":{\"dtype\":\"BF16\"," \
    "\"$P.3.self_attn.o_proj.weight\":{\"dtype\":\"U16\" ,"
expect_fail "o_proj dtype changed to U16" "$d" "$st" "o_proj.weight" "dtype U16"

d=$(fresh baddtype)
patch "$d/$st" "\"$P.3.self_attn.o_proj.weight\":{\"dtype\":\"BF16\"" \
    "\"$P.3.self_attn.o_proj.weight\":{\"dtype\":\"QQ16\""
expect_fail "unknown dtype QQ16" "$d" "$st" "o_proj.weight" "unknown dtype"

d=$(fresh missing)
patch "$d/$st" "$P.1.linear_attn.in_proj_z.weight" "$P.1.linear_attn.in_proj_y.weight"
expect_fail "in_proj_z removed from the header" "$d" "missing tensor" "$P.1.linear_attn.in_proj_z.weight"

d=$(fresh missing-expert)
patch "$d/$st" "$P.2.mlp.experts.5.down_proj.weight" "$P.2.mlp.experts.5.down_proj.wEight"
expect_fail "one expert's down_proj removed" "$d" "missing tensor" "$P.2.mlp.experts.5.down_proj.weight"

d=$(fresh bias)
patch "$d/$st" "$P.0.linear_attn.dt_bias" "$P.0.linear_attn.dt.bias"
expect_fail "a linear bias in a decoder layer" "$d" "$P.0.linear_attn.dt.bias" "biases are not supported"

d=$(fresh garbage)
printf 'garbage!garbage!garbage!' | dd of="$d/$st" bs=1 seek=8 conv=notrunc status=none
expect_fail "garbage header" "$d" "$st" "not valid JSON"

d=$(fresh hugelen)
printf '\377\377\377\377\377\377\377\177' | dd of="$d/$st" bs=1 seek=0 conv=notrunc status=none
expect_fail "header length 2^63" "$d" "$st" "header length"

d=$(fresh config)
printf '{"model_type": "qwen3_5_moe", "text_config": {' >"$d/config.json"
expect_fail "truncated config.json" "$d" "config.json" "not valid JSON"

d=$(fresh config2)
patch "$d/config.json" '"hidden_size":	64' '"hidden_size":	-4'
expect_fail "negative hidden_size" "$d" "config.json" "hidden_size"

d=$(fresh config3)
patch "$d/config.json" '"hidden_size":	64' '"hidden_size":	32'
expect_fail "config hidden_size disagrees with the tensors" "$d" "$st" "expected"

d=$(fresh config4)
patch "$d/config.json" '"vocab_size":	512' '"vocab_size":	511'
expect_fail "config vocab_size disagrees with the embedding" "$d" "vocab_size" "512"

d=$(fresh noconfig)
rm "$d/config.json"
expect_fail "config.json absent" "$d" "config.json"

d=$(fresh noshards)
rm "$d/$st"
expect_fail "no safetensors files" "$d" "no *.safetensors"

d=$(fresh mlx-scales mlx)
patch "$d/$st" "language_model.model.layers.0.linear_attn.in_proj_z.biases" \
    "language_model.model.layers.0.linear_attn.in_proj_z.biasez"
expect_fail "MLX biases of a quantized module removed" "$d" "in_proj_z.biases" "missing tensor"

d=$(fresh mlx-packed mlx)
patch "$d/$st" "\"language_model.model.layers.0.mlp.gate.weight\":{\"dtype\":\"U32\",\"shape\":[8,16]" \
    "\"language_model.model.layers.0.mlp.gate.weight\":{\"dtype\":\"U32\",\"shape\":[16,8]"
expect_fail "MLX 8-bit router packed shape wrong" "$d" "mlp.gate.weight" "expected [8, 16]"

rm -rf "$tmp/sharded-gone"
cp -r "$tmp/base-sharded" "$tmp/sharded-gone"
victim=$(ls "$tmp/sharded-gone" | grep -m1 'model-00002-of')
rm "$tmp/sharded-gone/$victim"
expect_fail "a shard named by the index is missing" "$tmp/sharded-gone" "$victim"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
