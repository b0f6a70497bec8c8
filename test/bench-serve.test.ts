// bench-serve's arithmetic against a scripted streaming endpoint on a real port whose pacing is known:
// every stream sends TOKENS one-token chunks GAP_MS apart after FIRST_MS. The run against the real
// `a2d serve` is in test/eval-e2e.test.ts.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { benchServe, formatBenchServe } from "../eval/bench-serve.js";

const TOKENS = 40;
const GAP_MS = 10;
const FIRST_MS = 150;

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
        const request = JSON.parse(body) as { max_tokens: number };
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
        if (withUsage) send({ choices: [], usage: { prompt_tokens: 5, completion_tokens: count, total_tokens: count + 5 } });
        res.end("data: [DONE]\n\n");
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/`;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  it("measures single-stream tokens/s over the whole request and the time to first token", async () => {
    maxTokensSeen.length = 0;
    const result = await benchServe({ url, prompt: "go", maxTokens: 100, concurrency: 3 });
    expect(maxTokensSeen).toEqual([16, 100, 100, 100, 100]); // warm-up, single, then 3 at once
    expect(result.model).toBe("paced");
    const minimumMs = FIRST_MS + (TOKENS - 1) * GAP_MS;
    expect(result.single).toMatchObject({ completionTokens: TOKENS, countedFrom: "usage", finishReason: "stop" });
    expect(result.single.totalMs).toBeGreaterThanOrEqual(minimumMs - 5);
    expect(result.single.tokensPerSecond).toBeCloseTo(TOKENS / (result.single.totalMs / 1000), 6);
    expect(result.single.tokensPerSecond).toBeLessThanOrEqual((TOKENS / (minimumMs - 5)) * 1000);
    expect(result.single.ttftMs!).toBeGreaterThanOrEqual(FIRST_MS - 5);
    expect(result.single.ttftMs!).toBeLessThan(result.single.totalMs);

    const concurrent = result.concurrent!;
    expect(concurrent).toMatchObject({ streams: 3, completionTokens: 3 * TOKENS });
    expect(concurrent.aggregateTokensPerSecond).toBeCloseTo((3 * TOKENS) / (concurrent.wallMs / 1000), 6);
    // The streams overlap, so the batch takes far less than three single streams back to back.
    expect(concurrent.wallMs).toBeLessThan(2 * minimumMs + 500);
    expect(concurrent.ttftMs.max).toBeGreaterThanOrEqual(concurrent.ttftMs.p50);
    expect(formatBenchServe(result)).toMatch(/single stream: 40 tokens in \d+\.\d\d s = \d+\.\d tok\/s, TTFT \d+ ms, finish stop\n3 concurrent streams: 120 tokens/);
  });

  it("passes extra body fields, and counts text chunks when the server reports no usage, saying so", async () => {
    withUsage = false;
    bodies.length = 0;
    const result = await benchServe({ url, prompt: "go", maxTokens: 25, concurrency: 1, extraBody: { ignore_eos: true, stream: false } });
    withUsage = true;
    // Server-specific fields pass through; nothing may turn streaming off.
    expect(bodies.map((body) => [body.ignore_eos, body.stream])).toEqual([
      [true, true],
      [true, true],
    ]);
    expect(result.single).toMatchObject({ completionTokens: 25, countedFrom: "chunks", finishReason: "length" });
    expect(result.concurrent).toBeNull();
    expect(formatBenchServe(result)).toContain("no usage from the server: text chunks counted as tokens");
  });
});
