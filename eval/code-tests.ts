// LiveCodeBench grading: a program passes when it passes every test (public, then private). One
// sandboxed process runs the program against the tests' inputs in order (eval/sandbox_driver.py, the
// official runner's rules) and reports each test's output; the expected outputs stay here, and the
// comparison happens outside the sandbox (eval/grader_worker.py, the runner's rules: stdout lines
// stripped and equal or equal as decimals; functional results equal with Python's ==). The first
// failing test ends the run, as in the runner.
import { readFileSync } from "node:fs";

import { evalFile } from "./paths.js";
import { DEFAULT_LIMITS, interpreterPaths, openSandboxSession, type SandboxLimits, type SandboxSession } from "./sandbox.js";

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

/** What a test produced, as the driver reports it. */
export type TestOutput = { kind: "stdin"; output: string } | { kind: "functional"; value: unknown };

/** Compares one test's output with its expected output, outside the sandbox. */
export type CompareOutput = (produced: TestOutput, expected: string) => Promise<{ pass: boolean; reason?: string }>;

export interface CodeRunOptions {
  /** Interpreter for the program, run as `nobody` in the sandbox. */
  python: string;
  compare: CompareOutput;
  /** timeoutMs is per test (the runner's 6 s); the other limits hold for the whole run. */
  limits?: Partial<SandboxLimits>;
}

// Read on first use: the CLI imports this module for every command, and `a2d serve` must start without
// eval's Python files.
let driver: string | undefined;
function sandboxDriver(): string {
  driver ??= readFileSync(evalFile("sandbox_driver.py"), "utf8");
  return driver;
}

type DriverMessage = { compiled?: boolean; error?: string; output?: string; value?: unknown };

/**
 * Runs `code` on `tests`. As in the runner, the mode comes from the problem, not the tests: with a
 * func_name every test is a call of it, without one every test feeds stdin.
 */
export async function runCodeTests(code: string, tests: CodeTest[], funcName: string | null, options: CodeRunOptions): Promise<CodeVerdict> {
  if (tests.length === 0) throw new Error("a LiveCodeBench problem without test cases cannot be graded");
  const perTestMs = options.limits?.timeoutMs ?? DEFAULT_LIMITS.timeoutMs;
  const perTestSeconds = Math.ceil(perTestMs / 1000);
  // The runner's global limit for one program: (timeout + 1) s per test + 5 s.
  const wholeRunMs = ((perTestSeconds + 1) * tests.length + 5) * 1000;
  const session = await openSandboxSession({
    files: { "solution.py": code, "driver.py": sandboxDriver(), "inputs.json": JSON.stringify(tests.map((test) => test.input)) },
    argv: [options.python, "driver.py", ...(funcName === null ? ["stdin"] : ["call", funcName])],
    limits: { ...options.limits, timeoutMs: wholeRunMs },
    readOnlyPaths: interpreterPaths(options.python),
  });
  try {
    const compiled = await nextMessage(session, perTestMs);
    if (compiled.kind !== "message") return { passed: false, testsRun: 0, failure: await abnormalEnd(compiled, session, "while loading the program") };
    if (compiled.message.compiled !== true) {
      return { passed: false, testsRun: 0, failure: `the program did not load: ${compiled.message.error ?? "unknown error"}` };
    }
    for (let index = 0; index < tests.length; index += 1) {
      const test = tests[index]!;
      const at = `test ${index + 1}`;
      session.send("next");
      const reply = await nextMessage(session, perTestMs);
      if (reply.kind !== "message") return { passed: false, testsRun: index + 1, failure: `${at}: ${await abnormalEnd(reply, session)}` };
      const { message } = reply;
      if (typeof message.error === "string") return { passed: false, testsRun: index + 1, failure: `${at}: runtime error: ${message.error}` };
      const produced: TestOutput | null =
        funcName === null
          ? typeof message.output === "string"
            ? { kind: "stdin", output: message.output }
            : null
          : "value" in message
            ? { kind: "functional", value: message.value }
            : null;
      if (produced === null) return { passed: false, testsRun: index + 1, failure: `${at}: the program broke the test protocol` };
      const verdict = await options.compare(produced, test.output);
      if (!verdict.pass) return { passed: false, testsRun: index + 1, failure: `${at}: wrong answer${verdict.reason ? ` (${verdict.reason})` : ""}` };
    }
    return { passed: true, testsRun: tests.length };
  } finally {
    session.kill();
    await session.result;
  }
}

type Next = { kind: "message"; message: DriverMessage } | { kind: "timeout" } | { kind: "ended" } | { kind: "garbled" };

/** The driver's next line within `ms`; a timeout kills the run. */
async function nextMessage(session: SandboxSession, ms: number): Promise<Next> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<Next>((resolve) => {
    timer = setTimeout(() => resolve({ kind: "timeout" }), ms);
  });
  const line = session.messages.next().then((item): Next => {
    if (item.done) return { kind: "ended" };
    try {
      const message = JSON.parse(item.value) as unknown;
      return typeof message === "object" && message !== null ? { kind: "message", message: message as DriverMessage } : { kind: "garbled" };
    } catch {
      return { kind: "garbled" };
    }
  });
  try {
    return await Promise.race([line, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

async function abnormalEnd(next: Next, session: SandboxSession, when = ""): Promise<string> {
  const suffix = when ? ` ${when}` : "";
  if (next.kind === "timeout") return `time limit exceeded${suffix}`;
  session.kill();
  const result = await session.result;
  // A run cut off for its output leaves a torn last message: the cut is the reason.
  if (result.outputExceeded) return `output limit exceeded${suffix}`;
  if (result.timedOut) return `time limit exceeded${suffix}`;
  if (next.kind === "garbled") return `the program broke the test protocol${suffix}`;
  const lastLine = result.stderr.trim().split("\n").pop() ?? "";
  return `the program died${suffix} (${result.signal ?? `exit ${result.exitCode}`}): ${lastLine.slice(0, 200)}`;
}
