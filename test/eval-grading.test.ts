// Model-free tests of eval's parts: the normalization table, the benchmark readers on the self-written
// fixtures (published layouts), the stratified sample, math-verify grading, and LiveCodeBench grading in
// the sandbox by the official runner's rules. Answer extraction is in test/eval-extraction.test.ts.
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { gpqaDiamond } from "../eval/benchmarks/gpqa-diamond.js";
import { V6_WINDOW, inWindow, liveCodeBench, type CodeItem } from "../eval/benchmarks/livecodebench.js";
import { math500 } from "../eval/benchmarks/math-500.js";
import { guessedLetter, mmluPro } from "../eval/benchmarks/mmlu-pro.js";
import type { EvalItem, LoadContext } from "../eval/benchmarks/types.js";
import { runCodeTests, type CodeTest } from "../eval/code-tests.js";
import { buildReport, normalizeAccuracy } from "../eval/normalize.js";
import { venvPython } from "../eval/paths.js";
import { PythonWorker } from "../eval/python-worker.js";
import { stratifiedSample } from "../eval/sample.js";

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

describe("--limit: a seeded, stratified sample", () => {
  // 60 items sorted by stratum, as the published files are (by subject, by date).
  const items: EvalItem[] = [
    ...Array.from({ length: 30 }, (_, i) => ({ id: `alg-${i}`, stratum: "Algebra", messages: [] })),
    ...Array.from({ length: 20 }, (_, i) => ({ id: `geo-${i}`, stratum: "Geometry", messages: [] })),
    ...Array.from({ length: 10 }, (_, i) => ({ id: `num-${i}`, stratum: "Number Theory", messages: [] })),
  ];
  const strata = (sample: EvalItem[]) => Object.fromEntries(["Algebra", "Geometry", "Number Theory"].map((s) => [s, sample.filter((i) => i.stratum === s).length]));

  it("keeps the strata in proportion, not the first rows", () => {
    expect(strata(stratifiedSample(items, 6, 0, "math_500"))).toEqual({ Algebra: 3, Geometry: 2, "Number Theory": 1 });
    // 7 × (1/2, 1/3, 1/6) = 3.5, 2.33, 1.17: the leftover item goes to the largest remainder.
    expect(strata(stratifiedSample(items, 7, 0, "math_500"))).toEqual({ Algebra: 4, Geometry: 2, "Number Theory": 1 });
    const sample = stratifiedSample(items, 6, 0, "math_500");
    expect(sample.map((i) => i.id)).not.toEqual(items.slice(0, 6).map((i) => i.id));
    // File order is kept.
    expect(sample).toEqual(items.filter((item) => sample.includes(item)));
  });

  it("is the same for the same seed, and another for another seed", () => {
    const ids = (seed: number) => stratifiedSample(items, 6, seed, "math_500").map((i) => i.id);
    expect(ids(0)).toEqual(ids(0));
    expect(ids(1)).not.toEqual(ids(0));
    expect(stratifiedSample(items, 100, 0, "math_500")).toEqual(items);
    // Membership depends on the item, not on the other rows: a shuffled file gives the same sample.
    expect(new Set(stratifiedSample([...items].reverse(), 6, 0, "math_500").map((i) => i.id))).toEqual(new Set(ids(0)));
  });
});

