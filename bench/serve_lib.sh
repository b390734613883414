# Shell functions of the GPU-machine server scripts (bench/gpu_serve.sh, bench/gpu_slots.sh).

# pack_libs BIN DIR: copies every shared library BIN needs but the C runtime's into DIR (the GPU
# machine has no libmicrohttpd, cJSON, PCRE2 or utf8proc).
pack_libs() {
    ldd "$1" | awk '/=> \//{print $3}' |
        grep -vE '/(libc|libm|libstdc\+\+|libgcc_s|libdl|librt|libpthread|ld-linux)[.-]' |
        while read -r so; do cp -L "$so" "$2/"; done
}

# serve_up PID PORTFILE LOG [SECONDS]: waits until the server PID wrote its port to PORTFILE and
# answers /health; exits the script with LOG's tail when the server ended first.
serve_up() {
    local i
    for i in $(seq 1 $((${4:-120} * 2))); do
        [ -s "$2" ] && curl -sf "http://127.0.0.1:$(cat "$2")/health" >/dev/null && return 0
        kill -0 "$1" 2>/dev/null || { echo "lily serve exited:"; tail -20 "$3"; exit 1; }
        sleep 0.5
    done
    echo "lily serve did not come up in ${4:-120} s"; tail -20 "$3"; exit 1
}
