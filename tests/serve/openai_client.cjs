// tests/serve/openai_client.cjs — `dew-run serve` through the official OpenAI client library (npm's
// `openai`), run by openai_client.sh:  node openai_client.cjs OPENAI_MODULE_DIR BASE_URL MODEL
//
// Checks: chat.completions.create answers (message, finish_reason, usage, seed); streaming equals
// non-streaming for a seed (text, finish reason, first delta's role, usage chunk); n = 2 gives two
// choices, each equal to its own stream; a drawn seed (none given) is <= 2^53 - 1 and replays the same
// text through JavaScript numbers (chat and completions); stop strings end a reply; errors come back as
// the client's typed errors (BadRequestError with the field for a non-integer seed in both APIs,
// unsupported `tools`, an empty `messages`, top_logprobs without logprobs, a streamed echo with logprobs; NotFoundError
// for another model); logprobs (chat: one entry per completion token, its bytes the reply's, the greedy token the
// likeliest one, streamed entries the same; completions: tokens, token_logprobs, top_logprobs, text_offset; with echo
// the prompt's tokens scored too).
const assert = require("node:assert/strict");
const path = require("node:path");

const [moduleDir, baseURL, model, mode] = process.argv.slice(2);
const { OpenAI, BadRequestError, NotFoundError } = require(path.join(moduleDir, "node_modules", "openai"));
const client = new OpenAI({ apiKey: "unused", baseURL, maxRetries: 0, timeout: 120000 });

const messages = [
  { role: "system", content: "You answer in riddles." },
  { role: "user", content: "The quick brown fox?" },
];

async function collect(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true });
  const texts = {}, finish = {}, roles = {}, logprobs = {};
  let usage = null, id = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, "chat.completion.chunk");
    id = id ?? chunk.id;
    assert.equal(chunk.id, id, "every chunk of a stream has the same id");
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (!(c.index in texts)) {
        texts[c.index] = "";
        roles[c.index] = c.delta.role;
      }
      texts[c.index] += c.delta.content ?? "";
      if (c.logprobs) logprobs[c.index] = [...(logprobs[c.index] ?? []), ...c.logprobs.content];
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  return { texts, finish, roles, usage, chunks, logprobs };
}

async function expectError(type, fn, param) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof type, `expected ${type.name}, got ${e.constructor.name}: ${e.message}`);
    if (param) assert.equal(e.param, param, `the error names '${param}': ${e.message}`);
    return e;
  }
  assert.fail(`expected ${type.name}`);
}

// `gemma`: the server renders with the Gemma fixture template (--chat-template): the prompt is exactly its
// rendering (a byte tokenizer: one token per byte) and a conversation it rejects is a BadRequestError
// carrying the template's message.
async function gemma() {
  const msgs = [{ role: "user", content: "hi" }];
  const r = await client.chat.completions.create({ model, messages: msgs, max_tokens: 8, seed: 3 });
  const rendering = "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n";
  assert.equal(r.usage.prompt_tokens, Buffer.byteLength(rendering));
  assert.ok(!r.choices[0].message.content.includes("<end_of_turn>"), "the end of turn is a stop string");
  const e = await expectError(BadRequestError, () =>
    client.chat.completions.create({ model, messages: [{ role: "user", content: "a" }, { role: "user", content: "b" }] }),
    "messages");
  assert.ok(e.message.includes("Conversation roles must alternate user/assistant/user/assistant/..."), e.message);
  console.log("openai_client: the run's template (gemma): prompt = rendering, the template's refusal as BadRequestError: ok");
}

