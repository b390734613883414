#!/usr/bin/env python3
"""Expected token ids from Hugging Face `tokenizers` for lily's tokenizer tests.

For every line of the corpus (one JSON string per line; lines are split on "\\n" only) writes
one line of space-separated ids (HF `Tokenizer.encode(text, add_special_tokens=False).ids`) and,
next to it, one JSON string per line with HF's decode of those ids (skip_special_tokens=False).

  python3 tools/hf_tokenizer_ids.py --tokenizer-dir DIR \\
      --corpus tests/fixtures/tokenizer/corpus.jsonl \\
      --out tests/fixtures/tokenizer/expected_qwen3.hf.txt [--pattern qwen35]

  # or both variants at once, with the file names the C test looks for:
  python3 tools/hf_tokenizer_ids.py --tokenizer-dir DIR --out-dir tests/fixtures/tokenizer

--pattern qwen35 loads DIR/tokenizer.json with its Split regex replaced by the Qwen3.5 regex in
tests/fixtures/tokenizer/qwen35_pattern.txt (same vocabulary and merges). When `transformers`
is importable, the ids are also checked against AutoTokenizer loaded offline from the same files;
disagreements are reported on stderr (the `tokenizers` ids are what gets written).

Needs no network. Exit status: 0 written, 1 any error (with a message), 3 transformers disagrees.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PATTERN_FILE = os.path.join(REPO, "tests", "fixtures", "tokenizer", "qwen35_pattern.txt")


def die(msg):
    print("hf_tokenizer_ids: error: " + msg, file=sys.stderr)
    sys.exit(1)


def read_corpus(path):
    try:
        with open(path, "rb") as f:
            data = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        die("cannot read corpus %s: %s" % (path, e))
    lines = data.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    texts = []
    for i, line in enumerate(lines):
        try:
            t = json.loads(line)
        except ValueError as e:
            die("%s line %d is not JSON: %s" % (path, i + 1, e))
        if not isinstance(t, str):
            die("%s line %d is not a JSON string" % (path, i + 1))
        texts.append(t)
    return texts


def tokenizer_json(tok_dir, variant, pattern_file):
    path = os.path.join(tok_dir, "tokenizer.json")
    try:
        with open(path, "rb") as f:
            spec = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as e:
        die("cannot load %s: %s" % (path, e))
    if variant == "qwen3":
        return spec
    try:
        with open(pattern_file, "rb") as f:
            pattern = f.read().decode("utf-8").rstrip("\r\n")
    except OSError as e:
        die("cannot read the Qwen3.5 pattern %s: %s" % (pattern_file, e))
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    splits = [p for p in steps or [] if isinstance(p, dict) and p.get("type") == "Split"]
    if len(splits) != 1 or "Regex" not in (splits[0].get("pattern") or {}):
        die("%s: expected exactly one Split pre-tokenizer with a Regex pattern" % path)
    splits[0]["pattern"] = {"Regex": pattern}
    return spec


def hf_ids(spec, texts):
    try:
        import tokenizers
    except ImportError as e:
        die("the Python package 'tokenizers' is not importable: %s" % e)
    try:
        tok = tokenizers.Tokenizer.from_str(json.dumps(spec))
    except Exception as e:  # noqa: BLE001 - report whatever the Rust side raised
        die("tokenizers cannot load the tokenizer: %s" % e)
    ids, dec = [], []
    for t in texts:
        enc = tok.encode(t, add_special_tokens=False).ids
        ids.append(enc)
        dec.append(tok.decode(enc, skip_special_tokens=False))
    return tokenizers.__version__, ids, dec


def transformers_check(spec, tok_dir, texts, ids, label):
    """Returns the number of texts where transformers' AutoTokenizer disagrees (None if it could
    not be used)."""
    try:
        import transformers
        from transformers import AutoTokenizer
    except ImportError:
        print("%s: transformers not importable; cross-check skipped" % label, file=sys.stderr)
        return None
    tmp = tempfile.mkdtemp(prefix="lily-hf-tok-")
    try:
        with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False)
        cfg = os.path.join(tok_dir, "tokenizer_config.json")
        if os.path.exists(cfg):
            shutil.copy(cfg, os.path.join(tmp, "tokenizer_config.json"))
        try:
            at = AutoTokenizer.from_pretrained(tmp, local_files_only=True)
        except Exception as e:  # noqa: BLE001
            print("%s: transformers %s could not load the tokenizer offline (%s); cross-check "
                  "skipped" % (label, transformers.__version__, e), file=sys.stderr)
            return None
        bad = 0
        for i, t in enumerate(texts):
            got = at(t, add_special_tokens=False)["input_ids"]
            if list(got) != ids[i]:
                bad += 1
                print("%s: transformers differs on line %d: %r\n  tokenizers:   %s\n"
                      "  transformers: %s" % (label, i, t[:60], ids[i][:40], list(got)[:40]),
                      file=sys.stderr)
        print("%s: transformers %s agrees on %d/%d texts"
              % (label, transformers.__version__, len(texts) - bad, len(texts)), file=sys.stderr)
        return bad
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_atomic(path, lines):
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        die("output directory %s does not exist" % d)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")
    os.replace(tmp, path)


def run(args, variant, out):
    texts = read_corpus(args.corpus)
    spec = tokenizer_json(args.tokenizer_dir, variant, args.pattern_file)
    version, ids, dec = hf_ids(spec, texts)
    label = "%s (tokenizers %s)" % (variant, version)
    write_atomic(out, [" ".join(str(i) for i in x) for x in ids])
    dec_out = out[:-4] + ".decode.jsonl" if out.endswith(".txt") else out + ".decode.jsonl"
    write_atomic(dec_out, [json.dumps(d, ensure_ascii=True) for d in dec])
    print("%s: %d texts, %d tokens -> %s, %s" % (label, len(texts), sum(map(len, ids)), out,
                                                 dec_out), file=sys.stderr)
    return transformers_check(spec, args.tokenizer_dir, texts, ids, label)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer-dir", required=True, help="directory with tokenizer.json")
    ap.add_argument("--corpus", default=os.path.join(REPO, "tests", "fixtures", "tokenizer",
                                                     "corpus.jsonl"))
    ap.add_argument("--out", help="ids file to write (decode goes to <out>.decode.jsonl)")
    ap.add_argument("--out-dir", help="write expected_qwen3.hf.* and expected_qwen35.hf.* here")
    ap.add_argument("--pattern", choices=["qwen3", "qwen35"], default="qwen3",
                    help="qwen35: swap in the Qwen3.5 split regex")
    ap.add_argument("--pattern-file", default=DEFAULT_PATTERN_FILE)
    args = ap.parse_args()
    if bool(args.out) == bool(args.out_dir):
        die("give exactly one of --out FILE or --out-dir DIR")
    if not os.path.isfile(os.path.join(args.tokenizer_dir, "tokenizer.json")):
        die("%s has no tokenizer.json" % args.tokenizer_dir)
    jobs = [(args.pattern, args.out)] if args.out else [
        (v, os.path.join(args.out_dir, "expected_%s.hf.txt" % v)) for v in ("qwen3", "qwen35")]
    disagree = 0
    for variant, out in jobs:
        disagree += run(args, variant, out) or 0
    sys.exit(3 if disagree else 0)


if __name__ == "__main__":
    main()
