// llama.cpp's prefill and decode speed on the CPU, measured as `lily bench` measures lily's:
//
//   node bench/llama/bench.mjs --model FILE.gguf [--variant default|avx2] [--threads 2]
//        [--prefill 512] [--decode 64,512] [--gen 32] [--rounds 3] [--json FILE|-]
//
// For each context length L of --prefill and --decode (one row per distinct L), each round: the
// sequence is cleared, L random token ids are prefilled in one batch up to the first greedy token
// (timed: prefill tok/s, for the lengths of --prefill), then --gen tokens are decoded greedily one
// at a time from there (timed: decode tok/s, for the lengths of --decode). An untimed warm-up (each length once, 4
// decode steps) comes first. Rows show the median over the rounds (and the samples in the JSON).
// The model is mapped as llama.cpp does by default (mmap, its Q4_0 repacking for the CPU on);
// flash attention is llama.cpp's default ("auto").
import fs from "node:fs";
import os from "node:os";
import { loadLlama } from "./load.mjs";

function parseArgs(argv) {
    const a = { variant: "default", threads: 2, prefill: "512", decode: "64,512", gen: 32, rounds: 3, json: null };
    for (let i = 2; i < argv.length; i += 2) {
        const k = argv[i].replace(/^--/, ""), v = argv[i + 1];
        if (!(k in a) && k !== "model") throw new Error(`unknown option ${argv[i]}`);
        if (v === undefined) throw new Error(`${argv[i]} needs a value`);
        a[k] = ["threads", "gen", "rounds"].includes(k) ? Number(v) : v;
    }
    if (!a.model) throw new Error("usage: bench.mjs --model FILE.gguf [--variant default|avx2] ...");
    const list = (s) => (s ? String(s).split(",").filter(Boolean).map(Number) : []);
    a.prefill = list(a.prefill);
    a.decode = list(a.decode);
    if ([...a.prefill, ...a.decode].some((x) => !(x >= 1)) || !(a.gen >= 1) || !(a.rounds >= 1))
        throw new Error("lengths, --gen and --rounds must be positive");
    return a;
}

function median(xs) {
    const s = [...xs].sort((x, y) => x - y), m = s.length >> 1;
    return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

const args = parseArgs(process.argv);
const lens = [...new Set([...args.prefill, ...args.decode])].sort((x, y) => x - y);
const maxLen = Math.max(...lens);
const { llama, info } = await loadLlama(args.variant, args.threads);
const model = await llama.loadModel({ modelPath: args.model, gpuLayers: 0, ignoreMemorySafetyChecks: true });
const ctx = await model.createContext({
    contextSize: maxLen + args.gen + 16, batchSize: Math.min(512, maxLen), threads: args.threads,
    ignoreMemorySafetyChecks: true,
});
const seq = ctx.getSequence();

// Random prompt ids (a fixed xorshift stream) over the first 8000 ids, so that the ids exist in
// any vocabulary; speed does not depend on which tokens they are.
let st = 0x2545f491;
const prompt = Array.from({ length: maxLen }, () => {
    st ^= st << 13, st ^= st >>> 17, st ^= st << 5;
    return (st >>> 0) % 8000;
});
// One round at length L: the prompt prefilled in one batch up to the first sampled token (the
// last position's logits included, as lily's prefill), then `gen` greedy decode steps, each
// evaluating the previous token (one sampler for the whole generation, as `lily bench` runs
// lily_session_decode_greedy). Returns [prefill seconds, decode seconds].
async function round(L, gen) {
    await seq.clearHistory();
    const it = seq.evaluate(prompt.slice(0, L), { temperature: 0 })[Symbol.asyncIterator]();
    const t0 = performance.now();
    if ((await it.next()).done) throw new Error("no token after the prompt");
    const t1 = performance.now();
    for (let i = 0; i < gen; i++)
        if ((await it.next()).done) throw new Error(`generation stopped after ${i} tokens`);
    const t2 = performance.now();
    await it.return();
    return [(t1 - t0) / 1000, (t2 - t1) / 1000];
}

for (const L of lens) await round(L, 4); // warm-up

const rows = [];
const out = process.stdout;
const log = args.json === "-" ? process.stderr : process.stdout;
log.write(`llama.cpp ${info.llama_cpp_release} (node-llama-cpp ${info.node_llama_cpp}), CPU backend ${info.backend}, ` +
    `${ctx.currentThreads} threads, ${args.rounds} rounds (median), gen ${args.gen}\n`);
log.write(`${"context".padStart(8)} ${"prefill tok/s".padStart(14)} ${"decode tok/s".padStart(13)}\n`);
for (const L of lens) {
    const pp = [], tg = [];
    for (let r = 0; r < args.rounds; r++) {
        const dec = args.decode.includes(L);
        const [tp, td] = await round(L, dec ? args.gen : 0);
        pp.push(L / tp);
        if (dec) tg.push(args.gen / td);
    }
    const row = {
        len: L,
        prefill_tok_s: args.prefill.includes(L) ? median(pp) : null,
        decode_tok_s: tg.length ? median(tg) : null,
        prefill_samples: args.prefill.includes(L) ? pp : null,
        decode_samples: tg.length ? tg : null,
    };
    rows.push(row);
    const f = (x) => (x === null ? "-" : x.toFixed(2));
    log.write(`${String(L).padStart(8)} ${f(row.prefill_tok_s).padStart(14)} ${f(row.decode_tok_s).padStart(13)}\n`);
}
// Memory as the kernel counts it at the end: anonymous (llama.cpp's repacked weights, KV cache,
// compute buffers) and file-backed (the mapped GGUF).
const status = fs.readFileSync("/proc/self/status", "utf8");
const kb = (k) => Number((new RegExp(`^${k}:\\s+(\\d+)`, "m").exec(status) || [, NaN])[1]);
const mem = { rss_anon_mb: Math.round(kb("RssAnon") / 1024), rss_file_mb: Math.round(kb("RssFile") / 1024) };
log.write(`memory: ${mem.rss_anon_mb} MB anonymous, ${mem.rss_file_mb} MB mapped from files\n`);
const result = {
    engine: "llama.cpp", model: args.model, ...info, threads: ctx.currentThreads,
    cpu: (os.cpus()[0] || {}).model, gen: args.gen, rounds: args.rounds, ...mem,
    loadavg_1min_at_end: os.loadavg()[0], rows,
};
if (args.json === "-") out.write(JSON.stringify(result) + "\n");
else if (args.json) fs.writeFileSync(args.json, JSON.stringify(result, null, 1) + "\n");
await ctx.dispose();
await model.dispose();
await llama.dispose();
