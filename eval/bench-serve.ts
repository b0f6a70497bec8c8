// `a2d bench-serve`: serving throughput of any OpenAI-compatible endpoint, so a2d and an AR baseline
// are measured the same way. At each concurrency level C (default 1, 2, 4, 8, 16, 32), C streamed long
// generations are sent at once: aggregate tokens/s = all completion tokens ÷ the level's wall time (first
// request sent → last byte), per-stream tokens/s, time to first token, inter-token latency (the gap between
// consecutive text chunks a client receives) and time per output token, with percentiles. With `promptTokens`
// the prompt is repeated until the server counts about that many prompt tokens (TTFT at a prompt length).
import { ChatClient, type ChatResult } from "./client.js";

export const DEFAULT_PROMPT =
  "Write a long, detailed story about a lighthouse keeper who finds an old map hidden in the wall of the lamp room. " +
  "Describe every place the map leads to, and keep writing until you are told to stop.";

export const DEFAULT_CONCURRENCY = [1, 2, 4, 8, 16, 32];

export interface BenchServeOptions {
  url: string;
  model?: string;
  apiKey?: string;
  prompt: string;
  /** Repeat the prompt (joined by blank lines) until the server's usage counts about this many prompt tokens. */
  promptTokens?: number;
  maxTokens: number;
  /** Concurrency levels, run in this order: C streams at once per level. */
  concurrency: number[];
  temperature?: number;
  /** Extra request body fields (e.g. vLLM's `ignore_eos`, a2d's `threshold`). */
  extraBody?: Record<string, unknown>;
}

export interface Percentiles {
  mean: number;
  p50: number;
  p90: number;
  p99: number;
  max: number;
}

export interface StreamStats {
  completionTokens: number;
  /** "usage": the server's count; "chunks": text chunks counted because the server sent no usage. */
  countedFrom: "usage" | "chunks";
  /** The server's count of the prompt's tokens (chat template included); null when it sent no usage. */
  promptTokens: number | null;
  finishReason: string | null;
  ttftMs: number | null;
  totalMs: number;
  tokensPerSecond: number;
  /** (total − TTFT) ÷ (tokens − 1): the mean time per token after the first; null under two tokens. */
  tpotMs: number | null;
}

export interface LevelStats {
  concurrency: number;
  wallMs: number;
  completionTokens: number;
  aggregateTokensPerSecond: number;
  perStreamTokensPerSecond: { mean: number; min: number; max: number };
  ttftMs: Percentiles;
  /** Gaps between consecutive text chunks of a stream, pooled over the level's streams; null if none. */
  itlMs: Percentiles | null;
  tpotMs: Percentiles | null;
  /** "chunks" if any stream's tokens had to be counted from text chunks. */
  countedFrom: "usage" | "chunks";
  finishReasons: Record<string, number>;
  streams: StreamStats[];
}

export interface BenchServeResult {
  url: string;
  model: string;
  maxTokens: number;
  /** The server's count of the prompt's tokens (the warm-up request's usage); null when it sends none. */
  promptTokens: number | null;
  /** How many times the prompt was repeated (1 without `promptTokens`). */
  promptRepeats: number;
  levels: LevelStats[];
}

function streamStats(result: ChatResult): StreamStats {
  const fromUsage = result.completionTokens !== null;
  const completionTokens = result.completionTokens ?? result.textChunks;
  const ttft = result.ttftMs;
  return {
    completionTokens,
    countedFrom: fromUsage ? "usage" : "chunks",
    promptTokens: result.promptTokens,
    finishReason: result.finishReason,
    ttftMs: ttft,
    totalMs: result.totalMs,
    tokensPerSecond: completionTokens / (result.totalMs / 1000),
    tpotMs: ttft !== null && completionTokens > 1 ? (result.totalMs - ttft) / (completionTokens - 1) : null,
  };
}

/** The q-quantile (0..1) of sorted values, interpolated linearly between the nearest ranks. */
export function quantile(sorted: readonly number[], q: number): number {
  if (sorted.length === 0) throw new Error("quantile of no values");
  const position = (sorted.length - 1) * q;
  const below = Math.floor(position);
  const above = Math.min(sorted.length - 1, below + 1);
  return sorted[below]! + (sorted[above]! - sorted[below]!) * (position - below);
}

export function percentiles(values: readonly number[]): Percentiles | null {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return {
    mean: sorted.reduce((a, b) => a + b, 0) / sorted.length,
    p50: quantile(sorted, 0.5),
    p90: quantile(sorted, 0.9),
    p99: quantile(sorted, 0.99),
    max: sorted[sorted.length - 1]!,
  };
}

function levelStats(concurrency: number, wallMs: number, results: ChatResult[]): LevelStats {
  const streams = results.map(streamStats);
  const rates = streams.map((s) => s.tokensPerSecond);
  const completionTokens = streams.reduce((sum, s) => sum + s.completionTokens, 0);
  const gaps = results.flatMap((r) => r.chunkMs.slice(1).map((at, i) => at - r.chunkMs[i]!));
  const finishReasons: Record<string, number> = {};
  for (const s of streams) finishReasons[String(s.finishReason)] = (finishReasons[String(s.finishReason)] ?? 0) + 1;
  return {
    concurrency,
    wallMs,
    completionTokens,
    aggregateTokensPerSecond: completionTokens / (wallMs / 1000),
    perStreamTokensPerSecond: { mean: rates.reduce((a, b) => a + b, 0) / rates.length, min: Math.min(...rates), max: Math.max(...rates) },
    ttftMs: percentiles(streams.map((s) => s.ttftMs ?? s.totalMs))!,
    itlMs: percentiles(gaps),
    tpotMs: percentiles(streams.flatMap((s) => (s.tpotMs === null ? [] : [s.tpotMs]))),
    countedFrom: streams.some((s) => s.countedFrom === "chunks") ? "chunks" : "usage",
    finishReasons,
    streams,
  };
}

