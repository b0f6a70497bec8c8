// Against a server that runs one generation at a time (test/eval-scripted-server.ts, serial): requests
// behind the running one get their headers and then nothing, or SSE comment heartbeats, for as long as
// the ones ahead take. The client must not time them out before their first token, must still give up
// on a stream that goes silent after it started, and the runner must send no more requests than /health
// says the server runs at once and report each request's time to first token.
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";

import { ChatClient, StreamStalled } from "../eval/client.js";
import { runEval } from "../eval/run-eval.js";
import { ScriptedServer } from "./eval-scripted-server.js";

const FIXTURES = join(import.meta.dirname, "..", "eval", "fixtures");
// Far above the gaps between chunks (100 ms), so a busy machine's event-loop delays cannot look like a stall.
const IDLE_MS = 1000;

let server: ScriptedServer | null = null;
afterEach(async () => {
  await server?.stop();
  server = null;
});

const chat = (client: ChatClient, text: string) => client.chat({ model: "scripted", messages: [{ role: "user", content: text }], maxTokens: 16 });

describe("a server that runs one generation at a time", () => {
  it("waits for a queued stream's first token longer than the idle timeout", async () => {
    // Each generation takes ~0.9 s (8 chunks 100 ms apart), so the fourth request is silent for ~2.7 s.
    const content = "an answer of eight chunks of seven characters, or so..";
    server = await new ScriptedServer({ serial: true, firstTokenMs: 100, chunkGapMs: 100, answer: () => ({ content }) }).start();
    const client = new ChatClient(server.url, { connections: 4, idleTimeoutMs: IDLE_MS });
    try {
      const results = await Promise.all([chat(client, "1"), chat(client, "2"), chat(client, "3"), chat(client, "4")]);
      expect(results.map((result) => result.content)).toEqual([content, content, content, content]);
      const ttfts = results.map((result) => result.ttftMs!).sort((a, b) => a - b);
      expect(ttfts[3]!).toBeGreaterThan(2 * IDLE_MS);
      expect(server.maxInFlight).toBe(1);
    } finally {
      await client.close();
    }
  });

  it("keeps waiting while heartbeats come, and gives up on a stream that stalls after it started", async () => {
    // Each generation takes ~0.9 s; the third waits ~1.8 s behind the others, hearing only heartbeats.
    const content = "an answer of eight chunks of seven characters, or so..";
    server = await new ScriptedServer({ serial: true, heartbeatMs: 100, firstTokenMs: 100, chunkGapMs: 100, answer: () => ({ content }) }).start();
    const client = new ChatClient(server.url, { connections: 3, idleTimeoutMs: IDLE_MS });
    try {
      const [first, , third] = await Promise.all([chat(client, "1"), chat(client, "2"), chat(client, "3")]);
      expect([first.content, third.content]).toEqual([content, content]);
      expect(third.heartbeats).toBeGreaterThan(8);
      expect(third.ttftMs!).toBeGreaterThan(first.ttftMs! + IDLE_MS);
    } finally {
      await client.close();
    }
    await server.stop();
    server = await new ScriptedServer({ stallAfterFirstChunkMs: 3 * IDLE_MS, answer: () => ({ content: "this answer stalls after its first chunk" }) }).start();
    const stalling = new ChatClient(server.url, { connections: 1, idleTimeoutMs: IDLE_MS });
    try {
      const error = await chat(stalling, "1").catch((caught: unknown) => caught);
      expect(error).toBeInstanceOf(StreamStalled);
      expect((error as Error).message).toMatch(/no data for 1.0 s after the stream had started; the server stalled/);
    } finally {
      await stalling.close();
    }
  });

  it("sends one request at a time when /health reports queue.max_running 1, and reports time to first token", async () => {
    server = await new ScriptedServer({ serial: true, firstTokenMs: 30, answer: () => ({ content: "the answer is (A)" }) }).start();
    server.health = { status: "ok", queue: { running: 0, waiting: 0, max_running: 1, max_waiting: 256 } };
    const logs: string[] = [];
    const run = await runEval({
      url: server.url,
      dataDir: FIXTURES,
      benchmarks: ["mmlu_pro"],
      concurrency: 4,
      maxTokens: 64,
      codePython: "/usr/bin/python3",
      progress: false,
      log: (line) => logs.push(line),
    });
    expect(server.maxInFlight).toBe(1);
    expect(server.requests).toBe(6);
    expect(run.record.concurrency).toEqual({ requested: 4, used: 1, reason: "/health reports queue.max_running 1" });
    expect(logs).toContain("concurrency 1 instead of 4: /health reports queue.max_running 1");
    for (const item of run.items) {
      expect(item.ttftMs).toBeGreaterThanOrEqual(25);
      expect(item.totalMs).toBeGreaterThanOrEqual(item.ttftMs!);
    }
    expect(run.record.ttft_ms).toMatchObject({ requests: 6 });
    expect(run.record.ttft_ms!.max).toBeGreaterThanOrEqual(run.record.ttft_ms!.p50);
    expect(logs.some((line) => /^time to first token over 6 requests \(server queueing included\): p50 \d+\.\d\d s, p90 \d+\.\d\d s, max \d+\.\d\d s$/.test(line))).toBe(true);
  });
});
