// Bad input: every case is answered with a 4xx in OpenAI's error shape over a real socket, and the
// server still serves afterwards. Routing details (health body, models, 404s, auth header forms) go
// through inject() on the same app built in-process around the real engine.
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import OpenAI from "openai";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { loadEngine } from "../engine/index.js";
import { type App, buildApp } from "../server/app.js";
import { ServerContext } from "../server/context.js";
import { inlineEncoder } from "../server/prompt-encoder.js";
import { ModelTokenizer } from "../server/tokenizer.js";
import { makeTinyModel, readSse, type ServerProcess, startServer } from "./server-harness.js";

const work = mkdtempSync(join(tmpdir(), "a2d-server-errors-"));
let model: string;
let server: ServerProcess;
let url: string;

beforeAll(async () => {
  model = makeTinyModel(join(work, "tiny"), ["--seed", "5"]);
  server = startServer(model, ["--max-context", "512"]);
  url = await server.url();
  await server.waitForLog("ready");
});

afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  rmSync(work, { recursive: true, force: true });
});

const user = [{ role: "user", content: "hi" }];
const long = "word ".repeat(2000);

interface BadCase {
  name: string;
  path?: string;
  method?: string;
  body: unknown;
  /** Raw body text instead of JSON.stringify(body). */
  raw?: string;
  contentType?: string;
  status?: number;
  code?: string;
  param?: string | null;
  /** What the message must say. */
  message?: RegExp;
}

