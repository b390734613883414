#!/usr/bin/env bash
# The request log and three server fixes (issue #34 item 6), without --quiet so that
# libmicrohttpd's own error log is on:
#   - `--log-format text` writes one line per request: time, client, method, path, status,
#     tokens, ttft and total; `--log-format none` writes none; a bad value is refused;
#   - /v1/completions with echo and a token-id prompt echoes the prompt's text;
#   - a client that leaves a non-streaming request is logged as 499 and no "internal error" is
#     printed;
#   - a request the front thread answers itself is logged (and on /v1/messages its error is in
#     Anthropic's shape);
#   - `--host ::1` serves over IPv6 (skipped where the machine has no IPv6 loopback).
# usage: bash tests/scripts/server_log.sh PATH/TO/lily   (from the repository root)
set -u
LILY=${1:?usage: server_log.sh LILY_BIN}
LILY=$(cd "$(dirname "$LILY")" && pwd)/$(basename "$LILY")
cd "$(dirname "$0")/../.."

. tests/scripts/lib/server.sh

command -v curl >/dev/null || { echo "skipped: needs curl"; exit 77; }
[ -f "$LILY_TOKDIR/tokenizer.json" ] || { echo "skipped: needs tests/js/node_modules"; exit 77; }
tmp=$(mktemp -d)
PID=
stop() {
    [ -n "$PID" ] || return 0
    kill -TERM "$PID" 2>/dev/null
    wait "$PID"
    local rc=$?
    PID=
    return $rc
}
trap 'stop; rm -rf "$tmp"' EXIT
fails=0
check() { # check OK WHAT
    printf '%-76s %s\n' "$2" "$([ "$1" = 0 ] && echo ok || echo FAIL)"
    [ "$1" = 0 ] || fails=$((fails + 1))
}
start() { # start HOST LOGFILE ARGS...
    local host=$1 log=$2
    shift 2
    rm -f "$tmp/port"
    "$LILY" serve --model "$tmp/m" --host "$host" --port 0 --port-file "$tmp/port" --ctx 512 \
        --threads 1 "$@" 2>"$log" &
    PID=$!
    for _ in $(seq 1 300); do
        [ -s "$tmp/port" ] && return 0
        kill -0 "$PID" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
srv_model "$tmp/m" 0 || { echo "mkmodel failed"; exit 1; }

"$LILY" serve --model "$tmp/m" --log-format yaml 2>"$tmp/bad"
check $(($? != 2 || ! $(grep -c "log-format" "$tmp/bad"))) "--log-format yaml refused"

start 127.0.0.1 "$tmp/log" --log-format text || { echo "server did not start"; exit 1; }
U=http://127.0.0.1:$(cat "$tmp/port")
J=(-H "Content-Type: application/json") # the server takes JSON bodies only
curl -sf "$U/health" >/dev/null
curl -s "$U/v1/chat/completions" "${J[@]}" -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}' \
    >/dev/null
curl -s "$U/v1/nowhere" >/dev/null
# echo with token ids: the text starts with the prompt's decoded text
ids='[9707, 11, 1879, 0]'
want=$(curl -s "$U/detokenize" "${J[@]}" -d "{\"tokens\": $ids}" | sed 's/^{"content":\(.*\)}$/\1/')
got=$(curl -s "$U/v1/completions" "${J[@]}" -d "{\"prompt\": $ids, \"echo\": true, \"max_tokens\": 2}")
case "$got" in *"\"text\":${want%\"}"*) r=0 ;; *) r=1; echo "  want $want in $got" ;; esac
check $r "completions echo with a token-id prompt returns the prompt text"
# a request the front answers itself (505) is logged, and on /v1/messages in Anthropic's shape
port=$(cat "$tmp/port")
front=$(exec 3<>"/dev/tcp/127.0.0.1/$port" &&
    printf 'POST /v1/messages HTTP/1.7\r\nHost: 127.0.0.1\r\n\r\n' >&3 && timeout 5 cat <&3)
case "$front" in *' 505 '*'"type":"error"'*) r=0 ;; *) r=1; echo "  got: $front" ;; esac
check $r "the front's 505 on /v1/messages is in Anthropic's error shape"
# a client that leaves a long non-streaming request
curl -s --max-time 0.5 "$U/v1/chat/completions" "${J[@]}" \
    -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":400}' >/dev/null
sleep 1.5
stop
ts='[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z 127\.0\.0\.1:[0-9]+'
grep -Eq "^$ts GET /health 200 total=[0-9.]+s$" "$tmp/log"
check $? "text log: GET /health 200 with time and client"
grep -Eq "^$ts POST /v1/chat/completions 200 prompt=[0-9]+ cached=0 gen=3 queue=[0-9.]+s ttft=[0-9.]+s total=[0-9.]+s$" "$tmp/log"
check $? "text log: a generation with prompt/cached/gen tokens, queue time, ttft and total"
grep -Eq "^$ts GET /v1/nowhere 404 total=" "$tmp/log"
check $? "text log: the 404"
grep -Eq "^$ts POST /v1/messages 505 total=" "$tmp/log"
check $? "text log: the front's own 505"
grep -Eq "^$ts POST /v1/chat/completions 499 " "$tmp/log"
check $? "text log: the client that left is logged as 499"
! grep -qi "internal error" "$tmp/log"
check $? "no 'Application reported internal error' for the client that left"
[ "$fails" = 0 ] || cat "$tmp/log"

start 127.0.0.1 "$tmp/log2" --log-format none || { echo "server did not start"; exit 1; }
curl -sf "http://127.0.0.1:$(cat "$tmp/port")/health" >/dev/null
stop
! grep -q "GET /health" "$tmp/log2"
check $? "--log-format none: no request lines"

if start ::1 "$tmp/log6" --log-format json; then
    out=$(curl -sg "http://[::1]:$(cat "$tmp/port")/health")
    stop
    case "$out" in *'"status":"ok"'*) r=0 ;; *) r=1 ;; esac
    check $r "--host ::1 serves over IPv6"
    grep -Eq '"client":"\[::1\]:[0-9]+","method":"GET","path":"/health","status":200' "$tmp/log6"
    check $? "json log: the IPv6 client"
elif grep -q "cannot listen" "$tmp/log6" && ! ip -6 addr show lo 2>/dev/null | grep -q "::1"; then
    echo "--host ::1: no IPv6 loopback here (skipped)"
else
    cat "$tmp/log6"
    check 1 "--host ::1 serves over IPv6"
fi
exit $((fails > 0))
