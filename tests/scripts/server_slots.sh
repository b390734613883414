#!/usr/bin/env bash
# Continuous batching in `lily serve` on loopback, with the trained tiny model (models/
# tiny-trained, CPU): tests/js/slots_server.mjs runs 8 seeded streams alone then all at once
# (--parallel 8, no prefix cache, prefill chunks of 64 tokens: every prompt is prefilled again while
# the others decode) and compares their texts; then 503 + Retry-After beyond slots + queue
# (--parallel 1 --parallel-queue 1); then the prefix cache shared across slots (--parallel 2).
# Exit 77 when node is missing.
# usage: bash tests/scripts/server_slots.sh PATH/TO/lily   (from the repository root)
set -u
LILY=${1:?usage: server_slots.sh LILY_BIN}
LILY=$(cd "$(dirname "$LILY")" && pwd)/$(basename "$LILY")
cd "$(dirname "$0")/../.."

. tests/scripts/lib/server.sh

command -v node >/dev/null || { echo "skipped: needs node"; exit 77; }
command -v curl >/dev/null || { echo "skipped: needs curl"; exit 77; }
[ -f models/tiny-trained/model.safetensors ] || { echo "skipped: no models/tiny-trained"; exit 77; }
# an ASan build runs several times slower: the first-token bound grows with it
if ldd "$LILY" 2>/dev/null | grep -q libasan; then export SLOTS_TTFT_BOUND_S=30; fi
tmp=$(mktemp -d)
trap 'srv_stop; rm -rf "$tmp"' EXIT
status=0
run() { # PHASE SERVER-ARGS...
    local phase=$1
    shift
    rm -f "$tmp/port"
    "$LILY" serve --model models/tiny-trained --port 0 --port-file "$tmp/port" --quiet \
        --threads 1 "$@" &
    SRV_PID=$!
    for _ in $(seq 1 300); do
        [ -s "$tmp/port" ] && SRV_URL="http://127.0.0.1:$(cat "$tmp/port")" &&
            curl -sf "$SRV_URL/health" >/dev/null && break
        kill -0 "$SRV_PID" 2>/dev/null || { echo "server did not start"; return 1; }
        sleep 0.1
    done
    local rc=0
    echo "== $phase ($*)"
    node tests/js/slots_server.mjs "$phase" "$SRV_URL" || rc=1
    srv_stop || { echo "server did not exit cleanly"; rc=1; }
    return $rc
}
run equal --ctx 1024 --parallel 8 --snapshot-mem 0 --prefill-chunk 64 || status=1
run busy --ctx 4096 --parallel 1 --parallel-queue 1 || status=1
run prefix --ctx 4096 --parallel 2 || status=1
exit $status
