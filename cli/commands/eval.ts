// `a2d eval`: benchmark accuracy of any OpenAI-compatible endpoint on local benchmark files (docs/eval.md).
import { existsSync } from "node:fs";

import { InvalidArgumentError, type Command } from "commander";

import { V6_WINDOW } from "../../eval/benchmarks/livecodebench.js";
import type { DateWindow } from "../../eval/benchmarks/types.js";
import { BENCHMARK_NAMES, isBenchmarkName, type BenchmarkName } from "../../eval/normalize.js";
import { formatReport } from "../../eval/report.js";
import { runEval, type EvalOptions } from "../../eval/run-eval.js";

export function positiveInt(value: string): number {
  const number = Number(value);
  if (!Number.isInteger(number) || number < 1) throw new InvalidArgumentError("expected a whole number >= 1");
  return number;
}

export function nonNegativeNumber(value: string): number {
  const number = Number(value);
  if (!Number.isFinite(number) || number < 0) throw new InvalidArgumentError("expected a number >= 0");
  return number;
}

/** --extra-body: a JSON object merged into every request body. */
export function jsonObject(value: string): Record<string, unknown> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(value);
  } catch {
    throw new InvalidArgumentError(`expected a JSON object, e.g. '{"ignore_eos": true}'`);
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw new InvalidArgumentError("expected a JSON object");
  return parsed as Record<string, unknown>;
}

/** --lcb-dates FROM..TO (YYYY-MM-DD, both included) or "all". */
export function dateWindow(value: string): DateWindow | null {
  if (value === "all") return null;
  const match = /^(\d{4}-\d{2}-\d{2})\.\.(\d{4}-\d{2}-\d{2})$/.exec(value.trim());
  if (match === null || match[1]! > match[2]!) {
    throw new InvalidArgumentError(`expected FROM..TO with FROM <= TO, e.g. ${V6_WINDOW.from}..${V6_WINDOW.to}, or "all"`);
  }
  return { from: match[1]!, to: match[2]! };
}

function benchmarkList(value: string): BenchmarkName[] {
  const names = value.split(",").map((name) => name.trim()).filter(Boolean);
  const unknown = names.filter((name) => !isBenchmarkName(name));
  if (unknown.length > 0 || names.length === 0) {
    throw new InvalidArgumentError(`unknown benchmark ${unknown.join(", ")}; choose from ${BENCHMARK_NAMES.join(", ")}`);
  }
  return names as BenchmarkName[];
}

/** Flags that are runEval options under the same name; the rest are renamed or converted below. */
type SharedFlags = Pick<
  EvalOptions,
  "url" | "limit" | "sampleSeed" | "concurrency" | "maxTokens" | "temperature" | "topP" | "seed" | "extraBody" | "model" | "apiKey" | "graderPython"
>;

interface EvalFlags extends SharedFlags {
  data: string;
  bench?: BenchmarkName[];
  json?: boolean;
  cache?: string;
  details?: string;
  python: string;
  codeTimeout: number;
  idleTimeout: number;
  lcbDates: DateWindow | null;
  progress: boolean;
}

export function register(program: Command): void {
  program
    .command("eval")
    .description("Score an OpenAI-compatible endpoint on GPQA-Diamond, MATH-500, LiveCodeBench v6 and MMLU-Pro from local files")
    .requiredOption("--url <url>", "server base URL, e.g. http://127.0.0.1:8000")
    .requiredOption("--data <dir>", "folder with gpqa_diamond.csv, math_500.jsonl, livecodebench_v6.jsonl, mmlu_pro.jsonl|.parquet")
    .option("--bench <list>", `comma-separated subset of ${BENCHMARK_NAMES.join(",")} (default: every file found)`, benchmarkList)
    .option("--limit <n>", "a seeded sample of N items of each benchmark, stratified by subject/domain/difficulty", positiveInt)
    .option("--sample-seed <n>", "seed of the --limit sample", (value) => Math.trunc(nonNegativeNumber(value)), 0)
    .option("--lcb-dates <from..to>", `LiveCodeBench contest_date window, both days included, or "all"`, dateWindow, V6_WINDOW)
    .option("--concurrency <n>", "requests in flight (never more than /health's queue.max_running)", positiveInt, 8)
    .option("--max-tokens <n>", "max_tokens per request (reasoning included)", positiveInt, 32768)
    .option("--temperature <t>", "sampling temperature (default: the server's)", nonNegativeNumber)
    .option("--top-p <p>", "nucleus sampling mass (default: the server's)", nonNegativeNumber)
    .option("--seed <n>", "request seed", (value) => Math.trunc(nonNegativeNumber(value)))
    .option("--extra-body <json>", "JSON object merged into every request (server-specific options)", jsonObject)
    .option("--model <id>", "model id to request (default: the first one /v1/models lists)")
    .option("--api-key <key>", "bearer token, if the server wants one")
    .option("--json", "print only the report as JSON on stdout")
    .option("--cache <file>", "response cache (JSON lines): a re-run resumes an interrupted one")
    .option("--details <file>", "write every item's grade as JSON lines")
    .option("--python <path>", "interpreter for model-written code, run as nobody in the sandbox", "/usr/bin/python3")
    .option("--grader-python <path>", "Python with math-verify (default: the project's .venv)")
    .option("--code-timeout <seconds>", "time limit per LiveCodeBench test", nonNegativeNumber, 6)
    .option("--idle-timeout <seconds>", "longest silence of a stream once it has sent a token or a heartbeat", positiveInt, 600)
    .option("--no-progress", "no progress bar")
    .action(async (flags: EvalFlags) => {
      if (!existsSync(flags.python)) throw new Error(`--python ${flags.python} does not exist; pass an interpreter path every user can run`);
      const { data, bench, json, cache, details, python, codeTimeout, idleTimeout, lcbDates, progress, ...shared } = flags;
      const run = await runEval({
        ...shared,
        dataDir: data,
        benchmarks: bench,
        apiKey: shared.apiKey ?? process.env.OPENAI_API_KEY,
        cacheFile: cache,
        detailsFile: details,
        codePython: python,
        codeLimits: { timeoutMs: codeTimeout * 1000 },
        idleTimeoutMs: idleTimeout * 1000,
        lcbWindow: lcbDates,
        progress: progress && process.stderr.isTTY === true,
        log: (line) => process.stderr.write(`${line}\n`),
      });
      process.stdout.write(json ? `${JSON.stringify({ ...run.report, run: run.record })}\n` : formatReport(run.report, run.record));
    });
}
