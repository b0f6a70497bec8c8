// `a2d bench-serve`: serving throughput of any OpenAI-compatible endpoint, so a2d and an AR baseline
// are measured the same way. At each concurrency level C (default 1, 2, 4, 8, 16, 32), C streamed long
// generations are sent at once: aggregate tokens/s = all completion tokens ÷ the level's wall time (first
// request sent → last byte), per-stream tokens/s, time to first token, inter-token latency (the gap between
// consecutive text chunks a client receives) and time per output token, with percentiles.
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
  levels: LevelStats[];
}

function streamStats(result: ChatResult): StreamStats {
  const fromUsage = result.completionTokens !== null;
  const completionTokens = result.completionTokens ?? result.textChunks;
  const ttft = result.ttftMs;
  return {
    completionTokens,
    countedFrom: fromUsage ? "usage" : "chunks",
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

export async function benchServe(options: BenchServeOptions, log: (line: string) => void = () => undefined): Promise<BenchServeResult> {
  if (options.concurrency.length === 0 || options.concurrency.some((c) => !Number.isInteger(c) || c < 1)) {
    throw new Error(`concurrency levels must be positive integers, got ${options.concurrency.join(",")}`);
  }
  const client = new ChatClient(options.url, { connections: Math.max(...options.concurrency), apiKey: options.apiKey });
  try {
    const model = options.model ?? (await client.models())[0];
    if (model === undefined) throw new Error(`${client.base}/models lists no model; pass --model`);
    const request = {
      model,
      messages: [{ role: "user" as const, content: options.prompt }],
      maxTokens: options.maxTokens,
      ...(options.temperature === undefined ? {} : { temperature: options.temperature }),
      ...(options.extraBody === undefined ? {} : { extra: options.extraBody }),
    };
    // A short request first, so one-time costs (lazy allocation, graph capture, JIT) stay out of the numbers.
    log(`warming up ${model} at ${client.base}`);
    await client.chat({ ...request, maxTokens: Math.min(16, options.maxTokens) });

    const levels: LevelStats[] = [];
    for (const concurrency of options.concurrency) {
      log(`${concurrency} stream${concurrency === 1 ? "" : "s"} at once, max_tokens ${options.maxTokens}`);
      const started = performance.now();
      const results = await Promise.all(Array.from({ length: concurrency }, () => client.chat(request)));
      levels.push(levelStats(concurrency, performance.now() - started, results));
    }
    return { url: client.base, model, maxTokens: options.maxTokens, levels };
  } finally {
    await client.close();
  }
}

function ms(value: number | undefined): string {
  return value === undefined ? "n/a" : value.toFixed(value < 10 ? 1 : 0);
}

export function formatBenchServe(result: BenchServeResult): string {
  const lines = [
    `model ${result.model} at ${result.url}, max_tokens ${result.maxTokens}`,
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