const cases: BadCase[] = [
  { name: "invalid JSON", raw: '{"messages": [', body: null, code: "invalid_json" },
  { name: "empty JSON body", raw: "", body: null, code: "invalid_json" },
  { name: "body is an array", body: [1, 2], code: "invalid_type" },
  { name: "messages missing", body: { model: "x" }, code: "missing_required_parameter", param: "messages" },
  { name: "messages empty", body: { messages: [] }, code: "invalid_value", param: "messages" },
  { name: "messages not an array", body: { messages: "hi" }, code: "invalid_type", param: "messages" },
  { name: "message without role", body: { messages: [{ content: "hi" }] }, code: "missing_required_parameter", param: "messages[0].role" },
  { name: "tool role", body: { messages: [{ role: "tool", content: "x", tool_call_id: "c1" }] }, code: "unsupported_value", param: "messages[0].role" },
  { name: "unknown role", body: { messages: [{ role: "robot", content: "x" }] }, code: "invalid_value", param: "messages[0].role" },
  { name: "role is a number", body: { messages: [{ role: 3, content: "x" }] }, param: "messages[0].role" },
  { name: "content is a number", body: { messages: [{ role: "user", content: 42 }] }, code: "invalid_type", param: "messages[0].content" },
  { name: "content missing", body: { messages: [{ role: "user" }] }, code: "missing_required_parameter", param: "messages[0].content" },
  { name: "content null", body: { messages: [{ role: "user", content: null }] }, code: "missing_required_parameter", param: "messages[0].content" },
  {
    name: "image content part",
    body: { messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "http://x" } }] }] },
    code: "unsupported_content",
    param: "messages[0].content[0].type",
  },
  { name: "text part without text", body: { messages: [{ role: "user", content: [{ type: "text" }] }] }, param: "messages[0].content[0].text" },
  { name: "content parts not objects", body: { messages: [{ role: "user", content: [1] }] }, code: "invalid_type", param: "messages[0].content" },
  { name: "temperature as a string", body: { messages: user, temperature: "0.5" }, code: "invalid_type", param: "temperature" },
  { name: "temperature above 2", body: { messages: user, temperature: 3 }, param: "temperature" },
  { name: "negative temperature", body: { messages: user, temperature: -1 }, param: "temperature" },
  { name: "top_p 0", body: { messages: user, top_p: 0 }, param: "top_p" },
  { name: "top_p above 1", body: { messages: user, top_p: 1.5 }, param: "top_p" },
  { name: "max_tokens 0", body: { messages: user, max_tokens: 0 }, param: "max_tokens" },
  { name: "max_tokens fractional", body: { messages: user, max_tokens: 1.5 }, param: "max_tokens" },
  { name: "max_tokens as a string", body: { messages: user, max_tokens: "10" }, param: "max_tokens" },
  { name: "frequency_penalty out of range", body: { messages: user, frequency_penalty: 3 }, param: "frequency_penalty" },
  { name: "steps above the block", body: { messages: user, block_size: 4, steps: 5 }, code: "invalid_value", param: "steps" },
  { name: "prompt longer than the context", body: { messages: [{ role: "user", content: long }] }, code: "context_length_exceeded" },
  { name: "n = 2", body: { messages: user, n: 2 }, code: "unsupported_value", param: "n" },
  { name: "stream not a boolean", body: { messages: user, stream: "yes" }, param: "stream" },
  { name: "stop a number", body: { messages: user, stop: 5 }, code: "invalid_type", param: "stop" },
  { name: "empty stop string", body: { messages: user, stop: [""] }, code: "invalid_value", param: "stop" },
  { name: "17 stop strings", body: { messages: user, stop: Array.from({ length: 17 }, (_, i) => `s${i}`) }, param: "stop" },
  { name: "fractional seed", body: { messages: user, seed: 1.5 }, param: "seed" },
  { name: "seed a string", body: { messages: user, seed: "abc" }, param: "seed" },
  { name: "logprobs", body: { messages: user, logprobs: true }, code: "unsupported_parameter", param: "logprobs" },
  { name: "presence_penalty", body: { messages: user, presence_penalty: 1 }, code: "unsupported_value", param: "presence_penalty" },
  { name: "enable_thinking not a boolean", body: { messages: user, chat_template_kwargs: { enable_thinking: "no" } }, param: "chat_template_kwargs" },
  { name: "stream_options a string", body: { messages: user, stream_options: "x" }, param: "stream_options" },
  { name: "block_size 0", body: { messages: user, block_size: 0 }, param: "block_size" },
  { name: "block_size 65", body: { messages: user, block_size: 65 }, param: "block_size" },
  { name: "threshold 2", body: { messages: user, threshold: 2 }, param: "threshold" },
  { name: "min_per_step above the block", body: { messages: user, block_size: 4, min_per_step: 5 }, param: "min_per_step" },
  { name: "unknown remasking", body: { messages: user, remasking: "sometimes" }, code: "invalid_value", param: "remasking" },
  { name: "remasking verify (retired: causal acceptance)", body: { messages: user, remasking: "verify" }, code: "invalid_value", param: "remasking" },
  { name: "remasking tree (retired: causal acceptance)", body: { messages: user, remasking: "tree" }, code: "invalid_value", param: "remasking" },
  // Fields of retired decoding methods: refused by name, whatever their value, never ignored.
  { name: "tree_width (removed)", body: { messages: user, tree_width: "abc" }, code: "unsupported_parameter", param: "tree_width", message: /removed/ },
  { name: "lookup_ngram (removed)", body: { messages: user, lookup_ngram: 3 }, code: "unsupported_parameter", param: "lookup_ngram", message: /removed/ },
  { name: "completions: tree_width (removed)", path: "/v1/completions", body: { prompt: "a", tree_width: 2 }, code: "unsupported_parameter", param: "tree_width" },
  { name: "block_size 1 (left to right)", body: { messages: user, block_size: 1 }, param: "block_size" },
  { name: "leftmost at threshold 1 (left to right)", body: { messages: user, remasking: "leftmost", threshold: 1 }, code: "invalid_value", param: "left_to_right" },
  { name: "a schedule with a sliding window", body: { messages: user, advance: "slide", steps: 2 }, code: "invalid_value", param: "schedule_needs_blocks" },
  { name: "unknown advance", body: { messages: user, advance: "jump" }, code: "invalid_value", param: "advance" },
  { name: "text/plain body", raw: "hello", contentType: "text/plain", body: null, status: 415, code: "unsupported_media_type" },
  // Fields a client relies on that this server cannot honour: a 400 naming the field, never plain text.
  { name: "tools", body: { messages: user, tools: [{ type: "function", function: { name: "f", parameters: {} } }] }, code: "unsupported_value", param: "tools" },
  { name: "tool_choice required", body: { messages: user, tool_choice: "required" }, code: "unsupported_value", param: "tool_choice" },
  { name: "tool_choice named", body: { messages: user, tool_choice: { type: "function", function: { name: "f" } } }, code: "unsupported_value", param: "tool_choice" },
  { name: "functions", body: { messages: user, functions: [{ name: "f", parameters: {} }] }, code: "unsupported_value", param: "functions" },
  { name: "function_call named", body: { messages: user, function_call: { name: "f" } }, code: "unsupported_value", param: "function_call" },
  { name: "response_format json_object", body: { messages: user, response_format: { type: "json_object" } }, code: "unsupported_value", param: "response_format" },
  {
    name: "response_format json_schema",
    body: { messages: user, response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object" } } } },
    code: "unsupported_value",
    param: "response_format",
  },
  { name: "response_format of another type", body: { messages: user, response_format: { type: "xml" } }, code: "invalid_value", param: "response_format.type" },
  { name: "function role", body: { messages: [{ role: "function", name: "f", content: "x" }] }, code: "unsupported_value", param: "messages[0].role" },
  {
    name: "assistant tool calls with null content",
    body: { messages: [...user, { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "f", arguments: "{}" } }] }] },
    code: "unsupported_value",
    param: "messages[1].tool_calls",
  },
  { name: "top_logprobs", body: { messages: user, top_logprobs: 3 }, code: "unsupported_value", param: "top_logprobs" },
  { name: "logit_bias", body: { messages: user, logit_bias: { "5": 10 } }, code: "unsupported_value", param: "logit_bias" },
  { name: "audio output", body: { messages: user, modalities: ["text", "audio"] }, code: "unsupported_value", param: "modalities" },
  { name: "completions: logit_bias", path: "/v1/completions", body: { prompt: "a", logit_bias: { "1": -100 } }, code: "unsupported_value", param: "logit_bias" },
  // Seeds are read from the body text exactly; past the 64-bit range is an error, not a wrap.
  { name: "seed 2^64", raw: '{"messages":[{"role":"user","content":"hi"}],"seed":18446744073709551616}', body: null, code: "invalid_value", param: "seed" },
  { name: "seed below -2^63", raw: '{"messages":[{"role":"user","content":"hi"}],"seed":-9223372036854775809}', body: null, code: "invalid_value", param: "seed" },
  { name: "seed past 2^53 in exponent form", raw: '{"messages":[{"role":"user","content":"hi"}],"seed":1.8446744073709552e19}', body: null, code: "invalid_value", param: "seed" },
  // What the engine refuses is refused before a stream's 200, not as an error event inside it.
  { name: "an engine refusal, streamed", body: { messages: user, stream: true, remasking: "verify", commit: "separate" }, code: "invalid_value" },
  { name: "completions: prompt missing", path: "/v1/completions", body: { max_tokens: 4 }, code: "missing_required_parameter", param: "prompt" },
  { name: "completions: empty prompt list", path: "/v1/completions", body: { prompt: [] }, param: "prompt" },
  { name: "completions: token id past the vocabulary", path: "/v1/completions", body: { prompt: [1, 2, 999999] }, code: "invalid_value", param: "prompt" },
  { name: "completions: two prompts", path: "/v1/completions", body: { prompt: ["a", "b"] }, code: "unsupported_value", param: "prompt" },
  { name: "completions: echo", path: "/v1/completions", body: { prompt: "a", echo: true }, code: "unsupported_parameter", param: "echo" },
  { name: "completions: empty prompt", path: "/v1/completions", body: { prompt: "" }, code: "invalid_value" },
  { name: "unknown route", path: "/v1/embeddings", body: { input: "x" }, status: 404, code: "not_found" },
  { name: "wrong method", path: "/v1/chat/completions", method: "GET", body: undefined, status: 404, code: "not_found" },
  { name: "unknown model id", path: "/v1/models/gpt-4", method: "GET", body: undefined, status: 404, code: "model_not_found" },
];

