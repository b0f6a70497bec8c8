// `a2d selfcheck --url` against a real `a2d serve`, and against real HTTP servers on real ports that answer
// the OpenAI way except for one thing each: a socket on 127.0.0.1 only, a usage that overstates the tokens,
// answers that are not text, the wrong `model`, a request that never returns. A well-behaved one passes every
// check, so each failure below is the misbehaviour's. Folder mode (`selfcheck DIR`) runs in simulate.test.ts.
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { ModelTokenizer } from "../server/tokenizer.js";
import { ensureDistFresh } from "./pack-build.js";
import { CLI, makeTinyModel, ROOT, SELFCHECK_CHECKS, type ServerProcess, startServer } from "./server-harness.js";

const work = mkdtempSync(join(tmpdir(), "a2d-selfcheck-"));
let model: string;
let tokenizer: ModelTokenizer;
let server: ServerProcess;
let url: string;

interface Report {
  ok: boolean;
  rows: Array<{ check: string; ok: boolean; detail: string }>;
  tokens_per_s: number | null;
}


function selfcheck(args: string[]): { status: number | null; report: Report } {
  const run = spawnSync(process.execPath, [CLI, "selfcheck", "--json", ...args], { cwd: ROOT, encoding: "utf8", timeout: 120_000 });
  try {
    return { status: run.status, report: JSON.parse(run.stdout) as Report };
  } catch {
    throw new Error(`selfcheck printed no JSON (exit ${run.status}):\n${run.stdout}\n${run.stderr}`);
  }
}

/** Spawned asynchronously: this process must keep serving the fake while selfcheck runs. */
async function selfcheckAsync(args: string[]): Promise<{ status: number | null; report: Report; seconds: number }> {
  const started = Date.now();
  const child = spawn(process.execPath, [CLI, "selfcheck", "--json", ...args], { cwd: ROOT });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d) => (stdout += d));
  child.stderr.on("data", (d) => (stderr += d));
  const status = await new Promise<number | null>((resolve) => child.on("exit", resolve));
  try {
    return { status, report: JSON.parse(stdout) as Report, seconds: (Date.now() - started) / 1000 };
  } catch {
    throw new Error(`selfcheck printed no JSON (exit ${status}):\n${stdout}\n${stderr}`);
  }
}

const failures = (report: Report) => Object.fromEntries(report.rows.filter((r) => !r.ok).map((r) => [r.check, r.detail]));

beforeAll(async () => {
  ensureDistFresh();
  model = makeTinyModel(join(work, "tiny"), ["--seed", "3", "--layers", "2", "--hidden", "64"]);
  tokenizer = await ModelTokenizer.load(model);
  server = startServer(model, ["--host", "0.0.0.0"]);
  url = await server.url();
  await server.waitForLog("ready");
});

afterAll(async () => {
  await server?.stop();
  rmSync(work, { recursive: true, force: true });
});

