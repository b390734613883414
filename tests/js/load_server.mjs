// Load and fault test for `lily serve` (loopback only): LOAD_CLIENTS concurrent clients (64) send
// LOAD_REQUESTS chat completions (1000), mostly streaming; 30 % of them disconnect at a random
// point (before the answer, in the queue, mid-stream). Checks: no unexpected status or broken
// stream, every request completed or cleanly cancelled/refused, the server drains (no stuck
// work), stays healthy, and its resident memory stays bounded (sampled from /proc/PID/status).
// usage: node load_server.mjs BASE_URL SERVER_PID
const [base, pid] = process.argv.slice(2);
const N = Number(process.env.LOAD_REQUESTS || 1000);
const C = Number(process.env.LOAD_CLIENTS || 64);
import { readFileSync } from 'node:fs';

function rss() {
  try {
    const m = readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
    return m ? Number(m[1]) / 1024 : NaN;
  } catch { return NaN; }
}
function rng(seed) { /* mulberry32 */
  return () => {
    seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const st = { done: 0, aborted: 0, rejected: 0, bad: 0 };
const problems = [];
let started = 0, finished = 0, rss_warm = NaN, rss_max = 0;
const sampler = setInterval(() => {
  const r = rss();
  if (r > rss_max) rss_max = r;
}, 200);

async function one(i) {
  const r = rng(i + 1);
  const disconnect = r() < 0.3;
  const stream = r() < 0.8;
  const ac = new AbortController();
  let timer = null;
  const abort_mode = r() < 0.5 ? 'timer' : 'chunks';
  const abort_after = Math.floor(r() * 6);
  if (disconnect && (abort_mode === 'timer' || !stream))
    timer = setTimeout(() => ac.abort(), Math.floor(r() * 400));
  const body = {
    model: 'load', stream, seed: i, temperature: 0.8, max_tokens: 3 + (i % 6),
    messages: [{ role: 'system', content: 'You answer load tests.' },
               { role: 'user', content: `Request ${i % 40}: describe a colour in one word.` }],
    chat_template_kwargs: { enable_thinking: false },
  };
  try {
    const res = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST', body: JSON.stringify(body), signal: ac.signal,
      headers: { 'Content-Type': 'application/json' } });
    if (res.status === 503) { st.rejected++; await res.text(); return; }
    if (res.status !== 200) {
      st.bad++;
      problems.push(`req ${i}: status ${res.status} ${await res.text()}`);
      return;
    }
    if (!stream) {
      const j = await res.json();
      if (!j.choices?.[0]?.finish_reason) { st.bad++; problems.push(`req ${i}: ${JSON.stringify(j)}`); return; }
      st.done++;
      return;
    }
    const reader = res.body.getReader();
    const dec = new TextDecoder('utf-8', { fatal: true });
    let text = '', events = 0;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += dec.decode(value, { stream: true });
      events = text.split('\n\n').length - 1;
      if (disconnect && abort_mode === 'chunks' && events >= abort_after) { ac.abort(); break; }
    }
    if (ac.signal.aborted) { st.aborted++; return; }
    const datas = text.split('\n\n').filter((e) => e.startsWith('data: '));
    const last = datas[datas.length - 1];
    const ok = last === 'data: [DONE]' && datas.slice(0, -1).every((e) => {
      const j = JSON.parse(e.slice(6));
      return j.object === 'chat.completion.chunk' && !j.error;
    });
    if (!ok) { st.bad++; problems.push(`req ${i}: broken stream ${text.slice(-300)}`); return; }
    st.done++;
  } catch (e) {
    if (ac.signal.aborted) st.aborted++;
    else { st.bad++; problems.push(`req ${i}: ${e.name} ${e.message} ${e.cause?.code ?? ""} ${e.cause?.message ?? ""}`); }
  } finally {
    if (timer) clearTimeout(timer);
    finished++;
    if (finished === Math.min(100, N)) rss_warm = rss();
  }
}

const t0 = Date.now();
await Promise.all(Array.from({ length: C }, async () => {
  while (started < N) await one(started++);
}));
const elapsed = (Date.now() - t0) / 1000;

// the server must drain: nothing queued or running once the clients are gone
async function metric(name) {
  const t = await (await fetch(`${base}/metrics`)).text();
  const m = t.match(new RegExp(`^lily_${name} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
}
let drained = false;
for (let i = 0; i < 300 && !drained; i++) {
  drained = (await metric('queue_depth')) === 0 && (await metric('busy')) === 0;
  if (!drained) await new Promise((r) => setTimeout(r, 100));
}
clearInterval(sampler);
const rss_end = rss();
const health = (await fetch(`${base}/health`)).status;
const gens = await metric('generations_total'), canc = await metric('cancelled_total');
console.log(`${N} requests, ${C} clients, ${elapsed.toFixed(1)} s: done ${st.done}, aborted ` +
            `${st.aborted}, refused ${st.rejected}, bad ${st.bad}; server: ${gens} generations, ` +
            `${canc} cancelled; RSS after warm-up ${rss_warm.toFixed(1)} MB, max ` +
            `${rss_max.toFixed(1)} MB, end ${rss_end.toFixed(1)} MB`);
for (const p of problems.slice(0, 10)) console.log('  ' + p);
let fail = 0;
const check = (ok, what) => { console.log(`${what.padEnd(60)} ${ok ? 'ok' : 'FAIL'}`); if (!ok) fail++; };
check(st.bad === 0, 'no unexpected status, error event or broken stream');
check(st.done + st.aborted + st.rejected === N, 'every request completed, cancelled or refused');
check(st.done >= 0.5 * N, 'most requests completed');
check(drained, 'server drained (queue empty, nothing running)');
check(health === 200, 'server healthy afterwards');
check(canc > 0 && gens <= N, 'disconnects cancelled generations on the server');
check(rss_max - rss_warm < 128, 'RSS bounded (growth after warm-up < 128 MB)');
console.log(`${7 - fail} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
