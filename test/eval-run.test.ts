// `a2d eval`'s runner against a scripted OpenAI-compatible endpoint on a real port: it streams the
// answers a model would give (right for some items, wrong for others, with reasoning in
// `reasoning_content` that must be ignored), so the scores are known exactly. The run against the real
// `a2d serve` is test/eval-e2e.test.ts.
import { appendFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { gpqaDiamond } from "../eval/benchmarks/gpqa-diamond.js";
import { liveCodeBench } from "../eval/benchmarks/livecodebench.js";
import { math500 } from "../eval/benchmarks/math-500.js";
import { mmluPro } from "../eval/benchmarks/mmlu-pro.js";
import { runEval, type EvalOptions } from "../eval/run-eval.js";

const FIXTURES = join(import.meta.dirname, "..", "eval", "fixtures");
const work = mkdtempSync(join(tmpdir(), "a2d-eval-run-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface Scripted {
  reasoning: string;
  content: string;
}

/** Answers keyed by the last message's text. */
async function scriptAnswers(): Promise<Map<string, Scripted>> {
  const answers = new Map<string, Scripted>();
  const say = (messages: { content: string }[], content: string, reasoning = "Let me think.") =>
    answers.set(messages[messages.length - 1]!.content, { reasoning, content });
  const gpqa = await gpqaDiamond.load(join(FIXTURES, "gpqa_diamond.csv"));
  say(gpqa[0]!.messages, `Step by step...\nAnswer: ${gpqa[0]!.correctLetter}`);
  say(gpqa[1]!.messages, `Answer: ${gpqa[1]!.correctLetter}`, `Answer: ${gpqa[1]!.correctLetter === "A" ? "B" : "A"}`);
  say(gpqa[2]!.messages, `Answer: ${gpqa[2]!.correctLetter === "A" ? "B" : "A"}`, `Answer: ${gpqa[2]!.correctLetter}`);
  const math = await math500.load(join(FIXTURES, "math_500.jsonl"));
  say(math[0]!.messages, "$7 \\times 8 - 6 = \\boxed{50}$");
  say(math[1]!.messages, "$\\boxed{0.75}$");
  say(math[2]!.messages, "$\\boxed{[1, 2)}$");
  say(math[3]!.messages, "$\\boxed{x^2 + 1}$", "\\boxed{x^2+2x}");
  const mmlu = await mmluPro.load(join(FIXTURES, "mmlu_pro.jsonl"));
  for (const item of mmlu) say(item.messages, `Thinking it over, the answer is (${item.answerLetter}).`, "the answer is (A)");
  const code = await liveCodeBench.load(join(FIXTURES, "livecodebench_v6.jsonl"));
  say(code[0]!.messages, "```python\nn = int(input())\na = list(map(int, input().split()))\nprint(sum(a), max(a))\n```");
  say(code[1]!.messages, "```python\nclass Solution:\n    def countVowels(self, s: str) -> int:\n        return sum(c in 'aeiou' for c in s)\n```");
  say(code[2]!.messages, "```python\nn = int(input())\nprint(sum(map(int, input().split())) // n)\n```");
  return answers;
}

describe("a2d eval runner", () => {
  let server: Server;
  let url: string;
  let answers: Map<string, Scripted>;
  let requests = 0;
  let refuse: string | null = null;

  beforeAll(async () => {
    answers = await scriptAnswers();
    server = createServer((req: IncomingMessage, res: ServerResponse) => {
      if (req.method === "GET" && req.url === "/v1/models") {
        res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ object: "list", data: [{ id: "scripted", object: "model" }] }));
        return;
      }
      let body = "";
      req.on("data", (chunk: Buffer) => (body += chunk.toString("utf8")));
      req.on("end", () => {
        requests += 1;
        const request = JSON.parse(body) as { messages: { content: string }[]; max_tokens: number; stream: boolean };
        const last = request.messages[request.messages.length - 1]!.content;
        if (refuse !== null && last.includes(refuse)) {
          res.writeHead(400, { "content-type": "application/json" }).end(JSON.stringify({ error: { message: "prompt too long", type: "invalid_request_error" } }));
          return;
        }
        const answer = answers.get(last) ?? { reasoning: "", content: "I do not know." };
        res.writeHead(200, { "content-type": "text/event-stream" });
        const send = (value: unknown) => res.write(`data: ${JSON.stringify(value)}\n\n`);
        send({ choices: [{ index: 0, delta: { role: "assistant", reasoning_content: answer.reasoning } }] });
        // Split the answer mid-word across chunks, as a detokenizer would.
        for (let at = 0; at < answer.content.length; at += 7) send({ choices: [{ index: 0, delta: { content: answer.content.slice(at, at + 7) } }] });
        send({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }] });
        send({ choices: [], usage: { prompt_tokens: 10, completion_tokens: 20, total_tokens: 30 } });
        res.end("data: [DONE]\n\n");
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  const options = (extra: Partial<EvalOptions> = {}): EvalOptions => ({
    url,
    dataDir: FIXTURES,
    concurrency: 3,
    maxTokens: 256,
    codePython: "/usr/bin/python3",
    progress: false,
    log: () => undefined,
    retryDelayMs: 10,
    ...extra,
  });

  it("scores every fixture benchmark from the answers, not the reasoning", async () => {
    const run = await runEval(options());
    expect(run.model).toBe("scripted");
    const { benchmarks } = run.report;
    expect(Object.keys(benchmarks)).toEqual(["gpqa_diamond", "math_500", "livecodebench_v6", "mmlu_pro"]);
    expect(benchmarks.gpqa_diamond).toMatchObject({ n: 3, accuracy: 2 / 3 });
    expect(benchmarks.math_500).toMatchObject({ n: 4, accuracy: 3 / 4 });
    expect(benchmarks.livecodebench_v6).toMatchObject({ n: 3, accuracy: 2 / 3 });
    expect(benchmarks.mmlu_pro).toMatchObject({ n: 3, accuracy: 1, normalized: 100 });
    expect(benchmarks.gpqa_diamond!.normalized).toBeCloseTo(((2 / 3 - 0.25) / (0.6717 - 0.25)) * 100, 10);
    expect(benchmarks.math_500!.normalized).toBeCloseTo((0.75 / 0.98) * 100, 10);
    expect(benchmarks.livecodebench_v6!.normalized).toBe(100);
    const normalized = Object.values(benchmarks).map((score) => score.normalized);
    expect(run.report.mean).toBeCloseTo(normalized.reduce((a, b) => a + b, 0) / 4, 10);
    const mean = run.items.find((item) => item.id === "fixture_abc001_b")!;
    expect(mean).toMatchObject({ correct: false, detail: "test 1: wrong answer", completionTokens: 20, finishReason: "stop" });
  });

  it("resumes from the response cache, torn last line included", async () => {
    const cache = join(work, "responses.jsonl");
    requests = 0;
    await runEval(options({ cacheFile: cache, benchmarks: ["gpqa_diamond", "mmlu_pro"], limit: 2 }));
    expect(requests).toBe(4);
    appendFileSync(cache, '{"key": "0123", "content": "interrupted mid-wri');
    requests = 0;
    const logs: string[] = [];
    const full = await runEval(options({ cacheFile: cache, benchmarks: ["gpqa_diamond", "mmlu_pro"], log: (line) => logs.push(line) }));
    expect(requests).toBe(2);
    expect(logs).toContain(`cache ${cache}: 4 responses (1 torn line(s) skipped)`);
    expect(full.items.filter((item) => item.cached).length).toBe(4);
    expect(full.report.benchmarks.gpqa_diamond).toMatchObject({ n: 3, accuracy: 2 / 3 });
    requests = 0;
    await runEval(options({ cacheFile: cache, benchmarks: ["gpqa_diamond", "mmlu_pro"] }));
    expect(requests).toBe(0);
    // 4 + 2 responses and the torn line, which the next write started a fresh line after.
    expect(readFileSync(cache, "utf8").trim().split("\n").length).toBe(7);
  });

  it("scores refused and ungradable items wrong and says so, and names the cache when the server is gone", async () => {
    refuse = "hexagon";
    const logs: string[] = [];
    const run = await runEval(options({ benchmarks: ["mmlu_pro"], log: (line) => logs.push(line) }));
    refuse = null;
    expect(run.report.benchmarks.mmlu_pro).toMatchObject({ n: 3, accuracy: 2 / 3 });
    expect(logs.some((line) => /request refused for 1 item\(s\), scored wrong; first: request refused: .*prompt too long/.test(line))).toBe(true);

    const data = join(work, "data");
    mkdirSync(data);
    writeFileSync(join(data, "math_500.jsonl"), `${JSON.stringify({ problem: "What is 1?", answer: "" })}\n${readFileSync(join(FIXTURES, "math_500.jsonl"), "utf8")}`);
    const gradingLogs: string[] = [];
    const graded = await runEval(options({ dataDir: data, log: (line) => gradingLogs.push(line) }));
    expect(graded.report.benchmarks.math_500).toMatchObject({ n: 5, accuracy: 3 / 5 });
    expect(gradingLogs).toContain("warning: grading failed for 1 item(s), scored wrong; first: grading failed: grader: ValueError: math-verify cannot parse the gold answer ''");

    const dead = createServer();
    await new Promise<void>((resolve) => dead.listen(0, "127.0.0.1", resolve));
    const deadUrl = `http://127.0.0.1:${(dead.address() as AddressInfo).port}`;
    await new Promise<void>((resolve) => dead.close(() => resolve()));
    await expect(runEval(options({ url: deadUrl, model: "m", benchmarks: ["mmlu_pro"], cacheFile: join(work, "never.jsonl") }))).rejects.toThrow(
      /is the server running at --url\?.*re-run the same command to resume/s,
    );
  });

  it("rejects a data folder without benchmark files, naming the files", async () => {
    await expect(runEval(options({ dataDir: tmpdir() + "/a2d-no-such-dir" }))).rejects.toThrow(/--data .* does not exist/);
    await expect(runEval(options({ dataDir: join(FIXTURES, "parquet"), benchmarks: ["gpqa_diamond"] }))).rejects.toThrow(
      /has no gpqa_diamond\.csv; add it or leave gpqa_diamond out of --bench/,
    );
  });
});