describe("bad input over a real socket", () => {
  it(`answers all ${cases.length} bad requests with a 4xx OpenAI error and keeps serving`, async () => {
    expect(cases.length).toBeGreaterThanOrEqual(30);
    for (const bad of cases) {
      const method = bad.method ?? "POST";
      const response = await fetch(`${url}${bad.path ?? "/v1/chat/completions"}`, {
        method,
        headers: method === "GET" ? {} : { "content-type": bad.contentType ?? "application/json" },
        ...(method === "GET" ? {} : { body: bad.raw ?? JSON.stringify(bad.body) }),
      });
      const body = (await response.json()) as { error: { message: unknown; type: unknown; param: unknown; code: unknown } };
      const where = `${bad.name}: ${JSON.stringify(body)}`;
      expect(response.status, where).toBe(bad.status ?? 400);
      expect(Object.keys(body), where).toEqual(["error"]);
      expect(typeof body.error.message, where).toBe("string");
      expect((body.error.message as string).length, where).toBeGreaterThan(10);
      expect(typeof body.error.type, where).toBe("string");
      expect(typeof body.error.code, where).toBe("string");
      expect(body.error.param === null || typeof body.error.param === "string", where).toBe(true);
      if (bad.code) expect(body.error.code, where).toBe(bad.code);
      if (bad.param !== undefined) expect(body.error.param, where).toBe(bad.param);
      if (bad.message) expect(body.error.message, where).toMatch(bad.message);
    }
    // Still up, and still generating.
    const ok = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ messages: user, max_tokens: 8, temperature: 0 }),
    });
    expect(ok.status).toBe(200);
    const result = (await ok.json()) as { choices: Array<{ finish_reason: string }> };
    expect(["stop", "length"]).toContain(result.choices[0]!.finish_reason);
  });
});

