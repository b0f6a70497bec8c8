// LiveCodeBench v6 code generation (the code_generation_lite layout), with the official chat prompt:
// the system message, the question, and a format section that either shows the LeetCode starter code
// (functional tests call metadata.func_name) or asks for a stdin/stdout program. pass@1 with one sample:
// the last fenced code block of the answer must pass every public and private test.
import { extractCode } from "../extract.js";
import type { CodeTest } from "../code-tests.js";
import { idField, readJsonl, stringField, type Row } from "./read.js";
import type { Benchmark, EvalItem } from "./types.js";

export interface CodeItem extends EvalItem {
  publicTests: CodeTest[];
  /** The raw private_test_cases field, decoded only when graded (it can be megabytes per problem). */
  privateTests: string;
  funcName: string | null;
}

const SYSTEM_MESSAGE =
  "You are an expert Python programmer. You will be given a question (problem specification) and will generate a correct " +
  "Python program that matches the specification and passes all tests. You will NOT return anything except for the program.";
const FORMAT_WITH_STARTER = "You will use the following starter code to write the solution to the problem and enclose your code within delimiters.";
const FORMAT_STDIN =
  "Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test on the sample inputs). " +
  "Enclose your code within delimiters as follows.";

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

  async load(file, limit) {
    const rows = await readJsonl(file, limit);
    return rows.map((row, index) => {
      const where = `${file} row ${index + 1}`;
      const starterCode = typeof row.starter_code === "string" ? row.starter_code : "";
      const publicTests = parseTests(stringField(row, "public_test_cases", where), `${where} public_test_cases`);
      const item: CodeItem = {
        id: idField(row, "question_id", index + 1),
        messages: [
          { role: "system", content: SYSTEM_MESSAGE },
          { role: "user", content: codePrompt(stringField(row, "question_content", where), starterCode) },
        ],
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
    if (code === null) return { correct: false, extracted: null, detail: "no fenced code block in the answer" };
    const privateTests = item.privateTests.trim() === "" ? [] : await context.python.decodeTests(item.privateTests);
    const verdict = await context.runCode(code, [...item.publicTests, ...privateTests], item.funcName);
    return { correct: verdict.passed, extracted: "code", detail: verdict.failure ?? `${verdict.testsRun} tests passed` };
  },
};
