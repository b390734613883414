// Guaranteed JSON and tool calls from `lily serve`, through the clients agent frameworks use: the
// Vercel AI SDK (@ai-sdk/openai-compatible: generateObject with a nested zod schema, generateText
// with a forced tool), LangChain's ChatOpenAI (withStructuredOutput, jsonSchema and
// functionCalling), the official openai client (response_format json_schema strict), and 100
// seeded constrained requests over varied schemas, each parsed and validated by ajv (an
// independent JSON Schema validator). The model has random weights: only the grammar makes the
// output valid, so every check here fails without constrained decoding.
// usage: node agent_clients.mjs BASE_URL API_KEY
import OpenAI from 'openai';
import { generateObject, generateText, tool } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { ChatOpenAI } from '@langchain/openai';
import { z } from 'zod';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

const [base, key] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: key, maxRetries: 0, timeout: 120000 });
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);
let pass = 0, fail = 0;

let t0 = Date.now();
function check(ok, what, detail = '') {
  const ms = Date.now() - t0;
  t0 = Date.now();
  console.log(`${what.padEnd(72)} ${ok ? 'ok' : 'FAIL'} ${String(ms).padStart(6)} ms${!ok && detail ? '  ' + detail : ''}`);
  ok ? pass++ : fail++;
}

async function attempt(what, fn) {
  try {
    await fn();
  } catch (e) {
    check(false, what, `${e.name}: ${e.message}`.slice(0, 400));
  }
}

const user = (content) => ({ role: 'user', content });

// ---- AI SDK ----------------------------------------------------------------------------------
const provider = createOpenAICompatible({
  name: 'lily', baseURL: `${base}/v1`, apiKey: key, supportsStructuredOutputs: true,
});
const model = provider.chatModel('lily');

const person = z.object({
  name: z.string().max(16),
  age: z.number(),
  tags: z.array(z.enum(['red', 'green', 'blue'])).max(3),
  address: z.object({ city: z.string().max(12), zip: z.string().max(6) }),
  pets: z.array(z.object({ kind: z.enum(['cat', 'dog']), name: z.string().max(8) })).max(2),
});
await attempt('ai-sdk generateObject (nested zod schema)', async () => {
  const r = await generateObject({ model, schema: person, prompt: 'Describe a person.', seed: 7,
                                   maxOutputTokens: 1000, maxRetries: 0 });
  const o = r.object;
  check(person.safeParse(o).success && typeof o.address.city === 'string',
        'ai-sdk generateObject (nested zod schema)', JSON.stringify(o));
});

const weatherTool = tool({
  description: 'Get the weather in a city',
  inputSchema: z.object({ city: z.string().max(12), unit: z.enum(['C', 'F']) }),
});
const timeTool = tool({
  description: 'Get the time in a time zone',
  inputSchema: z.object({ zone: z.string().max(10) }),
});
await attempt('ai-sdk generateText toolChoice {type:"tool"}', async () => {
  const r = await generateText({
    model, prompt: 'What is the weather in Oslo?', seed: 3, maxOutputTokens: 400, maxRetries: 0,
    tools: { get_weather: weatherTool, get_time: timeTool },
    toolChoice: { type: 'tool', toolName: 'get_weather' },
  });
  const calls = r.toolCalls;
  check(calls.length >= 1 && calls.every((c) => c.toolName === 'get_weather'
        && typeof c.input.city === 'string' && ['C', 'F'].includes(c.input.unit))
        && r.finishReason === 'tool-calls',
        'ai-sdk generateText toolChoice {type:"tool"}',
        JSON.stringify({ calls, finish: r.finishReason }));
});
await attempt('ai-sdk generateText toolChoice "required"', async () => {
  const r = await generateText({
    model, prompt: 'Weather or time?', seed: 4, maxOutputTokens: 400, maxRetries: 0,
    tools: { get_weather: weatherTool, get_time: timeTool }, toolChoice: 'required',
  });
  check(r.toolCalls.length >= 1 && r.toolCalls.every((c) => ['get_weather', 'get_time']
        .includes(c.toolName)), 'ai-sdk generateText toolChoice "required"',
        JSON.stringify(r.toolCalls));
});

