// Continuous batching through `lily serve`: aggregate decode tokens/s with 1, 2, 4, 8 concurrent
// streams, and the time to first token of a request (a PROMPT-token prompt) that arrives while 7
// streams decode, against the same request on an idle server. Start the server with
// --parallel 8 (bench/serve_slots.sh does).
// usage: node bench/serve_slots.mjs BASE_URL [TOKENS_PER_STREAM=64] [PROMPT=512] [ROUNDS=3]
const [base, tpsArg, promptArg, roundsArg] = process.argv.slice(2);
const T = Number(tpsArg || 64), P = Number(promptArg || 512), R = Number(roundsArg || 3);
const BAN = { 8166: -100, 8168: -100 }; /* tiny-trained's end-of-turn ids: fixed lengths */

async function stream(content, max_tokens, seed) {
  const t0 = performance.now();
  const res = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content }], max_tokens, seed,
      temperature: 0.8, logit_bias: BAN, stream: true,
      stream_options: { include_usage: true }, chat_template_kwargs: { enable_thinking: false } }) });
  let first = 0, buf = '', n = 0;
  const dec = new TextDecoder();
  for await (const part of res.body) {
    buf += dec.decode(part, { stream: true });
    if (!first && buf.includes('"content":"') && /"content":"[^"]/.test(buf)) first = performance.now();
    const m = buf.match(/"completion_tokens":(\d+)/);
    if (m) n = Number(m[1]);
  }
  return { t0, first, end: performance.now(), n };
}

const words = 'list copy move remove find grep sort uniq head tail'.split(' ');
const promptOf = (k, seed) => `Request ${seed}: ` +
  Array.from({ length: k }, (_, i) => words[(i * 7 + seed) % 10]).join(' ');
async function steps() { /* the server's decode steps: rows and seconds */
  const m = await (await fetch(`${base}/metrics`)).text();
  const v = k => Number((m.match(new RegExp(`^lily_${k} (\\S+)`, 'm')) || [])[1]);
  return { rows: v('decode_rows_total'), s: v('step_seconds_total'), n: v('decode_steps_total') };
}

await Promise.all(Array.from({ length: 8 }, (_, i) => stream(`Warm up ${i}.`, T, i))); /* warm-up */
/* the stream counts alternate within each round, so a change in the machine's load falls on
 * all of them alike */
const NS = [1, 2, 4, 8], agg = {}, st = {};
for (const n of NS) agg[n] = [], st[n] = { rows: 0, s: 0, n: 0 };
for (let r = 0; r < R; r++) {
  for (const n of r % 2 ? [...NS].reverse() : NS) {
    const m0 = await steps();
    const runs = await Promise.all(Array.from({ length: n }, (_, i) =>
      stream(`Say something about ${words[i]}.`, T, 100 * r + i)));
    const m1 = await steps();
    const t0 = Math.min(...runs.map(x => x.first)), t1 = Math.max(...runs.map(x => x.end));
    /* tokens after each stream's first, over the span every stream decoded in */
    agg[n].push(runs.reduce((a, x) => a + x.n - 1, 0) / ((t1 - t0) / 1e3));
    st[n].rows += m1.rows - m0.rows, st[n].s += m1.s - m0.s, st[n].n += m1.n - m0.n;
  }
}
console.log(`streams  aggregate tok/s (mean of ${R})  per-stream tok/s  in the steps: tok/s  ms/step`);
for (const n of NS) {
  const mean = agg[n].reduce((a, x) => a + x, 0) / R;
  console.log(`${String(n).padStart(7)}  ${mean.toFixed(1).padStart(28)}  ` +
    `${(mean / n).toFixed(1).padStart(16)}  ${(st[n].rows / st[n].s).toFixed(1).padStart(20)}  ` +
    `${(1e3 * st[n].s / st[n].n).toFixed(2).padStart(7)}`);
}

/* TTFT of a P-word prompt: idle, then while 7 long streams decode */
const ttft = [], busy = [];
for (let r = 0; r < R; r++) {
  const a = await stream(promptOf(P, r), 4, r);
  ttft.push((a.first - a.t0) / 1e3);
  const bg = Array.from({ length: 7 }, (_, i) => stream(`Tell me about ${words[i]}.`, 4 * T, i));
  await new Promise(res => setTimeout(res, 1500)); /* the 7 are decoding */
  const b = await stream(promptOf(P, r + 10), 4, r);
  busy.push((b.first - b.t0) / 1e3);
  await Promise.all(bg);
}
const med = v => [...v].sort((x, y) => x - y)[Math.floor(v.length / 2)];
console.log(`ttft of a ${P}-word prompt: idle ${med(ttft).toFixed(3)} s, while 7 streams decode ` +
  `${med(busy).toFixed(3)} s (medians of ${R}: idle ${ttft.map(x => x.toFixed(3))}, busy ` +
  `${busy.map(x => x.toFixed(3))})`);
