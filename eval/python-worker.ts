// The long-lived Python grader (eval/grader_worker.py): MATH answers through math-verify, the
// decoding of LiveCodeBench's pickled private tests and the comparison of their outputs, and GPQA's
// answer orders (Python's own random). One process for the whole run, since importing
// math-verify and sympy takes seconds; requests are answered strictly in order.
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { existsSync } from "node:fs";
import { createInterface } from "node:readline";

import type { CodeTest, TestOutput } from "./code-tests.js";
import { evalFile, venvPython } from "./paths.js";

interface Pending {
  resolve: (reply: Record<string, unknown>) => void;
  reject: (error: Error) => void;
}

/** The worker process is gone: every later grade would fail too. */
export class GraderExited extends Error {
  override name = "GraderExited";
}

export interface MathGrade {
  correct: boolean;
  extracted: string | null;
}

export class PythonWorker {
  private readonly pending: Pending[] = [];
  private stderr = "";
  private exited: GraderExited | null = null;

  private constructor(private readonly child: ChildProcessWithoutNullStreams) {
    createInterface({ input: child.stdout }).on("line", (line) => {
      const waiter = this.pending.shift();
      if (waiter === undefined) return;
      try {
        waiter.resolve(JSON.parse(line) as Record<string, unknown>);
      } catch {
        waiter.reject(new Error(`grader worker wrote a non-JSON line: ${line.slice(0, 200)}`));
      }
    });
    child.stderr.on("data", (chunk: Buffer) => {
      this.stderr = (this.stderr + chunk.toString("utf8")).slice(-4000);
    });
    child.on("exit", (code, signal) => {
      this.exited = new GraderExited(
        `the Python grader (eval/grader_worker.py) exited (${signal ?? `code ${code}`}): ${this.stderr.trim().slice(-1000)}`,
      );
      for (const waiter of this.pending.splice(0)) waiter.reject(this.exited);
    });
  }

  /** Starts the worker with `python` (default: the project venv, which has math-verify). */
  static start(python = venvPython()): PythonWorker {
    if (!existsSync(python)) {
      throw new Error(`Python for grading not found at ${python}; run \`npm run build:py\` to create the venv, or pass --grader-python`);
    }
    const child = spawn(python, [evalFile("grader_worker.py")], { stdio: ["pipe", "pipe", "pipe"] });
    // A write to a worker that died surfaces through its exit handler, with its stderr.
    child.stdin.on("error", () => undefined);
    return new PythonWorker(child);
  }

  private async call(request: Record<string, unknown>): Promise<Record<string, unknown>> {
    if (this.exited) throw this.exited;
    const reply = await new Promise<Record<string, unknown>>((resolve, reject) => {
      this.pending.push({ resolve, reject });
      this.child.stdin.write(`${JSON.stringify(request)}\n`);
    });
    if (typeof reply.error === "string") throw new Error(`grader: ${reply.error}`);
    return reply;
  }

  async gradeMath(gold: string, answer: string): Promise<MathGrade> {
    const reply = await this.call({ op: "math", gold, answer });
    return { correct: reply.correct === true, extracted: typeof reply.extracted === "string" ? reply.extracted : null };
  }

  /** Decodes a `private_test_cases` field: a JSON list, or base64(zlib(pickle(JSON))) as published. */
  async decodeTests(data: string): Promise<CodeTest[]> {
    const reply = await this.call({ op: "lcb_tests", data });
    return reply.tests as CodeTest[];
  }

  /** LiveCodeBench's comparison of one test's output with the expected one. */
  async compareOutput(produced: TestOutput, expected: string): Promise<{ pass: boolean; reason?: string }> {
    const reply =
      produced.kind === "stdin"
        ? await this.call({ op: "lcb_stdout", got: produced.output, expected })
        : await this.call({ op: "lcb_call", got: produced.value, expected });
    return { pass: reply.pass === true, ...(typeof reply.reason === "string" ? { reason: reply.reason } : {}) };
  }

  /** simple-evals' GPQA answer orders for the first `count` rows: random.Random(0).sample(range(4), 4) each. */
  async gpqaPermutations(count: number): Promise<number[][]> {
    const reply = await this.call({ op: "gpqa_permutations", count });
    return reply.permutations as number[][];
  }

  async close(): Promise<void> {
    if (this.exited) return;
    const exited = new Promise<void>((resolve) => this.child.once("exit", () => resolve()));
    this.child.stdin.end();
    await exited;
  }
}
