// The agent APIs of `lily serve` with the official clients: @anthropic-ai/sdk against
// /v1/messages (+ count_tokens) and the `openai` client's responses.create against /v1/responses.
// The model has random weights, so the checks are about shapes, event order and consistency
// (greedy streaming = non-streaming, cache reuse across turns); tool calls are forced with
// tool_choice (the grammar writes the named call; one call, an enum argument), never left to luck.
// usage: node agent_apis.mjs BASE_URL API_KEY
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

const [base, key] = process.argv.slice(2);
const anth = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 120000 });
const badAnth = new Anthropic({ baseURL: base, apiKey: 'wrong-key', maxRetries: 0 });
const oai = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 120000 });
let pass = 0, fail = 0;

function check(ok, what, detail = '') {
  console.log(`${what.padEnd(76)} ${ok ? 'ok' : 'FAIL'}${!ok && detail ? '  ' + detail : ''}`);
  ok ? pass++ : fail++;
}

async function expectError(p, status, test, what) {
  try {
    await p;
    check(false, what, 'no error');
  } catch (e) {
    check(e.status === status && test(e), what, `got ${e.status} ${JSON.stringify(e.error)}`);
  }
}

// an enum keeps the call short: the grammar (tool_choice enforcement) closes it within a few tokens
const weatherSchema = { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Rome'] } },
                        required: ['city'] };
const system = 'You are a terse assistant. Answer in one short sentence.';

// ---- Messages: text ---------------------------------------------------------------------------
const mreq = { model: 'claude-sonnet-4-5', max_tokens: 10, temperature: 0, system,
               thinking: { type: 'disabled' },
               messages: [{ role: 'user', content: 'Tell me about lilies.' }] };
const m1 = await anth.messages.create(mreq);
const texts = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
check(/^msg_[A-Za-z0-9]{24}$/.test(m1.id) && m1.type === 'message' && m1.role === 'assistant'
      && m1.model === 'claude-sonnet-4-5' && Array.isArray(m1.content)
      && m1.content.every((b) => b.type === 'text' && typeof b.text === 'string'),
      'messages.create: message shape, text blocks only', JSON.stringify(m1));
check(m1.stop_reason === 'max_tokens' && m1.stop_sequence === null
      && m1.usage.output_tokens === 10 && m1.usage.input_tokens > 0
      && Number.isInteger(m1.usage.cache_read_input_tokens),
      'messages.create: max_tokens stop_reason and usage', JSON.stringify(m1.usage));
const m1b = await anth.messages.create(mreq);
check(texts(m1b) === texts(m1) && m1b.usage.cache_read_input_tokens > 0
      && m1b.usage.input_tokens + m1b.usage.cache_read_input_tokens
         === m1.usage.input_tokens + m1.usage.cache_read_input_tokens,
      'messages.create again: same greedy text, prompt read from the cache',
      JSON.stringify([m1.usage, m1b.usage]));
const count = await anth.messages.countTokens({ model: mreq.model, system, messages: mreq.messages,
                                                thinking: mreq.thinking });
check(count.input_tokens === m1.usage.input_tokens + m1.usage.cache_read_input_tokens,
      'messages.countTokens = the prompt the message used', JSON.stringify(count));

const long = await anth.messages.countTokens({ model: mreq.model, messages: [
  { role: 'user', content: 'lily pad '.repeat(800) }] });
check(long.input_tokens > 1024, 'messages.countTokens beyond the context (1024) still counts',
      JSON.stringify(long));

// system as text blocks, content as text blocks: the same prompt
const m1c = await anth.messages.create({ ...mreq, system: [{ type: 'text', text: system }],
  messages: [{ role: 'user', content: [{ type: 'text', text: 'Tell me about lilies.' }] }] });
check(texts(m1c) === texts(m1), 'system and content as blocks: same prompt, same text');

// ---- Messages: streaming with the SDK helper ---------------------------------------------------
const stream = anth.messages.stream(mreq);
const events = [];
let deltaText = '';
for await (const ev of stream) {
  events.push(ev.type);
  if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') deltaText += ev.delta.text;
}
const fin = await stream.finalMessage();
const order = events.filter((t) => t !== 'ping');
const okOrder = order[0] === 'message_start' && order.at(-1) === 'message_stop'
  && order.at(-2) === 'message_delta' && order.includes('content_block_start')
  && order.indexOf('content_block_start') < order.indexOf('content_block_delta')
  && order.lastIndexOf('content_block_delta') < order.lastIndexOf('content_block_stop');
