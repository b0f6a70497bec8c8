// `a2d eval`'s runner against a scripted OpenAI-compatible endpoint on a real port (test/eval-scripted-
// server.ts): it streams the answers a model would give (right for some items, wrong for others, with
// reasoning in `reasoning_content` that must be ignored), so the scores are known exactly. Also the data
// guards: row counts, the LiveCodeBench window, the stratified --limit, the server's identity in the
// cache key, and the record of what was sent. The run against the real `a2d serve` is
// test/eval-e2e.test.ts; a server that runs one generation at a time is test/eval-serial-server.test.ts.
import { appendFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { gpqaDiamond } from "../eval/benchmarks/gpqa-diamond.js";
import { V6_WINDOW, liveCodeBench } from "../eval/benchmarks/livecodebench.js";
import { math500 } from "../eval/benchmarks/math-500.js";
import { mmluPro } from "../eval/benchmarks/mmlu-pro.js";
import { PythonWorker } from "../eval/python-worker.js";
import { runEval, type EvalOptions } from "../eval/run-eval.js";
import { ScriptedServer, type Scripted } from "./eval-scripted-server.js";

const FIXTURES = join(import.meta.dirname, "..", "eval", "fixtures");
const work = mkdtempSync(join(tmpdir(), "a2d-eval-run-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

/** Answers keyed by the last message's text. */
async function scriptAnswers(): Promise<Map<string, Scripted>> {
  const answers = new Map<string, Scripted>();
  const say = (messages: { content: string }[], content: string, reasoning = "Let me think.") =>
    answers.set(messages[messages.length - 1]!.content, { reasoning, content });
  const python = PythonWorker.start();
  const context = { python, lcbWindow: V6_WINDOW, log: () => undefined };
  try {
    const gpqa = await gpqaDiamond.load(join(FIXTURES, "gpqa_diamond.csv"), context);
    const right = (i: number) => gpqa[i]!.correctLetter;
    const wrong = (i: number) => (right(i) === "A" ? "B" : "A");
    say(gpqa[0]!.messages, `Step by step...\nAnswer: ${right(0)}`);
    say(gpqa[1]!.messages, `Answer: ${right(1)}`, `Answer: ${wrong(1)}`);
    say(gpqa[2]!.messages, `Answer: ${wrong(2)}`, `Answer: ${right(2)}`);
    say(gpqa[3]!.messages, `The answer is (${right(3)}).`);
    say(gpqa[4]!.messages, `\\boxed{${right(4)}}`);
    say(gpqa[5]!.messages, "I do not know.");
    const math = await math500.load(join(FIXTURES, "math_500.jsonl"), context);
    ["$7 \\times 8 - 6 = \\boxed{50}$", "$\\boxed{0.75}$", "$\\boxed{[1, 2)}$", "$\\boxed{x^2 + 1}$", "$\\boxed{3/8}$", "$\\boxed{6\\pi}$", "$\\boxed{7}$", "$\\boxed{2}$"].forEach(
      (content, i) => say(math[i]!.messages, content, "\\boxed{x^2+2x}"),
    );
    const mmlu = await mmluPro.load(join(FIXTURES, "mmlu_pro.parquet"), context);
    for (const item of mmlu) say(item.messages, `Thinking it over, the answer is (${item.answerLetter}).`, "the answer is (A)");
    const code = await liveCodeBench.load(join(FIXTURES, "livecodebench_v6.jsonl"), context);
    const programs = [
      "n = int(input())\na = list(map(int, input().split()))\nprint(sum(a), max(a))",
      "n = int(input())\nprint(sum(map(int, input().split())) // n)",
      "for _ in range(int(input())):\n    found = [int(x) for x in findall(r'-?\\d+', input())]\n    print(len(found), sum(found))",
      "class Solution:\n    def countVowels(self, s: str) -> int:\n        return sum(c in 'aeiou' for c in s)",
      "class Solution:\n    def digitSum(self, n: int) -> int:\n        return sum(map(int, str(n)))",
      "class Solution:\n    def joinValues(self, values: List[float]) -> str:\n        return ' '.join(map(str, values))",
    ];
    programs.forEach((program, i) => say(code[i]!.messages, `\`\`\`python\n${program}\n\`\`\``));
  } finally {
    await python.close();
  }
  return answers;
}

describe("a2d eval runner", () => {
  let server: ScriptedServer;
  let answers: Map<string, Scripted>;
  let refuse: string | null = null;

  beforeAll(async () => {
    answers = await scriptAnswers();
    server = await new ScriptedServer({
      answer: (body) => {
        const last = body.messages[body.messages.length - 1]!.content;
        if (refuse !== null && last.includes(refuse)) return { status: 400, message: "prompt too long" };
        return answers.get(last) ?? { content: "I do not know." };
      },
    }).start();
  });
  afterAll(() => server.stop());

  const options = (extra: Partial<EvalOptions> = {}): EvalOptions => ({
    url: server.url,
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
    expect(benchmarks.gpqa_diamond).toMatchObject({ n: 6, accuracy: 4 / 6 });
    expect(benchmarks.math_500).toMatchObject({ n: 8, accuracy: 6 / 8 });
    expect(benchmarks.livecodebench_v6).toMatchObject({ n: 6, accuracy: 5 / 6 });
    expect(benchmarks.mmlu_pro).toMatchObject({ n: 6, accuracy: 1, normalized: 100 });
    expect(benchmarks.gpqa_diamond!.normalized).toBeCloseTo(((4 / 6 - 0.25) / (0.6717 - 0.25)) * 100, 10);
    const normalized = Object.values(benchmarks).map((score) => score.normalized);
    expect(run.report.mean).toBeCloseTo(normalized.reduce((a, b) => a + b, 0) / 4, 10);
    const mean = run.items.find((item) => item.id === "fixture_abc392_b")!;
    expect(mean).toMatchObject({ correct: false, detail: "test 1: wrong answer (line 1 differs)", completionTokens: 20, finishReason: "stop" });
  });

  it("warns when a file is not the full set, and keeps LiveCodeBench to the v6 contest_date window", async () => {
    const logs: string[] = [];
    const run = await runEval(options({ benchmarks: ["gpqa_diamond", "livecodebench_v6", "mmlu_pro"], log: (line) => logs.push(line) }));
    expect(logs).toContain(`warning: gpqa_diamond has 6 items in ${join(FIXTURES, "gpqa_diamond.csv")}; the full set has 198, so its score is not comparable with published ones`);
    expect(logs).toContain(`warning: mmlu_pro has 6 items in ${join(FIXTURES, "mmlu_pro.parquet")}; the full set has 12032, so its score is not comparable with published ones`);
    expect(logs).toContain(`warning: livecodebench_v6 has 6 items in ${join(FIXTURES, "livecodebench_v6.jsonl")}; the full set has 175, so its score is not comparable with published ones`);
    expect(logs).toContain("livecodebench_v6: 6 of 8 rows have a contest_date in 2025-02-01..2025-05-01");
    expect(run.items.filter((item) => item.benchmark === "livecodebench_v6").map((item) => item.id)).not.toContain("fixture_abc385_a");
    expect(run.record.data.livecodebench_v6).toMatchObject({ rows: 6, full_set_rows: 175, items: 6, sample: null });
    expect(run.record.lcb_window).toEqual(V6_WINDOW);

    const everyRow: string[] = [];
    const all = await runEval(options({ benchmarks: ["livecodebench_v6"], lcbWindow: null, log: (line) => everyRow.push(line) }));
    expect(all.report.benchmarks.livecodebench_v6!.n).toBe(8);
    expect(everyRow.filter((line) => line.startsWith("warning"))).toEqual([]);
  });

  it("samples --limit per stratum with a seed, and says so", async () => {
    const logs: string[] = [];
    const run = await runEval(options({ benchmarks: ["gpqa_diamond", "mmlu_pro"], limit: 3, log: (line) => logs.push(line) }));
    const gpqa = run.items.filter((item) => item.benchmark === "gpqa_diamond").map((item) => item.id);
    // One per high-level domain (Physics 1-2, Chemistry 3-4, Biology 5-6), not the first three rows.
    expect(gpqa.map((id) => Math.ceil(Number(id.slice(-1)) / 2))).toEqual([1, 2, 3]);
    expect(logs).toContain(`gpqa_diamond: 3 items from ${join(FIXTURES, "gpqa_diamond.csv")} (3 of 6, stratified, seed 0)`);
    expect(run.record.data.gpqa_diamond!.sample).toBe("3 of 6, stratified, seed 0");
    const again = await runEval(options({ benchmarks: ["gpqa_diamond"], limit: 3 }));
    expect(again.items.map((item) => item.id)).toEqual(gpqa);
    const seeds = new Set<string>();
    for (const sampleSeed of [1, 2, 3, 4]) {
      seeds.add((await runEval(options({ benchmarks: ["gpqa_diamond"], limit: 3, sampleSeed }))).items.map((item) => item.id).join());
    }
    expect(seeds.size).toBeGreaterThan(1);
  });

  it("records the sampling parameters it sent", async () => {
    server.bodies = [];
    const sampling = { temperature: 0.6, topP: 0.95, seed: 7, extraBody: { threshold: 0.9 }, maxTokens: 1000 };
    const run = await runEval(options({ benchmarks: ["mmlu_pro"], ...sampling }));
    for (const body of server.bodies) expect(body).toMatchObject({ temperature: 0.6, top_p: 0.95, seed: 7, threshold: 0.9, max_tokens: 1000 });
    expect(run.record.sampling).toEqual({ max_tokens: 1000, temperature: 0.6, top_p: 0.95, seed: 7, extra_body: { threshold: 0.9 } });
    const defaults = await runEval(options({ benchmarks: ["mmlu_pro"] }));
    expect(defaults.record.sampling).toEqual({ max_tokens: 256, temperature: null, top_p: null, seed: null, extra_body: null });
    expect(defaults.record).toMatchObject({ url: `${server.url}/v1`, model: "scripted", server: { url: `${server.url}/v1`, model: { id: "scripted", object: "model", owned_by: "tests" } } });
  });

  it("resumes from the response cache, torn last line included", async () => {
    const cache = join(work, "responses.jsonl");
    server.requests = 0;
    await runEval(options({ cacheFile: cache, benchmarks: ["gpqa_diamond", "mmlu_pro"], limit: 3 }));
    expect(server.requests).toBe(6);
    appendFileSync(cache, '{"key": "0123", "content": "interrupted mid-wri');
    server.requests = 0;
    const logs: string[] = [];
    const full = await runEval(options({ cacheFile: cache, benchmarks: ["gpqa_diamond", "mmlu_pro"], log: (line) => logs.push(line) }));
    expect(server.requests).toBe(6);
    expect(logs).toContain(`cache ${cache}: 6 responses (1 torn line(s) skipped)`);
    expect(full.items.filter((item) => item.cached).length).toBe(6);
    expect(full.report.benchmarks.gpqa_diamond).toMatchObject({ n: 6, accuracy: 4 / 6 });
    server.requests = 0;
    await runEval(options({ cacheFile: cache, benchmarks: ["gpqa_diamond", "mmlu_pro"] }));
    expect(server.requests).toBe(0);
    // 6 + 6 responses and the torn line, which the next write started a fresh line after.
    expect(readFileSync(cache, "utf8").trim().split("\n").length).toBe(13);
  });

  it("keys the cache by the server too: another model card or decoding is asked again", async () => {
    const cache = join(work, "identity.jsonl");
    const run = () => runEval(options({ cacheFile: cache, benchmarks: ["mmlu_pro"] }));
    server.health = { status: "ok", model: "scripted", decoding: { method: "block_diffusion", threshold: 0.9 }, forward_passes: 1, queue: { running: 0, waiting: 0 } };
    server.requests = 0;
    await run();
    expect(server.requests).toBe(6);
    // Counters, queue state and the card's `created` change between calls; the responses stay valid.
    server.health = { ...server.health, forward_passes: 999, queue: { running: 1, waiting: 3 } };
    server.requests = 0;
    await run();
    expect(server.requests).toBe(0);
    server.health = { ...server.health, decoding: { method: "block_diffusion", threshold: 0.7 } };
    await run();
    expect(server.requests).toBe(6);
    server.card = { ...server.card, owned_by: "someone-else" };
    server.requests = 0;
    await run();
    expect(server.requests).toBe(6);
    server.card = { id: "scripted", object: "model", owned_by: "tests" };
    server.health = null;
  });

  it("scores refused and ungradable items wrong and says so, and names the cache when the server is gone", async () => {
    refuse = "hexagon";
    const logs: string[] = [];
    const run = await runEval(options({ benchmarks: ["mmlu_pro"], log: (line) => logs.push(line) }));
    refuse = null;
    expect(run.report.benchmarks.mmlu_pro).toMatchObject({ n: 6, accuracy: 5 / 6 });
    expect(logs.some((line) => /request refused for 1 item\(s\), scored wrong; first: request refused: .*prompt too long/.test(line))).toBe(true);

    const data = join(work, "data");
    mkdirSync(data);
    writeFileSync(join(data, "math_500.jsonl"), `${JSON.stringify({ problem: "What is 1?", answer: "" })}\n${readFileSync(join(FIXTURES, "math_500.jsonl"), "utf8")}`);
    const gradingLogs: string[] = [];
    const graded = await runEval(options({ dataDir: data, log: (line) => gradingLogs.push(line) }));
    expect(graded.report.benchmarks.math_500).toMatchObject({ n: 9, accuracy: 6 / 9 });
    expect(gradingLogs).toContain("warning: grading failed for 1 item(s), scored wrong; first: grading failed: grader: ValueError: math-verify cannot parse the gold answer ''");

    const dead = createServer();
    await new Promise<void>((resolve) => dead.listen(0, "127.0.0.1", resolve));
    const deadUrl = `http://127.0.0.1:${(dead.address() as AddressInfo).port}`;
    await new Promise<void>((resolve) => dead.close(() => resolve()));
    await expect(runEval(options({ url: deadUrl, model: "m", benchmarks: ["mmlu_pro"], cacheFile: join(work, "never.jsonl") }))).rejects.toThrow(
      /is the server running at --url\?/,
    );
  });

  it("rejects a data folder without benchmark files, naming the files", async () => {
    await expect(runEval(options({ dataDir: tmpdir() + "/a2d-no-such-dir" }))).rejects.toThrow(/--data .* does not exist/);
    await expect(runEval(options({ dataDir: join(FIXTURES, "jsonl"), benchmarks: ["gpqa_diamond"] }))).rejects.toThrow(
      /has no gpqa_diamond\.csv; add it or leave gpqa_diamond out of --bench/,
    );
  });
});
