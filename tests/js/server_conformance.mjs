// Conformance of `lily serve` with the official `openai` Node client (api.md §11): models,
// non-streaming and streaming chat with usage, stop strings, max_tokens, seed determinism,
// prefix reuse across turns, legacy completions, logprobs, tool-call streaming (with the Qwen3.5
// XML template), client disconnects, CORS, and every error class. The model has random weights,
// so the checks are about protocol and consistency, never about what the text says.
// usage: node server_conformance.mjs BASE_URL API_KEY   (TOOLS_XML=1 when the template is XML)
import OpenAI from 'openai';

const [base, key] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 120000 });
const bad = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong-key', maxRetries: 0 });
let pass = 0, fail = 0;

function check(ok, what, detail = '') {
  console.log(`${what.padEnd(72)} ${ok ? 'ok' : 'FAIL'}${!ok && detail ? '  ' + detail : ''}`);
  ok ? pass++ : fail++;
}

async function expectError(p, status, code, what) {
  try {
    await p;
    check(false, what, 'no error');
  } catch (e) {
    const c = e.code ?? e.error?.code;
    check(e.status === status && (!code || c === code), what, `got ${e.status} ${c} ${e.message}`);
  }
}

async function raw(path, init = {}) {
  const headers = { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json',
                    ...(init.headers || {}) };
  const r = await fetch(`${base}${path}`, { ...init, headers });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, headers: r.headers, text, json };
}

