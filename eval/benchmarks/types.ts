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
  /** The group a `--limit` sample keeps in proportion (subject, domain, difficulty). */
  stratum: string;
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

/** LiveCodeBench's contest_date window, both ends included (lcb_runner's start_date/end_date). */
export interface DateWindow {
  from: string;
  to: string;
}

export interface LoadContext {
  /** Present when the run has the Python grader (GPQA's shuffle needs Python's random). */
  python: PythonWorker | null;
  /** null: every row, whatever its date. */
  lcbWindow: DateWindow | null;
  log: (line: string) => void;
}

export interface Benchmark<I extends EvalItem = EvalItem> {
  name: BenchmarkName;
  /** File names looked for in the data folder, in the published layout. */
  files: readonly string[];
  /** Rows in the full published set (after the default date window), for the row-count warning. */
  fullSize: number;
  /** Whether loading or grading needs the Python grader. */
  needsPython: boolean;
  /** Every item of `file`, in file order. */
  load(file: string, context: LoadContext): Promise<I[]>;
  grade(item: I, answer: string, context: GradeContext): Promise<Grade>;
}