check(okOrder, 'stream: message_start, block start/delta/stop, message_delta, message_stop',
      events.join(','));
// the raw framing: "event: NAME" lines matching each data's type, a ping after message_start
const raw = await fetch(`${base}/v1/messages`, { method: 'POST', headers: { 'x-api-key': key,
  'content-type': 'application/json', 'anthropic-version': '2023-06-01' },
  body: JSON.stringify({ ...mreq, stream: true }) });
const frames = (await raw.text()).split('\n\n').filter((f) => f.trim());
const framed = frames.map((f) => {
  const ev = f.match(/^event: (\S+)$/m)?.[1];
  const data = JSON.parse(f.match(/^data: (.*)$/m)?.[1] ?? 'null');
  return ev && data && data.type === ev ? ev : null;
});
check(raw.headers.get('content-type') === 'text/event-stream' && framed.every(Boolean)
      && framed[0] === 'message_start' && framed[1] === 'ping' && framed.at(-1) === 'message_stop',
      'stream (raw): event lines name each data type; ping after message_start', framed.join(','));
check(texts(fin) === deltaText && deltaText === texts(m1) && fin.stop_reason === 'max_tokens'
      && fin.usage.output_tokens === 10 && fin.id.startsWith('msg_'),
      'stream: finalMessage = the deltas = the non-streaming text, usage from message_delta',
      JSON.stringify([texts(fin), texts(m1), fin.usage]));

// thinking on. With the Qwen3.5 template (../shared/data, when present: THINK_TEMPLATE=1) the
// prompt opens <think>, so what the model writes first is a thinking block. Without it the
// tokenizer package's template opens none: the request is still taken, and every block is a
// well-formed text or thinking block.
const th = await anth.messages.create({ ...mreq, max_tokens: 6,
                                        thinking: { type: 'enabled', budget_tokens: 1024 } });
const wellFormed = (b) => (b.type === 'text' && typeof b.text === 'string')
  || (b.type === 'thinking' && typeof b.thinking === 'string' && 'signature' in b);
if (process.env.THINK_TEMPLATE === '1') {
  check(th.content.length >= 1 && th.content[0].type === 'thinking' && th.content.every(wellFormed),
        'thinking enabled: a thinking block first', JSON.stringify(th.content));
} else {
  check(th.content.length >= 1 && th.content.every(wellFormed) && th.stop_reason === 'max_tokens',
        'thinking enabled (template without <think> in the prompt): well-formed blocks',
        JSON.stringify(th.content));
}

// stop_sequences taken from the greedy output
const full = texts(m1);
const mid = Math.floor(full.length / 2);
const stopstr = full.slice(mid, mid + 3);
if (stopstr.trim().length === 3 && !full.slice(0, mid).includes(stopstr)) {
  const ss = await anth.messages.create({ ...mreq, stop_sequences: ['zzqqzz', stopstr] });
  check(ss.stop_reason === 'stop_sequence' && ss.stop_sequence === stopstr
        && full.startsWith(texts(ss).trimEnd()),
        'stop_sequences: stop_reason stop_sequence, stop_sequence names it',
        JSON.stringify([full, stopstr, ss]));
} else {
  check(true, 'stop_sequences: output too short to pick one (skipped)');
}

// ---- Messages: tool use round trip -------------------------------------------------------------
const tools = [{ name: 'get_weather', description: 'Weather for a city', input_schema: weatherSchema },
               { name: 'get_time', description: 'Local time', input_schema: { type: 'object',
                 properties: {} } }];
const ask = { role: 'user', content: 'What is the weather in Paris?' };
const tu = await anth.messages.create({ ...mreq, max_tokens: 64, tools, messages: [ask],
                                        tool_choice: { type: 'tool', name: 'get_weather',
                                                       disable_parallel_tool_use: true } });
