// Continuous batching in `lily serve` (loopback only), on models/tiny-trained. One phase per run:
//   equal BASE_URL   8 seeded streaming requests (chat and completions; penalties, a stop string,
//                    logprobs, a JSON-object grammar, a long prompt prefilled in chunks while the
//                    others decode) run one at a time, then all 8 at once, with a 9th client that
//                    leaves mid-stream: every stream's text (and logprobs) equals its run alone,
//                    and each stream's first token arrives within TTFT_BOUND_S seconds (10; the
//                    script gives 30 to an ASan build, several times slower).
//   busy BASE_URL    (a server with --parallel 1 --parallel-queue 1) one stream runs, one request
//                    waits: a third is refused with 503, Retry-After and a JSON error body; when
//                    the stream's client leaves, the waiting request runs.
//   prefix BASE_URL  (--parallel 2) while a stream holds one slot, a request with the same
//                    system prompt on the other slot reuses the prefix the first one prefilled.
// Exit 0 when every check passes.
const [phase, base] = process.argv.slice(2);
const TTFT_BOUND_S = Number(process.env.SLOTS_TTFT_BOUND_S || 10); /* 30 under ASan */
const EOS_BAN = { 8166: -100, 8168: -100 }; /* <|endoftext|>, <|im_end|>: keep generating */
let fails = 0;
function check(ok, what, detail) {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`);
  if (!ok) { fails++; if (detail !== undefined) console.log('     ', detail); }
}

/* A streaming request: the text, the finish reason, the logprobs entries, when the first token
 * came (s after sending) and the whole time. abortAfter: leave after that many text chunks. */
async function stream(path, body, abortAfter = 0) {
  const ac = new AbortController();
  const t0 = performance.now();
  const res = await fetch(`${base}${path}`, {
    method: 'POST', signal: ac.signal, headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }) });
  const out = { status: res.status, text: '', finish: null, lp: [], ttft: -1, total: 0 };
  if (res.status !== 200) { out.body = await res.text(); return out; }
  const dec = new TextDecoder();
  let buf = '', chunks = 0;
  try {
    for await (const part of res.body) {
      buf += dec.decode(part, { stream: true });
      let k;
      while ((k = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, k);
        buf = buf.slice(k + 2);
        if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
        const js = JSON.parse(ev.slice(6));
        const c = js.choices && js.choices[0];
        if (!c) continue;
        const t = c.text ?? (c.delta && c.delta.content) ?? '';
        if (t) {
          if (out.ttft < 0) out.ttft = (performance.now() - t0) / 1e3;
          out.text += t;
          chunks++;
        }
        if (c.logprobs && c.logprobs.content) out.lp.push(...c.logprobs.content);
        if (c.finish_reason) out.finish = c.finish_reason;
        if (abortAfter && chunks >= abortAfter) { ac.abort(); out.aborted = true; return out; }
      }
    }
  } catch (e) {
    if (!out.aborted) throw e;
  }
  out.total = (performance.now() - t0) / 1e3;
  return out;
}

const chat = (content, extra = {}) => ({
  messages: [{ role: 'system', content: 'You are a helpful assistant.' },
             { role: 'user', content }],
  chat_template_kwargs: { enable_thinking: false }, ...extra });

const longPrompt = 'Explain these commands one by one: ' +
  Array.from({ length: 60 }, (_, i) => `ls -l${i}, grep -r word${i}`).join('; ') + '.';

const cases = [
  ['/v1/chat/completions', chat('What does ls do?', { seed: 1, temperature: 0.8, max_tokens: 48 })],
  ['/v1/chat/completions', chat('Define the word river.',
    { seed: 2, temperature: 1.0, top_p: 0.9, max_tokens: 48, frequency_penalty: 0.5 })],
  ['/v1/chat/completions', chat('What is grep?',
    { seed: 3, temperature: 0.7, max_tokens: 32, logprobs: true, top_logprobs: 3 })],
  ['/v1/chat/completions', chat('Give me a JSON object about a cat.',
    { seed: 4, temperature: 0.9, max_tokens: 40, response_format: { type: 'json_object' } })],
  ['/v1/chat/completions', chat(longPrompt, { seed: 5, temperature: 0.8, max_tokens: 40 })],
  ['/v1/chat/completions', chat('What is the man command?',
    { seed: 6, temperature: 0, max_tokens: 40, stop: ['.'] })],
  ['/v1/completions', { prompt: 'The python module os', seed: 7, temperature: 0.9,
    max_tokens: 48, presence_penalty: 0.3 }],
  ['/v1/chat/completions', chat('Describe the tar command.',
    { seed: 8, temperature: 0.8, max_tokens: 64, logit_bias: EOS_BAN })],
];

async function equal() {
  const alone = [];
  for (const [p, b] of cases) alone.push(await stream(p, b));
  for (let i = 0; i < alone.length; i++)
    check(alone[i].status === 200 && alone[i].text.length > 0, `alone ${i}: text`, alone[i]);
  /* all at once, and a 9th client that waits for a slot and leaves after 3 chunks */
  const t0 = performance.now();
  const leaver = stream('/v1/chat/completions',
    chat('Tell a long story.', { seed: 9, max_tokens: 200, logit_bias: EOS_BAN }), 3);
  const batch = await Promise.all(cases.map(([p, b]) => stream(p, b)));
  const wall = (performance.now() - t0) / 1e3;
  const left = await leaver;
  for (let i = 0; i < batch.length; i++) {
    const a = alone[i], b = batch[i];
    check(b.status === 200 && b.text === a.text && b.finish === a.finish,
      `batched ${i}: the same text as alone (${b.text.length} chars, finish ${b.finish})`,
      { alone: a.text, batched: b.text, fa: a.finish, fb: b.finish });
    check(b.ttft >= 0 && b.ttft <= TTFT_BOUND_S,
      `batched ${i}: first token after ${b.ttft.toFixed(3)} s (bound ${TTFT_BOUND_S} s)`);
  }
  const lpSame = JSON.stringify(alone[2].lp) === JSON.stringify(batch[2].lp);
  check(alone[2].lp.length > 0 && lpSame, 'batched logprobs equal alone');
  let obj = null;
  try { obj = JSON.parse(batch[3].text); } catch { /* reported below */ }
  check(batch[3].finish !== 'stop' || (obj && typeof obj === 'object'),
    'the constrained stream is a JSON object (or was cut by max_tokens)', batch[3].text);
  check(!batch[5].text.includes('.'), 'the stop string ends its stream');
  check(left.aborted === true, 'the 9th client left mid-stream');
  const m = await (await fetch(`${base}/metrics`)).text();
  const busy = [...m.matchAll(/^lily_slot_requests_total\{slot="(\d+)"\} (\d+)/gm)];
  check(busy.filter(x => Number(x[2]) > 0).length === 8, '8 slots ran requests', busy);
  const rows = Number((m.match(/^lily_decode_rows_total (\S+)/m) || [])[1]);
  const steps = Number((m.match(/^lily_decode_steps_total (\S+)/m) || [])[1]);
  check(rows > steps, `decode steps took several rows at once (${rows} rows in ${steps} steps)`);
  console.log(`  batch of 8: ${wall.toFixed(2)} s wall, ttft max ` +
    `${Math.max(...batch.map(b => b.ttft)).toFixed(3)} s`);
  const h = await (await fetch(`${base}/health`)).json();
  check(h.slots_processing === 0 && h.queue_depth === 0, 'idle afterwards', h);
}

async function busy() {
  const long = chat('Tell a long story.', { seed: 1, max_tokens: 3000, logit_bias: EOS_BAN });
  const ac = new AbortController();
  const a = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST', signal: ac.signal, headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...long, stream: true }) });
  const reader = a.body.getReader();
  await reader.read(); /* the role chunk: A holds the only slot */
  await reader.read();
  const waiting = fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(chat('hi', { max_tokens: 4 })) });
  await new Promise(r => setTimeout(r, 500));
  const h = await (await fetch(`${base}/health`)).json();
  check(h.slots_processing === 1 && h.queue_depth === 1, 'one running, one waiting', h);
  const c = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(chat('hello', { max_tokens: 4 })) });
  const cb = await c.text();
  let err = null;
  try { err = JSON.parse(cb).error; } catch { /* reported below */ }
  check(c.status === 503, `beyond slots + queue: ${c.status}`);
  check(Number(c.headers.get('retry-after')) >= 1, `Retry-After: ${c.headers.get('retry-after')}`);
  check(err && typeof err.message === 'string' && err.type === 'server_error',
    'a JSON error body', cb);
  ac.abort(); /* the stream's client leaves: its slot goes to the waiting request */
  const w = await Promise.race([waiting,
    new Promise(r => setTimeout(() => r({ status: 'timeout' }), 20000))]);
  check(w.status === 200, `the waiting request ran once the slot was free (${w.status})`);
  if (w.text) await w.text();
}

async function prefix() {
  const sys = 'You are a careful assistant for the command line. ' +
    Array.from({ length: 30 }, (_, i) => `Rule ${i}: answer briefly.`).join(' ');
  const msgs = u => [{ role: 'system', content: sys }, { role: 'user', content: u }];
  const ac = new AbortController();
  const a = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST', signal: ac.signal, headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: msgs('Tell a long story.'), stream: true, max_tokens: 3000,
      logit_bias: EOS_BAN, chat_template_kwargs: { enable_thinking: false } }) });
  const reader = a.body.getReader();
  await reader.read();
  await reader.read();
  const b = await (await fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: msgs('What is ls?'), max_tokens: 4,
      chat_template_kwargs: { enable_thinking: false } }) })).json();
  const m = await (await fetch(`${base}/metrics`)).text();
  ac.abort();
  const cached = b.usage && b.usage.prompt_tokens_details.cached_tokens;
  check(cached > 100 && cached < b.usage.prompt_tokens,
    `the second conversation reused the shared system prompt: ${cached} of ` +
    `${b.usage && b.usage.prompt_tokens} prompt tokens cached`, b.usage);
  check(/^lily_slot_busy\{slot="0"\} 1/m.test(m) && /^lily_slot_requests_total\{slot="1"\} 1/m.test(m),
    'while the first held slot 0, the second ran on slot 1');
}

const phases = { equal, busy, prefix };
if (!phases[phase]) { console.log('usage: node slots_server.mjs equal|busy|prefix BASE_URL'); process.exit(2); }
await phases[phase]();
process.exit(fails ? 1 : 0);
