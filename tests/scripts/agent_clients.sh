#!/usr/bin/env bash
# Constrained output through real agent clients: starts `lily serve` on a tiny random-weight
# checkpoint with the real Qwen tokenizer and the official Qwen3.5 template (when ../shared/data
# has it), runs tests/js/agent_clients.mjs (AI SDK generateObject / forced tool, LangChain
# withStructuredOutput, openai json_schema strict, 100 seeded requests validated by ajv), stops
# the server. Exit 77 when node or the npm packages are missing (cd tests/js && npm ci).
# usage: bash tests/scripts/agent_clients.sh PATH/TO/lily   (from the repository root)
set -u
LILY=${1:?usage: agent_clients.sh LILY_BIN}
LILY=$(cd "$(dirname "$LILY")" && pwd)/$(basename "$LILY")
cd "$(dirname "$0")/../.."

. tests/scripts/lib/server.sh

for p in openai ai @ai-sdk/openai-compatible @langchain/openai @langchain/core zod ajv ajv-formats; do
    if ! command -v node >/dev/null || [ ! -d "tests/js/node_modules/$p" ]; then
        echo "skipped: needs node and tests/js/node_modules/$p (cd tests/js && npm ci)"
        exit 77
    fi
done
[ -f "$LILY_TOKDIR/tokenizer.json" ] || { echo "skipped: no tokenizer"; exit 77; }
command -v curl >/dev/null || { echo "skipped: needs curl"; exit 77; }
tmp=$(mktemp -d)
trap 'srv_stop; rm -rf "$tmp"' EXIT
srv_model "$tmp/m" 1 || { echo "mkmodel failed"; exit 1; }
srv_start "$tmp/m" --api-key test-key-2 --ctx 2048 --threads 1 ||
    { echo "server did not start"; exit 1; }
echo "server at $SRV_URL"
status=0
(cd tests/js && node agent_clients.mjs "$SRV_URL" test-key-2) || status=1
srv_stop || { echo "server exited with an error"; status=1; }
exit $status