const use = tu.content.find((b) => b.type === 'tool_use');
check(use && /^toolu_[A-Za-z0-9]{24}$/.test(use.id) && use.name === 'get_weather'
      && use.input && ['Paris', 'Rome'].includes(use.input.city)
      && tu.stop_reason === 'tool_use',
      'tool_choice {type: tool}: a well-formed tool_use block, stop_reason tool_use',
      JSON.stringify(tu));
const tus = anth.messages.stream({ ...mreq, max_tokens: 64, tools, messages: [ask],
                                   tool_choice: { type: 'tool', name: 'get_weather',
                                                       disable_parallel_tool_use: true } });
const tevents = [];
let partial = '';
for await (const ev of tus) {
  tevents.push(ev.type === 'content_block_start' ? `start:${ev.content_block.type}`
               : ev.type === 'content_block_delta' ? `delta:${ev.delta.type}` : ev.type);
  if (ev.type === 'content_block_delta' && ev.delta.type === 'input_json_delta') partial += ev.delta.partial_json;
}
const tfin = await tus.finalMessage();
const suse = tfin.content.find((b) => b.type === 'tool_use');
check(tevents.includes('start:tool_use') && suse?.name === 'get_weather'
      && JSON.stringify(suse.input) === JSON.stringify(JSON.parse(partial || '{}'))
      && JSON.stringify(suse.input) === JSON.stringify(use.input),
      'tool_use streamed: input_json_delta pieces parse to the non-streaming input',
      JSON.stringify([tevents, partial, suse]));
const follow = await anth.messages.create({ ...mreq, max_tokens: 8, tools, messages: [
  ask, { role: 'assistant', content: tu.content },
  { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id,
                              content: [{ type: 'text', text: '18 C, sunny' }] }] }] });
check(follow.type === 'message' && follow.usage.cache_read_input_tokens > 0
      && follow.content.every((b) => ['text', 'tool_use'].includes(b.type)),
      'tool_result turn answered, the earlier turn read from the cache',
      JSON.stringify(follow.usage));
const any = await anth.messages.create({ ...mreq, max_tokens: 16, tools, messages: [ask],
                                         tool_choice: { type: 'any' } });
check(any.content.filter((b) => b.type === 'tool_use')
        .every((b) => ['get_weather', 'get_time'].includes(b.name) && /^toolu_/.test(b.id)),
      'tool_choice any: tool_use blocks name declared tools', JSON.stringify(any.content));
const none = await anth.messages.create({ ...mreq, max_tokens: 16, tools, messages: [ask],
                                          tool_choice: { type: 'none' } });
check(none.content.every((b) => b.type !== 'tool_use') && none.stop_reason !== 'tool_use',
      'tool_choice none: no tool_use', JSON.stringify(none.content));

// ---- Messages: errors in Anthropic's shape ------------------------------------------------------
const anthErr = (type) => (e) => e.error?.type === 'error' && e.error?.error?.type === type;
await expectError(anth.messages.create({ model: 'x', messages: [ask] }), 400,
                  anthErr('invalid_request_error'), 'missing max_tokens -> 400 invalid_request_error');
await expectError(anth.messages.create({ model: 'x', max_tokens: 4, messages: [
  { role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png',
                                                        data: 'AAAA' } }] }] }),
                  400, anthErr('invalid_request_error'), 'image block -> 400');
await expectError(badAnth.messages.create(mreq), 401, anthErr('authentication_error'),
                  'wrong x-api-key -> 401 authentication_error');

// ---- Responses ------------------------------------------------------------------------------------
const rreq = { model: 'gpt-5', input: 'Tell me about lilies.', instructions: system,
               max_output_tokens: 10, temperature: 0, reasoning: { effort: 'none' } };
const r1 = await oai.responses.create(rreq);
const msg = r1.output.find((o) => o.type === 'message');
check(/^resp_/.test(r1.id) && r1.object === 'response' && r1.status === 'incomplete'
      && r1.incomplete_details?.reason === 'max_output_tokens' && r1.model === 'gpt-5'
      && msg?.role === 'assistant' && msg.content[0].type === 'output_text'
      && r1.output_text === msg.content[0].text && r1.instructions === system,
      'responses.create: response shape, message with output_text', JSON.stringify(r1));
