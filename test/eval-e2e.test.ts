// `a2d eval` and `a2d bench-serve`, run as the built CLI, against a real `a2d serve` (CPU engine) on a
// tiny random model: every fixture benchmark end to end, the --json shape, resumption from the cache,
// and throughput numbers read from the server's usage.
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { BENCHMARK_NAMES } from "../eval/normalize.js";
import { ensureEvalBuilt } from "./eval-build.js";
import { CLI, ROOT, makeTinyModel, startServer, type ServerProcess } from "./server-harness.js";

const run = promisify(execFile);
const work = mkdtempSync(join(tmpdir(), "a2d-eval-e2e-"));
let server: ServerProcess;
let url: string;

/** Chat requests the server has logged so far. */
function chatRequests(): number {
  return server.logs.filter((line) => line.msg === "incoming request" && (line.req as { url?: string } | undefined)?.url === "/v1/chat/completions").length;
}

async function cli(args: string[]): Promise<{ stdout: string; stderr: string; ms: number }> {
  const started = performance.now();
  const { stdout, stderr } = await run(process.execPath, [CLI, ...args], { cwd: ROOT, maxBuffer: 16 * 1024 ** 2 });
  return { stdout, stderr, ms: performance.now() - started };
}

beforeAll(async () => {
  ensureEvalBuilt();
  const model = makeTinyModel(join(work, "tiny"), ["--seed", "5", "--layers", "2", "--hidden", "64"]);
  server = startServer(model, ["--model-name", "tiny-a2d"]);
  url = await server.url();
  await server.waitForLog("ready");
});

afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  rmSync(work, { recursive: true, force: true });
});

describe("a2d eval against a2d serve", () => {
  const cache = join(work, "responses.jsonl");
  let firstReport = "";
  const args = () => ["eval", "--url", url, "--data", join(ROOT, "eval", "fixtures"), "--max-tokens", "48", "--concurrency", "2", "--temperature", "0", "--cache", cache];

  it("scores all four fixture benchmarks and prints the report as JSON", async () => {
    const { stdout, stderr } = await cli([...args(), "--json", "--details", join(work, "details.jsonl")]);
    firstReport = stdout;
    const report = JSON.parse(stdout) as {
      benchmarks: Record<string, { accuracy: number; normalized: number; n: number }>;
      mean: number;
      run: { model: string; sampling: Record<string, unknown>; server: { health: Record<string, unknown> | null } };
    };
    expect(Object.keys(report)).toEqual(["benchmarks", "mean", "run"]);
    expect(report.run.model).toBe("tiny-a2d");
    expect(report.run.sampling).toEqual({ max_tokens: 48, temperature: 0, top_p: null, seed: null, extra_body: null });
    // a2d's /health describes the decoding; it is part of the cache key.
    expect(report.run.server.health).toMatchObject({ model: "tiny-a2d", decoding: { method: "block_diffusion" } });
    expect(Object.keys(report.benchmarks)).toEqual([...BENCHMARK_NAMES]);
    expect(Object.fromEntries(Object.entries(report.benchmarks).map(([name, score]) => [name, score.n]))).toEqual({
      gpqa_diamond: 6,
      math_500: 8,
      livecodebench_v6: 6,
      mmlu_pro: 6,
    });
    for (const score of Object.values(report.benchmarks)) {
      expect(Object.keys(score).sort()).toEqual(["accuracy", "n", "normalized"]);
      expect(score.accuracy).toBeGreaterThanOrEqual(0);
      expect(score.accuracy).toBeLessThanOrEqual(1);
      expect(score.normalized).toBeGreaterThanOrEqual(0);
      expect(score.normalized).toBeLessThanOrEqual(100);
    }
    const normalized = Object.values(report.benchmarks).map((score) => score.normalized);
    expect(report.mean).toBeCloseTo(normalized.reduce((a, b) => a + b, 0) / normalized.length, 10);
    expect(stderr).toContain("model tiny-a2d at");
    const details = readFileSync(join(work, "details.jsonl"), "utf8").trim().split("\n").map((line) => JSON.parse(line));
    expect(details.length).toBe(26);
    // The untrained model runs to the token limit or stops early; either way the server said which.
    for (const item of details) {
      expect(["stop", "length"]).toContain(item.finishReason);
      expect(item.completionTokens).toBeGreaterThan(0);
      expect(item.completionTokens).toBeLessThanOrEqual(48);
    }
  });

  it("resumes from the cache: the same command again sends no request and prints the same report", async () => {
    expect(readFileSync(cache, "utf8").trim().split("\n").length).toBe(26);
    const before = chatRequests();
    expect(before).toBeGreaterThanOrEqual(26);
    const again = await cli([...args(), "--json"]);
    expect(chatRequests()).toBe(before);
    const scores = (text: string) => {
      const { benchmarks, mean } = JSON.parse(text) as { benchmarks: unknown; mean: number };
      return { benchmarks, mean };
    };
    expect(scores(again.stdout)).toEqual(scores(firstReport));
    // Nothing was fetched, so there is no time to first token to report.
    expect(JSON.parse(again.stdout).run.ttft_ms).toBeNull();
    expect(JSON.parse(firstReport).run.ttft_ms.requests).toBe(26);
    expect(again.stderr).toContain(`cache ${cache}: 26 responses`);
    expect(readFileSync(cache, "utf8").trim().split("\n").length).toBe(26);
    const text = await cli([...args(), "--bench", "gpqa_diamond,mmlu_pro"]);
    expect(text.stdout).toMatch(/^model: tiny-a2d at http:\/\/127\.0\.0\.1:\d+\/v1\nbenchmark +n +accuracy +normalized\ngpqa_diamond +6 +\d+\.\d% +\d+\.\d\n/);
    expect(text.stdout).toMatch(/\nmean normalized: \d+\.\d\nsent: max_tokens 48, temperature 0, top_p not sent \(server default\), seed not sent \(server default\), extra body not sent \(server default\)\n/);
    expect(text.stdout).toContain("data: gpqa_diamond ");
    expect(text.stdout).toContain(", 6 items, NOT the full set of 198");
  });
});

