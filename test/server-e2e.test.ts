// `a2d serve` over a real socket with the real CPU engine and a tiny model, driven by the official
// `openai` client: stream and non-stream on both endpoints, stop strings across block boundaries,
// the reasoning split, and concurrent streams.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { makeTinyModel, type ServerProcess, startServer } from "./server-harness.js";

const work = mkdtempSync(join(tmpdir(), "a2d-server-e2e-"));
let server: ServerProcess;
let client: OpenAI;
let model: string;

beforeAll(async () => {
  model = makeTinyModel(join(work, "tiny"), ["--seed", "11", "--layers", "2", "--hidden", "64"]);
  // A template that opens the think block in the prompt, as reasoning models' templates do: the whole
  // completion is reasoning until the model writes </think>.
  const config = JSON.parse(readFileSync(join(model, "tokenizer_config.json"), "utf8"));
  writeFileSync(
    join(model, "chat_template.jinja"),
    String(config.chat_template).replace("{{- '<|im_start|>assistant\\n' -}}", "{{- '<|im_start|>assistant\\n<think>\\n' -}}"),
  );
  server = startServer(model, ["--model-name", "tiny-a2d"]);
  const url = await server.url();
  await server.waitForLog("ready");
  client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "not-checked", maxRetries: 0 });
});

afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  rmSync(work, { recursive: true, force: true });
});

const greedy = { temperature: 0, max_tokens: 48 } as const;

async function completionText(prompt: string, extra: Record<string, unknown> = {}) {
  const response = await client.completions.create({ model: "tiny-a2d", prompt, ...greedy, ...extra });
  return { text: response.choices[0]!.text, finish: response.choices[0]!.finish_reason, usage: response.usage! };
}

async function streamCompletion(prompt: string, extra: Record<string, unknown> = {}) {
  const stream = await client.completions.create({ model: "tiny-a2d", prompt, ...greedy, ...extra, stream: true });
  const pieces: string[] = [];
  let finish: string | null = null;
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (choice?.text) pieces.push(choice.text);
    if (choice?.finish_reason) finish = choice.finish_reason;
  }
  return { pieces, text: pieces.join(""), finish };
}