// ---- LangChain -------------------------------------------------------------------------------
const chat = new ChatOpenAI({ model: 'lily', apiKey: key, configuration: { baseURL: `${base}/v1` },
                              maxRetries: 0, maxTokens: 600, temperature: 1 });
const answer = z.object({
  answer: z.string().max(20),
  confidence: z.number(),
  sources: z.array(z.string().max(10)).max(2),
});
for (const method of ['jsonSchema', 'functionCalling']) {
  const what = `langchain withStructuredOutput (${method})`;
  await attempt(what, async () => {
    const s = chat.withStructuredOutput(answer, { method, name: 'answer', strict: true });
    const o = await s.invoke([{ role: 'user', content: 'Why is the sky blue?' }]);
    check(answer.safeParse(o).success, what, JSON.stringify(o));
  });
}

// ---- openai client: json_schema strict, json_object, forced tools ----------------------------
const strictSchema = {
  type: 'object',
  properties: {
    title: { type: 'string', maxLength: 20 },
    rating: { type: 'integer' },
    when: { type: 'string', format: 'date' },
    kind: { anyOf: [{ type: 'null' }, { enum: ['book', 'film'] }] },
  },
  required: ['title', 'rating', 'when', 'kind'],
  additionalProperties: false,
};
await attempt('openai response_format json_schema strict', async () => {
  const r = await client.chat.completions.create({
    model: 'lily', messages: [user('Review something.')], seed: 5, max_tokens: 600,
    response_format: { type: 'json_schema', json_schema: { name: 'review', strict: true,
                                                             schema: strictSchema } },
  });
  const c = r.choices[0];
  let v = null;
  try { v = JSON.parse(c.message.content); } catch { /* checked below */ }
  check(v !== null && ajv.validate(strictSchema, v) && c.finish_reason === 'stop',
        'openai response_format json_schema strict', c.message.content);
});
await attempt('openai response_format json_schema strict, streamed', async () => {
  const st = await client.chat.completions.create({
    model: 'lily', messages: [user('Review something.')], seed: 6, max_tokens: 600, stream: true,
    response_format: { type: 'json_schema', json_schema: { name: 'review', strict: true,
                                                             schema: strictSchema } },
  });
  let text = '';
  for await (const ch of st) text += ch.choices[0]?.delta?.content ?? '';
  let v = null;
  try { v = JSON.parse(text); } catch { /* checked below */ }
  check(v !== null && ajv.validate(strictSchema, v), 'openai response_format json_schema strict, streamed',
        text);
});
const fnTools = [
  { type: 'function', function: { name: 'add', strict: true, parameters: {
    type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } },
    required: ['a', 'b'], additionalProperties: false } } },
  { type: 'function', function: { name: 'echo', parameters: {
    type: 'object', properties: { text: { type: 'string', maxLength: 8 } }, required: ['text'] } } },
];
await attempt('openai tool_choice named, parallel_tool_calls false', async () => {
  const r = await client.chat.completions.create({
    model: 'lily', messages: [user('Add 2 and 3.')], seed: 8, max_tokens: 400, tools: fnTools,
    tool_choice: { type: 'function', function: { name: 'add' } }, parallel_tool_calls: false,
  });
  const c = r.choices[0], tc = c.message.tool_calls ?? [];
  let args = null;
  try { args = JSON.parse(tc[0]?.function.arguments); } catch { /* checked below */ }
  check(tc.length === 1 && tc[0].function.name === 'add' && args
        && ajv.validate(fnTools[0].function.parameters, args) && c.finish_reason === 'tool_calls',
        'openai tool_choice named, parallel_tool_calls false', JSON.stringify(c));
});
await attempt('openai tool_choice required, streamed', async () => {
  const st = await client.chat.completions.create({
    model: 'lily', messages: [user('Do something.')], seed: 9, max_tokens: 400, tools: fnTools,
    tool_choice: 'required', stream: true,
  });
  const calls = [];
  let finish = null;
  for await (const ch of st) {
    const ch0 = ch.choices[0];
    if (!ch0) continue;
    for (const d of ch0.delta?.tool_calls ?? []) {
      calls[d.index] ??= { name: '', args: '' };
      calls[d.index].name += d.function?.name ?? '';
      calls[d.index].args += d.function?.arguments ?? '';
    }
    finish = ch0.finish_reason ?? finish;
  }
  const ok = calls.length >= 1 && calls.every((c) => {
    const t = fnTools.find((f) => f.function.name === c.name);
    try { return t && ajv.validate(t.function.parameters, JSON.parse(c.args)); } catch { return false; }
  });
  check(ok && finish === 'tool_calls', 'openai tool_choice required, streamed',
        JSON.stringify({ calls, finish }));
});

