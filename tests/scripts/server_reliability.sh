#!/usr/bin/env bash
# Reliability of `lily serve` (issue #38), loopback only, bounded counts and times: slowloris with
# 1,000 slow connections while /health and a chat request answer within 2 s, every bad input
# answered with the OpenAI error JSON, the half-close, --max-tokens-cap, --request-timeout and a
# stalled stream reader (tests/scripts/lib/reliability.py), on plain HTTP and on HTTPS with a
# self-signed certificate made here; with TLS also the OpenAI conformance and a shorter load test
# (the plain runs are server_conformance.sh and server_load.sh). Exit 77 without python3.
# usage: bash tests/scripts/server_reliability.sh PATH/TO/lily   (from the repository root)
set -u
LILY=${1:?usage: server_reliability.sh LILY_BIN}
LILY=$(cd "$(dirname "$LILY")" && pwd)/$(basename "$LILY")
cd "$(dirname "$0")/../.."

. tests/scripts/lib/server.sh

command -v python3 >/dev/null || { echo "skipped: needs python3"; exit 77; }
command -v curl >/dev/null || { echo "skipped: needs curl"; exit 77; }
[ -f "$LILY_TOKDIR/tokenizer.json" ] || { echo "skipped: needs tests/js/node_modules"; exit 77; }
tmp=$(mktemp -d)
trap 'srv_stop; rm -rf "$tmp"' EXIT
srv_model "$tmp/m" 0 || { echo "mkmodel failed"; exit 1; }
status=0
# an ASan build is slower: fewer slow connections keep the time bounded
slow=1000 load=150 clients=16
ldd "$LILY" 2>/dev/null | grep -q libasan && slow=300 load=60 clients=8
R="python3 tests/scripts/lib/reliability.py"
MAIN=(--header-timeout 2 --body-timeout 3 --conns-per-ip 300 --max-body 65536 --max-tokens-cap 8 --ctx 512
      --threads 1 --conn-requests 5)

run() { # name, python args..., -- server flags...
    local name=$1
    shift
    local py=()
    while [ "$1" != -- ]; do py+=("$1"); shift; done
    shift
    srv_start "$tmp/m" "$@" || { echo "$name: server did not start"; status=1; return; }
    local url=$SRV_URL
    [ -n "${TLS:-}" ] && url=${url/http:/https:}
    $R "$url" "${py[@]}" || status=1
    case $name in main*) reuse "$url" ;; esac
    srv_stop || { echo "$name: server exited with an error"; status=1; }
}

reuse() { # curl with three URLs: one connection (keep-alive)
    local n
    n=$(curl -sv ${TLS:+--cacert "$tmp/cert.pem"} "$1/health" "$1/v1/models" "$1/health" 2>&1 |
        grep -c "Re-using existing connection")
    printf '%-66s %s\n' "curl: 3 requests on one connection" "$([ "$n" = 2 ] && echo ok || echo FAIL)"
    [ "$n" = 2 ] || status=1
}

echo "== plain HTTP"
run main main --slow $slow --conn-requests 5 -- "${MAIN[@]}"
run timeout timeout -- --ctx 4096 --threads 1 --request-timeout 1.5
run stall stall -- --ctx 4096 --threads 1 --send-timeout 1 --send-buffer 64K

if ! command -v openssl >/dev/null; then
    echo "TLS: skipped (no openssl)"
    exit $status
fi
echo "== HTTPS (self-signed certificate)"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -keyout "$tmp/key.pem" -out "$tmp/cert.pem" 2>/dev/null ||
    { echo "openssl could not make a certificate"; exit 1; }
TLSF=(--tls-cert "$tmp/cert.pem" --tls-key "$tmp/key.pem")
TLS=1
srv_start() { # as lib/server.sh, over HTTPS
    local dir=$1
    shift
    rm -f "$dir/port"
    "$LILY" serve --model "$dir" --port 0 --port-file "$dir/port" --quiet "$@" &
    SRV_PID=$!
    for _ in $(seq 1 600); do
        if [ -s "$dir/port" ]; then
            SRV_URL="http://127.0.0.1:$(cat "$dir/port")"
            curl -sf --cacert "$tmp/cert.pem" "https://127.0.0.1:$(cat "$dir/port")/health" \
                >/dev/null && return 0
        fi
        kill -0 "$SRV_PID" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
run main-tls main --tls "$tmp/cert.pem" --slow 200 --conn-requests 5 -- "${MAIN[@]}" "${TLSF[@]}"
run stall-tls stall --tls "$tmp/cert.pem" -- --ctx 4096 --threads 1 --send-timeout 1 \
    --send-buffer 64K "${TLSF[@]}"
if command -v node >/dev/null && [ -d tests/js/node_modules/openai ]; then
    srv_start "$tmp/m" --api-key test-key-1 --ctx 512 --max-body 65536 --threads 1 "${TLSF[@]}" ||
        { echo "server did not start"; exit 1; }
    url=${SRV_URL/http:/https:}
    (cd tests/js && NODE_EXTRA_CA_CERTS="$tmp/cert.pem" TOOLS_XML=0 \
        node server_conformance.mjs "$url" test-key-1) || status=1
    srv_stop || { echo "conformance-tls: server exited with an error"; status=1; }
    srv_start "$tmp/m" --ctx 256 --threads 1 --parallel-queue 128 --snapshot-mem 64 \
        "${TLSF[@]}" || { echo "server did not start"; exit 1; }
    url=${SRV_URL/http:/https:}
    (cd tests/js && NODE_EXTRA_CA_CERTS="$tmp/cert.pem" LOAD_REQUESTS=${LOAD_REQUESTS:-$load} \
        LOAD_CLIENTS=${LOAD_CLIENTS:-$clients} node load_server.mjs "$url" "$SRV_PID") ||
        status=1
    srv_stop || { echo "load-tls: server exited with an error"; status=1; }
else
    echo "TLS conformance and load: skipped (needs node and tests/js/node_modules)"
fi
exit $status
