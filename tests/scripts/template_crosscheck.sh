#!/bin/bash
# Cross-checks `lily template` on every request case x official Qwen template against
#  1. @huggingface/jinja (tests/js/template_crosscheck.mjs; known JS-side differences are listed
#     there with reasons), and
#  2. when python3 has jinja2: tools/hf_template_render.py in its jinja2 emulation mode (a plain
#     jinja2 environment configured exactly like transformers'), byte for byte, with error
#     messages required to match.
# The authoritative comparison against transformers itself is tests/unit/test_template_hf.c.
# usage: bash tests/scripts/template_crosscheck.sh PATH/TO/lily   (from the repository root)
set -u
LILY=${1:?usage: template_crosscheck.sh LILY_BIN}
LILY=$(cd "$(dirname "$LILY")" && pwd)/$(basename "$LILY")
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DATA=$ROOT/../shared/data
CASES=$ROOT/tests/fixtures/template/cases
if [ ! -d "$ROOT/tests/js/node_modules/@huggingface/jinja" ]; then
    echo "skipped: tests/js/node_modules/@huggingface/jinja absent (cd tests/js && npm ci)"
    exit 77
fi
if [ ! -f "$DATA/qwen3_5_chat_template.jinja" ]; then
    echo "skipped: $DATA has no official templates"
    exit 77
fi

status=0
echo "== @huggingface/jinja"
(cd "$ROOT/tests/js" && node template_crosscheck.mjs "$LILY" "$CASES" "$DATA") || status=1

if python3 -c 'import jinja2' 2>/dev/null; then
    echo "== python jinja2 $(python3 -c 'import jinja2; print(jinja2.__version__)') (HF environment emulation)"
    TMP=$(mktemp -d)
    trap 'rm -rf "$TMP"' EXIT
    if ! python3 "$ROOT/tools/hf_template_render.py" --allow-jinja2-emulation \
        --template "$DATA/qwen3_chat_template.jinja" --template "$DATA/qwen3_5_chat_template.jinja" \
        --template "$DATA/qwen3_coder_chat_template.jinja" --cases "$CASES" --out "$TMP/ref" \
        2>"$TMP/log"; then
        cat "$TMP/log"
        echo "FAIL: hf_template_render.py failed"
        exit 1
    fi
    pass=0
    fail=0
    for f in "$CASES"/*.json; do
        c=$(basename "$f" .json)
        for t in qwen3 qwen3_5 qwen3_coder; do
            "$LILY" template --template "$DATA/${t}_chat_template.jinja" --request "$f" \
                >"$TMP/out" 2>"$TMP/err"
            rc=$?
            if [ -f "$TMP/ref/$c.$t.txt" ]; then
                if [ $rc = 0 ] && cmp -s "$TMP/out" "$TMP/ref/$c.$t.txt"; then
                    pass=$((pass + 1))
                else
                    fail=$((fail + 1))
                    echo "FAIL $c.$t: rc=$rc $(head -c 300 "$TMP/err")"
                    cmp "$TMP/out" "$TMP/ref/$c.$t.txt" | head -1
                fi
            else
                want=$(cat "$TMP/ref/$c.$t.error")
                if [ $rc != 0 ] && grep -qF -- "$want" "$TMP/err"; then
                    pass=$((pass + 1))
                else
                    fail=$((fail + 1))
                    echo "FAIL $c.$t: want error '$want', got rc=$rc '$(head -c 300 "$TMP/err")'"
                fi
            fi
        done
    done
    echo "jinja2: $pass passed, $fail failed"
    [ $fail = 0 ] || status=1
else
    echo "(python3 jinja2 not available: jinja2 comparison not run)"
fi
exit $status