// ---- a continued assistant message: the grammar resumes after its content ---------------------
const abSchema = { type: 'object', properties: { a: { type: 'integer' }, b: { enum: ['p', 'q'] } },
                   required: ['a', 'b'], additionalProperties: false };
const abFormat = { type: 'json_schema', json_schema: { name: 'ab', strict: true, schema: abSchema } };
await attempt('continued assistant message under json_schema', async () => {
  const r = await client.chat.completions.create({
    model: 'lily', seed: 1, max_tokens: 100, response_format: abFormat,
    messages: [user('hi'), { role: 'assistant', content: '{"a": 12' }] });
  let v = null;
  try { v = JSON.parse('{"a": 12' + r.choices[0].message.content); } catch { /* checked below */ }
  check(v !== null && v.a === 12 && ajv.validate(abSchema, v), 'continued assistant message under json_schema',
        r.choices[0].message.content);
});
await expect400({ response_format: abFormat, messages: [user('hi'), { role: 'assistant', content: '[1' }] },
                'messages', 'continued assistant message outside the grammar -> 400', 'does not match');

// ---- 400s ------------------------------------------------------------------------------------
async function expect400(body, param, what, named = param) {
  try {
    await client.chat.completions.create({ model: 'lily', messages: [user('hi')], max_tokens: 4,
                                           ...body });
    check(false, what, 'no error');
  } catch (e) {
    check(e.status === 400 && e.error?.param === param && e.message.includes(named),
          what, `${e.status} ${e.error?.param} ${e.message}`);
  }
}
for (const f of ['grammar', 'guided_json', 'guided_regex', 'guided_choice', 'json_schema', 'format'])
  await expect400({ [f]: f === 'guided_choice' ? ['a', 'b'] : 'x' }, f, `unsupported field '${f}' -> 400`);
await expect400({ response_format: { type: 'json_schema', json_schema: { name: 'p', strict: true,
  schema: { type: 'string', pattern: '^a+$' } } } }, 'response_format.json_schema.schema',
  'response_format with pattern -> 400 naming it', 'pattern');
await expect400({ tools: [{ type: 'function', function: { name: 'f', strict: true, parameters: {
  type: 'object', properties: { n: { type: 'integer', multipleOf: 3 } } } } }], tool_choice: 'required' },
  'tools[0].function.parameters', 'strict tool with multipleOf -> 400 naming it', 'multipleOf');
