#!/usr/bin/env bash
# OpenAI-SDK conformance of `lily serve`: starts the server on a free loopback port with a tiny
# random-weight checkpoint carrying the real Qwen tokenizer (and the official Qwen3.5 template
# when ../shared/data has it), waits for /health, runs tests/js/server_conformance.mjs with the
# official `openai` npm client, and stops the server. Exit 77 when node or tests/js/node_modules
# is missing (run `npm ci` in tests/js).
# usage: bash tests/scripts/server_conformance.sh PATH/TO/lily [SERVE_OPTION...]
#        (from the repository root; the options go to `lily serve`)
set -u
LILY=${1:?usage: server_conformance.sh LILY_BIN [SERVE_OPTION...]}
shift
LILY=$(cd "$(dirname "$LILY")" && pwd)/$(basename "$LILY")
cd "$(dirname "$0")/../.."

. tests/scripts/lib/server.sh

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
srv_start "$tmp/m" --api-key test-key-1 --ctx 512 --max-body 65536 --threads 1 "$@" ||
    { echo "server did not start"; exit 1; }
echo "server at $SRV_URL (xml tool template: $xml)"
status=0
(cd tests/js && TOOLS_XML=$xml node server_conformance.mjs "$SRV_URL" test-key-1) || status=1
srv_stop || { echo "server exited with an error"; status=1; }
exit $status