describe("a2d bench-serve against a2d serve", () => {
  it("reports tokens/s, TTFT and inter-token latency per concurrency level from the server's usage", async () => {
    const { stdout } = await cli(["bench-serve", "--url", url, "--max-tokens", "64", "--concurrency", "1,2", "--temperature", "0", "--json"]);
    const result = JSON.parse(stdout);
    expect(result.model).toBe("tiny-a2d");
    const [one, two] = result.levels;
    expect(one.concurrency).toBe(1);
    expect(one.countedFrom).toBe("usage");
    const single = one.streams[0];
    expect(single.completionTokens).toBeGreaterThan(0);
    expect(single.completionTokens).toBeLessThanOrEqual(64);
    expect(single.tokensPerSecond).toBeCloseTo(single.completionTokens / (single.totalMs / 1000), 6);
    expect(single.ttftMs).toBeGreaterThan(0);
    expect(single.ttftMs).toBeLessThanOrEqual(single.totalMs);
    expect(two.concurrency).toBe(2);
    expect(two.streams).toHaveLength(2);
    expect(two.completionTokens).toBeGreaterThan(0);
    expect(two.ttftMs.p99).toBeGreaterThanOrEqual(two.ttftMs.p50);
  });

  it("sizes the prompt to --prompt-tokens by the server's own count", async () => {
    const { stdout } = await cli(["bench-serve", "--url", url, "--prompt-tokens", "400", "--max-tokens", "4", "--concurrency", "1", "--json"]);
    const result = JSON.parse(stdout);
    expect(result.levels[0].streams[0].promptTokens).toBe(result.promptTokens);
    expect(result.promptRepeats).toBeGreaterThan(1);
    // Within half a repeat of the target: a repeat is at most promptTokens / promptRepeats tokens.
    expect(Math.abs(result.promptTokens - 400)).toBeLessThanOrEqual(result.promptTokens / result.promptRepeats / 2 + 1);
  });
});
