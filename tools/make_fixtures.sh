#!/usr/bin/env bash
# Golden-logits fixtures (tests/fixtures/logits/<name>/): make the synthetic checkpoints, run the
# transformers reference on them, and install the results. Three steps, because the reference
# needs torch + transformers (the GPU machine) while the checkpoints come from our own binary:
#
#   here:         tools/make_fixtures.sh prepare build/lily      # -> .devcarry/models/<name>/
#   GPU machine:  tools/make_fixtures.sh run                     # -> $OUT/fixtures.tar (holding
#                                                                #    <name>.logits.bin, <name>.fnv)
#                                                                #    and $OUT/fixtures.log
#   here:         tools/make_fixtures.sh install DIR             # DIR = where $OUT came back
#                                                                #    (fixtures.tar or loose files)
#
# Each step takes optional fixture names (default: every fixture directory with tokens.bin).
# `run` options via environment: OUT (output folder, default ./fixtures-out), MODELS (default
# .devcarry/models), PYTHON (default python3), DTYPE (default float32), SELFCHECK (default 8:
# also compare HF's own cached decode with its one-pass logits for that many tokens).
# One failing fixture does not stop the others; a summary ends every step, and the exit status
# is non-zero if any fixture failed.
set -u

root=$(cd "$(dirname "$0")/.." && pwd)
fixtures="$root/tests/fixtures/logits"
models=${MODELS:-$root/.devcarry/models}
step=${1:-}
shift || true

names() {
    if [ $# -gt 0 ]; then
        printf '%s\n' "$@"
    else
        for d in "$fixtures"/*/; do
            [ -f "$d/tokens.bin" ] && basename "$d"
        done
    fi
}

ok=0
bad=0
failed=""
note() { echo "$*"; [ -n "${log:-}" ] && echo "$*" >>"$log"; }
fail() { note "FAIL $1: $2"; bad=$((bad + 1)); failed="$failed $1"; }
pass() { note "ok   $1"; ok=$((ok + 1)); }

case "$step" in
prepare)
    lily=${1:?usage: make_fixtures.sh prepare LILY_BIN [names...]}
    shift
    mkdir -p "$models"
    for n in $(names "$@"); do
        args=$(cat "$fixtures/$n/mkmodel.args" 2>/dev/null) || { fail "$n" "no mkmodel.args"; continue; }
        rm -rf "${models:?}/$n"
        # shellcheck disable=SC2086 # the args file is a word list on purpose
        if "$lily" mkmodel --out "$models/$n" $args --quiet >/dev/null; then
            pass "$n ($(du -sh "$models/$n" | cut -f1): mkmodel $args)"
        else
            fail "$n" "lily mkmodel --out $models/$n $args"
        fi
    done
    note "carry: .devcarry (make sure .git/info/exclude ignores /.devcarry/)"
    ;;
run)
    out=${OUT:-$root/fixtures-out}
    py=${PYTHON:-python3}
    mkdir -p "$out"
    log="$out/fixtures.log"
    : >"$log"
    note "make_fixtures run: $(date -u +%FT%TZ) on $(hostname); python: $($py -c 'import sys; print(sys.version.split()[0])' 2>&1)"
    for n in $(names "$@"); do
        note "=== $n"
        if [ ! -f "$models/$n/config.json" ]; then
            fail "$n" "no checkpoint at $models/$n (run 'prepare' and carry .devcarry)"
            continue
        fi
        if PYTHONUNBUFFERED=1 "$py" "$root/tools/hf_reference.py" --model "$models/$n" \
            --tokens "$fixtures/$n/tokens.bin" --out "$out/$n.logits.bin" \
            --fnv-out "$out/$n.fnv" --dtype "${DTYPE:-float32}" \
            --selfcheck "${SELFCHECK:-8}" >>"$log" 2>&1; then
            pass "$n -> $out/$n.logits.bin ($(stat -c %s "$out/$n.logits.bin") bytes)"
        else
            fail "$n" "hf_reference.py failed (see $log)"
            rm -f "$out/$n.logits.bin" "$out/$n.fnv"
        fi
    done
    # One archive instead of 2 files per fixture (the GPU tool returns at most 8 files).
    (cd "$out" && ls ./*.logits.bin ./*.fnv >/dev/null 2>&1 &&
        tar -cf fixtures.tar ./*.logits.bin ./*.fnv && rm -f ./*.logits.bin ./*.fnv) || true
    tail -n 400 "$log" | grep -E "^(===|ok|FAIL|hf_reference: ERROR|model |logits |selfcheck|  GDN)" || true
    ;;
install)
    src=${1:?usage: make_fixtures.sh install DIR [names...]}
    shift
    if [ -f "$src/fixtures.tar" ]; then
        tmp=$(mktemp -d)
        tar -xf "$src/fixtures.tar" -C "$tmp" || { echo "cannot unpack $src/fixtures.tar"; exit 1; }
        src=$tmp
    fi
    for n in $(names "$@"); do
        if [ ! -f "$src/$n.logits.bin" ] || [ ! -f "$src/$n.fnv" ]; then
            fail "$n" "no $src/$n.logits.bin or $src/$n.fnv"
            continue
        fi
        cp "$src/$n.logits.bin" "$fixtures/$n/logits.bin" &&
            cp "$src/$n.fnv" "$fixtures/$n/checkpoint.fnv" &&
            pass "$n installed (fnv $(cat "$src/$n.fnv"))" || fail "$n" "copy failed"
    done
    ;;
*)
    sed -n '2,18p' "$0"
    exit 2
    ;;
esac
note "summary: $ok ok, $bad failed${failed:+ (failed:$failed)}"
[ "$bad" -eq 0 ]
