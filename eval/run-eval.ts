// `a2d eval`: every selected benchmark item is sent to an OpenAI-compatible endpoint (streamed, up to
// --max-tokens so the model may reason), its final answer graded, and the accuracies rescaled per SPEC §1.
// Responses go to the cache as they finish, so an interrupted run resumes where it stopped.
import { existsSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { availableParallelism } from "node:os";
import { join } from "node:path";

import { SingleBar } from "cli-progress";

import { BENCHMARKS } from "./benchmarks/index.js";
import { V6_WINDOW } from "./benchmarks/livecodebench.js";
import type { DateWindow, EvalItem, Grade } from "./benchmarks/types.js";
import { ResponseCache, cacheKey, type CachedResponse } from "./cache.js";
import { ChatClient, HttpError, type ChatRequest } from "./client.js";
import { runCodeTests } from "./code-tests.js";
import { finalAnswer } from "./extract.js";
import { BENCHMARK_NAMES, buildReport, type BenchmarkName, type EvalReport } from "./normalize.js";
import { Semaphore, forEachPooled } from "./pool.js";
import { GraderExited, PythonWorker } from "./python-worker.js";
import { stratifiedSample } from "./sample.js";
import { checkSandbox, type SandboxLimits } from "./sandbox.js";

export interface EvalOptions {
  url: string;
  dataDir: string;
  /** Benchmarks to run; undefined: every benchmark whose file is in dataDir. */
  benchmarks?: BenchmarkName[];
  /** A stratified sample of N items of each benchmark (eval/sample.ts). */
  limit?: number;
  /** Seed of the --limit sample. */
  sampleSeed?: number;
  /** LiveCodeBench's contest_date window; null: every row. Default: the v6 window. */
  lcbWindow?: DateWindow | null;
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
  /** Longest silence of a stream once it has sent a token or a heartbeat. */
  idleTimeoutMs?: number;
}

export interface ItemResult {
  benchmark: BenchmarkName;
  id: string;
  correct: boolean;
  extracted: string | null;
  detail?: string;
  finishReason: string | null;
  completionTokens: number | null;
  /** Request sent → first token, queueing in the server included; null when none came or not recorded. */
  ttftMs: number | null;
  totalMs: number | null;
  cached: boolean;
  /** Why the item was scored wrong without a verdict: "request refused: …" (a 4xx) or "grading failed: …". */
  error?: string;
  /** The response's content, as the grader got it before the reasoning was cut off. */
  content: string;
}

/** What the run sent and to whom, printed with the report. */
export interface RunRecord {
  url: string;
  model: string;
  /** The stable part of what the server says about itself; part of every cache key. */
  server: ServerIdentity;
  concurrency: { requested: number; used: number; reason: string | null };
  /** The sampling fields every request carried; null: not sent, the server's default applies. */
  sampling: { max_tokens: number; temperature: number | null; top_p: number | null; seed: number | null; extra_body: Record<string, unknown> | null };
  data: Partial<Record<BenchmarkName, { file: string; rows: number; full_set_rows: number | null; items: number; sample: string | null }>>;
  lcb_window: DateWindow | null;
  ttft_ms: { requests: number; p50: number; p90: number; max: number } | null;
}

export interface EvalRun {
  report: EvalReport;
  items: ItemResult[];
  model: string;
  record: RunRecord;
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

export interface ServerIdentity {
  url: string;
  /** The /v1/models entry without its volatile fields (created, permission). */
  model: Record<string, unknown> | null;
  /** /health's description of the model and its decoding (a2d), without counters or queue state. */
  health: Record<string, unknown> | null;
}

const STABLE_CARD_FIELDS = ["id", "object", "owned_by", "root", "parent", "max_model_len"];
const STABLE_HEALTH_FIELDS = ["model", "device", "decoding", "max_context"];

function pick(source: Record<string, unknown> | null | undefined, fields: string[]): Record<string, unknown> | null {
  if (!source) return null;
  const picked = Object.fromEntries(fields.filter((field) => field in source).map((field) => [field, source[field]]));
  return Object.keys(picked).length > 0 ? picked : null;
}

export function serverIdentity(base: string, card: Record<string, unknown> | undefined, health: Record<string, unknown> | null): ServerIdentity {
  return { url: base, model: pick(card, STABLE_CARD_FIELDS), health: pick(health, STABLE_HEALTH_FIELDS) };
}

/**
 * Requests in flight: never more than the server runs at once when /health says how many that is
 * (`queue.max_running`). More would only wait in its queue, where their time to first token measures
 * the queue, and a server that refuses past a queue length would answer 429.
 */
export function effectiveConcurrency(requested: number, health: Record<string, unknown> | null): { used: number; reason: string | null } {
  const queue = health?.queue as Record<string, unknown> | undefined;
  const running = queue?.max_running;
  if (typeof running === "number" && Number.isInteger(running) && running >= 1 && running < requested) {
    return { used: running, reason: `/health reports queue.max_running ${running}` };
  }
  return { used: requested, reason: null };
}

const RETRYABLE_ATTEMPTS = 4;
/** A busy server (429) is waited for longer: it said to come back. */
const BUSY_ATTEMPTS = 30;
const MAX_RETRY_AFTER_MS = 600_000;
/** Refusals about one request (its prompt or length); anything else (401, 404…) is wrong for every request. */
const PER_ITEM_STATUSES = new Set([400, 413, 422]);

/** One response: from the cache, or requested with retries for transient failures (5xx, 429, network, stalls). */
async function respond(
  client: ChatClient,
  chat: ChatRequest,
  key: string,
  cache: ResponseCache | null,
  retryDelayMs: number,
): Promise<CachedResponse & { cached: boolean }> {
  const hit = cache?.get(key);
  if (hit) return { ...hit, cached: true };
  let failures = 0;
  let busy = 0;
  for (;;) {
    try {
      const result = await client.chat(chat);
      const response: CachedResponse = {
        content: result.content,
        reasoning: result.reasoning,
        finishReason: result.finishReason,
        completionTokens: result.completionTokens,
        ttftMs: result.ttftMs,
        totalMs: result.totalMs,
      };
      await cache?.put(key, response);
      return { ...response, cached: false };
    } catch (error) {
      if (error instanceof HttpError && error.status === 429 && busy + 1 < BUSY_ATTEMPTS) {
        busy += 1;
        const waitMs = error.retryAfterSeconds !== null ? error.retryAfterSeconds * 1000 : retryDelayMs * 2 ** Math.min(busy - 1, 8);
        await new Promise((resolve) => setTimeout(resolve, Math.min(MAX_RETRY_AFTER_MS, waitMs)));
        continue;
      }
      const permanent = error instanceof HttpError && error.status < 500;
      failures += 1;
      if (permanent || failures >= RETRYABLE_ATTEMPTS) throw error;
      await new Promise((resolve) => setTimeout(resolve, retryDelayMs * 2 ** (failures - 1)));
    }
  }
}

function percentile(sorted: number[], fraction: number): number {
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(fraction * sorted.length) - 1))]!;
}

