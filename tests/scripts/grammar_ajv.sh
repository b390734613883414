#!/bin/bash
# Constrained generations checked by an independent JSON Schema validator: test_grammar_mask
# --emit runs random walks under each of its schemas (a random allowed token per step, synthetic
# vocabulary) and writes the outputs; tests/js/grammar_ajv.mjs validates each with ajv
# (JSON Schema 2020-12, ajv-formats for date / date-time / time / uuid).
# Usage: bash tests/scripts/grammar_ajv.sh path/to/lily   (exit 77 without node or ajv)
LILY=${1:?usage: grammar_ajv.sh LILY_BIN}
BIN=$(dirname "$LILY")
if ! command -v node > /dev/null; then
    echo "SKIP: node not found"
    exit 77
fi
if [ ! -d tests/js/node_modules/ajv ] || [ ! -d tests/js/node_modules/ajv-formats ]; then
    echo "SKIP: tests/js/node_modules absent (run npm ci in tests/js)"
    exit 77
fi
out=$(mktemp /tmp/lily_grammar_ajv.XXXXXX)
trap 'rm -f "$out"' EXIT
"$BIN/test_grammar_mask" --emit "$out" > /dev/null || { echo "FAIL: test_grammar_mask --emit"; exit 1; }
node tests/js/grammar_ajv.mjs "$out"
