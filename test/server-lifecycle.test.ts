// The server's life around its requests, on real processes and sockets: /health while loading, the API
// key, the bounded queue, a client that disconnects mid-stream, and SIGTERM drains.
import { execFileSync } from "node:child_process";
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

import OpenAI from "openai";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";

import { type LogLine, makeTinyModel, type ServerProcess, startServer } from "./server-harness.js";

const work = mkdtempSync(join(tmpdir(), "a2d-server-life-"));
let model: string;
const servers: ServerProcess[] = [];

/** Big enough that a long generation takes seconds on one thread, small enough to build in one. */
beforeAll(() => {
  model = makeTinyModel(join(work, "slow"), ["--seed", "21", "--layers", "4", "--hidden", "256", "--intermediate", "768", "--heads", "4", "--kv-heads", "2"]);
});

afterAll(async () => {
  for (const server of servers) await server.stop();
  rmSync(work, { recursive: true, force: true });
});

function serve(args: string[] = [], env: NodeJS.ProcessEnv = {}, dir = model): ServerProcess {
  const server = startServer(dir, args, env);
  servers.push(server);
  return server;
}

/** A long generation: threshold 1 reveals exactly one token per forward, and no EOS ends it early. */
const LONG = { prompt: "Once upon a time", max_tokens: 3000, temperature: 0, threshold: 1, ignore_eos: true, stream: true };

/** A generation's log line by the seed its request carried: a line of an earlier test's cancelled generation can reach
 * this process after the next test has started (stdout and the /health answer are separate channels), so a test takes
 * only its own line. */
const seeded = (seed: number) => (line: LogLine) => line.seed === String(seed);

/** Starts a streaming completion and resolves once its first text chunk has arrived. */
async function startStream(url: string, body: object, headers: Record<string, string> = {}) {
  const controller = new AbortController();
  const response = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
    signal: controller.signal,
  });
  expect(response.status).toBe(200);
  const reader = response.body!.getReader();
  const decoder = new TextDecoder();
  let received = "";
  while (!/"text":"[^"]/.test(received)) {
    const { value, done } = await reader.read();
    if (done) break;
    received += decoder.decode(value, { stream: true });
  }
  /** Reads the rest of the stream. */
  const rest = async () => {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return received;
      received += decoder.decode(value, { stream: true });
    }
  };
  return { controller, rest };
}