// Any JSON object (json_object, and a non-strict tool whose schema does not compile) has strings
// of unbounded length, which random weights seldom close (a few hundred of the vocabulary's
// tokens hold a quote). A logit_bias of +100 on '"' and '}' makes them close (the mask applies
// before the bias, so the bias can never pull in a token the grammar refuses): every answer that
// ends by itself must parse, and most of a few seeds must end by itself.
const tokId = async (text) => {
  const r = await fetch(`${base}/tokenize`, { method: 'POST', body: JSON.stringify({ content: text }),
    headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' } });
  const j = await r.json();
  return (j.tokens ?? j.ids)[0];
};
const closing = { [await tokId('"')]: 100, [await tokId('}')]: 100 };
await attempt('non-strict tool with unsupported schema falls back to json_object', async () => {
  let ended = 0, bad = [];
  for (const seed of [2, 3, 4, 5]) {
    const r = await client.chat.completions.create({
      model: 'lily', messages: [user('go')], seed, max_tokens: 150, tool_choice: 'required', logit_bias: closing,
      parallel_tool_calls: false, tools: [{ type: 'function', function: { name: 'f', parameters: {
        type: 'object', properties: { n: { type: 'integer', multipleOf: 3 } } } } }],
    });
    const c = r.choices[0], tc = c.message.tool_calls ?? [];
    if (c.finish_reason === 'length') continue;
    ended++;
    let a = null;
    try { a = JSON.parse(tc[0]?.function.arguments); } catch { /* checked below */ }
    if (!(tc.length === 1 && c.finish_reason === 'tool_calls' && a !== null && typeof a === 'object'
          && !Array.isArray(a))) bad.push(JSON.stringify(c));
  }
  check(ended >= 2 && !bad.length, 'non-strict tool with unsupported schema falls back to json_object',
        `${ended} ended; ${bad.join(' ')}`);
});
await attempt('response_format json_object', async () => {
  let ended = 0, bad = [];
  for (const seed of [11, 12, 13, 14, 15, 16]) {
    const r = await client.chat.completions.create({
      model: 'lily', messages: [user('JSON please')], seed, max_tokens: 150, logit_bias: closing,
      response_format: { type: 'json_object' } });
    const c = r.choices[0];
    if (c.finish_reason === 'length') continue;
    ended++;
    let v = null;
    try { v = JSON.parse(c.message.content); } catch { /* checked below */ }
    if (!(v !== null && typeof v === 'object' && !Array.isArray(v))) bad.push(c.message.content);
  }
  check(ended >= 3 && !bad.length, 'response_format json_object', `${ended} ended; ${bad.join(' ')}`);
});

// ---- 100 seeded constrained requests -------------------------------------------------------
const schemas = [
  { type: 'object', properties: { a: { type: 'string', maxLength: 4 }, b: { type: 'array',
    items: { type: 'boolean' }, maxItems: 2 } }, required: ['a', 'b'], additionalProperties: false },
  { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false },
  { type: 'object', properties: { n: { type: 'integer' }, x: { type: 'number' } }, required: ['n', 'x'],
    additionalProperties: false },
  { type: 'object', properties: { color: { enum: ['red', 'green', 'blue', null] } }, required: ['color'],
    additionalProperties: false },
  { type: 'object', properties: { id: { type: 'string', format: 'uuid' },
    at: { type: 'string', format: 'date-time' } }, required: ['id', 'at'], additionalProperties: false },
  { type: 'object', properties: { items: { type: 'array', items: { type: 'integer' }, minItems: 1,
    maxItems: 4 } }, required: ['items'], additionalProperties: false },
  { type: 'object', properties: { name: { type: 'string', minLength: 2, maxLength: 10 },
    nick: { type: 'string', maxLength: 5 } }, required: ['name'], additionalProperties: false },
  { type: 'object', properties: { v: { anyOf: [{ type: 'integer' }, { type: 'string', maxLength: 6 },
    { type: 'null' }] } }, required: ['v'], additionalProperties: false },
  { $defs: { node: { type: 'object', properties: { val: { type: 'integer' },
    kids: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 1 } }, required: ['val', 'kids'],
    additionalProperties: false } }, $ref: '#/$defs/node' },
  { type: 'object', properties: { p: { type: 'object', properties: { q: { const: 'fixed' },
    r: { type: 'array', items: { enum: [1, 2, 3] }, maxItems: 3 } }, required: ['q', 'r'],
    additionalProperties: false }, s: { type: 'boolean' } }, required: ['p', 's'],
    additionalProperties: false },
];
let seeded = 0, seededOk = 0;
const failures = [];
for (let i = 0; i < 100; i++) {
  const schema = schemas[i % schemas.length];
  const rf = schema === null ? { type: 'json_object' }
    : { type: 'json_schema', json_schema: { name: `s${i % schemas.length}`, strict: true, schema } };
  seeded++;
  try {
    const r = await client.chat.completions.create({
      model: 'lily', messages: [user(`Request ${i}`)], seed: 1000 + i, max_tokens: 800,
      temperature: 1, response_format: rf,
    });
    const text = r.choices[0].message.content;
    const v = JSON.parse(text);
    const ok = schema === null ? typeof v === 'object' && v !== null && !Array.isArray(v)
      : ajv.validate(schema, v);
    if (ok && r.choices[0].finish_reason === 'stop') seededOk++;
    else failures.push(`#${i}: ${r.choices[0].finish_reason} ${JSON.stringify(ajv.errors)} ${text}`);
  } catch (e) {
    failures.push(`#${i}: ${e.message}`);
  }
}
check(seededOk === 100 && seeded === 100, `100 seeded constrained requests validate with ajv (${seededOk}/100)`,
      failures.slice(0, 3).join('\n    '));

console.log(`${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
