#!/usr/bin/env bash
# Load and fault test of `lily serve` on loopback: 64 concurrent clients, 1000 chat completions,
# 30 % of the clients disconnecting at random points (tests/js/load_server.mjs), with a tiny
# random-weight model. Then the server is stopped with SIGTERM and must exit cleanly (under an
# ASan build that includes LeakSanitizer's leak check at exit). LOAD_REQUESTS / LOAD_CLIENTS
# override the sizes (an ASan build defaults to 300 requests from 32 clients). Exit 77 when node
# or tests/js/node_modules is missing.
# usage: bash tests/scripts/server_load.sh PATH/TO/lily   (from the repository root)
set -u
LILY=${1:?usage: server_load.sh LILY_BIN}
LILY=$(cd "$(dirname "$LILY")" && pwd)/$(basename "$LILY")
cd "$(dirname "$0")/../.."

. tests/scripts/lib/server.sh

if ! command -v node >/dev/null || [ ! -f "$LILY_TOKDIR/tokenizer.json" ]; then
    echo "skipped: needs node and tests/js/node_modules (cd tests/js && npm ci)"
    exit 77
fi
command -v curl >/dev/null || { echo "skipped: needs curl"; exit 77; }
tmp=$(mktemp -d)
trap 'srv_stop; rm -rf "$tmp"' EXIT
srv_model "$tmp/m" 0 || { echo "mkmodel failed"; exit 1; }
srv_start "$tmp/m" --ctx 256 --threads 1 --parallel-queue 128 --snapshot-mem 64 ||
    { echo "server did not start"; exit 1; }
# an ASan build runs several times slower: a smaller load keeps the suite's time reasonable
if ldd "$LILY" 2>/dev/null | grep -q libasan && [ -z "${LOAD_REQUESTS:-}" ]; then
    export LOAD_REQUESTS=300 LOAD_CLIENTS=32
fi
status=0
(cd tests/js && node load_server.mjs "$SRV_URL" "$SRV_PID") || status=1
srv_stop || { echo "server did not exit cleanly"; status=1; }
[ $status = 0 ] && echo "server exited cleanly"
exit $status
