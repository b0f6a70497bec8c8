// GPQA-Diamond as simple-evals runs it: the four answers shuffled with a fixed seed, the model asked to
// end with `Answer: $LETTER`. The shuffle is seeded by the question text, so an item's letter order does
// not depend on row order or --limit.
import { createHash } from "node:crypto";
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

/** A permutation of 0..n-1 drawn from sha256(seed text): Fisher–Yates over the digest's 32-bit words. */
export function seededPermutation(seedText: string, n: number): number[] {
  const digest = createHash("sha256").update(seedText).digest();
  const order = Array.from({ length: n }, (_, index) => index);
  for (let i = n - 1; i > 0; i -= 1) {
    const j = digest.readUInt32BE(((n - 1 - i) * 4) % 32) % (i + 1);
    [order[i], order[j]] = [order[j]!, order[i]!];
  }
  return order;
}

export const gpqaDiamond: Benchmark<GpqaItem> = {
  name: "gpqa_diamond",
  files: ["gpqa_diamond.csv"],

  async load(file, limit) {
    const records = parse(await readFile(file, "utf8"), { columns: true, skip_empty_lines: true, bom: true }) as Record<string, string>[];
    const first = records[0];
    if (first === undefined) throw new Error(`${file}: no rows`);
    const missing = COLUMNS.filter((column) => !(column in first));
    if (missing.length > 0) {
      throw new Error(`${file}: missing column(s) ${missing.join(", ")}; expected the published GPQA CSV header`);
    }
    return records.slice(0, limit).map((record, index) => {
      const values = COLUMNS.map((column) => (record[column] ?? "").trim());
      const empty = values.findIndex((value) => value === "");
      if (empty >= 0) throw new Error(`${file}: row ${index + 2} has an empty "${COLUMNS[empty]}"`);
      // answers[0] is the correct one.
      const [question, ...answers] = values as [string, ...string[]];
      const order = seededPermutation(`gpqa:${question}`, 4);
      const choices = order.map((source) => answers[source]!);
      return {
        id: record["Record ID"]?.trim() || String(index + 1),
        messages: [{ role: "user", content: gpqaPrompt(question, choices) }],
        correctLetter: LETTERS[order.indexOf(0)]!,
      };
    });
  },

  async grade(item, answer) {
    const letter = extractGpqaLetter(answer);
    return { correct: letter === item.correctLetter, extracted: letter };
  },
};
