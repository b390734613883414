#!/usr/bin/env bash
# Decode through `lily serve` on the tiny random-weight model (real Qwen tokenizer, Qwen3.5
# template), unconstrained or constrained: N seeded chat requests of up to 200 tokens, summed
# timings (predicted_n, predicted_ms, and for constrained requests grammar_ms: the masks, their
# application to a copy of the logits and the matcher's steps).
# usage: [WARM=1] bash bench/serve_constrained.sh LILY_BIN plain|json|tool [N]   (from the repository root)
set -u
LILY=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
MODE=$2
N=${3:-8}
. tests/scripts/lib/server.sh
tmp=$(mktemp -d)
trap 'srv_stop; rm -rf "$tmp"' EXIT
srv_model "$tmp/m" 1 > /dev/null || exit 1
srv_start "$tmp/m" --ctx 2048 --threads 1 || { echo "server did not start"; exit 1; }
extra=''
case $MODE in
json) extra=',"response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,"schema":{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string","maxLength":40},"c":{"type":"array","items":{"enum":["x","y",true,3]},"maxItems":8},"d":{"type":"string","format":"uuid"}},"required":["a","b","c","d"],"additionalProperties":false}}}' ;;
tool) extra=',"tool_choice":"required","tools":[{"type":"function","function":{"name":"get_weather","strict":true,"parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":30},"days":{"type":"integer"}},"required":["city","days"],"additionalProperties":false}}}]' ;;
esac
# warm-up (WARM requests of the same kind: the per-terminal token tables fill once per process)
for i in $(seq 1 "${WARM:-1}"); do
    curl -s "$SRV_URL/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"messages":[{"role":"user","content":"warm up"}],"max_tokens":200,"seed":'"$((100 + i))"''"$extra"'}' > /dev/null
done
for i in $(seq 1 "$N"); do
    curl -s "$SRV_URL/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"messages":[{"role":"user","content":"Tell me a long story, number '"$i"'"}],"max_tokens":200,"seed":'"$i"',"temperature":1'"$extra"'}'
    echo
done | python3 -c '
import sys, json
n = ms = gms = 0
for line in sys.stdin:
    t = json.loads(line)["timings"]
    n += t["predicted_n"]; ms += t["predicted_ms"]; gms += t.get("grammar_ms", 0)
print("%s: %d tokens, %.3f ms/token (%.1f tok/s), grammar %.4f ms/token" % (sys.argv[1], n, ms / n, 1000 * n / ms, gms / n))
' "$MODE"
