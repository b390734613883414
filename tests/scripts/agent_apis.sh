#!/usr/bin/env bash
# The agent APIs of `lily serve` with the official clients: starts the server (tiny random-weight
# checkpoint, real Qwen tokenizer, the Qwen3.5 template when ../shared/data has it) with an API
# key and the JSON request log, runs tests/js/agent_apis.mjs (@anthropic-ai/sdk against
# /v1/messages, openai's responses.create against /v1/responses), then checks that the request
# log has one well-formed line per request. Exit 77 when node or the npm packages are missing.
# usage: bash tests/scripts/agent_apis.sh PATH/TO/lily   (from the repository root)
set -u
LILY=${1:?usage: agent_apis.sh LILY_BIN}
LILY=$(cd "$(dirname "$LILY")" && pwd)/$(basename "$LILY")
cd "$(dirname "$0")/../.."

. tests/scripts/lib/server.sh

if ! command -v node >/dev/null || [ ! -d tests/js/node_modules/@anthropic-ai/sdk ] ||
    [ ! -d tests/js/node_modules/openai ] || [ ! -f "$LILY_TOKDIR/tokenizer.json" ]; then
    echo "skipped: needs node and tests/js/node_modules (cd tests/js && npm ci)"
    exit 77
fi
command -v curl >/dev/null || { echo "skipped: needs curl"; exit 77; }
tmp=$(mktemp -d)
trap 'srv_stop; rm -rf "$tmp"' EXIT
srv_model "$tmp/m" 1 || { echo "mkmodel failed"; exit 1; }
srv_start "$tmp/m" --api-key test-key-2 --ctx 1024 --threads 1 --log-format json \
    2>"$tmp/log" || { echo "server did not start"; cat "$tmp/log"; exit 1; }
echo "server at $SRV_URL"
status=0
# the Qwen3.5 template (copied by srv_model when ../shared has it) opens <think> in the prompt
think=0
[ -f "$tmp/m/chat_template.jinja" ] && think=1
(cd tests/js && THINK_TEMPLATE=$think node agent_apis.mjs "$SRV_URL" test-key-2) || status=1
srv_stop || { echo "server exited with an error"; status=1; }
# the log: one JSON line per request, with tokens for the generations
node - "$tmp/log" <<'JS' || status=1
const fs = require('fs');
const lines = fs.readFileSync(process.argv[2], 'utf8').split('\n').filter((l) => l.startsWith('{'));
const rows = lines.map((l) => JSON.parse(l));
let bad = 0;
const need = (ok, what) => { console.log(`${what.padEnd(76)} ${ok ? 'ok' : 'FAIL'}`); bad += !ok; };
const gen = rows.filter((r) => r.method === 'POST' && r.status === 200 &&
                        ['/v1/messages', '/v1/responses'].includes(r.path));
need(rows.length >= 20 && rows.every((r) => /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/.test(r.time)
     && /^127\.0\.0\.1:\d+$/.test(r.client) && Number.isInteger(r.status) && r.total_s >= 0),
     `log: ${rows.length} JSON lines with time, client, status, total_s`);
const odd = gen.filter((r) => !(r.prompt_tokens > 0 && r.generated_tokens > 0
     && r.cached_tokens >= 0 && r.ttft_s >= 0 && r.ttft_s <= r.total_s));
if (odd.length) console.log(JSON.stringify(odd));
need(gen.length >= 15 && gen.every((r) => r.prompt_tokens > 0 && r.generated_tokens > 0
     && r.cached_tokens >= 0 && r.ttft_s >= 0 && r.ttft_s <= r.total_s),
     'log: generations carry prompt/cached/generated tokens and ttft <= total');
need(gen.some((r) => r.cached_tokens > 0), 'log: a cache hit is logged');
need(rows.some((r) => r.path === '/v1/messages' && r.status === 401 && r.prompt_tokens === null),
     'log: the 401 is logged, without tokens');
need(rows.some((r) => r.path === '/v1/messages/count_tokens' && r.status === 200),
     'log: count_tokens is logged');
process.exit(bad ? 1 : 0);
JS
exit $status