/** The prompt repeated `repeats` times, joined by blank lines. */
export function repeatedPrompt(prompt: string, repeats: number): string {
  return Array.from({ length: repeats }, () => prompt).join("\n\n");
}

/**
 * How many repeats of the prompt come closest to `target` prompt tokens, from the server's counts of one and two
 * repeats: two repeats cost one repeat's tokens more, and one repeat is that plus the chat template's.
 */
export function repeatsFor(target: number, one: number, two: number): number {
  const each = two - one;
  if (each <= 0) throw new Error(`the server counts ${one} prompt tokens for the prompt and ${two} for it twice; cannot size a prompt from that`);
  return Math.max(1, Math.round((target - (one - each)) / each));
}

export async function benchServe(options: BenchServeOptions, log: (line: string) => void = () => undefined): Promise<BenchServeResult> {
  if (options.concurrency.length === 0 || options.concurrency.some((c) => !Number.isInteger(c) || c < 1)) {
    throw new Error(`concurrency levels must be positive integers, got ${options.concurrency.join(",")}`);
  }
  if (options.promptTokens !== undefined && (!Number.isInteger(options.promptTokens) || options.promptTokens < 1)) {
    throw new Error(`promptTokens must be a positive integer, got ${options.promptTokens}`);
  }
  const client = new ChatClient(options.url, { connections: Math.max(...options.concurrency), apiKey: options.apiKey });
  try {
    const model = options.model ?? (await client.models())[0];
    if (model === undefined) throw new Error(`${client.base}/models lists no model; pass --model`);
    const requestFor = (content: string) => ({
      model,
      messages: [{ role: "user" as const, content }],
      maxTokens: options.maxTokens,
      ...(options.temperature === undefined ? {} : { temperature: options.temperature }),
      ...(options.extraBody === undefined ? {} : { extra: options.extraBody }),
    });
    let repeats = 1;
    if (options.promptTokens !== undefined) {
      const count = async (n: number): Promise<number> => {
        const { promptTokens } = await client.chat({ ...requestFor(repeatedPrompt(options.prompt, n)), maxTokens: 1 });
        if (promptTokens === null) throw new Error("--prompt-tokens needs the server's usage.prompt_tokens, and this server sends none");
        return promptTokens;
      };
      repeats = repeatsFor(options.promptTokens, await count(1), await count(2));
    }
    const request = requestFor(repeatedPrompt(options.prompt, repeats));
    // A short request first, so one-time costs (lazy allocation, graph capture, JIT) stay out of the numbers.
    log(`warming up ${model} at ${client.base}`);
    const warmup = await client.chat({ ...request, maxTokens: Math.min(16, options.maxTokens) });
    if (options.promptTokens !== undefined) log(`prompt: ${repeats} repeats, ${warmup.promptTokens} tokens`);

    const levels: LevelStats[] = [];
    for (const concurrency of options.concurrency) {
      log(`${concurrency} stream${concurrency === 1 ? "" : "s"} at once, max_tokens ${options.maxTokens}`);
      const started = performance.now();
      const results = await Promise.all(Array.from({ length: concurrency }, () => client.chat(request)));
      levels.push(levelStats(concurrency, performance.now() - started, results));
    }
    return { url: client.base, model, maxTokens: options.maxTokens, promptTokens: warmup.promptTokens, promptRepeats: repeats, levels };
  } finally {
    await client.close();
  }
}

function ms(value: number | undefined): string {
  return value === undefined ? "n/a" : value.toFixed(value < 10 ? 1 : 0);
}

export function formatBenchServe(result: BenchServeResult): string {
  const lines = [
    `model ${result.model} at ${result.url}, max_tokens ${result.maxTokens}` +
      (result.promptTokens === null ? "" : `, prompt ${result.promptTokens} tokens`),
    "streams  tokens   wall s  aggregate tok/s  per-stream tok/s (min-max)  TTFT ms p50/p99  ITL ms p50/p90/p99  TPOT ms p50  finish",
  ];
  for (const level of result.levels) {
    const s = level.perStreamTokensPerSecond;
    const finish = Object.entries(level.finishReasons)
      .map(([reason, count]) => `${reason} ${count}`)
      .join(", ");
    lines.push(
      [
        String(level.concurrency).padStart(7),
        String(level.completionTokens).padStart(7),
        (level.wallMs / 1000).toFixed(2).padStart(8),
        level.aggregateTokensPerSecond.toFixed(1).padStart(16),
        `${s.mean.toFixed(1)} (${s.min.toFixed(1)}-${s.max.toFixed(1)})`.padStart(27),
        `${ms(level.ttftMs.p50)}/${ms(level.ttftMs.p99)}`.padStart(16),
        `${ms(level.itlMs?.p50)}/${ms(level.itlMs?.p90)}/${ms(level.itlMs?.p99)}`.padStart(19),
        ms(level.tpotMs?.p50).padStart(12),
        ` ${finish}`,
      ].join(" "),
    );
  }
  if (result.levels.some((level) => level.countedFrom === "chunks")) {
    lines.push("(no usage from the server: text chunks counted as tokens)");
  }
  return `${lines.join("\n")}\n`;
}
