#!/bin/bash
# lily bench end to end on a tiny generated model (CPU backend): the sweep rows, the agent-turn
# rows (--turn N@D), the table, --json and --csv agree on what was asked, every timed figure is
# positive and finite, unmeasured cells are null / empty, the header and the JSON name the machine
# and the commit, --json - writes to stdout, --plot writes a well-formed SVG (xmllint) with the
# reference series of --plot-ref files (llama-bench -o json, lily's own JSON), and bad lists,
# rounds or reference files exit 2 with a message.
# Usage: bash tests/scripts/bench_cli.sh path/to/lily
LILY=${1:?usage: bench_cli.sh LILY_BIN}
command -v python3 >/dev/null || { echo "SKIP: python3 absent"; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
check() { # name, condition result (0 = ok)
    if [ "$2" = 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; fi
}

"$LILY" mkmodel --out "$TMP/m" --quiet --threads 2
check "mkmodel" $?

"$LILY" bench --model "$TMP/m" --threads 2 --prefill 48,96 --decode 96,33 --gen 5 \
    --turn 16@100,7@0,9@200 --rounds 2 --json "$TMP/b.json" --csv "$TMP/b.csv" >"$TMP/out.txt"
check "bench runs" $?
cat "$TMP/out.txt"

python3 - "$TMP/b.json" "$TMP/b.csv" "$TMP/out.txt" <<'PY'
import csv, json, math, sys
j = json.load(open(sys.argv[1]))
rows = {r["len"]: r for r in j["rows"]}
assert sorted(rows) == [33, 48, 96], rows
ok = lambda x: x > 0 and math.isfinite(x)
for n in (48, 96):
    assert ok(rows[n]["prefill_tok_s"]) and ok(rows[n]["prefill_tflops"]), rows[n]
for n in (96, 33):
    assert ok(rows[n]["decode_tok_s"]) and ok(rows[n]["decode_gb_s"]), rows[n]
assert rows[48]["decode_tok_s"] is None and rows[33]["prefill_tok_s"] is None
assert rows[48]["decode_gb_s"] is None and rows[33]["prefill_tflops"] is None
assert all(r["device_used_bytes"] is None for r in rows.values()), rows  # the CPU has no device memory
for n in (48, 96):
    r = rows[n]
    assert len(r["prefill_samples"]) == 2 and r["prefill_tok_s_sd"] >= 0, r
    assert abs(sum(r["prefill_samples"]) / 2 - r["prefill_tok_s"]) < 1e-6 * r["prefill_tok_s"], r
assert j["threads"] == 2 and j["commit"] and j["cpu"] and j["gpu"] is None, j
assert j["rounds"] == 2 and j["backend"] == "cpu", j
turns = [(t["new"], t["depth"]) for t in j["turns"]]
assert turns == [(16, 100), (7, 0), (9, 200)], turns
for t in j["turns"]:
    assert ok(t["prefill_tok_s"]) and ok(t["ms"]), t
    assert abs(t["new"] / t["prefill_tok_s"] * 1e3 - t["ms"]) < 1e-3 * t["ms"] + 1e-3, t
c = list(csv.DictReader(open(sys.argv[2])))
assert [(int(r["len"]), int(r["depth"])) for r in c] == \
    [(48, 0), (96, 0), (33, 0), (16, 100), (7, 0), (9, 200)], c
text = open(sys.argv[3]).read()
table = text.split()
assert "turn" in table and "depth" in table and "context" in table
assert "commit " + j["commit"] in text and "2 threads" in text and j["cpu"] in text, text
assert "±" in text, text
assert c[0]["decode_tok_s"] == "" and c[2]["prefill_tok_s"] == "", c
# the CPU kernel set: named alike in the three outputs
assert j["kernels"] in ("avx512-vnni", "avx512", "avx2", "scalar"), j
assert j["q4_products"] in ("int16", "fp32", "int8-decode"), j
assert all(r["kernels"] == j["kernels"] for r in c), c
assert "kernels %s (%s Q4 products)" % (j["kernels"], j["q4_products"]) in text, text
print("json/csv/table consistent")
PY
check "json, csv and table" $?

# the kernel set follows --cpu-isa and --precision
"$LILY" bench --model "$TMP/m" --threads 2 --prefill 8 --cpu-isa scalar >"$TMP/scalar.txt"
check "bench --cpu-isa scalar names its kernels" "$(grep -q 'kernels scalar (fp32 Q4 products)' \
    "$TMP/scalar.txt"; echo $?)"
if grep -q avx2 /proc/cpuinfo; then
    "$LILY" bench --model "$TMP/m" --threads 2 --prefill 8 --cpu-isa avx2 --precision exact \
        >"$TMP/avx2.txt"
    check "bench --cpu-isa avx2 --precision exact names its kernels" \
        "$(grep -q 'kernels avx2 (fp32 Q4 products)' "$TMP/avx2.txt"; echo $?)"
fi

# rows appear as they are measured: the short row is out well before the long one
"$LILY" bench --model "$TMP/m" --threads 2 --prefill 8 --decode 200 --gen 300 --rounds 2 |
    while IFS= read -r l; do echo "$EPOCHREALTIME $l"; done >"$TMP/ts.txt" # bash 5: no fork
python3 - "$TMP/ts.txt" <<'PY'
import sys
lines = [l.split() for l in open(sys.argv[1])]
rows = {int(f[1]): f for f in lines if len(f) > 1 and f[1].isdigit()}
assert set(rows) == {8, 200}, rows
gap = float(rows[200][0]) - float(rows[8][0])
decode_s = 2 * 300 / float(rows[200][4])  # the row's 2 rounds of 300 decode steps
assert gap > 0.5 * decode_s, (gap, decode_s)
print("row 200 came %.2f s after row 8 (its decoding took %.2f s)" % (gap, decode_s))
PY
check "rows printed as measured" $?

# --json - to stdout (the table to stderr), --plot with reference series
command -v xmllint >/dev/null || { echo "SKIP: xmllint absent (libxml2-utils)"; exit 77; }
"$LILY" bench --model "$TMP/m" --threads 2 --prefill 32,64 --decode 64 --gen 3 --json - \
    --plot "$TMP/p.svg" --plot-ref tests/fixtures/bench/llama_bench.json \
    --plot-ref "$TMP/b.json" >"$TMP/stdout.json" 2>"$TMP/stderr.txt"
check "bench --json - --plot runs" $?
check "the table went to stderr" "$(grep -q 'prefill tok/s' "$TMP/stderr.txt"; echo $?)"
check "stdout is the JSON" "$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert [r["len"] for r in j["rows"]] == [32, 64]' "$TMP/stdout.json"; echo $?)"
check "no file named -" "$([ ! -e - ]; echo $?)"
check "SVG well-formed" "$(xmllint --noout "$TMP/p.svg"; echo $?)"
python3 - "$TMP/p.svg" <<'PY'
import sys, xml.etree.ElementTree as ET
ns = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[1]).getroot()
texts = [t.text or "" for t in root.iter(ns + "text")]
assert any("llama.cpp qwen3moe tiny BF16, CPU, 2 threads" in t for t in texts), texts
assert sum(t.startswith("lily ") for t in texts) == 2, texts  # this run and the reference run
assert "prefill tok/s" in texts and "decode tok/s" in texts, texts
assert sum("context length" in t for t in texts) == 2, texts
lines = list(root.iter(ns + "polyline"))
# prefill: this run (2 points), llama.cpp (3), the reference run (2); decode: llama.cpp (2), ref (2)
assert len(lines) == 5, len(lines)
assert len(list(root.iter(ns + "circle"))) == 2 + 1 + 3 + 2 + 3 + 2, "points"
print("svg: legend, axes, series ok")
PY
check "SVG content" $?
echo '{"rows": 5}' >"$TMP/bad.json"
"$LILY" bench --model "$TMP/m" --prefill 8 --plot "$TMP/q.svg" --plot-ref "$TMP/bad.json" \
    >/dev/null 2>"$TMP/err.txt"
check "bad reference exits 2" "$([ $? = 2 ]; echo $?)"
check "bad reference says why" "$(grep -q 'neither llama-bench JSON' "$TMP/err.txt"; echo $?)"
"$LILY" bench --model "$TMP/m" --prefill 8 --rounds 0 >/dev/null 2>"$TMP/err.txt"
check "--rounds 0 exits 2 with a reason" "$([ $? = 2 ] && grep -q 'rounds takes an integer from 1 to 64' "$TMP/err.txt"; echo $?)"

for bad in "--prefill 0" "--prefill 12,x" "--turn 5@" "--turn 0@5" "--turn 5" "--turn @5"; do
    "$LILY" bench --model "$TMP/m" $bad >/dev/null 2>"$TMP/err.txt"
    r=$?
    check "bench $bad exits 2 (got $r)" "$([ $r = 2 ]; echo $?)"
    check "bench $bad says why" "$(grep -q 'bad list' "$TMP/err.txt"; echo $?)"
done
"$LILY" bench --model "$TMP/nope" --prefill 8 >/dev/null 2>"$TMP/err.txt"
check "missing model exits non-zero" "$([ $? != 0 ]; echo $?)"

echo "bench_cli: $pass passed, $fail failed"
[ "$fail" = 0 ]
