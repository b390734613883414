#!/bin/bash
# lily bench end to end on a tiny generated model (CPU backend): the sweep rows, the agent-turn
# rows (--turn N@D), the table, --json and --csv agree on what was asked, every timed figure is
# positive and finite, and bad lists exit 2 with a message.
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
assert rows[48]["decode_tok_s"] == 0 and rows[33]["prefill_tok_s"] == 0
turns = [(t["new"], t["depth"]) for t in j["turns"]]
assert turns == [(16, 100), (7, 0), (9, 200)], turns
for t in j["turns"]:
    assert ok(t["prefill_tok_s"]) and ok(t["ms"]), t
    assert abs(t["new"] / t["prefill_tok_s"] * 1e3 - t["ms"]) < 1e-3 * t["ms"] + 1e-3, t
c = list(csv.DictReader(open(sys.argv[2])))
assert [(int(r["len"]), int(r["depth"])) for r in c] == \
    [(48, 0), (96, 0), (33, 0), (16, 100), (7, 0), (9, 200)], c
table = open(sys.argv[3]).read().split()
assert "turn" in table and "depth" in table and "context" in table
print("json/csv/table consistent")
PY
check "json, csv and table" $?

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
