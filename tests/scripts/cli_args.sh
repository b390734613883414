#!/bin/bash
# The shared argument parser (tools/args.c): golden messages and exit code 2 for unknown options,
# missing values, out-of-range or malformed numbers and bad enum values, across commands; --help
# prints the usage to stdout and exits 0. No model is needed: every case fails before loading.
# Usage: bash tests/scripts/cli_args.sh path/to/lily
LILY=${1:?usage: cli_args.sh LILY_BIN}
[ -x "$LILY" ] || { echo "SKIP: no lily binary"; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0 fail=0
# case EXPECTED_MESSAGE_SUBSTRING ARGS...: exit code 2, the message on stderr, nothing on stdout
case2() {
    local want=$1
    shift
    "$LILY" "$@" </dev/null >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ $rc = 2 ] && grep -qF -- "$want" "$TMP/err" && [ ! -s "$TMP/out" ] &&
        [ "$(wc -l <"$TMP/err")" = 1 ]; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL: lily $* -> rc $rc, stderr: $(cat "$TMP/err"); want rc 2 and: $want"
    fi
}

case2 "lily run: unknown option '--bogus' (see lily run --help)" run --model M --bogus
case2 "lily run: unknown option '--bogus' (see lily run --help)" run --model M --bogus x
case2 "lily chat: unknown option '--bogus' (see lily chat --help)" chat --bogus
case2 "lily generate: unknown option '--think' (see lily generate --help)" generate --think on
case2 "lily run: option '--model' needs a value" run --model
case2 "lily chat: option '--system' needs a value" chat --model M --system
case2 "lily run: --top-p takes a number from 0 to 1, not '7'" run --model M --top-p 7 hi
case2 "lily run: --temp takes a number from 0 to 100, not '-1'" run --model M --temp -1 hi
case2 "lily run: --temp takes a number from 0 to 100, not '0.5x'" run --model M --temp 0.5x hi
case2 "lily run: -n takes an integer from 1 to 2147483647, not 'abc'" run --model M -n abc hi
case2 "lily chat: -n takes an integer from 1 to 2147483647, not '0'" chat --model M -n 0
case2 "lily generate: --ctx takes an integer from 2 to 2147483647, not '1'" generate --ctx 1
case2 "lily run: --think takes off|on, not 'maybe'" run --model M --think maybe hi
case2 "lily chat: --backend takes cpu|cuda, not 'tpu'" chat --model M --backend tpu
case2 "lily generate: --precision takes default|exact|fast, not 'x'" generate --precision x
case2 "lily run: --cpu-isa takes auto|avx512|avx2|scalar, not 'neon'" run --cpu-isa neon
case2 "lily chat: --sample-on takes auto|device|host, not 'gpu'" chat --sample-on gpu
case2 "lily run: --threads takes an integer from 0 to 4096, not '-3'" run --threads -3
case2 "lily run: unexpected argument 'b'" run --model M a b
case2 "lily chat: unexpected argument 'hello'" chat --model M hello
case2 "lily generate: --top-p takes a number from 0 to 1, not 'nan'" generate --top-p nan
case2 "lily bench: --rounds takes an integer from 1 to 64, not '0'" bench --model M --rounds 0
case2 "lily bench: bad list '12,x' for --prefill" bench --model M --prefill 12,x
case2 "lily bench: option '--json' needs a value" bench --model M --json
case2 "lily score: --threads takes an integer from 0 to 4096, not 'x'" score --threads x
case2 "lily score: unknown option '--bogus' (see lily score --help)" score --bogus x
case2 "lily eval: --min-top1 takes a number from 0 to 100, not '101'" eval --min-top1 101
case2 "lily eval: --chunk takes an integer from 0 to 2147483647, not '-1'" eval --chunk -1
case2 "lily info: unknown option '--bogus' (see lily info --help)" info --bogus x
case2 "lily info: option '--model' needs a value" info --model
case2 "lily tokenize: unknown option '--bogus' (see lily tokenize --help)" tokenize --bogus
case2 "lily detokenize: option '--model' needs a value" detokenize --model
case2 "lily template: unknown option '--bogus' (see lily template --help)" template --bogus
case2 "lily mkmodel: --hidden takes an integer from 1 to 1073741824, not '0'" mkmodel --hidden 0
case2 "lily mkmodel: --layout takes hf|mlx4|mlx8, not 'gguf'" mkmodel --layout gguf
case2 "lily pull: unknown option '--bogus' (see lily pull --help)" pull --bogus
case2 "lily pull: unexpected argument 'b/c'" pull a/b b/c
case2 "lily convert: option '--out' needs a value" convert --model M --out
cmds="run chat generate bench score eval info tokenize detokenize template mkmodel pull convert"
if "$LILY" serve --help >/dev/null 2>&1; then # a build with the server
    case2 "lily serve: --port takes an integer from 0 to 65535, not '99999'" serve --port 99999
    case2 "lily serve: unknown option '--bogus' (see lily serve --help)" serve --bogus x
    case2 "lily serve: --reasoning takes off|on, not 'yes'" serve --model M --reasoning yes
    case2 "lily serve: --request-timeout takes a number from 0.001 to 1e+06, not '0'" \
        serve --model M --request-timeout 0
    case2 "lily serve: --log-format takes text|json|none, not 'yaml'" serve --log-format yaml
    cmds="$cmds serve"
fi

for cmd in $cmds; do
    "$LILY" $cmd --help >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ $rc = 0 ] && grep -q "usage: lily $cmd" "$TMP/out" && [ ! -s "$TMP/err" ]; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL: lily $cmd --help -> rc $rc"
    fi
done

echo "cli_args: $pass passed, $fail failed"
[ "$fail" = 0 ]