describe("a2d serve lifecycle", () => {
  it("answers /health 503 while the model loads and 200 once it can serve", async () => {
    // tokenizer.json as a named pipe: loading blocks on it until the test writes the real file in.
    const dir = join(work, "fifo-model");
    cpSync(model, dir, { recursive: true });
    const tokenizer = readFileSync(join(dir, "tokenizer.json"));
    rmSync(join(dir, "tokenizer.json"));
    execFileSync("mkfifo", [join(dir, "tokenizer.json")]);
    const server = serve([], {}, dir);
    const url = await server.url();

    const loading = await fetch(`${url}/health`);
    expect(loading.status).toBe(503);
    expect(((await loading.json()) as { error: { code: string } }).error.code).toBe("model_loading");
    const early = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "hi", max_tokens: 2 }),
    });
    expect(early.status).toBe(503);

    writeFileSync(join(dir, "tokenizer.json"), tokenizer);
    await server.waitForLog("ready");
    const ready = await fetch(`${url}/health`);
    expect(ready.status).toBe(200);
    expect(((await ready.json()) as { decoding: { method: string } }).decoding.method).toBe("block_diffusion");
    expect(await server.stop()).toBe(0);
  });

  describe("with an API key, one generation at a time and room for one waiting request", () => {
    let server: ServerProcess;
    let url: string;
    const auth = { authorization: "Bearer k-123" };

    beforeAll(async () => {
      server = serve(["--max-batch", "1", "--max-queue", "1", "--sse-heartbeat", "0.2"], { A2D_API_KEY: "k-123" });
      url = await server.url();
      await server.waitForLog("ready");
    });

    /** Each test starts on an idle engine: cancellations of the previous one have landed. */
    beforeEach(async () => {
      for (;;) {
        const { queue } = (await (await fetch(`${url}/health`)).json()) as { queue: { running: number; waiting: number } };
        if (queue.running === 0 && queue.waiting === 0) return;
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    });

    it("wants the key on /v1 (401 in OpenAI's shape) but not on /health", async () => {
      const wrong = new OpenAI({ baseURL: `${url}/v1`, apiKey: "nope", maxRetries: 0 });
      const error = await wrong.models.list().catch((caught: unknown) => caught);
      expect(error).toBeInstanceOf(OpenAI.AuthenticationError);
      expect((error as InstanceType<typeof OpenAI.AuthenticationError>).code).toBe("invalid_api_key");
      const right = new OpenAI({ baseURL: `${url}/v1`, apiKey: "k-123", maxRetries: 0 });
      expect((await right.models.list()).data).toHaveLength(1);
      expect((await fetch(`${url}/health`)).status).toBe(200);
    });

    it("refuses past the queue bound with 429 and Retry-After", async () => {
      const running = await startStream(url, LONG, auth);
      // The waiting one gets its stream headers at once and its first chunk only when its turn comes.
      const waiting = new AbortController();
      const queued = await fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", ...auth },
        body: JSON.stringify(LONG),
        signal: waiting.signal,
      });
      expect(queued.status).toBe(200);
      const refused = await fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", ...auth },
        body: JSON.stringify({ prompt: "x", max_tokens: 2 }),
      });
      expect(refused.status).toBe(429);
      expect(Number(refused.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
      expect(((await refused.json()) as { error: { code: string } }).error.code).toBe("rate_limit_exceeded");
      waiting.abort();
      running.controller.abort();
    });

    it("sends a comment line every --sse-heartbeat seconds to a stream waiting in the queue", async () => {
      const running = await startStream(url, LONG, auth);
      const waiting = new AbortController();
      const queued = await fetch(`${url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", ...auth },
        body: JSON.stringify({ messages: [{ role: "user", content: "hi" }], max_tokens: 8, stream: true }),
        signal: waiting.signal,
      });
      expect(queued.status).toBe(200);
      const reader = queued.body!.getReader();
      const decoder = new TextDecoder();
      let received = "";
      const until = performance.now() + 1100;
      while (performance.now() < until) {
        const { value } = await reader.read();
        received += decoder.decode(value, { stream: true });
      }
      // The chat stream's first chunk (the assistant role) goes out at once; then only heartbeats.
      const events = received.split("\n\n").filter((event) => event !== "");
      expect(events[0]).toMatch(/^data: .*"role":"assistant"/);
      const beats = events.slice(1);
      expect(beats.length).toBeGreaterThanOrEqual(3);
      expect(new Set(beats)).toEqual(new Set([": queued"]));
      waiting.abort();
      running.controller.abort();
    });

    it("cancels the generation of a client that left while its prompt was being tokenized", async () => {
      const logsBefore = server.logs.length;
      // The whole request, then the connection closed at once: the server learns of it while it tokenizes.
      const body = JSON.stringify({ ...LONG, stream: false, seed: 11 });
      const { host, port } = new URL(url);
      const socket = connect({ host: host.split(":")[0], port: Number(port) });
      await new Promise<void>((resolve) => socket.on("connect", resolve));
      socket.end(
        `POST /v1/completions HTTP/1.1\r\nHost: ${host}\r\nAuthorization: ${auth.authorization}\r\nContent-Type: application/json\r\n` +
          `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
      );
      socket.destroy();
      const generation = await server.waitForLog("generation", 10_000, logsBefore, seeded(11));
      expect(generation.finish_reason).toBe("cancelled");
      expect(generation.completion_tokens as number).toBeLessThan(100);
    });

    it("cancels the generation of a client that disconnects, so the next request starts promptly", async () => {
      const logsBefore = server.logs.length;
      const running = await startStream(url, { ...LONG, seed: 12 }, auth);
      running.controller.abort();
      const started = performance.now();
      const next = await fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", ...auth },
        body: JSON.stringify({ prompt: "Hello", max_tokens: 8, temperature: 0, seed: 13 }),
      });
      expect(next.status).toBe(200);
      const elapsed = performance.now() - started;
      const abandoned = await server.waitForLog("generation", 10_000, logsBefore, seeded(12));
      expect(abandoned.finish_reason).toBe("cancelled");
      const cancelledTokens = abandoned.completion_tokens as number;
      expect(cancelledTokens).toBeLessThan(LONG.max_tokens);
      // The abandoned generation would have needed (3000 - cancelledTokens) more forwards; the next
      // request waited for at most a step of it.
      const msPerToken = (abandoned.ms as number) / Math.max(cancelledTokens, 1);
      expect(elapsed).toBeLessThan(Math.max(1500, 0.25 * msPerToken * (LONG.max_tokens - cancelledTokens)));
      // The next request's own log line reaches this process through the server's stdout, possibly after its
      // answer: wait for it here, so that it is not left arriving during a later test.
      await server.waitForLog("generation", 10_000, logsBefore, seeded(13));
    });

    it("cancels a non-streaming generation whose client gives up", async () => {
      const logsBefore = server.logs.length;
      const controller = new AbortController();
      const abandoned = fetch(`${url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", ...auth },
        body: JSON.stringify({ ...LONG, stream: false, seed: 14 }),
        signal: controller.signal,
      }).catch((error: unknown) => error);
      // Abort once the engine has started on it (its forward passes show in /health).
      const passes = async () => ((await (await fetch(`${url}/health`)).json()) as { forward_passes: number }).forward_passes;
      const before = await passes();
      while ((await passes()) === before) await new Promise((resolve) => setTimeout(resolve, 20));
      controller.abort();
      expect(await abandoned).toBeInstanceOf(Error);
      const cancelled = await server.waitForLog("generation", 10_000, logsBefore, seeded(14));
      expect(cancelled.finish_reason).toBe("cancelled");
      expect(cancelled.completion_tokens as number).toBeLessThan(LONG.max_tokens);
    });
  });

  it("runs --max-batch generations at once, queues the next, refuses past --max-queue, and /health counts them", async () => {
    const server = serve(["--max-batch", "2", "--max-queue", "1"]);
    const url = await server.url();
    await server.waitForLog("ready");
    const health = async () => ((await (await fetch(`${url}/health`)).json()) as { queue: Record<string, number> }).queue;
    expect(await health()).toMatchObject({ running: 0, waiting: 0, max_running: 2, max_waiting: 1 });
    // Both streams get text before either finishes: they run together.
    const first = await startStream(url, LONG);
    const second = await startStream(url, LONG);
    const waiting = new AbortController();
    const queued = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "x", max_tokens: 4, stream: true }),
      signal: waiting.signal,
    });
    expect(queued.status).toBe(200);
    expect(await health()).toMatchObject({ running: 2, waiting: 1 });
    const refused = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "x", max_tokens: 2 }),
    });
    expect(refused.status).toBe(429);
    // A client that goes away frees its place: the queued one runs to its end beside the other.
    first.controller.abort();
    const text = await queued.text();
    expect(text).toContain('"finish_reason":"length"');
    second.controller.abort();
    for (;;) {
      const queue = await health();
      if (queue.running === 0 && queue.waiting === 0) break;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect(await server.stop()).toBe(0);
  });

  it("drains on SIGTERM: the running stream finishes, new connections are refused, exit 0", async () => {
    const server = serve();
    const url = await server.url();
    await server.waitForLog("ready");
    const running = await startStream(url, { ...LONG, max_tokens: 300 });
    server.child.kill("SIGTERM");
    await server.waitForLog("draining");
    const text = await running.rest();
    const ended = performance.now();
    expect(text).toContain('"finish_reason":"length"');
    expect(text.trimEnd().endsWith("data: [DONE]")).toBe(true);
    // The client keeps its connection alive (undici: 4 s, or what Keep-Alive says); the server does not wait for it.
    expect(await server.exited).toBe(0);
    expect(performance.now() - ended).toBeLessThan(2000);
    await expect(fetch(`${url}/health`)).rejects.toThrow();
  });

  it("does not wait on a connection that never sent a request (a client pool's spare one)", async () => {
    const server = serve();
    const url = await server.url();
    await server.waitForLog("ready");
    const spare = connect(Number(new URL(url).port), "127.0.0.1");
    await new Promise((resolve, reject) => spare.once("connect", resolve).once("error", reject));
    const closed = new Promise((resolve) => spare.once("close", resolve));
    const signalled = performance.now();
    server.child.kill("SIGTERM");
    const timeout = new Promise((resolve) => setTimeout(() => resolve("still running after 5 s"), 5000));
    expect(await Promise.race([server.exited, timeout])).toBe(0);
    expect(performance.now() - signalled).toBeLessThan(2000);
    await closed;
  });

  it("cancels what is still running when the grace period ends, telling the client, exit 0", async () => {
    const server = serve(["--shutdown-grace", "0.2"]);
    const url = await server.url();
    await server.waitForLog("ready");
    const running = await startStream(url, LONG);
    const signalled = performance.now();
    server.child.kill("SIGTERM");
    const text = await running.rest();
    expect(text).toContain('"code":"shutting_down"');
    expect(text.trimEnd().endsWith("data: [DONE]")).toBe(true);
    expect(await server.exited).toBe(0);
    expect(performance.now() - signalled).toBeLessThan(2500);
  });
});
