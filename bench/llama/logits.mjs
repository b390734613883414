// llama.cpp's next-token distributions over the token ids of a lily reference file, compared with
// that reference and written as a reference file of their own, so that `lily eval --ref OUT`
// compares lily with llama.cpp (the check that a GGUF from bench/gguf_q4.c means the same model).
//
//   node bench/llama/logits.mjs --model FILE.gguf --ref models/tiny-trained/ref.bin \
//        [--out llama_ref.bin] [--threads 2] [--variant default|avx2] [--mode prefill|decode]
//
// The reference file (tools/cmd_eval.c, tools/train_tiny.py):
//   "LILYREF1" | u32 n | u32 vocab | u32 0 | u32 0 | i32 ids[n] | i32 argmax[n] | f32 nll[n] |
//   f16 logprob[n][vocab]
// Prints one JSON line: llama.cpp's perplexity over the slice, and against the reference: mean and
// max KL(ref || llama.cpp) and top-1 agreement.
import fs from "node:fs";
import { loadLlama } from "./load.mjs";

function parseArgs(argv) {
    const a = { threads: 2, variant: "default", mode: "prefill" };
    for (let i = 2; i < argv.length; i += 2) {
        const k = argv[i].replace(/^--/, ""), v = argv[i + 1];
        if (v === undefined) throw new Error(`${argv[i]} needs a value`);
        a[k] = k === "threads" ? Number(v) : v;
    }
    if (!a.model || !a.ref) throw new Error("usage: logits.mjs --model FILE.gguf --ref REF.bin [--out FILE]");
    return a;
}

function halfToFloat(h) {
    const s = h >> 15 ? -1 : 1, e = (h >> 10) & 31, m = h & 1023;
    if (e === 0) return s * m * 2 ** -24;
    if (e === 31) return m ? NaN : s * Infinity;
    return s * (m + 1024) * 2 ** (e - 25);
}

const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);
function floatToHalf(x) { // round to nearest even, as the C side's gguf_f32_to_f16
    f32[0] = x;
    const u = u32[0], sign = (u >>> 16) & 0x8000, a = u & 0x7fffffff;
    if (a > 0x7f800000) return sign | 0x7e00;
    if (a >= 0x477ff000) return sign | 0x7c00;
    if (a < 0x38800000) {
        if (a < 0x33000000) return sign;
        const man = (a & 0x7fffff) | 0x800000, shift = 126 - (a >>> 23);
        let q = man >>> shift;
        const rem = man & ((1 << shift) - 1), half = 1 << (shift - 1);
        if (rem > half || (rem === half && (q & 1))) q++;
        return sign | q;
    }
    let h = (a >>> 13) - (112 << 10);
    const rem = a & 0x1fff;
    if (rem > 0x1000 || (rem === 0x1000 && (h & 1))) h++;
    return sign | h;
}

function readRef(path) {
    const b = fs.readFileSync(path);
    if (b.toString("latin1", 0, 8) !== "LILYREF1") throw new Error(`${path}: not a LILYREF1 file`);
    const n = b.readUInt32LE(8), vocab = b.readUInt32LE(12);
    let o = 24;
    const ids = Array.from({ length: n }, (_, i) => b.readInt32LE(o + 4 * i));
    o += 4 * n;
    const argmax = Array.from({ length: n }, (_, i) => b.readInt32LE(o + 4 * i));
    o += 8 * n; // argmax and nll
    return { n, vocab, ids, argmax, lp: b, lpOff: o };
}

function logSoftmax(row) {
    let mx = -Infinity;
    for (const v of row) mx = Math.max(mx, v);
    let s = 0;
    for (const v of row) s += Math.exp(v - mx);
    const lse = mx + Math.log(s);
    return row.map((v) => v - lse);
}

const args = parseArgs(process.argv);
const ref = readRef(args.ref);
const { llama, info } = await loadLlama(args.variant, args.threads);
const model = await llama.loadModel({ modelPath: args.model, gpuLayers: 0 });
const ctx = await model.createContext({ contextSize: Math.max(1024, ref.n + 64), threads: args.threads, batchSize: 512 });
const seq = ctx.getSequence();
const want = { generateNext: { logits: true } };
let results = [];
if (args.mode === "decode") {
    for (const t of ref.ids) results.push((await seq.controlledEvaluate([[t, want]]))[0]);
} else {
    results = await seq.controlledEvaluate(ref.ids.map((t) => [t, want]));
}

const n = ref.n, V = ref.vocab;
const out = Buffer.alloc(24 + 12 * n + 2 * n * V);
out.write("LILYREF1", 0, "latin1");
out.writeUInt32LE(n, 8);
out.writeUInt32LE(V, 12);
let klSum = 0, klMax = 0, top1 = 0, nllSum = 0;
for (let i = 0; i < n; i++) {
    const m = results[i]?.next?.logits;
    if (!m || m.size !== V) throw new Error(`position ${i}: ${m ? m.size : 0} logits, want ${V}`);
    const row = new Array(V);
    for (const [tok, v] of m) row[tok] = v;
    const lp = logSoftmax(row);
    let am = 0;
    for (let j = 1; j < V; j++) if (lp[j] > lp[am]) am = j;
    // the reference row, renormalised after its fp16 rounding
    const rp = new Float64Array(V);
    let rs = 0;
    for (let j = 0; j < V; j++) rs += rp[j] = Math.exp(halfToFloat(ref.lp.readUInt16LE(ref.lpOff + 2 * (i * V + j))));
    let kl = 0;
    for (let j = 0; j < V; j++) if (rp[j] > 0) kl += (rp[j] / rs) * (Math.log(rp[j] / rs) - lp[j]);
    klSum += kl;
    klMax = Math.max(klMax, kl);
    if (am === ref.argmax[i]) top1++;
    const nll = i + 1 < n ? -lp[ref.ids[i + 1]] : 0;
    if (i + 1 < n) nllSum += nll;
    out.writeInt32LE(ref.ids[i], 24 + 4 * i);
    out.writeInt32LE(am, 24 + 4 * n + 4 * i);
    out.writeFloatLE(nll, 24 + 8 * n + 4 * i);
    for (let j = 0; j < V; j++) out.writeUInt16LE(floatToHalf(lp[j]), 24 + 12 * n + 2 * (i * V + j));
}
if (args.out) fs.writeFileSync(args.out, out);
console.log(JSON.stringify({
    model: args.model, mode: args.mode, ...info, tokens: n,
    ppl: Math.exp(nllSum / (n - 1)), mean_kl_vs_ref: klSum / n, max_kl_vs_ref: klMax, top1_vs_ref: top1 / n,
}));
await ctx.dispose();
await model.dispose();
await llama.dispose();