export async function runEval(options: EvalOptions): Promise<EvalRun> {
  const files = findDataFiles(options.dataDir, options.benchmarks);
  const lcbWindow = options.lcbWindow === undefined ? V6_WINDOW : options.lcbWindow;
  const sampleSeed = options.sampleSeed ?? 0;
  const needsPython = [...files.keys()].some((name) => BENCHMARKS[name].needsPython);
  const python = needsPython ? PythonWorker.start(options.graderPython) : null;
  const client = new ChatClient(options.url, { connections: options.concurrency, apiKey: options.apiKey, idleTimeoutMs: options.idleTimeoutMs });
  const bar = options.progress
    ? new SingleBar({ format: "eval |{bar}| {value}/{total} items | {correct} correct | {eta_formatted} left", stream: process.stderr, hideCursor: true })
    : null;
  try {
    const jobs: Job[] = [];
    const data: RunRecord["data"] = {};
    for (const [name, file] of files) {
      const benchmark = BENCHMARKS[name];
      const all = await benchmark.load(file, { python, lcbWindow, log: options.log });
      if (all.length === 0) throw new Error(`${file} holds no items${name === "livecodebench_v6" && lcbWindow ? " in the contest_date window" : ""}`);
      const fullSetRows = name === "livecodebench_v6" && (lcbWindow?.from !== V6_WINDOW.from || lcbWindow?.to !== V6_WINDOW.to) ? null : benchmark.fullSize;
      if (fullSetRows !== null && all.length !== fullSetRows) {
        options.log(`warning: ${name} has ${all.length} items in ${file}; the full set has ${fullSetRows}, so its score is not comparable with published ones`);
      }
      const items = options.limit === undefined ? all : stratifiedSample(all, options.limit, sampleSeed, name);
      const sample = items.length < all.length ? `${items.length} of ${all.length}, stratified, seed ${sampleSeed}` : null;
      options.log(`${name}: ${items.length} items from ${file}${sample ? ` (${sample})` : ""}`);
      data[name] = { file, rows: all.length, full_set_rows: fullSetRows, items: items.length, sample };
      for (const item of items) jobs.push({ benchmark: name, item });
    }
    if (files.has("livecodebench_v6")) await checkSandbox(options.codePython);

    // With --model given, a server without /v1/models still works (its identity is then the URL and /health).
    const cards = await client.modelCards().catch((error: unknown) => {
      if (options.model !== undefined && error instanceof HttpError) return [];
      throw error;
    });
    const model = options.model ?? (cards[0]?.id as string | undefined);
    if (model === undefined) throw new Error(`${client.base}/models lists no model; pass --model`);
    const health = await client.health();
    const server = serverIdentity(client.base, cards.find((card) => card.id === model), health);
    const concurrency = effectiveConcurrency(options.concurrency, health);
    if (concurrency.reason) options.log(`concurrency ${concurrency.used} instead of ${options.concurrency}: ${concurrency.reason}`);
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
        codeSlots.run(() =>
          runCodeTests(code, tests, funcName, {
            python: options.codePython,
            limits: options.codeLimits,
            compare: (produced, expected) => context.python.compareOutput(produced, expected),
          }),
        ),
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

    await forEachPooled([...jobs.keys()], concurrency.used, async (index) => {
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
        response = await respond(client, chat, cacheKey(chat, server), cache, options.retryDelayMs ?? 2000);
      } catch (error) {
        if (!(error instanceof HttpError && PER_ITEM_STATUSES.has(error.status))) throw error;
        // The server refused this one request (e.g. a prompt over its context): score it wrong, go on.
        const refused = { correct: false, extracted: null, finishReason: null, completionTokens: null, ttftMs: null, totalMs: null, cached: false, content: "" };
        record(index, { ...base, ...refused, error: `request refused: ${error.message}` });
        return;
      }
      const served = {
        finishReason: response.finishReason,
        completionTokens: response.completionTokens,
        ttftMs: response.ttftMs,
        totalMs: response.totalMs,
        cached: response.cached,
        content: response.content,
      };
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

    const fetched = results.filter((result) => !result.cached && result.ttftMs !== null).map((result) => result.ttftMs!).sort((a, b) => a - b);
    const ttft = fetched.length > 0 ? { requests: fetched.length, p50: percentile(fetched, 0.5), p90: percentile(fetched, 0.9), max: fetched[fetched.length - 1]! } : null;
    if (ttft) {
      const s = (ms: number) => `${(ms / 1000).toFixed(2)} s`;
      options.log(`time to first token over ${ttft.requests} requests (server queueing included): p50 ${s(ttft.p50)}, p90 ${s(ttft.p90)}, max ${s(ttft.max)}`);
    }

    const counts: Partial<Record<BenchmarkName, { correct: number; total: number }>> = {};
    for (const result of results) {
      const count = (counts[result.benchmark] ??= { correct: 0, total: 0 });
      count.total += 1;
      if (result.correct) count.correct += 1;
    }
    const runRecord: RunRecord = {
      url: client.base,
      model,
      server,
      concurrency: { requested: options.concurrency, ...concurrency },
      sampling: {
        max_tokens: options.maxTokens,
        temperature: options.temperature ?? null,
        top_p: options.topP ?? null,
        seed: options.seed ?? null,
        extra_body: options.extraBody ?? null,
      },
      data,
      lcb_window: files.has("livecodebench_v6") ? lcbWindow : null,
      ttft_ms: ttft,
    };
    return { report: buildReport(counts), items: results, model, record: runRecord };
  } finally {
    bar?.stop();
    await python?.close();
    await client.close();
  }
}
