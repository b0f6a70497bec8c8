// MMLU-Pro, zero-shot with TIGER-Lab's chain-of-thought instruction: up to ten options lettered A–J and
// an answer that ends with "the answer is (X)". Reads the JSON-lines export or the published parquet.
import { asyncBufferFromFile, parquetReadObjects } from "hyparquet";

import { extractMmluProLetter } from "../extract.js";
import { idField, readJsonl, stringField, type Row } from "./read.js";
import type { Benchmark, EvalItem } from "./types.js";

const LETTERS = "ABCDEFGHIJ";

export interface MmluProItem extends EvalItem {
  answerLetter: string;
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

async function readRows(file: string, limit?: number): Promise<Row[]> {
  if (file.endsWith(".parquet")) {
    const buffer = await asyncBufferFromFile(file);
    return (await parquetReadObjects({ file: buffer, ...(limit === undefined ? {} : { rowEnd: limit }) })) as Row[];
  }
  return readJsonl(file, limit);
}

function toItem(row: Row, index: number, file: string): MmluProItem {
  const where = `${file} row ${index + 1}`;
  const options = row.options;
  if (!Array.isArray(options) || options.length < 3 || options.length > 10 || !options.every((o) => typeof o === "string")) {
    throw new Error(`${where}: "options" must be a list of 3 to 10 strings`);
  }
  const answerLetter = stringField(row, "answer", where).trim().toUpperCase();
  const position = LETTERS.indexOf(answerLetter);
  if (answerLetter.length !== 1 || position < 0 || position >= options.length) {
    throw new Error(`${where}: "answer" must be one of the option letters A–${LETTERS[options.length - 1]}, found ${JSON.stringify(row.answer)}`);
  }
  const category = typeof row.category === "string" ? row.category : null;
  return {
    id: idField(row, "question_id", index + 1),
    messages: [{ role: "user", content: mmluProPrompt(stringField(row, "question", where), options as string[], category) }],
    answerLetter,
  };
}

export const mmluPro: Benchmark<MmluProItem> = {
  name: "mmlu_pro",
  files: ["mmlu_pro.jsonl", "mmlu_pro.parquet"],

  async load(file, limit) {
    const rows = await readRows(file, limit);
    return rows.map((row, index) => toItem(row, index, file));
  },

  async grade(item, answer) {
    const letter = extractMmluProLetter(answer);
    return { correct: letter === item.answerLetter, extracted: letter };
  },
};
