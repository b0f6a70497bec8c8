// `a2d bench-serve`: serving throughput of any OpenAI-compatible endpoint, so a2d and an AR baseline
// are measured the same way. Single stream: completion tokens ÷ wall time of one streamed long
// generation (request sent → last byte), and time to first token. Then N streams at once: aggregate
// tokens/s over the batch's wall time, per-stream rates and TTFTs.
import { ChatClient, type ChatResult } from "./client.js";

export const DEFAULT_PROMPT =
  "Write a long, detailed story about a lighthouse keeper who finds an old map hidden in the wall of the lamp room. " +
  "Describe every place the map leads to, and keep writing until you are told to stop.";

export interface BenchServeOptions {
  url: string;
  model?: string;
  apiKey?: string;
  prompt: string;
  maxTokens: number;
  concurrency: number;
  temperature?: number;
  /** Extra request body fields (e.g. vLLM's `ignore_eos`, a2d's `threshold`). */
  extraBody?: Record<string, unknown>;
}

export interface StreamStats {
  completionTokens: number;
  /** "usage": the server's count; "chunks": text chunks counted because the server sent no usage. */
  countedFrom: "usage" | "chunks";
  finishReason: string | null;
  ttftMs: number | null;
  totalMs: number;
  tokensPerSecond: number;
}

export interface ConcurrentStats {
  streams: number;
  wallMs: number;
  completionTokens: number;
  aggregateTokensPerSecond: number;
  perStreamTokensPerSecond: { mean: number; min: number; max: number };
  ttftMs: { mean: number; p50: number; max: number };
}

export interface BenchServeResult {
  url: string;
  model: string;
  maxTokens: number;
  single: StreamStats;
  concurrent: ConcurrentStats | null;
}

function streamStats(result: ChatResult): StreamStats {
  const fromUsage = result.completionTokens !== null;
  const completionTokens = result.completionTokens ?? result.textChunks;
  return {
    completionTokens,
    countedFrom: fromUsage ? "usage" : "chunks",
    finishReason: result.finishReason,
    ttftMs: result.ttftMs,
    totalMs: result.totalMs,
    tokensPerSecond: completionTokens / (result.totalMs / 1000),
  };
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
}

export async function benchServe(options: BenchServeOptions, log: (line: string) => void = () => undefined): Promise<BenchServeResult> {
  const client = new ChatClient(options.url, { connections: Math.max(1, options.concurrency), apiKey: options.apiKey });
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

    log(`single stream, max_tokens ${options.maxTokens}`);
    const single = streamStats(await client.chat(request));

    let concurrent: ConcurrentStats | null = null;
    if (options.concurrency > 1) {
      log(`${options.concurrency} concurrent streams`);
      const started = performance.now();
      const results = await Promise.all(Array.from({ length: options.concurrency }, () => client.chat(request)));
      const wallMs = performance.now() - started;
      const stats = results.map(streamStats);
      const rates = stats.map((s) => s.tokensPerSecond);
      const ttfts = stats.map((s) => s.ttftMs ?? s.totalMs);
      const completionTokens = stats.reduce((sum, s) => sum + s.completionTokens, 0);
      concurrent = {
        streams: options.concurrency,
        wallMs,
        completionTokens,
        aggregateTokensPerSecond: completionTokens / (wallMs / 1000),
        perStreamTokensPerSecond: { mean: rates.reduce((a, b) => a + b, 0) / rates.length, min: Math.min(...rates), max: Math.max(...rates) },
        ttftMs: { mean: ttfts.reduce((a, b) => a + b, 0) / ttfts.length, p50: median(ttfts), max: Math.max(...ttfts) },
      };
    }
    return { url: client.base, model, maxTokens: options.maxTokens, single, concurrent };
  } finally {
    await client.close();
  }
}

export function formatBenchServe(result: BenchServeResult): string {
  const s = result.single;
  const counted = s.countedFrom === "chunks" ? " (no usage from the server: text chunks counted as tokens)" : "";
  const lines = [
    `model ${result.model} at ${result.url}, max_tokens ${result.maxTokens}`,
    `single stream: ${s.completionTokens} tokens in ${(s.totalMs / 1000).toFixed(2)} s = ${s.tokensPerSecond.toFixed(1)} tok/s, ` +
      `TTFT ${s.ttftMs === null ? "n/a" : `${s.ttftMs.toFixed(0)} ms`}, finish ${s.finishReason}${counted}`,
  ];
  const c = result.concurrent;
  if (c) {
    lines.push(
      `${c.streams} concurrent streams: ${c.completionTokens} tokens in ${(c.wallMs / 1000).toFixed(2)} s = ` +
        `${c.aggregateTokensPerSecond.toFixed(1)} tok/s aggregate; per stream ${c.perStreamTokensPerSecond.mean.toFixed(1)} tok/s mean ` +
        `(${c.perStreamTokensPerSecond.min.toFixed(1)}–${c.perStreamTokensPerSecond.max.toFixed(1)}); ` +
        `TTFT mean ${c.ttftMs.mean.toFixed(0)} ms, p50 ${c.ttftMs.p50.toFixed(0)} ms, max ${c.ttftMs.max.toFixed(0)} ms`,
    );
  }
  return `${lines.join("\n")}\n`;
}
