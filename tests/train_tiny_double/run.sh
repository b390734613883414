#!/usr/bin/env bash
# CPU dry run of tools/train_tiny.py against test doubles of `tokenizers` (byte-level ids) and
# `transformers` (qwen3_5_moe's parameter names and shapes with simplified math), so that the
# script's own logic (batches, MTP slicing, the training loop, MLX export, the float32 reference
# read back through tools/hf_reference.py, ref.bin, train_log.json) runs end to end without the
# GPU machine. Needs python3 with torch and numpy (Debian: python3-torch python3-numpy); not part
# of CTest (CI has no torch). What it cannot check: the real transformers/tokenizers APIs.
#   [PYTHON=/usr/bin/python3] tests/train_tiny_double/run.sh CORPUS_OUT_DIR [WORKDIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
src=${1:?usage: run.sh CORPUS_OUT_DIR [WORKDIR] (the out/ folder of tools/make_corpus.sh)}
work=${2:-/tmp/train_tiny_double}
rm -rf "$work" && mkdir -p "$work/corpus"
${PYTHON:-python3} - "$src" "$work/corpus" <<'PY'
import sys
src, dst = sys.argv[1:]
for fn, n in (("train.txt", 60), ("heldout.txt", 12), ("chat_train.txt", 400),
              ("chat_heldout.txt", 100)):
    docs = open(f"{src}/{fn}").read().split("\n<|endoftext|>\n")[:n]
    open(f"{dst}/{fn}", "w").write("\n<|endoftext|>\n".join(docs))
PY
PYTHONPATH=$here ${PYTHON:-python3} "$root/tools/train_tiny.py" --corpus "$work/corpus" --out "$work/out" \
    --smoke --batch 2 --seq 64 --ref-tokens 128 \
    --template "${TEMPLATE:-/work/shared/data/qwen3_5_chat_template.jinja}" \
    --hf-reference "$root/tools/hf_reference.py"
ls -l "$work/out/model"
