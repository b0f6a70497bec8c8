// Answer extraction, table-driven: the endings in eval/fixtures/endings/*.json (at least 30 per benchmark)
// are what reasoning and non-reasoning models write last. Each row states what a2d must read and, where
// the official harness reads differently, what it reads; bench/reference_grader.py, written from the
// harnesses' rules apart from eval/, must agree with both columns.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { math500, type MathItem } from "../eval/benchmarks/math-500.js";
import { extractCode, extractGpqaLetter, extractMmluProLetter, finalAnswer } from "../eval/extract.js";
import { venvPython } from "../eval/paths.js";
import { PythonWorker } from "../eval/python-worker.js";

const ROOT = join(import.meta.dirname, "..");
const ENDINGS = join(ROOT, "eval", "fixtures", "endings");

interface Row<T> {
  content: string;
  expected: T;
  official?: T;
}
const table = <T>(name: string) => (JSON.parse(readFileSync(join(ENDINGS, `${name}.json`), "utf8")) as { rows: Row<T>[] }).rows;
const gpqa = table<string | null>("gpqa_diamond");
const mmlu = table<string | null>("mmlu_pro");
const code = table<string | null>("livecodebench_v6");
const math = (JSON.parse(readFileSync(join(ENDINGS, "math_500.json"), "utf8")) as { rows: { gold: string; content: string; correct: boolean }[] }).rows;

function reference(rules: "a2d" | "official"): Record<string, unknown[]> {
  const out = execFileSync(venvPython(), [join(ROOT, "bench", "reference_grader.py"), "endings", ENDINGS, "--rules", rules], { encoding: "utf8" });
  return JSON.parse(out) as Record<string, unknown[]>;
}

describe("answer endings", () => {
  it("has at least 30 endings per benchmark", () => {
    for (const rows of [gpqa, mmlu, code, math]) expect(rows.length).toBeGreaterThanOrEqual(30);
  });

  it.each(gpqa.map((row) => [row.content, row.expected] as const))("GPQA reads %j as %s", (content, expected) => {
    expect(extractGpqaLetter(finalAnswer(content))).toBe(expected);
  });

  it.each(mmlu.map((row) => [row.content, row.expected] as const))("MMLU-Pro reads %j as %s", (content, expected) => {
    expect(extractMmluProLetter(finalAnswer(content))).toBe(expected);
  });

  it.each(code.map((row) => [row.content, row.expected] as const))("LiveCodeBench reads %j as %j", (content, expected) => {
    expect(extractCode(finalAnswer(content))).toBe(expected);
  });

  describe("MATH-500 through math-verify", () => {
    let python: PythonWorker;
    beforeAll(() => {
      python = PythonWorker.start();
    });
    afterAll(() => python.close());

    it("grades every ending as the table says", async () => {
      const context = { python, runCode: () => Promise.reject(new Error("no code here")) };
      const graded = [];
      for (const row of math) {
        const item: MathItem = { id: "t", messages: [], stratum: "all", gold: row.gold };
        graded.push((await math500.grade(item, finalAnswer(row.content), context)).correct);
      }
      expect(graded).toEqual(math.map((row) => row.correct));
    });
  });

  it("agrees with the reference grader under a2d's rules, and differs from the official ones only where the table says", () => {
    const ours = reference("a2d");
    expect(ours.gpqa_diamond).toEqual(gpqa.map((row) => row.expected));
    expect(ours.mmlu_pro).toEqual(mmlu.map((row) => row.expected));
    expect(ours.livecodebench_v6).toEqual(code.map((row) => row.expected));
    expect(ours.math_500).toEqual(math.map((row) => row.correct));
    const official = reference("official");
    expect(official.gpqa_diamond).toEqual(gpqa.map((row) => ("official" in row ? row.official : row.expected)));
    expect(official.mmlu_pro).toEqual(mmlu.map((row) => row.expected));
    expect(official.livecodebench_v6).toEqual(code.map((row) => row.expected));
    // Departures from simple-evals are only fallbacks where it reads nothing, and words it misreads as letters.
    const departures = gpqa.filter((row) => "official" in row);
    for (const row of departures) expect(row.official === null || row.expected === null || row.content.includes("because")).toBe(true);
  });
});
