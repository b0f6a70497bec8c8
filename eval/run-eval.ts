// `a2d eval`: every selected benchmark item is sent to an OpenAI-compatible endpoint (streamed, up to
// --max-tokens so the model may reason), its final answer graded, and the accuracies rescaled per SPEC §1.
// Responses go to the cache as they finish, so an interrupted run resumes where it stopped.
import { existsSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { availableParallelism } from "node:os";
import { join } from "node:path";

import { SingleBar } from "cli-progress";

import { BENCHMARKS } from "./benchmarks/index.js";
import type { EvalItem, Grade } from "./benchmarks/types.js";
import { ResponseCache, cacheKey, type CachedResponse } from "./cache.js";
import { ChatClient, HttpError, type ChatRequest } from "./client.js";
import { runCodeTests } from "./code-tests.js";
import { finalAnswer } from "./extract.js";
import { BENCHMARK_NAMES, buildReport, type BenchmarkName, type EvalReport } from "./normalize.js";
import { Semaphore, forEachPooled } from "./pool.js";
import { GraderExited, PythonWorker } from "./python-worker.js";
import { checkSandbox, type SandboxLimits } from "./sandbox.js";

export interface EvalOptions {
  url: string;
  dataDir: string;
  /** Benchmarks to run; undefined: every benchmark whose file is in dataDir. */
  benchmarks?: BenchmarkName[];
  /** First N items of each benchmark. */
  limit?: number;
  concurrency: number;
  maxTokens: number;
  temperature?: number;
  topP?: number;
  seed?: number;
  /** Extra request body fields (--extra-body). */
  extraBody?: Record<string, unknown>;
  /** Served model id; default: the first one GET /v1/models lists. */
  model?: string;
  apiKey?: string;
  cacheFile?: string;
  detailsFile?: string;
  /** Interpreter for model-written code, run as `nobody` in the sandbox. */
  codePython: string;
  /** Interpreter with math-verify for the grader; default: the project venv. */
  graderPython?: string;
  codeLimits?: Partial<SandboxLimits>;
  progress: boolean;
  log: (line: string) => void;
  /** First retry delay for transient failures; doubles per attempt. */
  retryDelayMs?: number;
}

export interface ItemResult {
  benchmark: BenchmarkName;
  id: string;
  correct: boolean;
  extracted: string | null;
  detail?: string;
  finishReason: string | null;
  completionTokens: number | null;
  cached: boolean;
  /** Why the item was scored wrong without a verdict: "request refused: …" (a 4xx) or "grading failed: …". */
  error?: string;
}

export interface EvalRun {
  report: EvalReport;
  items: ItemResult[];
  model: string;
}

interface Job {
  benchmark: BenchmarkName;
  item: EvalItem;
}

/** The data file of each benchmark found in `dataDir`, in canonical order. */
export function findDataFiles(dataDir: string, wanted?: BenchmarkName[]): Map<BenchmarkName, string> {
  if (!existsSync(dataDir)) throw new Error(`--data ${dataDir} does not exist`);
  const found = new Map<BenchmarkName, string>();
  for (const name of BENCHMARK_NAMES) {
    if (wanted && !wanted.includes(name)) continue;
    const present = BENCHMARKS[name].files.map((file) => join(dataDir, file)).filter((path) => existsSync(path));
    if (present.length > 1) throw new Error(`${dataDir} holds both ${present.join(" and ")}; keep one`);
    if (present[0] !== undefined) found.set(name, present[0]);
    else if (wanted) {
      throw new Error(`${dataDir} has no ${BENCHMARKS[name].files.join(" or ")}; add it or leave ${name} out of --bench`);
    }
  }
  if (found.size === 0) {
    const expected = BENCHMARK_NAMES.flatMap((name) => BENCHMARKS[name].files).join(", ");
    throw new Error(`${dataDir} holds none of the benchmark files (${expected})`);
  }
  return found;
}

const RETRYABLE_ATTEMPTS = 4;
/** Refusals about one request (its prompt or length); anything else (401, 404…) is wrong for every request. */
const PER_ITEM_STATUSES = new Set([400, 413, 422]);

/** One response: from the cache, or requested with retries for transient failures (5xx, 429, network). */
async function respond(
  client: ChatClient,
  chat: ChatRequest,
  cache: ResponseCache | null,
  retryDelayMs: number,
): Promise<CachedResponse & { cached: boolean }> {
  const key = cacheKey(chat);
  const hit = cache?.get(key);
  if (hit) return { ...hit, cached: true };
  for (let attempt = 1; ; attempt += 1) {
    try {
      const result = await client.chat(chat);
      const response: CachedResponse = {
        content: result.content,
        reasoning: result.reasoning,
        finishReason: result.finishReason,
        completionTokens: result.completionTokens,
      };
      await cache?.put(key, response);
      return { ...response, cached: false };
    } catch (error) {
      const permanent = error instanceof HttpError && error.status < 500 && error.status !== 429;
      if (permanent || attempt >= RETRYABLE_ATTEMPTS) throw error;
      await new Promise((resolve) => setTimeout(resolve, retryDelayMs * 2 ** (attempt - 1)));
    }
  }
}

export async function runEval(options: EvalOptions): Promise<EvalRun> {
  const files = findDataFiles(options.dataDir, options.benchmarks);
  const jobs: Job[] = [];
  for (const [name, file] of files) {
    const items = await BENCHMARKS[name].load(file, options.limit);
    if (items.length === 0) throw new Error(`${file} holds no items`);
    options.log(`${name}: ${items.length} items from ${file}`);
    for (const item of items) jobs.push({ benchmark: name, item });
  }
  if (files.has("livecodebench_v6")) await checkSandbox(options.codePython);

  const client = new ChatClient(options.url, { connections: options.concurrency, apiKey: options.apiKey });
  const python = files.has("math_500") || files.has("livecodebench_v6") ? PythonWorker.start(options.graderPython) : null;
  const bar = options.progress
    ? new SingleBar({ format: "eval |{bar}| {value}/{total} items | {correct} correct | {eta_formatted} left", stream: process.stderr, hideCursor: true })
    : null;
  try {
    const model = options.model ?? (await client.models())[0];
    if (model === undefined) throw new Error(`${client.base}/models lists no model; pass --model`);
    const cache = options.cacheFile ? await ResponseCache.open(options.cacheFile) : null;
    if (cache) {
      const torn = cache.skippedLines > 0 ? ` (${cache.skippedLines} torn line(s) skipped)` : "";
      options.log(`cache ${cache.file}: ${cache.size} responses${torn}`);
    }
    options.log(`model ${model} at ${client.base}`);

    const codeSlots = new Semaphore(Math.max(1, Math.min(4, availableParallelism() - 1)));
    const context = {
      get python(): PythonWorker {
        if (python === null) throw new Error("internal: a benchmark asked for the Python grader it did not declare");
        return python;
      },
      runCode: (code: string, tests: Parameters<typeof runCodeTests>[1], funcName: string | null) =>
        codeSlots.run(() => runCodeTests(code, tests, funcName, { python: options.codePython, limits: options.codeLimits })),
    };
    const results: ItemResult[] = new Array(jobs.length);
    const grading: Promise<void>[] = [];
    let correct = 0;
    let graderDown: GraderExited | null = null;
    const record = (index: number, result: ItemResult): void => {
      results[index] = result;
      if (result.correct) correct += 1;
      bar?.increment(1, { correct });
    };
    bar?.start(jobs.length, 0, { correct });

    await forEachPooled([...jobs.keys()], options.concurrency, async (index) => {
      if (graderDown) throw graderDown;
      const { benchmark, item } = jobs[index]!;
      const chat: ChatRequest = {
        model,
        messages: item.messages,
        maxTokens: options.maxTokens,
        ...(options.temperature === undefined ? {} : { temperature: options.temperature }),
        ...(options.topP === undefined ? {} : { topP: options.topP }),
        ...(options.seed === undefined ? {} : { seed: options.seed }),
        ...(options.extraBody === undefined ? {} : { extra: options.extraBody }),
      };
      const base = { benchmark, id: item.id };
      let response: CachedResponse & { cached: boolean };
      try {
        response = await respond(client, chat, cache, options.retryDelayMs ?? 2000);
      } catch (error) {
        if (!(error instanceof HttpError && PER_ITEM_STATUSES.has(error.status))) throw error;
        // The server refused this one request (e.g. a prompt over its context): score it wrong, go on.
        const refused = { correct: false, extracted: null, finishReason: null, completionTokens: null, cached: false };
        record(index, { ...base, ...refused, error: `request refused: ${error.message}` });
        return;
      }
      const served = { finishReason: response.finishReason, completionTokens: response.completionTokens, cached: response.cached };
      // Grading (sandboxed code in particular) runs beside the next requests instead of holding a slot.
      // One item that cannot be graded (a malformed test case, a gold answer math-verify cannot parse)
      // is scored wrong and reported; a grader that died stops the run.
      grading.push(
        BENCHMARKS[benchmark]
          .grade(item, finalAnswer(response.content), context)
          .then((grade: Grade) => record(index, { ...base, ...grade, ...served }))
          .catch((error: unknown) => {
            if (error instanceof GraderExited) {
              graderDown = error;
              return;
            }
            const message = error instanceof Error ? error.message : String(error);
            record(index, { ...base, correct: false, extracted: null, ...served, error: `grading failed: ${message}` });
          }),
      );
    }).catch(async (error: unknown) => {
      await Promise.all(grading);
      const resume = cache ? `; finished responses are in ${cache.file}, re-run the same command to resume` : "; pass --cache FILE to make runs resumable";
      throw new Error(`${error instanceof Error ? error.message : String(error)}${resume}`, { cause: error });
    });
    await Promise.all(grading);
    if (graderDown) throw graderDown;
    await cache?.flush();
    bar?.stop();

    for (const stage of ["request refused", "grading failed"]) {
      const failed = results.filter((result) => result.error?.startsWith(stage));
      if (failed.length > 0) options.log(`warning: ${stage} for ${failed.length} item(s), scored wrong; first: ${failed[0]!.error}`);
    }
    if (options.detailsFile) await writeFile(options.detailsFile, results.map((result) => JSON.stringify(result)).join("\n") + "\n");

    const counts: Partial<Record<BenchmarkName, { correct: number; total: number }>> = {};
    for (const result of results) {
      const count = (counts[result.benchmark] ??= { correct: 0, total: 0 });
      count.total += 1;
      if (result.correct) count.correct += 1;
    }
    return { report: buildReport(counts), items: results, model };
  } finally {
    bar?.stop();
    await python?.close();
    await client.close();
  }
}
