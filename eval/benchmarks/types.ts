// What every benchmark provides to the runner: items with their chat prompt, and a grader that reads
// only the final answer (eval/extract.ts: finalAnswer).
import type { ChatMessage } from "../client.js";
import type { CodeVerdict, CodeTest } from "../code-tests.js";
import type { BenchmarkName } from "../normalize.js";
import type { PythonWorker } from "../python-worker.js";

export interface EvalItem {
  /** Stable id from the dataset (or the row number when it has none). */
  id: string;
  messages: ChatMessage[];
}

export interface Grade {
  correct: boolean;
  /** What was read from the answer (a letter, a math expression, "code"), null when nothing was. */
  extracted: string | null;
  detail?: string;
}

export interface GradeContext {
  python: PythonWorker;
  runCode: (code: string, tests: CodeTest[], funcName: string | null) => Promise<CodeVerdict>;
}

export interface Benchmark<I extends EvalItem = EvalItem> {
  name: BenchmarkName;
  /** File names looked for in the data folder, in the published layout. */
  files: readonly string[];
  /** Reads the first `limit` items (all when undefined) of `file`. */
  load(file: string, limit?: number): Promise<I[]>;
  grade(item: I, answer: string, context: GradeContext): Promise<Grade>;
}
