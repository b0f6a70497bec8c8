// A minimal OpenAI-compatible chat client over undici: model listing, /health, and streamed chat
// completions with the timing bench-serve and eval need. Works against any server that speaks /v1/models
// and /v1/chat/completions with `stream: true`.
//
// A server that runs one generation at a time keeps a queued request silent for as long as the ones
// ahead of it take (minutes, for 32k-token answers). So no timer runs until the stream shows life: the
// first token, or an SSE comment (`: …`), which servers send as heartbeats while a request waits. From
// then on a silence longer than the idle timeout, reset by every byte, heartbeats included, ends the
// request as stalled.
import { Agent, request } from "undici";

import { SseDecoder } from "./sse.js";

export interface ChatMessage {
  role: "system" | "user" | "assistant";
  content: string;
}

export interface ChatRequest {
  model: string;
  messages: ChatMessage[];
  maxTokens: number;
  temperature?: number;
  topP?: number;
  seed?: number;
  /** Extra body fields for server-specific options (a2d's `threshold`, vLLM's `ignore_eos`, …). */
  extra?: Record<string, unknown>;
}

export interface ChatResult {
  content: string;
  /** Text the server marked as reasoning (`reasoning_content` or `reasoning` deltas). */
  reasoning: string;
  finishReason: string | null;
  /** From the server's `usage`; null when it sent none. */
  completionTokens: number | null;
  promptTokens: number | null;
  /** Stream chunks that carried text: the token count's fallback when the server reports no usage. */
  textChunks: number;
  /** Milliseconds from sending the request to the first chunk carrying text; null if none came. */
  ttftMs: number | null;
  /** Milliseconds from sending the request to each chunk carrying text, in order (inter-token latency). */
  chunkMs: number[];
  totalMs: number;
  /** SSE comment lines (heartbeats) received. */
  heartbeats: number;
}

/** The request went silent for longer than the idle timeout after the stream had started. */
export class StreamStalled extends Error {
  override name = "StreamStalled";
}

export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    /** The server's Retry-After in seconds (a 429 or 503), when it sent one. */
    readonly retryAfterSeconds: number | null = null,
  ) {
    super(message);
    this.name = "HttpError";
  }
}

/** Accepts `http://host:port`, `http://host:port/` or `http://host:port/v1`; returns the `/v1` base. */
export function apiBase(url: string): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new Error(`--url ${JSON.stringify(url)} is not a URL; pass e.g. http://127.0.0.1:8000`);
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new Error(`--url ${url} must be http:// or https://`);
  }
  const path = parsed.pathname.replace(/\/+$/, "");
  parsed.pathname = path.endsWith("/v1") ? path : `${path}/v1`;
  return parsed.toString().replace(/\/+$/, "");
}

interface StreamChunk {
  choices?: { delta?: { content?: string | null; reasoning_content?: string | null; reasoning?: string | null }; finish_reason?: string | null }[];
  usage?: { completion_tokens?: number; prompt_tokens?: number } | null;
  error?: { message?: string } | string;
}

export class ChatClient {
  readonly base: string;
  private readonly agent: Agent;
  private readonly apiKey: string | undefined;

  private readonly idleTimeoutMs: number;

  /**
   * @param connections sockets kept to the server: at least the number of concurrent requests.
   * @param idleTimeoutMs longest silence allowed once a stream has sent a token or a heartbeat.
   */
  constructor(url: string, options: { connections: number; idleTimeoutMs?: number; apiKey?: string }) {
    this.base = apiBase(url);
    this.idleTimeoutMs = options.idleTimeoutMs ?? 600_000;
    // undici's own timers would fire while a request waits its turn; the stream watchdog below replaces them.
    this.agent = new Agent({ connections: options.connections, headersTimeout: 0, bodyTimeout: 0 });
    this.apiKey = options.apiKey;
  }

  private headers(): Record<string, string> {
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (this.apiKey) headers.authorization = `Bearer ${this.apiKey}`;
    return headers;
  }

  /** The ids listed by GET /v1/models. */
  async models(): Promise<string[]> {
    return (await this.modelCards()).map((card) => card.id as string);
  }

  /** The entries of GET /v1/models that have a string id. */
  async modelCards(): Promise<Record<string, unknown>[]> {
    const response = await this.send("GET", "/models");
    const body = (await response.body.json()) as { data?: Record<string, unknown>[] };
    return (body.data ?? []).filter((card) => typeof card?.id === "string");
  }

  /** GET /health next to /v1 (a2d, vLLM, SGLang serve it there): its JSON body, or null if it has none. */
  async health(): Promise<Record<string, unknown> | null> {
    const url = `${this.base.replace(/\/v1$/, "")}/health`;
    try {
      const response = await request(url, { method: "GET", headers: this.headers(), dispatcher: this.agent, headersTimeout: 30_000, bodyTimeout: 30_000 });
      const text = await response.body.text();
      if (response.statusCode !== 200) return null;
      const body = JSON.parse(text) as unknown;
      return typeof body === "object" && body !== null && !Array.isArray(body) ? (body as Record<string, unknown>) : null;
    } catch {
      return null;
    }
  }