describe("benchmark readers on the fixtures", () => {
  let python: PythonWorker;
  let context: LoadContext;
  beforeAll(() => {
    python = PythonWorker.start();
    context = { python, lcbWindow: V6_WINDOW, log: () => undefined };
  });
  afterAll(() => python.close());

  it("reads GPQA-Diamond CSV and orders the answers as simple-evals does (random.Random(0), one sample per row)", async () => {
    const items = await gpqaDiamond.load(join(FIXTURES, "gpqa_diamond.csv"), context);
    expect(items.map((item) => item.id)).toEqual(["recFixture00001", "recFixture00002", "recFixture00003", "recFixture00004", "recFixture00005", "recFixture00006"]);
    expect(items.map((item) => item.stratum)).toEqual(["Physics", "Physics", "Chemistry", "Chemistry", "Biology", "Biology"]);
    // Python: r = random.Random(0); [r.sample(range(4), 4) for _ in range(6)]
    const orders = JSON.parse(
      execFileSync(venvPython(), ["-c", "import json, random\nr = random.Random(0)\nprint(json.dumps([r.sample(range(4), 4) for _ in range(6)]))"], { encoding: "utf8" }),
    ) as number[][];
    const correct = ["19.6 m", "4 A", "Nitrogen", "2", "tRNA", "1/4"];
    items.forEach((item, row) => {
      const prompt = item.messages[0]!.content;
      expect(prompt).toMatch(/^Answer the following multiple choice question\. The last line of your response should be of the following format: 'Answer: \$LETTER'/);
      expect(item.correctLetter).toBe("ABCD"[orders[row]!.indexOf(0)]);
      expect(prompt.split("\n")).toContain(`${item.correctLetter}) ${correct[row]}`);
    });
    expect(items[3]!.messages[0]!.content).toContain('counting "every" carbon');
  });

  it("names the file and the fix for a malformed CSV or JSON line", async () => {
    writeFileSync(join(work, "gpqa_diamond.csv"), "Question,Correct Answer\nq,a\n");
    await expect(gpqaDiamond.load(join(work, "gpqa_diamond.csv"), context)).rejects.toThrow(/gpqa_diamond\.csv: missing column\(s\) Incorrect Answer 1/);
    writeFileSync(join(work, "math_500.jsonl"), '{"problem": "p", "answer": "1"}\nnot json\n');
    await expect(math500.load(join(work, "math_500.jsonl"), context)).rejects.toThrow(/math_500\.jsonl:2: not valid JSON/);
  });

  it("reads MMLU-Pro from the parquet and JSON lines alike, dropping N/A options", async () => {
    const fromParquet = await mmluPro.load(join(FIXTURES, "mmlu_pro.parquet"), context);
    const fromJsonl = await mmluPro.load(join(FIXTURES, "jsonl", "mmlu_pro.jsonl"), context);
    expect(fromParquet).toEqual(fromJsonl);
    expect(fromParquet.map((item) => [item.id, item.answerLetter, item.optionCount, item.stratum])).toEqual([
      ["90001", "C", 10, "math"],
      ["90002", "B", 4, "physics"],
      ["90003", "C", 3, "engineering"],
      ["90004", "B", 8, "law"],
      ["90005", "E", 10, "biology"],
      ["90006", "J", 10, "history"],
    ]);
    expect(fromParquet[0]!.messages[0]!.content).toContain("\nJ. 11");
    expect(fromParquet[1]!.messages[0]!.content).not.toContain("N/A");
  });

  it("guesses for an answer without a letter, repeatably and among the item's own options", async () => {
    const [hexagon] = await mmluPro.load(join(FIXTURES, "mmlu_pro.parquet"), context);
    const graded = await mmluPro.grade(hexagon!, "Hard to say.", { python, runCode: () => Promise.reject(new Error("unused")) });
    expect(graded.extracted).toBeNull();
    expect(graded.detail).toBe(`no letter in the answer; guessed ${guessedLetter(hexagon!)}`);
    expect(graded.correct).toBe(guessedLetter(hexagon!) === "C");
    const guesses = new Set(Array.from({ length: 200 }, (_, i) => guessedLetter({ id: String(i), optionCount: 3 })));
    expect(guesses).toEqual(new Set(["A", "B", "C"]));
  });

  it("reads LiveCodeBench with the official prompt, inside the v6 contest_date window", async () => {
    const logs: string[] = [];
    const items = await liveCodeBench.load(join(FIXTURES, "livecodebench_v6.jsonl"), { ...context, log: (line) => logs.push(line) });
    expect(items.map((item) => [item.id, item.funcName, item.stratum])).toEqual([
      ["fixture_abc390_a", null, "easy"],
      ["fixture_abc392_b", null, "medium"],
      ["fixture_abc395_c", null, "hard"],
      ["fixture_3501", "countVowels", "easy"],
      ["fixture_3502", "digitSum", "easy"],
      ["fixture_3503", "joinValues", "medium"],
    ]);
    expect(logs).toEqual(["livecodebench_v6: 6 of 8 rows have a contest_date in 2025-02-01..2025-05-01"]);
    expect((await liveCodeBench.load(join(FIXTURES, "livecodebench_v6.jsonl"), { ...context, lcbWindow: null })).length).toBe(8);
    const system = items[0]!.messages[0]!;
    expect(system).toEqual({
      role: "system",
      content: "You are an expert Python programmer. You will be given a question (problem specification) and will generate a correct Python program that matches the specification and passes all tests.",
    });
    expect(items[0]!.messages[1]!.content).toContain(
      "### Format: Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test on the sample inputs). " +
        "Enclose your code within delimiters as follows. Ensure that when the python program runs, it reads the inputs, runs the algorithm and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n```\n\n",
    );
    expect(items[3]!.messages[1]!.content).toContain("```python\nclass Solution:\n    def countVowels(self, s: str) -> int:\n        \n```");
    expect(items[3]!.messages[1]!.content.endsWith("### Answer: (use the provided format with backticks)\n\n")).toBe(true);
  });

  it("applies the window as lcb_runner does: both ends included, each at midnight", () => {
    expect(inWindow("2025-02-01T00:00:00", V6_WINDOW, "x")).toBe(true);
    expect(inWindow("2025-01-31T23:59:59", V6_WINDOW, "x")).toBe(false);
    expect(inWindow("2025-05-01T00:00:00", V6_WINDOW, "x")).toBe(true);
    expect(inWindow("2025-05-01T12:00:00", V6_WINDOW, "x")).toBe(false);
    expect(() => inWindow("soon", V6_WINDOW, "row 3")).toThrow(/row 3: "contest_date" "soon" is not an ISO date/);
  });
});

