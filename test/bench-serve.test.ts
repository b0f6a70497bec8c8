// bench-serve's arithmetic against a scripted streaming endpoint on a real port whose pacing is known:
// every stream sends TOKENS one-token chunks GAP_MS apart after FIRST_MS, and counts a prompt's tokens as its
// words plus TEMPLATE_TOKENS. The run against the real `a2d serve` is in test/eval-e2e.test.ts.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { benchServe, formatBenchServe, percentiles, quantile, repeatedPrompt, repeatsFor } from "../eval/bench-serve.js";

const TOKENS = 40;
const GAP_MS = 10;
const FIRST_MS = 150;
const TEMPLATE_TOKENS = 3;

describe("bench-serve", () => {
  let server: Server;
  let url: string;
  let withUsage = true;
  const maxTokensSeen: number[] = [];
  const bodies: Record<string, unknown>[] = [];

  beforeAll(async () => {
    server = createServer((req, res) => {
      if (req.url === "/v1/models") {
        res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ data: [{ id: "paced" }] }));
        return;
      }
      let body = "";
      req.on("data", (chunk: Buffer) => (body += chunk.toString("utf8")));
      req.on("end", async () => {
        const request = JSON.parse(body) as { max_tokens: number; messages: { content: string }[] };
        const promptTokens = TEMPLATE_TOKENS + request.messages[0]!.content.split(/\s+/).filter((word) => word !== "").length;
        maxTokensSeen.push(request.max_tokens);
        bodies.push(request);
        const count = Math.min(TOKENS, request.max_tokens);
        res.writeHead(200, { "content-type": "text/event-stream" });
        const send = (value: unknown) => res.write(`data: ${JSON.stringify(value)}\n\n`);
        await new Promise((resolve) => setTimeout(resolve, FIRST_MS));
        for (let i = 0; i < count; i += 1) {
          if (i > 0) await new Promise((resolve) => setTimeout(resolve, GAP_MS));
          send({ choices: [{ index: 0, delta: { content: ` w${i}` } }] });
        }
        send({ choices: [{ index: 0, delta: {}, finish_reason: count === request.max_tokens ? "length" : "stop" }] });
        if (withUsage) send({ choices: [], usage: { prompt_tokens: promptTokens, completion_tokens: count, total_tokens: count + promptTokens } });
        res.end("data: [DONE]\n\n");
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/`;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  it("measures each concurrency level: aggregate and per-stream tokens/s, TTFT, inter-token latency and TPOT", async () => {
    maxTokensSeen.length = 0;
    const result = await benchServe({ url, prompt: "go", maxTokens: 100, concurrency: [1, 3] });
    expect(maxTokensSeen).toEqual([16, 100, 100, 100, 100]); // warm-up, then 1 stream, then 3 at once
    expect(result.model).toBe("paced");
    const minimumMs = FIRST_MS + (TOKENS - 1) * GAP_MS;
    const [one, three] = result.levels;
    expect(one).toMatchObject({ concurrency: 1, completionTokens: TOKENS, countedFrom: "usage", finishReasons: { stop: 1 } });
    const single = one!.streams[0]!;
    expect(single.totalMs).toBeGreaterThanOrEqual(minimumMs - 5);
    expect(single.tokensPerSecond).toBeCloseTo(TOKENS / (single.totalMs / 1000), 6);
    expect(single.tokensPerSecond).toBeLessThanOrEqual((TOKENS / (minimumMs - 5)) * 1000);
    expect(single.ttftMs!).toBeGreaterThanOrEqual(FIRST_MS - 5);
    expect(single.ttftMs!).toBeLessThan(single.totalMs);
    expect(single.tpotMs!).toBeCloseTo((single.totalMs - single.ttftMs!) / (TOKENS - 1), 6);
    // Chunks come GAP_MS apart: every percentile of the gaps is about that (timers fire late, never early).
    expect(one!.itlMs!.p50).toBeGreaterThanOrEqual(GAP_MS - 2);
    expect(one!.itlMs!.p50).toBeLessThan(GAP_MS + 15);
    expect(one!.itlMs!.p99).toBeGreaterThanOrEqual(one!.itlMs!.p90);
    expect(one!.itlMs!.max).toBeGreaterThanOrEqual(one!.itlMs!.p99);

    expect(three).toMatchObject({ concurrency: 3, completionTokens: 3 * TOKENS });
    expect(three!.streams).toHaveLength(3);
    expect(three!.aggregateTokensPerSecond).toBeCloseTo((3 * TOKENS) / (three!.wallMs / 1000), 6);
    // The streams overlap, so the level takes far less than three single streams back to back.
    expect(three!.wallMs).toBeLessThan(2 * minimumMs + 500);
    expect(three!.ttftMs.max).toBeGreaterThanOrEqual(three!.ttftMs.p50);
    const table = formatBenchServe(result).split("\n");
    expect(table[2]).toMatch(/^ +1 +40 +\d+\.\d\d +\d+\.\d +\d+\.\d \(/);
    expect(table[3]).toMatch(/^ +3 +120 /);
    expect(table[3]).toContain("stop 3");
  });

  it("repeats the prompt until the server counts about --prompt-tokens tokens, and reports the count", async () => {
    maxTokensSeen.length = 0;
    // Seven words: the server counts 10 tokens for one repeat, 17 for two, so 28 repeats give 199 (200 asked).
    const result = await benchServe({ url, prompt: "a b c d e f g", promptTokens: 200, maxTokens: 20, concurrency: [2] });
    expect(maxTokensSeen).toEqual([1, 1, 16, 20, 20]); // one and two repeats counted, the warm-up, then the level
    expect(result).toMatchObject({ promptTokens: 199, promptRepeats: 28 });
    expect(result.levels[0]!.streams.map((stream) => stream.promptTokens)).toEqual([199, 199]);
    expect(formatBenchServe(result).split("\n")[0]).toContain("prompt 199 tokens");

    withUsage = false;
    await expect(benchServe({ url, prompt: "go", promptTokens: 50, maxTokens: 5, concurrency: [1] })).rejects.toThrow(
      "--prompt-tokens needs the server's usage.prompt_tokens",
    );
    withUsage = true;
    await expect(benchServe({ url, prompt: "go", promptTokens: 0, maxTokens: 5, concurrency: [1] })).rejects.toThrow("positive integer");
  });

  it("sizes the repeats from the counts of one and two, and refuses counts that do not grow", () => {
    expect(repeatsFor(1024, 40, 70)).toBe(34); // 10 tokens of template, 30 a repeat: 10 + 34 x 30 = 1030
    expect(repeatsFor(5, 40, 70)).toBe(1);
    expect(() => repeatsFor(100, 40, 40)).toThrow("cannot size a prompt");
    expect(repeatedPrompt("x", 3)).toBe("x\n\nx\n\nx");
  });

  it("takes percentiles by linear interpolation between ranks", () => {
    expect(quantile([10], 0.99)).toBe(10);
    expect(quantile([0, 10], 0.5)).toBe(5);
    expect(quantile([1, 2, 3, 4, 5], 0.9)).toBeCloseTo(4.6, 12);
    expect(percentiles([3, 1, 2])).toEqual({ mean: 2, p50: 2, p90: 2.8, p99: 2.98, max: 3 });
    expect(percentiles([])).toBeNull();
  });

  it("passes extra body fields, and counts text chunks when the server reports no usage, saying so", async () => {
    withUsage = false;
    bodies.length = 0;
    const result = await benchServe({ url, prompt: "go", maxTokens: 25, concurrency: [1], extraBody: { ignore_eos: true, stream: false } });
    withUsage = true;
    // Server-specific fields pass through; nothing may turn streaming off.
    expect(bodies.map((body) => [body.ignore_eos, body.stream])).toEqual([
      [true, true],
      [true, true],
    ]);
    expect(result.levels).toHaveLength(1);
    expect(result.levels[0]!.streams[0]).toMatchObject({ completionTokens: 25, countedFrom: "chunks", finishReason: "length" });
    expect(formatBenchServe(result)).toContain("no usage from the server: text chunks counted as tokens");
  });
});