const user = (content) => ({ role: 'user', content });
const metric = async (name) => {
  const r = await raw('/metrics');
  const m = r.text.match(new RegExp(`^lily_${name} (\\S+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
};

// ---- models --------------------------------------------------------------------------------
const models = await client.models.list();
const id = models.data[0]?.id;
check(models.data.length === 1 && typeof id === 'string' && models.data[0].object === 'model'
      && models.data[0].owned_by && Number.isInteger(models.data[0].created), 'models.list');
const one = await client.models.retrieve(id);
check(one.id === id && one.context_length === 512, 'models.retrieve (context_length)');
await expectError(client.models.retrieve('no-such-model'), 404, 'model_not_found',
                  'models.retrieve unknown id -> 404 model_not_found');

// ---- non-streaming / streaming chat, seed determinism --------------------------------------
const base_req = { model: 'gpt-4o', messages: [user('Say something about lilies.')],
                   max_tokens: 12, seed: 1234, temperature: 0.9,
                   chat_template_kwargs: { enable_thinking: false } };
const a = await client.chat.completions.create(base_req);
const c0 = a.choices[0];
check(a.object === 'chat.completion' && /^chatcmpl-[A-Za-z0-9]{24,}$/.test(a.id) && a.model === id
      && c0.message.role === 'assistant' && c0.index === 0 && 'logprobs' in c0,
      'chat: response shape');
check(c0.finish_reason === 'length' && a.usage.completion_tokens === 12
      && a.usage.total_tokens === a.usage.prompt_tokens + 12
      && a.usage.prompt_tokens_details?.cached_tokens >= 0, 'chat: max_tokens -> length, usage');
const b = await client.chat.completions.create(base_req);
check(b.choices[0].message.content === c0.message.content, 'chat: same seed -> same text');
check(b.usage.prompt_tokens_details.cached_tokens === b.usage.prompt_tokens,
      'chat: identical request reuses the whole prompt (cached_tokens)',
      JSON.stringify(b.usage));
const d = await client.chat.completions.create({ ...base_req, seed: 99 });
check(d.choices[0].message.content !== c0.message.content, 'chat: other seed -> other text');

const stream = await client.chat.completions.create({ ...base_req, stream: true,
  stream_options: { include_usage: true } });
let first = null, text = '', finish = null, usage = null, ids = new Set(), after_finish = 0;
for await (const ch of stream) {
  ids.add(ch.id);
  if (!first) first = ch;
  if (ch.choices.length) {
    text += ch.choices[0].delta.content ?? '';
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  } else {
    usage = ch.usage;
  }
  if (finish && ch.choices.length && !ch.choices[0].finish_reason) after_finish++;
}
check(first?.choices[0].delta.role === 'assistant' && ids.size === 1
      && first.object === 'chat.completion.chunk', 'stream: role chunk first, one id');
check(text === c0.message.content && finish === 'length' && !after_finish,
      'stream: same text as non-streaming, finish chunk last', JSON.stringify(text));
check(usage && usage.completion_tokens === 12 && usage.prompt_tokens === a.usage.prompt_tokens,
      'stream: include_usage chunk with choices []');
const s2 = await client.chat.completions.create({ ...base_req, stream: true });
let got_usage = false;
for await (const ch of s2) if (ch.usage) got_usage = true;
check(!got_usage, 'stream: no usage chunk without include_usage');

// thinking on (the Qwen3.5 template opens <think>): the text is reasoning, not content
const th = await client.chat.completions.create({ ...base_req, chat_template_kwargs: {} });
const thm = th.choices[0].message;
if (process.env.TOOLS_XML === '1') {
  check(typeof thm.reasoning_content === 'string' && thm.reasoning_content.length > 0
        && th.usage.completion_tokens_details.reasoning_tokens === 12,
        'thinking on: output in reasoning_content, reasoning_tokens counted', JSON.stringify(thm));
  const tb = await client.chat.completions.create({ ...base_req, chat_template_kwargs: {},
                                                    thinking_budget: 3, max_tokens: 16 });
  const tbm = tb.choices[0].message;
  check(tbm.reasoning_content && tbm.content && !/think>/.test(tbm.reasoning_content + tbm.content)
        && tb.usage.completion_tokens_details.reasoning_tokens <= 8,
        'thinking_budget: think block closed after the budget, answer follows', JSON.stringify(tbm));
}

// stop string taken from the middle of the known output: the answer ends right before it
const full = c0.message.content;
const mid = Math.floor(full.length / 2);
const stopstr = [...full].length > 4 ? full.slice(mid, mid + 3) : null;
if (stopstr && stopstr.trim() && !full.slice(0, mid).includes(stopstr)) {
  const s = await client.chat.completions.create({ ...base_req, stop: [stopstr, 'zzzzqq'] });
  check(s.choices[0].finish_reason === 'stop' && s.choices[0].message.content === full.slice(0, mid).trimEnd(),
        'stop string across tokens: text cut before it, finish stop',
        JSON.stringify([full, stopstr, s.choices[0].message.content]));
  const st = await client.chat.completions.create({ ...base_req, stop: stopstr, stream: true });
  let t2 = '', f2 = null;
  for await (const ch of st) {
    t2 += ch.choices[0]?.delta?.content ?? '';
    f2 = ch.choices[0]?.finish_reason ?? f2;
  }
  check(f2 === 'stop' && t2 === s.choices[0].message.content, 'stop string (streaming)');
} else {
  check(true, 'stop string: output too short to pick one (skipped)');
}

// logprobs
const lp = await client.chat.completions.create({ ...base_req, max_tokens: 4, logprobs: true,
                                                  top_logprobs: 3 });
const ent = lp.choices[0].logprobs?.content ?? [];
check(ent.length >= 1 && ent.every((e) => typeof e.token === 'string' && e.logprob <= 0
      && Array.isArray(e.bytes) && e.top_logprobs.length === 3
      && e.top_logprobs[0].logprob >= e.top_logprobs[2].logprob), 'logprobs + top_logprobs');

// ---- multi-turn reuse ------------------------------------------------------------------------
const conv = [{ role: 'system', content: 'You are terse.' }];
let prev = null;
let reuse_ok = true, reuse_log = [];
for (const q of ['First question about Kyoto?', 'And the food?', 'Budget in yen?']) {
  conv.push(user(q));
  const r = await raw('/v1/chat/completions', { method: 'POST', body: JSON.stringify(
    { messages: conv, max_tokens: 6, temperature: 0, chat_template_kwargs: { enable_thinking: false } }) });
  const u = r.json.usage, t = r.json.timings;
  reuse_log.push(`${u.prompt_tokens}/${u.prompt_tokens_details.cached_tokens}/${t.prompt_n}`);
  if (prev && !(u.prompt_tokens_details.cached_tokens >= prev - 8
      && t.prompt_n === u.prompt_tokens - u.prompt_tokens_details.cached_tokens)) reuse_ok = false;
  prev = u.prompt_tokens;
  conv.push({ role: 'assistant', content: r.json.choices[0].message.content ?? '' });
}
check(reuse_ok, 'multi-turn: each turn reuses the previous prompt, prefills the rest',
      reuse_log.join(' '));

// ---- legacy completions -----------------------------------------------------------------------
const comp = await client.completions.create({ model: id, prompt: 'Once upon a time', max_tokens: 5,
                                               seed: 7, logprobs: 2 });
check(comp.object === 'text_completion' && typeof comp.choices[0].text === 'string'
      && comp.choices[0].finish_reason === 'length' && comp.usage.completion_tokens === 5
      && comp.choices[0].logprobs.tokens.length === 5, 'completions (legacy) non-streaming');
const cs = await client.completions.create({ model: id, prompt: 'Once upon a time', max_tokens: 5,
                                             seed: 7, stream: true });
let ctext = '';
for await (const ch of cs) ctext += ch.choices[0]?.text ?? '';
check(ctext === comp.choices[0].text, 'completions (legacy) streaming = non-streaming');

// ---- tool calls (Qwen3.5 XML template): a forced named call streams id/type/name first --------
if (process.env.TOOLS_XML === '1') {
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: {
    type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } } } } }];
  const req = { model: id, messages: [user('Weather in Oslo?')], tools, max_tokens: 40, seed: 5,
                tool_choice: { type: 'function', function: { name: 'get_weather' } },
                chat_template_kwargs: { enable_thinking: false } };
  const r1 = await client.chat.completions.create(req);
  const tc = r1.choices[0].message.tool_calls?.[0];
  let args_ok = false;
  try { args_ok = typeof JSON.parse(tc.function.arguments) === 'object'; } catch { /* */ }
  check(tc && /^call_[A-Za-z0-9]{24}$/.test(tc.id) && tc.type === 'function'
        && tc.function.name === 'get_weather' && args_ok, 'tools: named tool_choice -> tool call',
        JSON.stringify(r1.choices[0]));
  const runner = client.chat.completions.stream(req);
  const final = await runner.finalChatCompletion();
  const sc = final.choices[0].message.tool_calls?.[0];
  check(sc && sc.function.name === 'get_weather' && sc.function.arguments === tc.function.arguments
        && sc.id && final.choices[0].finish_reason, 'tools: stream helper assembles the same call');
  const none = await client.chat.completions.create({ ...req, tool_choice: 'none' });
  check(!none.choices[0].message.tool_calls, 'tools: tool_choice none -> no tool calls');
} else {
  check(true, 'tools: XML template not available (skipped)');
}

// ---- disconnects -------------------------------------------------------------------------------
const cancelled0 = await metric('cancelled_total');
const ac = new AbortController();
const ds = await client.chat.completions.create({ ...base_req, max_tokens: 400, stream: true },
                                                { signal: ac.signal });
let n = 0;
try {
  for await (const ch of ds) { if (++n === 3) ac.abort(); }
} catch { /* aborted */ }
let cancelled1 = cancelled0;
for (let i = 0; i < 100 && cancelled1 === cancelled0; i++) {
  await new Promise((r) => setTimeout(r, 100));
  cancelled1 = await metric('cancelled_total');
}
check(cancelled1 === cancelled0 + 1, 'disconnect mid-stream cancels the generation');
const after = await client.chat.completions.create({ ...base_req, max_tokens: 2 });
check(after.choices[0].finish_reason === 'length', 'server keeps serving after a disconnect');

// ---- CORS --------------------------------------------------------------------------------------
const pre = await fetch(`${base}/v1/chat/completions`, { method: 'OPTIONS', headers: {
  Origin: 'http://localhost:5173', 'Access-Control-Request-Method': 'POST',
  'Access-Control-Request-Headers': 'authorization,content-type,x-stainless-os' } });
check(pre.status === 204 && pre.headers.get('access-control-allow-origin') === 'http://localhost:5173'
      && /x-stainless-os/.test(pre.headers.get('access-control-allow-headers') ?? ''),
      'CORS: localhost preflight reflects origin and headers');
const evil = await fetch(`${base}/v1/chat/completions`, { method: 'OPTIONS',
  headers: { Origin: 'https://evil.example', 'Access-Control-Request-Method': 'POST' } });
check(evil.status === 403, 'CORS: foreign origin preflight -> 403');

// ---- errors --------------------------------------------------------------------------------------
const e1 = await raw('/v1/chat/completions', { method: 'POST', body: '{"messages": [' });
check(e1.status === 400 && e1.json?.error?.code === 'invalid_json'
      && ['message', 'type', 'param', 'code'].every((k) => k in e1.json.error), 'bad JSON -> 400 invalid_json');
await expectError(client.chat.completions.create({ model: id }), 400, 'missing_required_parameter',
                  'missing messages -> 400');
await expectError(client.chat.completions.create({ ...base_req, temperature: 'hot' }), 400,
                  'invalid_type', 'wrong type -> 400 invalid_type');
await expectError(client.chat.completions.create({ ...base_req, messages: [{ role: 'wizard', content: 'x' }] }),
                  400, 'invalid_value', 'unknown role -> 400 invalid_value');
await expectError(client.chat.completions.create({ ...base_req, messages: [user('x'.repeat(70000))] }),
                  413, 'request_too_large', 'oversized body -> 413');
const long = Array.from({ length: 600 }, (_, i) => `word${i}`).join(' ');
await expectError(client.chat.completions.create({ ...base_req, messages: [user(long)] }), 400,
                  'context_length_exceeded', 'context overflow -> 400 context_length_exceeded');
const ov = await raw('/v1/chat/completions', { method: 'POST', body: JSON.stringify(
  { messages: [user(long)], stream: true }) });
check(ov.status === 400 && /maximum context length/.test(ov.json?.error?.message ?? '')
      && ov.json.error.n_ctx === 512, 'context overflow while streaming -> HTTP 400 before SSE');
await expectError(bad.chat.completions.create(base_req), 401, 'invalid_api_key', 'wrong API key -> 401');
const nokey = await fetch(`${base}/v1/models`);
check(nokey.status === 200, '/v1/models is public');
const e404 = await raw('/v1/nothing', { method: 'POST', body: '{}' });
check(e404.status === 404 && e404.json?.error?.code === 'unknown_url', 'unknown route -> 404');
const e405 = await raw('/v1/chat/completions', { method: 'GET' });
check(e405.status === 405, 'wrong method -> 405');
await expectError(client.chat.completions.create({ ...base_req, n: 2 }), 400, 'unsupported_value',
                  'n > 1 -> 400 unsupported_value');
const health = await fetch(`${base}/health`);
check(health.status === 200 && (await health.json()).status === 'ok', '/health');

console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
