// GPQA-Diamond as simple-evals runs it: the four answers put in the order simple-evals gives the row
// (random.Random(0), one rng.sample(range(4), 4) per row in file order: its first repeat), the model
// asked to end with `Answer: $LETTER`.
import { readFile } from "node:fs/promises";

import { parse } from "csv-parse/sync";

import { extractGpqaLetter } from "../extract.js";
import type { Benchmark, EvalItem } from "./types.js";

const COLUMNS = ["Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"] as const;
const LETTERS = ["A", "B", "C", "D"] as const;

export interface GpqaItem extends EvalItem {
  correctLetter: string;
}

export function gpqaPrompt(question: string, choices: readonly string[]): string {
  return [
    "Answer the following multiple choice question. The last line of your response should be of the following format: " +
      "'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. Think step by step before answering.",
    "",
    question,
    "",
    ...choices.map((choice, index) => `${LETTERS[index]}) ${choice}`),
  ].join("\n");
}

export const gpqaDiamond: Benchmark<GpqaItem> = {
  name: "gpqa_diamond",
  files: ["gpqa_diamond.csv"],
  fullSize: 198,
  needsPython: true,

  async load(file, context) {
    const records = parse(await readFile(file, "utf8"), { columns: true, skip_empty_lines: true, bom: true }) as Record<string, string>[];
    const first = records[0];
    if (first === undefined) throw new Error(`${file}: no rows`);
    const missing = COLUMNS.filter((column) => !(column in first));
    if (missing.length > 0) {
      throw new Error(`${file}: missing column(s) ${missing.join(", ")}; expected the published GPQA CSV header`);
    }
    if (context.python === null) throw new Error("internal: GPQA's answer order needs the Python grader");
    const permutations = await context.python.gpqaPermutations(records.length);
    return records.map((record, index) => {
      const values = COLUMNS.map((column) => record[column] ?? "");
      const empty = values.findIndex((value) => value.trim() === "");
      if (empty >= 0) throw new Error(`${file}: row ${index + 2} has an empty "${COLUMNS[empty]}"`);
      // answers[0] is the correct one.
      const [question, ...answers] = values as [string, ...string[]];
      const choices = permutations[index]!.map((source) => answers[source]!);
      return {
        id: record["Record ID"]?.trim() || String(index + 1),
        messages: [{ role: "user", content: gpqaPrompt(question, choices) }],
        stratum: record["High-level domain"]?.trim() || "all",
        // simple-evals: choices.index(correct answer), the first choice with that text.
        correctLetter: LETTERS[choices.indexOf(answers[0]!)]!,
      };
    });
  },

  async grade(item, answer) {
    const letter = extractGpqaLetter(answer);
    return { correct: letter === item.correctLetter, extracted: letter };
  },
};