interface UsageBody {
  choices: Array<{ finish_reason: string }>;
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
}

describe("token budgets past the context", () => {
  // The engine's rule (engine/index.ts, positionsNeeded): prompt + max_tokens + block_size - 1 <= 512.
  const cases = [
    { path: "/v1/chat/completions", body: { messages: user }, blockSize: 4 },
    { path: "/v1/chat/completions", body: { messages: [{ role: "user", content: "a longer question, to move the prompt" }] }, blockSize: 16 },
    { path: "/v1/completions", body: { prompt: "Once upon a time" }, blockSize: 3 },
    { path: "/v1/completions", body: { prompt: "Once upon" }, blockSize: 32 },
  ];

  it.each(cases)("fills the context exactly without max_tokens: $path, block size $blockSize, stream and not", async ({ path, body, blockSize }) => {
    for (const maxTokens of [undefined, 100_000]) {
      const request = { ...body, ...(maxTokens ? { max_tokens: maxTokens } : {}), block_size: blockSize, temperature: 0, ignore_eos: true };
      const whole = await fetch(`${url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(request) });
      const result = (await whole.json()) as UsageBody;
      expect(whole.status, JSON.stringify(result)).toBe(200);
      expect(result.choices[0]!.finish_reason).toBe("length");
      expect(result.usage.total_tokens).toBe(512 - (blockSize - 1));

      const streamed = await fetch(`${url}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ ...request, stream: true, stream_options: { include_usage: true } }),
      });
      expect(streamed.status).toBe(200);
      const events = (await readSse(streamed)).map((event) => (event === "[DONE]" ? event : (JSON.parse(event) as Partial<UsageBody> & { error?: unknown })));
      expect(events.filter((event) => typeof event === "object" && "error" in event)).toEqual([]);
      expect(events.at(-1)).toBe("[DONE]");
      expect((events.at(-2) as UsageBody).usage).toEqual(result.usage);
    }
  });

  it("serves the official client's default call (no max_tokens), stream and non-stream", async () => {
    const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "none", maxRetries: 0 });
    // ignore_eos makes the budget the only end, so the default budget is what is tested.
    const request = { model: "tiny", messages: [{ role: "user" as const, content: "Hello" }], ignore_eos: true } as OpenAI.ChatCompletionCreateParamsNonStreaming;
    const whole = await client.chat.completions.create(request);
    expect(whole.choices[0]!.finish_reason).toBe("length");
    expect(whole.usage!.total_tokens).toBe(512 - 3);
    const stream = await client.chat.completions.create({ ...request, stream: true, stream_options: { include_usage: true } });
    let usage: OpenAI.CompletionUsage | undefined;
    let finish: string | null = null;
    for await (const chunk of stream) {
      usage = chunk.usage ?? usage;
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
    expect(finish).toBe("length");
    expect(usage).toEqual(whole.usage);
  });

  it("serves the official Python client's default call (no max_tokens), stream and non-stream", () => {
    const script = `
import json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", max_retries=0, timeout=120)
request = dict(model="tiny", messages=[{"role": "user", "content": "Hello"}], extra_body={"ignore_eos": True})
whole = client.chat.completions.create(**request)
finish, usage = None, None
for chunk in client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}):
    usage = chunk.usage or usage
    if chunk.choices and chunk.choices[0].finish_reason:
        finish = chunk.choices[0].finish_reason
print(json.dumps({"finish": whole.choices[0].finish_reason, "usage": whole.usage.model_dump(exclude_none=True),
                  "stream_finish": finish, "stream_usage": usage.model_dump(exclude_none=True)}))
`;
    const python = join(process.cwd(), ".venv", "bin", "python");
    const out = JSON.parse(execFileSync(python, ["-c", script, url], { encoding: "utf8", timeout: 240_000 }).trim().split("\n").at(-1)!) as {
      finish: string; usage: { total_tokens: number }; stream_finish: string; stream_usage: unknown;
    };
    expect(out.finish).toBe("length");
    expect(out.usage.total_tokens).toBe(512 - 3);
    expect(out.stream_finish).toBe("length");
    expect(out.stream_usage).toEqual(out.usage);
  });
});