describe("the official client against a2d serve", () => {
  it("lists the model", async () => {
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual(["tiny-a2d"]);
  });

  it("chat: stream and non-stream give the same reasoning and content, with usage", async () => {
    const request = { model: "tiny-a2d", messages: [{ role: "user" as const, content: "What is two plus two?" }], ...greedy };
    const whole = await client.chat.completions.create(request);
    expect(whole.object).toBe("chat.completion");
    expect(whole.model).toBe("tiny-a2d");
    const message = whole.choices[0]!.message as OpenAI.ChatCompletionMessage & { reasoning_content?: string; reasoning?: string };
    expect(message.role).toBe("assistant");
    expect(["stop", "length"]).toContain(whole.choices[0]!.finish_reason);
    expect(whole.usage!.completion_tokens).toBeGreaterThan(0);
    expect(whole.usage!.completion_tokens).toBeLessThanOrEqual(48);
    expect(whole.usage!.total_tokens).toBe(whole.usage!.prompt_tokens + whole.usage!.completion_tokens);
    // The template opened a think block, so the completion starts as reasoning under both names.
    expect(message.reasoning_content?.length).toBeGreaterThan(0);
    expect(message.reasoning).toBe(message.reasoning_content);

    const stream = await client.chat.completions.create({ ...request, stream: true, stream_options: { include_usage: true } });
    let reasoning = "";
    let content = "";
    let role: string | undefined;
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      expect(chunk.object).toBe("chat.completion.chunk");
      expect(chunk.id).toBe(chunk.id);
      if (chunk.usage) usage = chunk.usage;
      const choice = chunk.choices[0];
      if (!choice) continue;
      const delta = choice.delta as OpenAI.ChatCompletionChunk.Choice.Delta & { reasoning_content?: string; reasoning?: string };
      role ??= delta.role;
      expect(delta.reasoning).toBe(delta.reasoning_content);
      reasoning += delta.reasoning_content ?? "";
      content += delta.content ?? "";
      if (choice.finish_reason) finish = choice.finish_reason;
    }
    expect(role).toBe("assistant");
    expect(reasoning).toBe(message.reasoning_content);
    expect(content).toBe(message.content ?? "");
    expect(finish).toBe(whole.choices[0]!.finish_reason);
    expect(usage).toEqual(whole.usage);
  });

  it("completions: stream and non-stream agree, one chunk per committed block", async () => {
    const whole = await completionText("The quick brown fox");
    const streamed = await streamCompletion("The quick brown fox", { block_size: 4 });
    expect(streamed.text).toBe(whole.text);
    expect(streamed.finish).toBe(whole.finish);
    expect(streamed.pieces.length).toBeGreaterThan(2);
  });

  it("decodes with a sliding window: stream and non-stream agree, a chunk per step that commits", async () => {
    const extra = { advance: "slide", threshold: 0.3 };
    const whole = await completionText("The quick brown fox", extra);
    const streamed = await streamCompletion("The quick brown fox", extra);
    expect(whole.text.length).toBeGreaterThan(0);
    expect(streamed.text).toBe(whole.text);
    expect(streamed.finish).toBe(whole.finish);
    expect(streamed.pieces.length).toBeGreaterThan(2);
    expect((await completionText("The quick brown fox")).text).not.toBe(whole.text); // a different decoding
  });

  it("honours a stop string that straddles a block boundary and sends nothing after it", async () => {
    const prompt = "Once upon a time";
    const { pieces, text } = await streamCompletion(prompt, { block_size: 4 });
    // A stop string made of the end of one streamed block and the start of the next.
    let stop: string | null = null;
    let boundary = 0;
    for (let i = 0; i + 1 < pieces.length && stop === null; i++) {
      boundary += pieces[i]!.length;
      const candidate = pieces[i]!.slice(-2) + pieces[i + 1]!.slice(0, 2);
      // Text before the stop string too, so that what is cut and what is kept both show.
      if (boundary > 2 && pieces[i]!.length >= 2 && pieces[i + 1]!.length >= 2 && text.indexOf(candidate) === boundary - 2) stop = candidate;
    }
    expect(stop, `no usable block boundary in ${JSON.stringify(pieces)}`).not.toBeNull();
    const expected = text.slice(0, text.indexOf(stop!));
    expect(expected.length).toBeGreaterThan(0);

    const stopped = await streamCompletion(prompt, { block_size: 4, stop: [stop!, "never-appears"] });
    expect(stopped.text).toBe(expected);
    expect(stopped.finish).toBe("stop");
    const whole = await completionText(prompt, { block_size: 4, stop: stop! });
    expect(whole.text).toBe(expected);
    expect(whole.finish).toBe("stop");
  });

  it("splits reasoning from the answer at </think>, matching the raw completion", async () => {
    // Find a user message whose completion closes the think block (the tiny model writes </think> now
    // and then); the raw text comes from /v1/completions on the same rendered prompt.
    const template = readFileSync(join(model, "chat_template.jinja"), "utf8");
    expect(template).toContain("<think>");
    let found: { question: string; raw: string } | null = null;
    for (let i = 0; i < 60 && found === null; i++) {
      const question = `Question number ${i}?`;
      const rendered = `<|im_start|>user\n${question}<|im_end|>\n<|im_start|>assistant\n<think>\n`;
      const raw = (await completionText(rendered, { max_tokens: 64 })).text;
      if (raw.includes("</think>") && raw.slice(raw.indexOf("</think>") + 8).trim() !== "") found = { question, raw };
    }
    expect(found, "no prompt among 60 made the tiny model close its think block").not.toBeNull();
    const { question, raw } = found!;
    const end = raw.indexOf("</think>");
    const response = await client.chat.completions.create({
      model: "tiny-a2d",
      messages: [{ role: "user", content: question }],
      ...greedy,
      max_tokens: 64,
    });
    const message = response.choices[0]!.message as OpenAI.ChatCompletionMessage & { reasoning_content?: string };
    expect(message.reasoning_content).toBe(raw.slice(0, end));
    expect(message.content).toBe(raw.slice(end + "</think>".length).trimStart());
  });

  it("answers content null when the completion is all reasoning", async () => {
    const question = "Hi";
    const rendered = `<|im_start|>user\n${question}<|im_end|>\n<|im_start|>assistant\n<think>\n`;
    const raw = (await completionText(rendered, { max_tokens: 8 })).text;
    expect(raw, "the completion closed its think block; pick another question").not.toContain("</think>");
    const response = await client.chat.completions.create({ model: "tiny-a2d", messages: [{ role: "user", content: question }], ...greedy, max_tokens: 8 });
    const message = response.choices[0]!.message as OpenAI.ChatCompletionMessage & { reasoning_content?: string };
    expect(message.reasoning_content).toBe(raw);
    expect(message.content).toBeNull();
  });

  it("samples reproducibly with a seed and afresh without one", async () => {
    const sampled = { temperature: 1, max_tokens: 32 };
    const seeded = await Promise.all([completionText("Hello", { ...sampled, seed: 42 }), completionText("Hello", { ...sampled, seed: 42 })]);
    expect(seeded[0].text).toBe(seeded[1].text);
    const unseeded = await Promise.all([completionText("Hello", sampled), completionText("Hello", sampled)]);
    expect(unseeded[0].text).not.toBe(unseeded[1].text);
  });

  it("runs 4 concurrent streams to completion, each as if it ran alone", async () => {
    const prompts = ["Hello! How are you", "def add(a, b):", "Numbers: 0 1 2", "The sun rises"];
    const alone = [];
    for (const prompt of prompts) alone.push(await completionText(prompt, { max_tokens: 32 }));
    const together = await Promise.all(prompts.map((prompt) => streamCompletion(prompt, { max_tokens: 32 })));
    expect(together.map((result) => result.text)).toEqual(alone.map((result) => result.text));
    expect(together.map((result) => result.finish)).toEqual(alone.map((result) => result.finish));
  });
});