async function main() {
  if (mode === "gemma") return gemma();
  const params = { model, messages, seed: 7, max_tokens: 24, temperature: 0.9, top_p: 0.95, top_k: 40 };
  const r = await client.chat.completions.create(params);
  assert.equal(r.object, "chat.completion");
  assert.equal(r.model, model);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, "assistant");
  assert.equal(typeof r.choices[0].message.content, "string");
  assert.ok(["stop", "length"].includes(r.choices[0].finish_reason), r.choices[0].finish_reason);
  // The prompt is dew's default (ChatML) rendering with its generation prompt, one byte per token.
  const chatml = "<|im_start|>system\nYou answer in riddles.<|im_end|>\n<|im_start|>user\nThe quick brown fox?<|im_end|>\n" +
    "<|im_start|>assistant\n";
  assert.equal(r.usage.prompt_tokens, Buffer.byteLength(chatml));
  assert.ok(!r.choices[0].message.content.includes("<|im_end|>"), "the end of turn is a stop string");
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(r.seed, 7);

  // Streaming equals non-streaming for the seed.
  const s = await collect(params);
  assert.equal(s.texts[0], r.choices[0].message.content);
  assert.equal(s.finish[0], r.choices[0].finish_reason);
  assert.equal(s.roles[0], "assistant");
  assert.deepEqual(s.usage, r.usage);
  assert.ok(s.chunks >= 2, "text chunk(s), then the usage chunk");

  // n = 2: two choices, each its own stream's text.
  const two = await client.chat.completions.create({ ...params, n: 2, seed: 11 });
  assert.equal(two.choices.length, 2);
  const two_s = await collect({ ...params, n: 2, seed: 11 });
  for (const c of two.choices) assert.equal(two_s.texts[c.index], c.message.content);

  // A drawn seed stays a safe integer and replays exactly through JavaScript numbers.
  for (let k = 0; k < 4; k++) {
    const drawn = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 1.0 });
    assert.ok(Number.isSafeInteger(drawn.seed) && drawn.seed >= 0, `drawn seed ${drawn.seed}`);
    const again = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 1.0, seed: drawn.seed });
    assert.equal(again.choices[0].message.content, drawn.choices[0].message.content);
    const c1 = await client.completions.create({ model, prompt: "The ", max_tokens: 12, temperature: 1.0 });
    assert.ok(Number.isSafeInteger(c1.seed), `drawn completions seed ${c1.seed}`);
    const c2 = await client.completions.create({ model, prompt: "The ", max_tokens: 12, temperature: 1.0, seed: c1.seed });
    assert.equal(c2.choices[0].text, c1.choices[0].text);
  }

  // A stop string ends the reply before it.
  const long = await client.chat.completions.create({ ...params, max_tokens: 40, temperature: 0 });
  const text = long.choices[0].message.content;
  if (text.length > 2) {
    const stop = text.slice(1, 2);
    const cut = await client.chat.completions.create({ ...params, max_tokens: 40, temperature: 0, stop: [stop] });
    assert.equal(cut.choices[0].message.content, text.slice(0, text.indexOf(stop)));
    assert.equal(cut.choices[0].finish_reason, "stop");
  }

  // Log-probabilities (greedy, so each drawn token is its entry's likeliest): one entry per completion token, whose
  // bytes make the reply (the last may run into the end-of-turn stop string, which is cut from the text).
  const lp = await client.chat.completions.create({ ...params, temperature: 0, logprobs: true, top_logprobs: 3 });
  const content = lp.choices[0].logprobs.content;
  assert.equal(content.length, lp.usage.completion_tokens);
  const bytes = Buffer.from(content.flatMap((e) => e.bytes));
  assert.ok(bytes.toString("latin1").startsWith(Buffer.from(lp.choices[0].message.content).toString("latin1")));
  for (const e of content) {
    assert.ok(e.logprob <= 0, `logprob ${e.logprob}`);
    assert.equal(e.top_logprobs.length, 3);
    assert.equal(e.top_logprobs[0].token, e.token, "greedy: the drawn token is the likeliest");
    assert.equal(e.top_logprobs[0].logprob, e.logprob);
    assert.ok(e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob && e.top_logprobs[2].logprob <= e.top_logprobs[1].logprob);
  }
  const lp_s = await collect({ ...params, temperature: 0, logprobs: true, top_logprobs: 3 });
  assert.deepEqual(lp_s.logprobs[0], content, "streamed entries = non-streamed ones");
  assert.equal(r.choices[0].logprobs, null, "none unless asked for");
  const cl = await client.completions.create({ model, prompt: "The ", max_tokens: 12, seed: 5, logprobs: 2 });
  const l = cl.choices[0].logprobs;
  assert.equal(l.tokens.length, cl.usage.completion_tokens);
  assert.equal(l.token_logprobs.length, l.tokens.length);
  assert.equal(l.text_offset[0], 0);
  for (let k = 0; k < l.tokens.length; k++) {
    assert.ok(l.token_logprobs[k] <= 0);
    assert.equal(l.top_logprobs[k][l.tokens[k]], l.token_logprobs[k], "the drawn token is among top_logprobs");
    assert.ok(Object.keys(l.top_logprobs[k]).length <= 3);
  }
  await expectError(BadRequestError, () => client.chat.completions.create({ ...params, top_logprobs: 2 }), "top_logprobs");
  // echo with logprobs scores the prompt (how a harness scores a continuation): its tokens first, the first unscored.
  const sc = await client.completions.create({ model, prompt: "The quick", max_tokens: 1, temperature: 0, logprobs: 1, echo: true });
  const sl = sc.choices[0].logprobs;
  assert.equal(sl.tokens.length, sc.usage.prompt_tokens + sc.usage.completion_tokens);
  assert.equal(sl.tokens.slice(0, sc.usage.prompt_tokens).join(""), "The quick");
  assert.equal(sl.token_logprobs[0], null);
  assert.equal(sl.top_logprobs[0], null);
  for (let k = 1; k < sl.tokens.length; k++) assert.ok(sl.token_logprobs[k] <= 0, `${k}: ${sl.token_logprobs[k]}`);
  assert.ok(sc.choices[0].text.startsWith("The quick"));
  await expectError(BadRequestError, () =>
    client.completions.create({ model, prompt: "x", logprobs: 1, echo: true, stream: true }), "stream");

  // Errors are the client's typed errors.
  await expectError(BadRequestError, () => client.chat.completions.create({ ...params, seed: 1.5 }), "seed");
  await expectError(BadRequestError, () => client.completions.create({ model, prompt: "x", seed: 2.5 }), "seed");
  await expectError(BadRequestError, () => client.chat.completions.create({ ...params, seed: -1 }), "seed");
  await expectError(BadRequestError, () => client.chat.completions.create({ ...params, temperature: -1 }), "temperature");
  await expectError(BadRequestError, () => client.chat.completions.create({ model, messages: [] }), "messages");
  await expectError(BadRequestError, () =>
    client.chat.completions.create({ ...params, tools: [{ type: "function", function: { name: "f" } }] }), "tools");
  await expectError(NotFoundError, () => client.chat.completions.create({ ...params, model: "not-" + model }), "model");
  console.log("openai_client: chat.completions.create streaming and not, n, drawn seeds, stop, logprobs, typed errors: ok");
}

main().catch((e) => {
  console.error("openai_client: FAILED:", e);
  process.exit(1);
});
