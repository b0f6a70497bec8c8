// MATH-500: the problem with the usual instruction to reason and box the final answer; graded by
// math-verify (eval/grader_worker.py), which accepts equivalent forms (14/3 = \frac{14}{3}, 0.5 = 1/2).
import { idField, readJsonl, stringField } from "./read.js";
import type { Benchmark, EvalItem } from "./types.js";

export interface MathItem extends EvalItem {
  gold: string;
}

export function mathPrompt(problem: string): string {
  return `${problem}\nPlease reason step by step, and put your final answer within \\boxed{}.`;
}

export const math500: Benchmark<MathItem> = {
  name: "math_500",
  files: ["math_500.jsonl"],
  fullSize: 500,
  needsPython: true,

  async load(file) {
    const rows = await readJsonl(file);
    return rows.map((row, index) => {
      const where = `${file} row ${index + 1}`;
      return {
        id: idField(row, "unique_id", index + 1),
        messages: [{ role: "user", content: mathPrompt(stringField(row, "problem", where)) }],
        stratum: typeof row.subject === "string" && row.subject !== "" ? row.subject : "all",
        gold: stringField(row, "answer", where),
      };
    });
  },

  async grade(item, answer, context) {
    if (answer.trim() === "") return { correct: false, extracted: null };
    return context.python.gradeMath(item.gold, answer);
  },
};
