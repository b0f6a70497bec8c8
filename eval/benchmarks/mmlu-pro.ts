// MMLU-Pro, zero-shot with TIGER-Lab's chain-of-thought instruction: the options lettered A–J ("N/A"
// placeholders dropped, as TIGER-Lab's preprocess does) and an answer that ends with "the answer is (X)".
// Reads the published parquet or a JSON-lines export. An answer with no letter gets a guess, as
// TIGER-Lab scores it; the guess is seeded by the question id, so a run is repeatable.
import { createHash } from "node:crypto";

import { asyncBufferFromFile, parquetReadObjects } from "hyparquet";

import { extractMmluProLetter } from "../extract.js";
import { idField, readJsonl, stringField, type Row } from "./read.js";
import type { Benchmark, EvalItem } from "./types.js";

const LETTERS = "ABCDEFGHIJ";

export interface MmluProItem extends EvalItem {
  answerLetter: string;
  optionCount: number;
}

export function mmluProPrompt(question: string, options: readonly string[], category: string | null): string {
  const subject = category ? ` about ${category}` : "";
  return [
    `The following is a multiple choice question${subject}. Think step by step and then finish your answer with ` +
      `"the answer is (X)" where X is the correct letter choice.`,
    "",
    `Question: ${question}`,
    "Options:",
    ...options.map((option, index) => `${LETTERS[index]}. ${option}`),
  ].join("\n");
}

async function readRows(file: string): Promise<Row[]> {
  if (file.endsWith(".parquet")) return (await parquetReadObjects({ file: await asyncBufferFromFile(file) })) as Row[];
  return readJsonl(file);
}

function toItem(row: Row, index: number, file: string): MmluProItem {
  const where = `${file} row ${index + 1}`;
  const published = row.options;
  if (!Array.isArray(published) || !published.every((o) => typeof o === "string")) throw new Error(`${where}: "options" must be a list of strings`);
  const options = (published as string[]).filter((option) => option !== "N/A");
  if (options.length < 2 || options.length > 10) throw new Error(`${where}: "options" must hold 2 to 10 options besides "N/A", found ${options.length}`);
  const answerLetter = stringField(row, "answer", where).trim().toUpperCase();
  const position = LETTERS.indexOf(answerLetter);
  if (answerLetter.length !== 1 || position < 0 || position >= options.length) {
    throw new Error(`${where}: "answer" must be one of the option letters A–${LETTERS[options.length - 1]}, found ${JSON.stringify(row.answer)}`);
  }
  const category = typeof row.category === "string" && row.category !== "" ? row.category : null;
  return {
    id: idField(row, "question_id", index + 1),
    messages: [{ role: "user", content: mmluProPrompt(stringField(row, "question", where), options, category) }],
    stratum: category ?? "all",
    answerLetter,
    optionCount: options.length,
  };
}

/** TIGER-Lab picks a random option when no letter is found; here the pick is seeded by the item id. */
export function guessedLetter(item: Pick<MmluProItem, "id" | "optionCount">): string {
  const digest = createHash("sha256").update(`mmlu_pro guess:${item.id}`).digest();
  return LETTERS[digest.readUInt32BE(0) % item.optionCount]!;
}

export const mmluPro: Benchmark<MmluProItem> = {
  name: "mmlu_pro",
  files: ["mmlu_pro.parquet", "mmlu_pro.jsonl"],
  fullSize: 12_032,
  needsPython: false,

  async load(file) {
    const rows = await readRows(file);
    return rows.map((row, index) => toItem(row, index, file));
  },

  async grade(item, answer) {
    const letter = extractMmluProLetter(answer);
    if (letter !== null) return { correct: letter === item.answerLetter, extracted: letter };
    const guess = guessedLetter(item);
    return { correct: guess === item.answerLetter, extracted: null, detail: `no letter in the answer; guessed ${guess}` };
  },
};
