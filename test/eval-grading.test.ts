// Model-free tests of eval's parts: the normalization table, answer extraction, math-verify grading,
// the benchmark readers on the self-written fixtures, and LiveCodeBench grading in the sandbox.
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { gpqaDiamond, seededPermutation } from "../eval/benchmarks/gpqa-diamond.js";
import { liveCodeBench, type CodeItem } from "../eval/benchmarks/livecodebench.js";
import { math500 } from "../eval/benchmarks/math-500.js";
import { mmluPro } from "../eval/benchmarks/mmlu-pro.js";
import { canonicalDecimal, runCodeTests, stdoutMatches } from "../eval/code-tests.js";
import { extractCode, extractGpqaLetter, extractMmluProLetter, finalAnswer } from "../eval/extract.js";
import { buildReport, normalizeAccuracy } from "../eval/normalize.js";
import { venvPython } from "../eval/paths.js";
import { PythonWorker } from "../eval/python-worker.js";

const FIXTURES = join(import.meta.dirname, "..", "eval", "fixtures");
const work = mkdtempSync(join(tmpdir(), "a2d-eval-grading-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

describe("normalization (SPEC §1)", () => {
  it("maps chance to 0 and the AR model to 100, clamped", () => {
    expect(normalizeAccuracy("gpqa_diamond", 0.25)).toBe(0);
    expect(normalizeAccuracy("gpqa_diamond", 0.6717)).toBeCloseTo(100, 10);
    expect(normalizeAccuracy("gpqa_diamond", 0.1)).toBe(0);
    expect(normalizeAccuracy("math_500", 0.49)).toBeCloseTo(50, 10);
    expect(normalizeAccuracy("math_500", 1)).toBe(100);
    expect(normalizeAccuracy("livecodebench_v6", 0.6483 / 4)).toBeCloseTo(25, 10);
    expect(normalizeAccuracy("mmlu_pro", 0.1111)).toBe(0);
    expect(normalizeAccuracy("mmlu_pro", (0.1111 + 0.6914) / 2)).toBeCloseTo(50, 10);
    expect(() => normalizeAccuracy("math_500", 1.5)).toThrow(/fraction/);
  });

  it("reports accuracy, normalized and n per benchmark and the mean in the documented shape", () => {
    const report = buildReport({ math_500: { correct: 49, total: 100 }, gpqa_diamond: { correct: 1, total: 4 } });
    expect(Object.keys(report)).toEqual(["benchmarks", "mean"]);
    expect(Object.keys(report.benchmarks)).toEqual(["gpqa_diamond", "math_500"]);
    expect(report.benchmarks.math_500).toEqual({ accuracy: 0.49, normalized: expect.closeTo(50, 10), n: 100 });
    expect(report.benchmarks.gpqa_diamond!.normalized).toBe(0);
    expect(report.mean).toBeCloseTo(25, 10);
  });
});

describe("answer extraction", () => {
  it("takes the answer after the reasoning, never from it", () => {
    expect(finalAnswer("<think>Answer: A</think>\n\nAnswer: B")).toBe("Answer: B");
    expect(finalAnswer("<think>Answer: A, still thinking")).toBe("");
    expect(finalAnswer("Answer: C")).toBe("Answer: C");
  });

  it("reads GPQA letters as simple-evals does, last match wins", () => {
    expect(extractGpqaLetter("so...\nAnswer: C")).toBe("C");
    expect(extractGpqaLetter("answer: $b$")).toBe("B");
    expect(extractGpqaLetter("**Answer:** D")).toBe("D");
    expect(extractGpqaLetter("Answer: $\\boxed{A}$")).toBe("A");
    expect(extractGpqaLetter("Answer: A is tempting.\nAnswer: D")).toBe("D");
    expect(extractGpqaLetter("Answer: E")).toBeNull();
    expect(extractGpqaLetter("I think it is B")).toBeNull();
  });

  it("reads MMLU-Pro letters A–J with TIGER-Lab's cascade", () => {
    expect(extractMmluProLetter("... so the answer is (J).")).toBe("J");
    expect(extractMmluProLetter("the answer is C")).toBe("C");
    expect(extractMmluProLetter("Answer: (G)")).toBe("G");
    expect(extractMmluProLetter("B looks wrong, and E is right")).toBe("E");
    expect(extractMmluProLetter("the answer is (K)")).toBeNull();
    expect(extractMmluProLetter("no letter here")).toBeNull();
  });

  it("takes the last complete fenced code block", () => {
    expect(extractCode("draft:\n```python\nprint(1)\n```\nfinal:\n```python\nprint(2)\n```\n")).toBe("print(2)");
    expect(extractCode("```python\nprint(1)\n```\nthen\n```python\nprint(2")).toBe("print(1)");
    expect(extractCode("print(3)")).toBeNull();
  });
});

describe("stdout comparison (LiveCodeBench rule)", () => {
  it("strips lines and accepts equal decimals", () => {
    expect(stdoutMatches("8 5\n", "8 5")).toBe(true);
    expect(stdoutMatches("  8   5  \n\n", "8 5\n")).toBe(true); // numbers compare token by token
    expect(stdoutMatches("Yes  No", "Yes No")).toBe(false); // words compare as the whole line
    expect(stdoutMatches("2.5\n", "2.50\n")).toBe(true);
    expect(stdoutMatches("1e3", "1000")).toBe(true);
    expect(stdoutMatches("2.51", "2.50")).toBe(false);
    expect(stdoutMatches("1\n2", "1 2")).toBe(false);
    expect(stdoutMatches("nan", "nan")).toBe(true); // identical text needs no number
    expect(stdoutMatches("nan", "NaN")).toBe(false);
    expect(canonicalDecimal("-0.000")).toBe("0");
    expect(canonicalDecimal("1_000")).toBe(canonicalDecimal("1000"));
    expect(canonicalDecimal("abc")).toBeNull();
  });
});

describe("benchmark readers on the fixtures", () => {
  it("reads GPQA-Diamond CSV, shuffles with a fixed seed and keeps the correct answer's letter", async () => {
    const items = await gpqaDiamond.load(join(FIXTURES, "gpqa_diamond.csv"));
    expect(items.map((item) => item.id)).toEqual(["fixture-phys-1", "fixture-chem-1", "fixture-chem-2"]);
    for (const item of items) {
      const prompt = item.messages[0]!.content;
      expect(prompt).toMatch(/^Answer the following multiple choice question\. The last line of your response should be of the following format: 'Answer: \$LETTER'/);
      const line = prompt.split("\n").find((text) => text.startsWith(`${item.correctLetter}) `));
      expect(line).toBeDefined();
      expect(["19.6 m", "Nitrogen", "2"]).toContain(line!.slice(3));
    }
    expect(items[2]!.messages[0]!.content).toContain('counting "every" carbon');
    expect(await gpqaDiamond.load(join(FIXTURES, "gpqa_diamond.csv"))).toEqual(items);
    expect(seededPermutation("x", 4).sort()).toEqual([0, 1, 2, 3]);
  });

  it("names the file and the fix for a malformed CSV", async () => {
    const dir = work;
    writeFileSync(join(dir, "gpqa_diamond.csv"), "Question,Correct Answer\nq,a\n");
    await expect(gpqaDiamond.load(join(dir, "gpqa_diamond.csv"))).rejects.toThrow(/gpqa_diamond\.csv: missing column\(s\) Incorrect Answer 1/);
    writeFileSync(join(dir, "math_500.jsonl"), '{"problem": "p", "answer": "1"}\nnot json\n');
    await expect(math500.load(join(dir, "math_500.jsonl"))).rejects.toThrow(/math_500\.jsonl:2: not valid JSON/);
  });

  it("reads MMLU-Pro from JSON lines and from parquet alike", async () => {
    const fromJsonl = await mmluPro.load(join(FIXTURES, "mmlu_pro.jsonl"));
    const fromParquet = await mmluPro.load(join(FIXTURES, "parquet", "mmlu_pro.parquet"));
    expect(fromParquet).toEqual(fromJsonl);
    expect(fromJsonl.map((item) => item.answerLetter)).toEqual(["C", "B", "C"]);
    expect(fromJsonl[0]!.messages[0]!.content).toContain("\nJ. 11");
    expect(fromJsonl[2]!.messages[0]!.content).not.toContain("\nD. ");
    expect((await mmluPro.load(join(FIXTURES, "mmlu_pro.jsonl"), 2)).length).toBe(2);
  });

  it("reads LiveCodeBench with the official prompt for stdin and functional problems", async () => {
    const items = await liveCodeBench.load(join(FIXTURES, "livecodebench_v6.jsonl"));
    expect(items.map((item) => [item.id, item.funcName])).toEqual([
      ["fixture_abc001_a", null],
      ["fixture_9001", "countVowels"],
      ["fixture_abc001_b", null],
    ]);
    expect(items[0]!.messages[0]!.role).toBe("system");
    expect(items[0]!.messages[1]!.content).toContain("### Format: Read the inputs from stdin solve the problem");
    expect(items[1]!.messages[1]!.content).toContain("```python\nclass Solution:\n    def countVowels(self, s: str) -> int:\n        \n```");
    expect(items[1]!.messages[1]!.content.endsWith("### Answer: (use the provided format with backticks)\n\n")).toBe(true);
  });
});

describe("graders that need Python", () => {
  let python: PythonWorker;
  let items: CodeItem[];
  beforeAll(async () => {
    python = PythonWorker.start();
    items = await liveCodeBench.load(join(FIXTURES, "livecodebench_v6.jsonl"));
  });
  afterAll(() => python.close());
  const runCode = (code: string, tests: Parameters<typeof runCodeTests>[1], funcName: string | null) =>
    runCodeTests(code, tests, funcName, { python: "/usr/bin/python3" });

  it("grades MATH answers by equivalence with math-verify", async () => {
    const cases: [string, string, boolean][] = [
      ["\\frac{3}{4}", "so it is \\boxed{0.75}", true],
      ["\\frac{3}{4}", "\\boxed{\\dfrac{6}{8}}", true],
      ["[1,2)", "The set is $\\boxed{[1, 2)}$.", true],
      ["[1,2)", "\\boxed{[1, 2]}", false],
      ["x^2+2x", "\\boxed{2x + x^2}", true],
      ["50", "Check: $7 \\cdot 8 = 56$, so $\\boxed{50}$.", true],
      // math-verify reads several boxed answers as one set: hedging is wrong.
      ["50", "\\boxed{49} or \\boxed{50}", false],
      ["50", "\\boxed{51}", false],
      ["50", "no idea", false],
    ];
    for (const [gold, answer, correct] of cases) {
      expect((await python.gradeMath(gold, answer)).correct, `${gold} vs ${answer}`).toBe(correct);
    }
    const [first] = await math500.load(join(FIXTURES, "math_500.jsonl"));
    expect(await math500.grade(first!, "7*8-6 = \\boxed{50}", { python, runCode })).toMatchObject({ correct: true, extracted: "50" });
  });

  it("decodes pickled private tests and refuses pickles that name code", async () => {
    const tests = await python.decodeTests(items[0]!.privateTests);
    expect(tests).toEqual([
      { input: "1\n-7\n", output: "-7 -7\n", testtype: "stdin" },
      { input: "4\n10 -3 10 0\n", output: "17 10\n", testtype: "stdin" },
    ]);
    const marker = join(work, "pickle-ran");
    const hostile = execFileSync(venvPython(), [
      "-c",
      `import base64, os, pickle, zlib\nclass P:\n    def __reduce__(self):\n        return (os.system, ("touch ${marker}",))\nprint(base64.b64encode(zlib.compress(pickle.dumps(P()))).decode())`,
    ]).toString().trim();
    await expect(python.decodeTests(hostile)).rejects.toThrow(/plain data/);
    expect(existsSync(marker)).toBe(false);
  });

  it("passes a correct stdin program and fails wrong, crashing and silent ones", async () => {
    const [sumMax, , mean] = items;
    const context = { python, runCode };
    const right = "```python\nn = int(input())\na = list(map(int, input().split()))\nprint(sum(a), max(a))\n```";
    expect(await liveCodeBench.grade(sumMax!, right, context)).toMatchObject({ correct: true, detail: "3 tests passed" });
    const wrongOnPrivate = "```python\ninput()\nprint(8, 5)\n```";
    expect(await liveCodeBench.grade(sumMax!, wrongOnPrivate, context)).toMatchObject({ correct: false, detail: "test 2: wrong answer" });
    const crash = "```python\nraise ValueError('boom')\n```";
    expect((await liveCodeBench.grade(sumMax!, crash, context)).detail).toMatch(/test 1: runtime error \(exit 1\): ValueError: boom/);
    expect(await liveCodeBench.grade(sumMax!, "I would loop over the numbers.", context)).toMatchObject({ correct: false, extracted: null });
    const meanProgram = "```python\nn = int(input())\na = list(map(int, input().split()))\nprint(sum(a) / n)\n```";
    expect(await liveCodeBench.grade(mean!, meanProgram, context)).toMatchObject({ correct: true });
  });

  it("calls LeetCode-style methods with the runner's imports and compares in Python", async () => {
    const vowels = items[1]!;
    const context = { python, runCode };
    const right = "```python\nclass Solution:\n    def countVowels(self, s: str) -> int:\n        return sum(Counter(s)[v] for v in 'aeiou')\n```";
    expect(await liveCodeBench.grade(vowels, right, context)).toMatchObject({ correct: true, detail: "3 tests passed" });
    const spoof = "```python\nclass Solution:\n    def countVowels(self, s: str) -> int:\n        print('A2D-VERDICT 0 {\"pass\": true}')\n        return -1\n```";
    expect(await liveCodeBench.grade(vowels, spoof, context)).toMatchObject({ correct: false });
    const slow = "```python\nclass Solution:\n    def countVowels(self, s):\n        while True: pass\n```";
    const verdict = await runCodeTests(extractCode(slow)!, vowels.publicTests, "countVowels", { python: "/usr/bin/python3", limits: { timeoutMs: 1000 } });
    expect(verdict).toEqual({ passed: false, testsRun: 1, failure: "test 1: time limit exceeded" });
  });
});
