#!/bin/bash
# Enforced tool calls in the template's XML form checked by an independent JSON Schema
# validator: test_toolgram --emit runs random walks under each tool's grammar, parses each call
# with the output parser and writes its schema and arguments; tests/js/grammar_ajv.mjs
# validates each with ajv (JSON Schema 2020-12, ajv-formats).
# Usage: bash tests/scripts/toolgram_ajv.sh path/to/lily   (exit 77 without node, ajv or the
# server build)
LILY=${1:?usage: toolgram_ajv.sh LILY_BIN}
BIN=$(dirname "$LILY")
if ! command -v node > /dev/null; then
    echo "SKIP: node not found"
    exit 77
fi
if [ ! -d tests/js/node_modules/ajv ] || [ ! -d tests/js/node_modules/ajv-formats ]; then
    echo "SKIP: tests/js/node_modules absent (run npm ci in tests/js)"
    exit 77
fi
if [ ! -x "$BIN/test_toolgram" ]; then
    echo "SKIP: test_toolgram not built (LILY_SERVER=OFF)"
    exit 77
fi
out=$(mktemp /tmp/lily_toolgram_ajv.XXXXXX)
trap 'rm -f "$out"' EXIT
"$BIN/test_toolgram" --emit "$out" > /dev/null || { echo "FAIL: test_toolgram --emit"; exit 1; }
node tests/js/grammar_ajv.mjs "$out"
