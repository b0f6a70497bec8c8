// The TS tokenizer and chat template against the Python stack (tokenizers + transformers) on the same
// tokenizer folders: ids, rendered prompts and decoded text must be identical.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { ChatTemplateError, type TemplateMessage } from "../server/chat-template.js";
import { ModelTokenizer } from "../server/tokenizer.js";

const PYTHON = join(import.meta.dirname, "..", ".venv", "bin", "python");
const REFERENCE = join(import.meta.dirname, "tokenizer-reference.py");
const work = mkdtempSync(join(tmpdir(), "a2d-tokenizer-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const texts = [
  "Hello World",
  "",
  " leading space and trailing ",
  "  the quick  brown fox\n\nnaïve 你好 🙂",
  "tabs\tand\r\nwindows lines",
  "<|im_start|>user\nhi<|im_end|>",
  "<think>x</think> answer",
  "numbers 1234567890 and 3.14159, symbols #$%&*()[]{}",
  "ÀÉÎÕÜ ß Ωμέγα привет мир 🚀🔥👩‍👩‍👧",
  "a<|mask|>b",
];

interface ChatCase {
  messages: TemplateMessage[];
  enable_thinking?: boolean;
}
const allChats: ChatCase[] = [
  { messages: [{ role: "user", content: "Hello" }] },
  {
    messages: [
      { role: "system", content: "Be brief. " },
      { role: "user", content: "What is 2+2?" },
      { role: "assistant", content: "<think>add</think>\n\n4" },
      { role: "user", content: [{ type: "text", text: "And 3+3?" }] },
    ],
    enable_thinking: false,
  },
  { messages: [{ role: "user", content: "Hi 🙂" }], enable_thinking: true },
  {
    messages: [
      { role: "user", content: "q" },
      { role: "assistant", content: "a", reasoning_content: "\nthinking\n" },
    ],
  },
];

/** Deterministic id lists over the vocabulary, specials included, to compare decoding. */
function decodeCases(vocabSize: number): number[][] {
  let state = 12345;
  const next = () => (state = (state * 1103515245 + 12345) % 2147483648);
  const lists: number[][] = [[]];
  for (let n = 1; n <= 24; n++) lists.push(Array.from({ length: n }, () => next() % vocabSize));
  return lists;
}

interface Answer {
  encoded: number[][];
  chats: Array<{ text: string; ids: number[] }>;
  decoded: string[];
}

const FLAVOURS = ["byte-level", "metaspace", "tiny-base"] as const;

/** Builds each flavour's folder (the two reference flavours, and the tokenizer the converter's
 * tiny-base writes, which the server and CLI suites run on) and asks the Python stack about all of
 * them in one call. */
function buildAndAsk(): Map<string, { dir: string; decode: number[][]; chats: ChatCase[]; answer: Answer }> {
  const jobs = FLAVOURS.map((flavour) => {
    const dir = join(work, flavour);
    if (flavour === "tiny-base") execFileSync(PYTHON, ["-m", "a2d_convert", "tiny-base", "--out", dir], { cwd: join(import.meta.dirname, "..") });
    else execFileSync(PYTHON, [REFERENCE, "make", "--flavour", flavour, "--out", dir]);
    // tiny-base's template concatenates content as a string, as many real templates do.
    const chats = flavour === "tiny-base" ? allChats.filter((chat) => chat.messages.every((m) => typeof m.content === "string")) : allChats;
    return { flavour, dir, decode: decodeCases(idCount(dir)), chats };
  });
  const jobsPath = join(work, "jobs.json");
  // transformers refuses to decode an empty list the same way; it gets the non-empty ones.
  writeFileSync(jobsPath, JSON.stringify(jobs.map((job) => ({ model: job.dir, cases: { texts, chats: job.chats, decode: job.decode.slice(1) } }))));
  const answers = JSON.parse(execFileSync(PYTHON, [REFERENCE, "answer", "--jobs", jobsPath], { encoding: "utf8" })) as Answer[];
  return new Map(jobs.map((job, i) => [job.flavour, { ...job, answer: answers[i]! }]));
}

/** One past the largest id of a tokenizer.json (model vocabulary and added tokens). */
function idCount(modelDir: string): number {
  const json = JSON.parse(readFileSync(join(modelDir, "tokenizer.json"), "utf8"));
  const ids = [...Object.values(json.model.vocab as Record<string, number>), ...json.added_tokens.map((t: { id: number }) => t.id)];
  return Math.max(...ids) + 1;
}

let folders: ReturnType<typeof buildAndAsk>;
beforeAll(() => {
  folders = buildAndAsk();
});

describe.each(FLAVOURS)("%s tokenizer", (flavour) => {
  it("encodes, renders chats and decodes exactly as transformers does", async () => {
    const { dir, decode, chats, answer: expected } = folders.get(flavour)!;
    const tokenizer = await ModelTokenizer.load(dir);
    expect(texts.map((text) => tokenizer.encodePrompt(text))).toEqual(expected.encoded);
    const template = tokenizer.chatTemplate;
    expect(template).not.toBeNull();
    const rendered = chats.map((chat) => template!.render(chat.messages, { enableThinking: chat.enable_thinking }));
    expect(rendered).toEqual(expected.chats.map((chat) => chat.text));
    expect(rendered.map((text) => tokenizer.encodeRendered(text))).toEqual(expected.chats.map((chat) => chat.ids));
    expect(decode.slice(1).map((ids) => tokenizer.decode(ids))).toEqual(expected.decoded);
    expect(tokenizer.decode([])).toBe("");
  });

  it("keeps reasoning tags when asked, and only them among special tokens", async () => {
    const tokenizer = await ModelTokenizer.load(folders.get(flavour)!.dir);
    const think = tokenizer.tokenId("<think>")!;
    const close = tokenizer.tokenId("</think>")!;
    const imEnd = tokenizer.tokenId("<|im_end|>")!;
    const ids = [think, ...tokenizer.encodeRendered("why"), close, ...tokenizer.encodeRendered("so"), imEnd];
    // Metaspace tokenizers give "why" and "so" a leading space of their own; the tags are what matters.
    expect(tokenizer.decodeKeeping(ids, new Set([think, close]))).toMatch(/^<think> ?why<\/think> ?so$/);
    expect(tokenizer.decode(ids)).toMatch(/^<think> ?why<\/think> ?so$/);
    expect(tokenizer.decodeKeeping(ids, new Set([imEnd]))).toMatch(/so<\|im_end\|>$/);
  });
});

describe("bad tokenizer folders", () => {
  it("names the missing file", async () => {
    await expect(ModelTokenizer.load(join(work, "nowhere"))).rejects.toThrow(/nowhere\/tokenizer\.json: cannot read it/);
  });

  it("names a corrupt tokenizer.json", async () => {
    const dir = join(work, "corrupt");
    execFileSync(PYTHON, [REFERENCE, "make", "--flavour", "byte-level", "--out", dir]);
    writeFileSync(join(dir, "tokenizer.json"), "{ not json");
    await expect(ModelTokenizer.load(dir)).rejects.toThrow(/corrupt\/tokenizer\.json: not valid JSON/);
  });

  it("names a template that does not parse, and reports a template's own refusal", async () => {
    const dir = join(work, "bad-template");
    execFileSync(PYTHON, [REFERENCE, "make", "--flavour", "byte-level", "--out", dir]);
    writeFileSync(join(dir, "chat_template.jinja"), "{% for m in messages %}{{ m.content }");
    await expect(ModelTokenizer.load(dir)).rejects.toThrow(/the chat template does not parse/);
    writeFileSync(join(dir, "chat_template.jinja"), "{{ raise_exception('roles must alternate') }}");
    const tokenizer = await ModelTokenizer.load(dir);
    expect(() => tokenizer.chatTemplate!.render([{ role: "user", content: "x" }])).toThrow(ChatTemplateError);
  });
});
