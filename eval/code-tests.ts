// LiveCodeBench grading: a program passes when it passes every test (public and private), each run as
// its own sandboxed process. Stdin tests compare stdout the way the LiveCodeBench runner does; functional
// (LeetCode) tests call the named method and compare in Python (eval/sandbox_driver.py).
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";

import { evalFile } from "./paths.js";
import { runSandboxed, type SandboxLimits } from "./sandbox.js";

export interface CodeTest {
  input: string;
  output: string;
  testtype: "stdin" | "functional";
}

export interface CodeVerdict {
  passed: boolean;
  /** Tests run before the verdict (the run stops at the first failure). */
  testsRun: number;
  /** Why the first failing test failed. */
  failure?: string;
}

export interface CodeRunOptions {
  /** Interpreter for the program, executable by `nobody`. */
  python: string;
  limits?: Partial<SandboxLimits>;
}

// Read on first use: the CLI imports this module for every command, and `a2d serve` must start without
// eval's Python files.
let driver: string | undefined;
function sandboxDriver(): string {
  driver ??= readFileSync(evalFile("sandbox_driver.py"), "utf8");
  return driver;
}

export async function runCodeTests(
  code: string,
  tests: CodeTest[],
  funcName: string | null,
  options: CodeRunOptions,
): Promise<CodeVerdict> {
  if (tests.length === 0) throw new Error("a LiveCodeBench problem without test cases cannot be graded");
  for (let index = 0; index < tests.length; index += 1) {
    const test = tests[index]!;
    const failure =
      test.testtype === "functional"
        ? await runFunctionalTest(code, test, funcName, options)
        : await runStdinTest(code, test, options);
    if (failure !== null) return { passed: false, testsRun: index + 1, failure: `test ${index + 1}: ${failure}` };
  }
  return { passed: true, testsRun: tests.length };
}

async function runStdinTest(code: string, test: CodeTest, options: CodeRunOptions): Promise<string | null> {
  const result = await runSandboxed({
    files: { "solution.py": code, "driver.py": sandboxDriver() },
    argv: [options.python, "driver.py", "stdin"],
    stdin: test.input,
    limits: options.limits,
  });
  const abnormal = abnormalEnd(result);
  if (abnormal !== null) return abnormal;
  return stdoutMatches(result.stdout, test.output) ? null : "wrong answer";
}

async function runFunctionalTest(
  code: string,
  test: CodeTest,
  funcName: string | null,
  options: CodeRunOptions,
): Promise<string | null> {
  if (funcName === null) throw new Error("a functional LiveCodeBench test needs metadata.func_name");
  const nonce = randomBytes(16).toString("hex");
  // Each input line is one JSON-encoded argument.
  const args = test.input.split("\n").filter((line) => line.trim() !== "").map((line) => JSON.parse(line) as unknown);
  const result = await runSandboxed({
    files: {
      "solution.py": code,
      "driver.py": sandboxDriver(),
      "args.json": JSON.stringify(args),
      "expected.json": test.output,
      "nonce.txt": nonce,
    },
    argv: [options.python, "driver.py", "call", funcName],
    limits: options.limits,
  });
  const abnormal = abnormalEnd(result);
  if (abnormal !== null) return abnormal;
  const prefix = `A2D-VERDICT ${nonce} `;
  const line = result.stdout.split("\n").find((candidate) => candidate.startsWith(prefix));
  if (line === undefined) return "no verdict (the program did not return)";
  const verdict = JSON.parse(line.slice(prefix.length)) as { pass: boolean; got: string };
  return verdict.pass ? null : `wrong answer (got ${verdict.got})`;
}

function abnormalEnd(result: Awaited<ReturnType<typeof runSandboxed>>): string | null {
  if (result.timedOut) return "time limit exceeded";
  if (result.outputExceeded) return "output limit exceeded";
  if (result.exitCode !== 0) {
    const lastLine = result.stderr.trim().split("\n").pop() ?? "";
    return `runtime error (${result.signal ?? `exit ${result.exitCode}`}): ${lastLine.slice(0, 200)}`;
  }
  return null;
}

/**
 * LiveCodeBench's stdout rule: strip both texts, split into lines, strip each line; the line counts
 * must match and each line must be equal or, token by token, equal as decimal numbers.
 */
export function stdoutMatches(got: string, expected: string): boolean {
  const gotLines = got.trim().split("\n").map((line) => line.trim());
  const expectedLines = expected.trim().split("\n").map((line) => line.trim());
  if (gotLines.length !== expectedLines.length) return false;
  return gotLines.every((line, index) => line === expectedLines[index] || decimalLinesEqual(line, expectedLines[index]!));
}

function decimalLinesEqual(a: string, b: string): boolean {
  const left = a.split(/\s+/).filter(Boolean).map(canonicalDecimal);
  const right = b.split(/\s+/).filter(Boolean).map(canonicalDecimal);
  if (left.length !== right.length || left.some((x) => x === null) || right.some((x) => x === null)) return false;
  return left.every((value, index) => value === right[index]);
}

/**
 * A canonical spelling of a decimal literal as Python's Decimal reads it, so equal values compare
 * equal as strings ("1.50" = "1.5" = "15e-1", "-0" = "0"); null when the token is not a number.
 * NaN is null too, since NaN equals nothing.
 */
export function canonicalDecimal(token: string): string | null {
  const match = /^([+-]?)(?:(inf(?:inity)?)|(\d+(?:_\d+)*)?(?:\.(\d+(?:_\d+)*)?)?(?:[eE]([+-]?\d+(?:_\d+)*))?)$/i.exec(token);
  if (match === null) return null;
  const [, sign, infinity, whole = "", fraction = "", exponent = "0"] = match;
  if (infinity !== undefined) return `${sign === "-" ? "-" : ""}inf`;
  if (whole === "" && fraction === "") return null;
  const digits = (whole + fraction).replace(/_/g, "");
  let scale = BigInt(exponent.replace(/_/g, "")) - BigInt(fraction.replace(/_/g, "").length);
  let mantissa = digits.replace(/^0+/, "");
  if (mantissa === "") return "0";
  const trailing = mantissa.length - mantissa.replace(/0+$/, "").length;
  mantissa = mantissa.slice(0, mantissa.length - trailing);
  scale += BigInt(trailing);
  return `${sign === "-" ? "-" : ""}${mantissa}e${scale}`;
}