describe("seeds", () => {
  let requests = 0;
  /** The seed the generation log says it ran with, and the text. */
  async function seededLog(seedLiteral: string): Promise<string> {
    // A budget of its own (all of it generated, ignore_eos) tells this request's log line from others'.
    const budget = 20 + requests++;
    const response = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: `{"prompt":"Hello","max_tokens":${budget},"ignore_eos":true,"temperature":1,"seed":${seedLiteral}}`,
    });
    expect(response.status).toBe(200);
    const text = ((await response.json()) as { choices: Array<{ text: string }> }).choices[0]!.text;
    let line = server.logs.find((entry) => entry.msg === "generation" && entry.completion_tokens === budget);
    for (let waited = 0; line === undefined && waited < 100; waited++) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      line = server.logs.find((entry) => entry.msg === "generation" && entry.completion_tokens === budget);
    }
    return `${String(line?.seed)} ${text}`;
  }

  it("reads seeds past 2^53 exactly: neighbours sample differently, -1 is 2^64 - 1", async () => {
    const [a, b] = [await seededLog("9007199254740992"), await seededLog("9007199254740993")];
    expect(a.split(" ")[0]).toBe("9007199254740992");
    expect(b.split(" ")[0]).toBe("9007199254740993");
    expect(a.slice(a.indexOf(" "))).not.toBe(b.slice(b.indexOf(" ")));
    const top = await seededLog("18446744073709551615");
    expect(top.split(" ")[0]).toBe("18446744073709551615");
    const minusOne = await seededLog("-1");
    expect(minusOne.split(" ")[0]).toBe("18446744073709551615");
    expect((await seededLog("18446744073709551614")).split(" ")[0]).toBe("18446744073709551614");
  });
});

