// LiveCodeBench v6 code generation (the code_generation_lite layout), with the official chat prompt
// (lcb_runner's generic chat format): the system message, the question, and a format section that
// either shows the LeetCode starter code (functional tests call metadata.func_name) or asks for a
// stdin/stdout program. pass@1 with one sample: the code between the answer's last two ``` lines must
// pass every public and private test. Rows outside the v6 contest_date window are left out.
import { extractCode } from "../extract.js";
import type { CodeTest } from "../code-tests.js";
import { idField, readJsonl, stringField, type Row } from "./read.js";
import type { Benchmark, DateWindow, EvalItem } from "./types.js";

export interface CodeItem extends EvalItem {
  publicTests: CodeTest[];
  /** The raw private_test_cases field, decoded only when graded (it can be megabytes per problem). */
  privateTests: string;
  funcName: string | null;
}

const SYSTEM_MESSAGE =
  "You are an expert Python programmer. You will be given a question (problem specification) and will generate a correct " +
  "Python program that matches the specification and passes all tests.";
const FORMAT_WITH_STARTER = "You will use the following starter code to write the solution to the problem and enclose your code within delimiters.";
const FORMAT_STDIN =
  "Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test on the sample inputs). " +
  "Enclose your code within delimiters as follows. Ensure that when the python program runs, it reads the inputs, runs the " +
  "algorithm and writes output to STDOUT.";

/**
 * LiveCodeBench v6 as model cards report it ("v6 (25.02-25.05)"): the problems release_v6 added over
 * release_v5, 175 of its 1055 (LiveCodeBench README: 880 in v5).
 */
export const V6_WINDOW: DateWindow = { from: "2025-02-01", to: "2025-05-01" };
export const V6_PROBLEMS = 175;

export function codePrompt(question: string, starterCode: string): string {
  const format = starterCode
    ? `### Format: ${FORMAT_WITH_STARTER}\n\`\`\`python\n${starterCode}\n\`\`\`\n\n`
    : `### Format: ${FORMAT_STDIN}\n\`\`\`python\n# YOUR CODE HERE\n\`\`\`\n\n`;
  return `### Question:\n${question}\n\n${format}### Answer: (use the provided format with backticks)\n\n`;
}

export function parseTests(text: string, where: string): CodeTest[] {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new Error(`${where}: test cases are not valid JSON`);
  }
  if (!Array.isArray(value)) throw new Error(`${where}: test cases must be a JSON list`);
  return value.map((test: Row, index) => {
    const at = `${where} test ${index + 1}`;
    const testtype = stringField(test, "testtype", at);
    if (testtype !== "stdin" && testtype !== "functional") throw new Error(`${at}: testtype must be "stdin" or "functional"`);
    return { input: stringField(test, "input", at), output: stringField(test, "output", at), testtype };
  });
}

/** "2025-02-03T00:00:00" or "2025-02-03 00:00:00" or "2025-02-03" as a sortable "YYYY-MM-DDTHH:MM:SS". */
function sortableDate(text: string, where: string): string {
  const match = /^(\d{4}-\d{2}-\d{2})(?:[T ](\d{2}:\d{2}(?::\d{2})?))?/.exec(text.trim());
  if (match === null) throw new Error(`${where}: "contest_date" ${JSON.stringify(text)} is not an ISO date`);
  const time = match[2] ?? "00:00:00";
  return `${match[1]}T${time.length === 5 ? `${time}:00` : time}`;
}

/** lcb_runner's filter: start_date <= contest_date <= end_date, the ends being midnight of those days. */
export function inWindow(contestDate: string, window: DateWindow, where: string): boolean {
  const date = sortableDate(contestDate, where);
  return sortableDate(window.from, "--lcb-dates") <= date && date <= sortableDate(window.to, "--lcb-dates");
}

function funcNameOf(row: Row, where: string): string | null {
  let metadata = row.metadata ?? {};
  if (typeof metadata === "string") {
    try {
      metadata = metadata.trim() === "" ? {} : JSON.parse(metadata);
    } catch {
      throw new Error(`${where}: "metadata" is not valid JSON`);
    }
  }
  const name = (metadata as Row).func_name;
  return typeof name === "string" && name !== "" ? name : null;
}

export const liveCodeBench: Benchmark<CodeItem> = {
  name: "livecodebench_v6",
  files: ["livecodebench_v6.jsonl"],
  fullSize: V6_PROBLEMS,
  needsPython: true,

  async load(file, context) {
    const rows = await readJsonl(file);
    const { lcbWindow } = context;
    const kept = rows.flatMap((row, index) => {
      const where = `${file} row ${index + 1}`;
      if (lcbWindow === null) return [{ row, where }];
      return inWindow(stringField(row, "contest_date", where), lcbWindow, where) ? [{ row, where }] : [];
    });
    if (lcbWindow !== null) {
      context.log(`livecodebench_v6: ${kept.length} of ${rows.length} rows have a contest_date in ${lcbWindow.from}..${lcbWindow.to}`);
    }
    return kept.map(({ row, where }, index) => {
      const starterCode = typeof row.starter_code === "string" ? row.starter_code : "";
      const publicTests = parseTests(stringField(row, "public_test_cases", where), `${where} public_test_cases`);
      const item: CodeItem = {
        id: idField(row, "question_id", index + 1),
        messages: [
          { role: "system", content: SYSTEM_MESSAGE },
          { role: "user", content: codePrompt(stringField(row, "question_content", where), starterCode) },
        ],
        stratum: typeof row.difficulty === "string" && row.difficulty !== "" ? row.difficulty : "all",
        publicTests,
        privateTests: typeof row.private_test_cases === "string" ? row.private_test_cases : "[]",
        funcName: funcNameOf(row, where),
      };
      if (item.funcName === null && publicTests.some((test) => test.testtype === "functional")) {
        throw new Error(`${where}: functional tests need "metadata" with func_name`);
      }
      return item;
    });
  },

  async grade(item, answer, context) {
    const code = extractCode(answer);
    if (code === null) return { correct: false, extracted: null, detail: "no fenced code block in the answer (fewer than two ``` lines)" };
    const privateTests = item.privateTests.trim() === "" ? [] : await context.python.decodeTests(item.privateTests);
    const verdict = await context.runCode(code, [...item.publicTests, ...privateTests], item.funcName);
    return { correct: verdict.passed, extracted: "code", detail: verdict.failure ?? `${verdict.testsRun} tests passed` };
  },
};