describe("selfcheck --url against a real a2d server", () => {
  it("passes every check but the text of a random-weights model's answers, which it names", () => {
    const { status, report } = selfcheck(["--url", url, model, "--max-tokens", "64"]);
    expect(report.rows.map((r) => r.check)).toEqual(SELFCHECK_CHECKS);
    // The tiny model's weights are random: its answers are byte soup, and selfcheck says so.
    expect(Object.keys(failures(report))).toEqual(["answers are text"]);
    expect(failures(report)["answers are text"]).toMatch(/characters are U\+FFFD/);
    expect(status).toBe(1);
    const speed = report.rows.find((r) => r.check === "single-stream tokens/s")!.detail;
    expect(speed).toMatch(/tokens\/s \(\d+ tokens in .* s: \d+ by the model's tokenizer, usage \d+; max_tokens 64\); not judged on device cpu/);
    expect(report.tokens_per_s).toBeGreaterThan(0);
  });

  it("fails the speed check when the bar is above what the server does", () => {
    const { status, report } = selfcheck(["--url", url, model, "--max-tokens", "16", "--min-tps", "1e9"]);
    expect(status).toBe(1);
    expect(Object.keys(failures(report))).toEqual(["single-stream tokens/s", "answers are text"]);
  });

  it("without the folder, does not take the server's usage on trust", () => {
    const { report } = selfcheck(["--url", url, "--max-tokens", "16"]);
    expect(failures(report)["single-stream tokens/s"]).toMatch(/cannot count the tokens: no folder given.*the server's usage \(16\) is not taken on trust/);
  });

  it("fails fast when nothing answers within the budget", () => {
    const { status, report } = selfcheck(["--url", "http://127.0.0.1:9", "--budget", "2"]);
    expect(status).toBe(1);
    expect(report.rows).toEqual([{ check: "ready", ok: false, detail: "/health did not turn 200 within 2 s" }]);
  });
});

interface Behaviour {
  /** The address the fake listens on (default 0.0.0.0). */
  host?: string;
  /** The answer's text for a prompt (default: a sensible sentence or story). */
  answer?: (prompt: string) => string;
  /** The usage it reports for an answer of `tokens` tokens (default: exactly that). */
  usage?: (tokens: number) => number;
  /** The `model` it writes (default: the one asked for). */
  model?: string;
  /** Never answer chat requests. */
  hang?: boolean;
}

const STORY = Array.from(
  { length: 12 },
  (_, i) => `On the ${i + 1}th night the keeper climbed the stairs, trimmed the wick and watched the ships pass the rocks.`,
).join(" ");

function sensible(prompt: string): string {
  if (/capital of France/.test(prompt)) return "The capital of France is Paris.";
  if (/Count/.test(prompt)) return "One, two, three, four, five.";
  if (/prime/.test(prompt)) return "91 is 7 times 13, so it is not a prime number.";
  return STORY;
}

/** An OpenAI-compatible server in this process: the right shapes, honest usage, unless told otherwise. */
async function fakeServer(behaviour: Behaviour): Promise<{ url: string; close: () => Promise<void> }> {
  const hung: http.ServerResponse[] = [];
  const fake = http.createServer((req, res) => {
    const json = (value: unknown) => {
      res.setHeader("content-type", "application/json");
      res.end(JSON.stringify(value));
    };
    if (req.url === "/health") {
      return json({ status: "ok", device: "cpu", decoding: { method: "block_diffusion", block_size: 4, threshold: 0.9, steps: 0 } });
    }
    if (req.url === "/v1/models") return json({ object: "list", data: [{ id: "tiny", object: "model" }] });
    let raw = "";
    req.on("data", (c) => (raw += c));
    req.on("end", () => {
      if (behaviour.hang) return void hung.push(res);
      const body = JSON.parse(raw) as { model: string; stream?: boolean; messages: Array<{ content: string }> };
      const text = (behaviour.answer ?? sensible)(body.messages[0]!.content);
      const tokens = tokenizer.encodeRendered(text).length;
      const usage = { prompt_tokens: 10, completion_tokens: (behaviour.usage ?? ((n) => n))(tokens), total_tokens: 10 + tokens };
      const common = { id: "chatcmpl-1", created: 1_800_000_000, model: behaviour.model ?? body.model };
      // A generation takes time: 2 ms a token, so a speed is a speed and not a division by almost nothing.
      setTimeout(() => {
        if (!body.stream) {
          return json({ ...common, object: "chat.completion", choices: [{ index: 0, message: { role: "assistant", content: text }, finish_reason: "stop" }], usage });
        }
        res.setHeader("content-type", "text/event-stream");
        const pieces = text.match(/.{1,12}/gs) ?? [];
        for (const [i, piece] of pieces.entries()) {
          const delta = i === 0 ? { role: "assistant", content: piece } : { content: piece };
          res.write(`data: ${JSON.stringify({ ...common, object: "chat.completion.chunk", choices: [{ index: 0, delta, finish_reason: null }] })}\n\n`);
        }
        res.write(`data: ${JSON.stringify({ ...common, object: "chat.completion.chunk", choices: [{ index: 0, delta: {}, finish_reason: "stop" }] })}\n\n`);
        res.write(`data: ${JSON.stringify({ ...common, object: "chat.completion.chunk", choices: [], usage })}\n\n`);
        res.end("data: [DONE]\n\n");
      }, 2 * tokens);
    });
  });
  await new Promise<void>((resolve) => fake.listen(0, behaviour.host ?? "0.0.0.0", resolve));
  const port = (fake.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () => {
      for (const res of hung) res.destroy();
      return new Promise((resolve) => fake.close(() => resolve()));
    },
  };
}

async function checkFake(behaviour: Behaviour, extra: string[] = []): Promise<{ status: number | null; report: Report; seconds: number }> {
  const fake = await fakeServer(behaviour);
  try {
    return await selfcheckAsync(["--url", fake.url, model, "--max-tokens", "64", ...extra]);
  } finally {
    await fake.close();
  }
}

describe("selfcheck --url against servers that misbehave in one way each", () => {
  it("passes a well-behaved server (so each failure below is its misbehaviour's)", async () => {
    const { status, report } = await checkFake({});
    expect(report.rows.filter((r) => !r.ok)).toEqual([]);
    expect(report.rows.map((r) => r.check)).toEqual(SELFCHECK_CHECKS);
    expect(status).toBe(0);
  });

  it("fails a server bound to 127.0.0.1 only", async () => {
    const { report } = await checkFake({ host: "127.0.0.1" });
    expect(failures(report)).toEqual({
      "listens on all addresses": expect.stringMatching(/^listens on 127\.0\.0\.1:\d+ only: nothing outside this machine can reach it/),
    });
  });

  it("counts the tokens itself: a usage of 100,000 tokens for a short story is named, not turned into a speed", async () => {
    const { report } = await checkFake({ usage: () => 100_000 });
    const failed = failures(report);
    expect(Object.keys(failed)).toEqual(["chat (non-stream)", "chat (stream)", "chat with reasoning", "single-stream tokens/s"]);
    expect(failed["single-stream tokens/s"]).toMatch(/its usage says 100000 completion tokens, but the answer is \d+ bytes of text \(\d+ tokens by the model.s tokenizer\): the server overstates its usage/);
    // The speed is the story's own tokens over the time (the fake takes 2 ms a token), not the usage's claim.
    expect(report.tokens_per_s).toBeGreaterThan(0);
    expect(report.tokens_per_s!).toBeLessThanOrEqual(500);
  });

  it.each([
    ["empty", () => "", /the answer is empty/],
    ["one token repeated", () => " the".repeat(40), /one token \(id \d+\) is \d+ of its \d+ tokens: the answer repeats a single token/],
    ["bytes that are not UTF-8", () => "The capital \uFFFD\uFFFD of \uFFFDFrance\uFFFD", /4 of its \d+ characters are U\+FFFD/],
    ["control characters", () => "The\u0001 capital\u0002 of\u0003 France\u0004 is\u0005 Paris", /5 of its \d+ characters are not printable \(U\+0001, U\+0002, U\+0003, U\+0004…\): it is not text/],
  ] as const)("fails answers that are not text: %s", async (_name, answer, message) => {
    const { report } = await checkFake({ answer });
    const failed = failures(report);
    expect(failed["answers are text"]).toMatch(message);
    for (const what of ["chat (non-stream)", "chat (stream)", "chat with reasoning", "the long generation"]) expect(failed["answers are text"]).toContain(`${what}: `);
  });

  it("fails answers that name another model than the one asked for", async () => {
    const { report } = await checkFake({ model: "gpt-4o" });
    const failed = failures(report);
    expect(Object.keys(failed)).toEqual(["chat (non-stream)", "chat (stream)", "chat with reasoning", "single-stream tokens/s"]);
    expect(failed["chat (non-stream)"]).toBe('it answers as model "gpt-4o", but the request asked for "tiny" (the id /v1/models lists)');
  });

  it("reports a request that never returns after --timeout, checks the rest, and prints the whole report", async () => {
    const { status, report, seconds } = await checkFake({ hang: true }, ["--timeout", "2"]);
    expect(status).toBe(1);
    expect(seconds).toBeLessThan(30);
    expect(report.rows.map((r) => r.check)).toEqual(SELFCHECK_CHECKS);
    const failed = failures(report);
    expect(failed["chat (non-stream)"]).toBe("no complete answer within 2 s");
    expect(failed["chat (stream)"]).toBe("no complete answer within 2 s");
    expect(failed["single-stream tokens/s"]).toBe("the long generation failed: no complete answer within 2 s");
    expect(failed["answers are text"]).toBe("no answer came back to judge");
    expect(report.rows.find((r) => r.check === "/v1/models")!.ok).toBe(true);
  });

  it("fails a server that answers in the wrong shapes, naming each check", async () => {
    // An OpenAI look-alike that gets the details wrong the way real servers do.
    const wrong = http.createServer((req, res) => {
      res.setHeader("content-type", "application/json");
      if (req.url === "/health") return res.end(JSON.stringify({ status: "ok", decoding: { method: "autoregressive" } }));
      if (req.url === "/v1/models") return res.end(JSON.stringify({ object: "list", data: [] }));
      let body = "";
      req.on("data", (c) => (body += c));
      req.on("end", () => {
        if (JSON.parse(body).stream) {
          res.setHeader("content-type", "text/event-stream");
          return res.end(`data: ${JSON.stringify({ id: "x", object: "chat.completion.chunk", created: 1, model: "m", choices: [{ index: 0, delta: { content: "hi" } }] })}\n\n`);
        }
        res.end(JSON.stringify({ id: "x", object: "text_completion", choices: [{ text: "<think>hmm</think>hi" }] }));
      });
    });
    await new Promise<void>((resolve) => wrong.listen(0, "0.0.0.0", resolve));
    try {
      const port = (wrong.address() as AddressInfo).port;
      const { status, report } = await selfcheckAsync(["--url", `http://127.0.0.1:${port}`, model, "--max-tokens", "8"]);
      expect(status).toBe(1);
      const failed = failures(report);
      expect(Object.keys(failed)).toEqual([
        "/health reports iterative denoising",
        "/v1/models",
        "chat (non-stream)",
        "chat (stream)",
        "chat with reasoning",
        "single-stream tokens/s",
      ]);
      expect(failed["/health reports iterative denoising"]).toMatch(/decoding\/block_size/);
      expect(failed["chat (stream)"]).toMatch(/no data: \[DONE\] at the end; no chunk has a finish_reason/);
    } finally {
      wrong.close();
    }
  });
});