  /** One streamed chat completion; `onText` sees every text delta as it arrives. */
  async chat(chat: ChatRequest, onText?: (text: string) => void, signal?: AbortSignal): Promise<ChatResult> {
    const body = {
      ...chat.extra,
      model: chat.model,
      messages: chat.messages,
      max_tokens: chat.maxTokens,
      ...(chat.temperature === undefined ? {} : { temperature: chat.temperature }),
      ...(chat.topP === undefined ? {} : { top_p: chat.topP }),
      ...(chat.seed === undefined ? {} : { seed: chat.seed }),
      // Streaming is how both commands read responses and usage; no extra field may turn it off.
      stream: true,
      stream_options: { include_usage: true },
    };
    const started = performance.now();
    const watchdog = new AbortController();
    const stalled = new StreamStalled(
      `${this.base}/chat/completions: no data for ${(this.idleTimeoutMs / 1000).toFixed(1)} s after the stream had started; the server stalled`,
    );
    let timer: NodeJS.Timeout | undefined;
    const resetWatchdog = () => {
      clearTimeout(timer);
      timer = setTimeout(() => watchdog.abort(stalled), this.idleTimeoutMs);
    };
    const combined = signal ? AbortSignal.any([signal, watchdog.signal]) : watchdog.signal;
    try {
      return await this.stream(body, started, combined, resetWatchdog, onText);
    } catch (error) {
      if (watchdog.signal.aborted) throw stalled;
      throw error;
    } finally {
      clearTimeout(timer);
    }
  }

  private async stream(
    body: Record<string, unknown>,
    started: number,
    signal: AbortSignal,
    resetWatchdog: () => void,
    onText?: (text: string) => void,
  ): Promise<ChatResult> {
    const response = await this.send("POST", "/chat/completions", JSON.stringify(body), signal);
    const result: ChatResult = {
      content: "",
      reasoning: "",
      finishReason: null,
      completionTokens: null,
      promptTokens: null,
      textChunks: 0,
      ttftMs: null,
      chunkMs: [],
      totalMs: 0,
      heartbeats: 0,
    };
    const decoder = new SseDecoder();
    let done = false;
    const take = (payloads: string[]): void => {
      for (const payload of payloads) {
        if (done) return;
        if (payload.trim() === "[DONE]") {
          done = true;
          return;
        }
        this.applyChunk(parseChunk(payload), result, started, onText);
      }
    };
    for await (const bytes of response.body) {
      take(decoder.push(bytes as Buffer));
      result.heartbeats = decoder.comments;
      if (result.ttftMs !== null || decoder.comments > 0) resetWatchdog();
      if (done) break;
    }
    if (!done) take(decoder.end());
    result.totalMs = performance.now() - started;
    if (!done && result.finishReason === null) {
      throw new Error(`${this.base}/chat/completions: the stream ended before a finish_reason or [DONE]`);
    }
    return result;
  }

  private applyChunk(chunk: StreamChunk, result: ChatResult, started: number, onText?: (text: string) => void): void {
    if (chunk.error !== undefined) {
      const message = typeof chunk.error === "string" ? chunk.error : (chunk.error.message ?? JSON.stringify(chunk.error));
      throw new Error(`${this.base}/chat/completions: server error in stream: ${message}`);
    }
    if (chunk.usage) {
      if (typeof chunk.usage.completion_tokens === "number") result.completionTokens = chunk.usage.completion_tokens;
      if (typeof chunk.usage.prompt_tokens === "number") result.promptTokens = chunk.usage.prompt_tokens;
    }
    for (const choice of chunk.choices ?? []) {
      const delta = choice.delta ?? {};
      const reasoning = delta.reasoning_content ?? delta.reasoning ?? "";
      const content = delta.content ?? "";
      if (reasoning.length > 0 || content.length > 0) {
        const at = performance.now() - started;
        result.ttftMs ??= at;
        result.chunkMs.push(at);
        result.textChunks += 1;
        result.reasoning += reasoning;
        result.content += content;
        onText?.(reasoning + content);
      }
      if (choice.finish_reason) result.finishReason = choice.finish_reason;
    }
  }

  private async send(method: "GET" | "POST", path: string, body?: string, signal?: AbortSignal) {
    const url = `${this.base}${path}`;
    let response;
    try {
      response = await request(url, { method, headers: this.headers(), body, dispatcher: this.agent, signal });
    } catch (error) {
      const reason = error instanceof Error ? error.message : String(error);
      throw new Error(`${method} ${url} failed: ${reason} (is the server running at --url?)`, { cause: error });
    }
    if (response.statusCode !== 200) {
      const text = await response.body.text();
      const retryAfter = Number(response.headers["retry-after"]);
      throw new HttpError(
        response.statusCode,
        `${method} ${url} answered ${response.statusCode}: ${errorMessage(text)}`,
        Number.isFinite(retryAfter) && retryAfter >= 0 ? retryAfter : null,
      );
    }
    return response;
  }

  async close(): Promise<void> {
    await this.agent.close();
  }
}

function parseChunk(payload: string): StreamChunk {
  try {
    return JSON.parse(payload) as StreamChunk;
  } catch {
    throw new Error(`malformed stream chunk (not JSON): ${payload.slice(0, 200)}`);
  }
}

function errorMessage(text: string): string {
  try {
    const parsed = JSON.parse(text) as { error?: { message?: string } | string; message?: string };
    if (typeof parsed.error === "string") return parsed.error;
    return parsed.error?.message ?? parsed.message ?? text.slice(0, 500);
  } catch {
    return text.slice(0, 500);
  }
}