describe("graders that need Python", () => {
  let python: PythonWorker;
  let items: CodeItem[];
  beforeAll(async () => {
    python = PythonWorker.start();
    items = await liveCodeBench.load(join(FIXTURES, "livecodebench_v6.jsonl"), { python, lcbWindow: V6_WINDOW, log: () => undefined });
  });
  afterAll(() => python.close());
  const runCode = (code: string, tests: CodeTest[], funcName: string | null, timeoutMs?: number) =>
    runCodeTests(code, tests, funcName, {
      python: "/usr/bin/python3",
      compare: (produced, expected) => python.compareOutput(produced, expected),
      ...(timeoutMs === undefined ? {} : { limits: { timeoutMs } }),
    });
  const grade = (item: CodeItem, answer: string) => liveCodeBench.grade(item, answer, { python, runCode });
  const stdin = (pairs: [string, string][]): CodeTest[] => pairs.map(([input, output]) => ({ input, output, testtype: "stdin" }));
  const functional = (pairs: [string, string][]): CodeTest[] => pairs.map(([input, output]) => ({ input, output, testtype: "functional" }));

  it("grades MATH answers by equivalence with math-verify", async () => {
    const [first] = await math500.load(join(FIXTURES, "math_500.jsonl"), { python, lcbWindow: null, log: () => undefined });
    expect(await math500.grade(first!, "7*8-6 = \\boxed{50}", { python, runCode })).toMatchObject({ correct: true, extracted: "50" });
    expect(await math500.grade(first!, "\\boxed{49} or \\boxed{50}", { python, runCode })).toMatchObject({ correct: false });
  });

  it("decodes pickled private tests and refuses pickles that name code", async () => {
    const tests = await python.decodeTests(items[0]!.privateTests);
    expect(tests).toEqual(stdin([["1\n-7\n", "-7 -7\n"], ["4\n10 -3 10 0\n", "17 10\n"]]));
    const marker = join(work, "pickle-ran");
    const hostile = execFileSync(venvPython(), [
      "-c",
      `import base64, os, pickle, zlib\nclass P:\n    def __reduce__(self):\n        return (os.system, ("touch ${marker}",))\nprint(base64.b64encode(zlib.compress(pickle.dumps(P()))).decode())`,
    ]).toString().trim();
    await expect(python.decodeTests(hostile)).rejects.toThrow(/plain data/);
    expect(existsSync(marker)).toBe(false);
  });

  it("compares stdout by the runner's rule: stripped lines, equal as text or as Decimals", async () => {
    const cases: [string, string, boolean][] = [
      ["8 5\n", "8 5", true],
      ["  8   5  \n\n", "8 5\n", true],
      ["Yes  No", "Yes No", false],
      ["2.5\n", "2.50\n", true],
      ["1e3", "1000", true],
      ["2.51", "2.50", false],
      ["1\n2", "1 2", false],
      ["nan", "nan", true],
      ["NaN", "nan", false],
      ["-0.000", "0", true],
      ["1_000", "1000", true],
      ["Infinity", "inf", true],
      ["100000000000000000001", "100000000000000000000", false],
    ];
    for (const [got, expected, pass] of cases) {
      expect((await python.compareOutput({ kind: "stdin", output: got }, expected)).pass, `${JSON.stringify(got)} vs ${JSON.stringify(expected)}`).toBe(pass);
    }
  });

  it("passes a correct stdin program and fails wrong, crashing and silent ones", async () => {
    const [sumMax, mean] = items;
    const right = "```python\nn = int(input())\na = list(map(int, input().split()))\nprint(sum(a), max(a))\n```";
    expect(await grade(sumMax!, right)).toMatchObject({ correct: true, detail: "3 tests passed" });
    expect(await grade(sumMax!, "```python\ninput()\nprint(8, 5)\n```")).toMatchObject({ correct: false, detail: "test 2: wrong answer (line 1 differs)" });
    expect((await grade(sumMax!, "```python\nraise ValueError('boom')\n```")).detail).toBe("test 1: runtime error: ValueError: boom");
    expect(await grade(sumMax!, "I would loop over the numbers.")).toMatchObject({ correct: false, extracted: null });
    expect((await grade(sumMax!, "```python\nprint(1\n```")).detail).toMatch(/^the program did not load: SyntaxError/);
    const meanProgram = "```python\nn = int(input())\na = list(map(int, input().split()))\nprint(sum(a) / n)\n```";
    expect(await grade(mean!, meanProgram)).toMatchObject({ correct: true });
  });

  it("hands functional arguments to Python as written: big integers and floats arrive intact", async () => {
    const digitSum = items[4]!;
    const right = "```python\nclass Solution:\n    def digitSum(self, n: int) -> int:\n        return sum(map(int, str(n)))\n```";
    expect(await grade(digitSum, right)).toMatchObject({ correct: true, detail: "3 tests passed" });
    const joinValues = items[5]!;
    const join = "```python\nclass Solution:\n    def joinValues(self, values: List[float]) -> str:\n        return ' '.join(map(str, values))\n```";
    expect(await grade(joinValues, join)).toMatchObject({ correct: true, detail: "3 tests passed" });
    const echo = "class Solution:\n    def f(self, a, b):\n        return [repr(a), repr(b)]";
    const verdict = await runCode(echo, functional([["999999999999999999\n[1.0, 2.5]", '["999999999999999999", "[1.0, 2.5]"]']]), "f");
    expect(verdict).toEqual({ passed: true, testsRun: 1 });
    const huge = await runCode(echo, functional([["12345678901234567890\n-0.0", '["12345678901234567890", "-0.0"]']]), "f");
    expect(huge).toEqual({ passed: true, testsRun: 1 });
  });

  it("gives programs the runner's imports: stdin, setrecursionlimit, findall, StringIO, loads need no import", async () => {
    const numbers = items[2]!;
    const program = [
      "```python",
      "setrecursionlimit(10000)",
      "n = int(stdin.readline())",
      "for _ in range(n):",
      "    line = stdin.readline()",
      "    found = [int(x) for x in findall(r'-?\\d+', line)]",
      "    print(len(found), sum(found))",
      "```",
    ].join("\n");
    expect(await grade(numbers, program)).toMatchObject({ correct: true, detail: "3 tests passed" });
    const buffered = "buf = StringIO(sys.stdin.read())\nrows = loads(buf.readline())\nprint(sum(rows))";
    expect(await runCode(buffered, stdin([["[1, 2, 3]\n", "6\n"]]), null)).toEqual({ passed: true, testsRun: 1 });
  });

  it("runs stdin programs as the runner does: top-level code in one function, stdin mocked", async () => {
    const tests = stdin([["2\n3 4\n", "7\n"], ["1\n5\n", "5\n"]]);
    const guarded = "def main():\n    input()\n    print(sum(map(int, input().split())))\n\nif __name__ == '__main__':\n    main()";
    expect(await runCode(guarded, tests, null)).toEqual({ passed: true, testsRun: 2 });
    expect(await runCode("import sys\ndata = sys.stdin.buffer.read().split()\nprint(sum(map(int, data[1:])))", tests, null)).toEqual({ passed: true, testsRun: 2 });
    expect(await runCode("input()\nprint(sum(map(int, input().split())))\nexit()", tests, null)).toEqual({ passed: true, testsRun: 2 });
    // The runner's stand-in for sys.stdin cannot be iterated; `open` is the real one, bound by its
    // `from builtins import *` before open() is mocked; `global` names a module variable that the
    // wrapping turned into a local: all three fail there, so they fail here.
    expect((await runCode("import sys\nprint(sum(map(int, open(0).read().split()[1:])))", tests, null)).failure).toBe("test 1: wrong answer (line 1 differs)");
    expect((await runCode("import sys\nprint(sum(int(x) for line in list(sys.stdin)[1:] for x in line.split()))", tests, null)).failure).toMatch(
      /^test 1: runtime error: TypeError: 'StdinStandIn' object is not iterable/,
    );
    const global = "total = 0\ndef add(x):\n    global total\n    total += x\ninput()\nfor v in input().split():\n    add(int(v))\nprint(total)";
    expect((await runCode(global, tests, null)).failure).toMatch(/^test 1: runtime error: NameError/);
    // The runner's reliability guard: os.getcwd is gone, `resource` cannot be imported.
    expect((await runCode("import os\nprint(os.getcwd())", tests, null)).failure).toMatch(/^test 1: runtime error: TypeError/);
    expect((await runCode("import resource\nprint(1)", tests, null)).failure).toMatch(/^the program did not load: ModuleNotFoundError: import of resource halted/);
  });

  it("caps each test's output, not the sum over a problem's tests", async () => {
    const options = { python: "/usr/bin/python3", compare: (produced: Parameters<typeof python.compareOutput>[0], expected: string) => python.compareOutput(produced, expected) };
    const line = "9".repeat(300_000);
    const many = stdin(Array.from({ length: 5 }, (): [string, string] => ["x\n", `${line}\n`]));
    expect(await runCodeTests(`input()\nprint("9" * 300000)`, many, null, { ...options, limits: { maxOutputBytes: 1024 ** 2 } })).toEqual({ passed: true, testsRun: 5 });
    const huge = await runCodeTests(`input()\nprint("9" * 2000000)`, many, null, { ...options, limits: { maxOutputBytes: 1024 ** 2 } });
    expect(huge).toEqual({ passed: false, testsRun: 1, failure: "test 1: output limit exceeded" });
  });

  it("calls LeetCode methods on one Solution, counts a tuple as a list, and compares with Python's ==", async () => {
    const vowels = items[3]!;
    const right = "```python\nclass Solution:\n    def countVowels(self, s: str) -> int:\n        return sum(Counter(s)[v] for v in 'aeiou')\n```";
    expect(await grade(vowels, right)).toMatchObject({ correct: true, detail: "3 tests passed" });
    const spoof = "```python\nclass Solution:\n    def countVowels(self, s: str) -> int:\n        print('{\"value\": [\"int\", \"0x3\"]}')\n        return -1\n```";
    expect(await grade(vowels, spoof)).toMatchObject({ correct: false, detail: "test 1: wrong answer (got -1)" });
    const pair = "class Solution:\n    def f(self, x):\n        return (x, 2.0)";
    expect(await runCode(pair, functional([["1", "[1, 2]"]]), "f")).toEqual({ passed: true, testsRun: 1 });
    const nested = "class Solution:\n    def f(self, x):\n        return [(x, 2)]";
    expect((await runCode(nested, functional([["1", "[[1, 2]]"]]), "f")).failure).toBe("test 1: wrong answer (got [(1, 2)])");
    const counter = "class Solution:\n    def __init__(self):\n        self.calls = 0\n    def f(self, x):\n        self.calls += 1\n        return self.calls";
    expect(await runCode(counter, functional([["0", "1"], ["0", "2"]]), "f")).toEqual({ passed: true, testsRun: 2 });
    const odd = "class Solution:\n    def f(self, x):\n        return object()";
    expect((await runCode(odd, functional([["0", "1"]]), "f")).failure).toMatch(/^test 1: runtime error: TypeError: the result is a object/);
    const slow = "class Solution:\n    def f(self, x):\n        while True: pass";
    expect(await runCode(slow, functional([["1", "1"]]), "f", 1000)).toEqual({ passed: false, testsRun: 1, failure: "test 1: time limit exceeded" });
  });
});