check(r1.usage.output_tokens === 10 && r1.usage.input_tokens > 0
      && r1.usage.total_tokens === r1.usage.input_tokens + 10
      && Number.isInteger(r1.usage.input_tokens_details.cached_tokens),
      'responses.create: usage', JSON.stringify(r1.usage));
const r1b = await oai.responses.create({ ...rreq, input: [{ role: 'user', content: [
  { type: 'input_text', text: 'Tell me about lilies.' }] }] });
check(r1b.output_text === r1.output_text
      && r1b.usage.input_tokens_details.cached_tokens === r1b.usage.input_tokens,
      'input as message items: same prompt (all cached), same greedy text',
      JSON.stringify(r1b.usage));

const rs = oai.responses.stream(rreq);
const rtypes = [], seqs = [];
let rtext = '';
for await (const ev of rs) {
  rtypes.push(ev.type);
  seqs.push(ev.sequence_number);
  if (ev.type === 'response.output_text.delta') rtext += ev.delta;
}
const rfin = await rs.finalResponse();
const want = ['response.created', 'response.in_progress', 'response.output_item.added',
              'response.content_part.added', 'response.output_text.delta'];
check(want.every((t, i) => rtypes[i] === t) && rtypes.at(-1) === 'response.incomplete'
      && rtypes.at(-2) === 'response.output_item.done' && rtypes.at(-3) === 'response.content_part.done'
      && rtypes.at(-4) === 'response.output_text.done'
      && seqs.every((s, i) => s === i),
      'responses stream: created, in_progress, item/part added, deltas, done events, '
      + 'sequence_number 0..n', rtypes.join(','));
check(rtext === r1.output_text && rfin.output_text === rtext && rfin.status === 'incomplete'
      && rfin.usage.output_tokens === 10,
      'responses stream: final response = the deltas = the non-streaming text');

// function tool round trip
const rtools = [{ type: 'function', name: 'get_weather', description: 'Weather for a city',
                  parameters: weatherSchema }];
const rin = [{ role: 'user', content: 'What is the weather in Paris?' }];
const fc = await oai.responses.create({ ...rreq, max_output_tokens: 64, input: rin, tools: rtools,
                                        tool_choice: { type: 'function', name: 'get_weather' },
                                        parallel_tool_calls: false });
const call = fc.output.find((o) => o.type === 'function_call');
let args = null;
try { args = JSON.parse(call?.arguments); } catch { /* checked below */ }
check(call && call.name === 'get_weather' && /^call_/.test(call.call_id) && /^fc_/.test(call.id)
      && args && ['Paris', 'Rome'].includes(args.city),
      'responses function tool forced: a function_call item with JSON arguments',
      JSON.stringify(fc.output));
const fcs = oai.responses.stream({ ...rreq, max_output_tokens: 64, input: rin, tools: rtools,
                                   tool_choice: { type: 'function', name: 'get_weather' },
                                        parallel_tool_calls: false });
let argDeltas = '', argDone = null;
for await (const ev of fcs) {
  if (ev.type === 'response.function_call_arguments.delta') argDeltas += ev.delta;
  if (ev.type === 'response.function_call_arguments.done') argDone = ev.arguments;
}
const fcfin = await fcs.finalResponse();
const scall = fcfin.output.find((o) => o.type === 'function_call');
check(argDone === argDeltas && scall?.arguments === argDone && argDone === call.arguments,
      'function_call_arguments.delta pieces = .done = the non-streaming arguments',
      JSON.stringify([argDeltas, argDone, call.arguments]));
const fout = await oai.responses.create({ ...rreq, max_output_tokens: 8, tools: rtools, input: [
  ...rin, ...fc.output, { type: 'function_call_output', call_id: call.call_id,
                          output: '18 C, sunny' }] });
check(['completed', 'incomplete'].includes(fout.status)
      && fout.usage.input_tokens_details.cached_tokens > 0,
      'function_call_output turn answered, the earlier turn read from the cache',
      JSON.stringify(fout.usage));
await expectError(oai.responses.create({ ...rreq, previous_response_id: r1.id }), 400,
                  (e) => e.param === 'previous_response_id',
                  'previous_response_id -> 400 naming it');

console.log(`\n${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