describe("routing details through inject()", () => {
  let app: App;
  let ctx: ServerContext;

  beforeAll(async () => {
    const log = pino({ level: "silent" });
    ctx = new ServerContext("tiny", "sekrit", 4, log);
    app = buildApp(ctx, log);
    await app.ready();
  });
  afterAll(async () => {
    await app.close();
    await ctx.model?.engine.close();
  });

  it("answers 503 while loading, then 200 with the decoding method and parameters", async () => {
    const loading = await app.inject({ method: "GET", url: "/health" });
    expect(loading.statusCode).toBe(503);
    expect(loading.json().error.code).toBe("model_loading");
    const chat = await app.inject({ method: "POST", url: "/v1/chat/completions", headers: { authorization: "Bearer sekrit" }, payload: { messages: user } });
    expect(chat.statusCode).toBe(503);

    const tokenizer = await ModelTokenizer.load(model);
    ctx.ready({ engine: await loadEngine({ modelDir: model, device: "cpu", threads: 1 }), tokenizer, encoder: inlineEncoder(tokenizer) });
    const health = await app.inject({ method: "GET", url: "/health" });
    expect(health.statusCode).toBe(200);
    const body = health.json();
    expect(body.decoding.method).toBe("block_diffusion");
    expect(body.decoding.block_size).toBe(4);
    expect(body.decoding.threshold).toBe(0.9);
    expect(body.decoding.min_tokens_per_step).toBe(1);
    expect(body.decoding.steps).toBe(0);
    expect(body.forward_passes).toBe(0);

    const done = await app.inject({
      method: "POST",
      url: "/v1/completions",
      headers: { authorization: "Bearer sekrit" },
      payload: { prompt: "Hello", max_tokens: 8, temperature: 0 },
    });
    expect(done.statusCode).toBe(200);
    const after = (await app.inject({ method: "GET", url: "/health" })).json();
    expect(after.forward_passes).toBeGreaterThan(0);
  });

  it("checks the API key on /v1 only, in its Bearer forms", async () => {
    const models = (authorization?: string) =>
      app.inject({ method: "GET", url: "/v1/models", headers: authorization === undefined ? {} : { authorization } });
    for (const bad of [undefined, "sekrit", "Bearer wrong", "Bearer sekrit2", "Basic c2Vrcml0"]) {
      const response = await models(bad);
      expect(response.statusCode, String(bad)).toBe(401);
      expect(response.json().error.code).toBe("invalid_api_key");
      expect(response.json().error.type).toBe("invalid_request_error");
    }
    expect((await models("Bearer sekrit")).statusCode).toBe(200);
    expect((await models("bearer   sekrit")).statusCode).toBe(200);
    expect((await app.inject({ method: "GET", url: "/health" })).statusCode).toBe(200);
  });

  it("describes the model in /v1/models and /v1/models/:id", async () => {
    const headers = { authorization: "Bearer sekrit" };
    const list = (await app.inject({ method: "GET", url: "/v1/models", headers })).json();
    expect(list.object).toBe("list");
    expect(list.data).toEqual([{ id: "tiny", object: "model", created: ctx.created, owned_by: "a2d" }]);
    expect((await app.inject({ method: "GET", url: "/v1/models/tiny", headers })).json().id).toBe("tiny");
  });

  it("ignores unknown fields and takes text parts, developer messages and enable_thinking", async () => {
    const response = await app.inject({
      method: "POST",
      url: "/v1/chat/completions",
      headers: { authorization: "Bearer sekrit" },
      payload: {
        model: "anything",
        messages: [
          { role: "developer", content: "Be brief." },
          { role: "user", content: [{ type: "text", text: "Hi" }, { type: "text", text: "there" }], name: "me" },
        ],
        max_completion_tokens: 6,
        temperature: 0.7,
        top_p: 0.9,
        seed: -1,
        chat_template_kwargs: { enable_thinking: false },
        user: "someone",
        frequency_penalty: 0,
        parallel_tool_calls: false,
        // The trivial values of fields that are otherwise refused.
        tools: [],
        tool_choice: "none",
        function_call: "auto",
        response_format: { type: "text" },
        logit_bias: {},
        top_logprobs: 0,
        modalities: ["text"],
      },
    });
    expect(response.statusCode).toBe(200);
    const body = response.json();
    expect(body.model).toBe("tiny");
    expect(body.usage.completion_tokens).toBeLessThanOrEqual(6);
    // enable_thinking=false pre-fills an empty think block: the completion is all answer.
    expect(body.choices[0].message.reasoning_content).toBeUndefined();
  });
});
