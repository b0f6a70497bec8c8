// Server-sent events in OpenAI's framing: `data: <json>\n\n` per chunk, `data: [DONE]` at the end.
// The reply is hijacked so fastify leaves the socket to us for the life of the stream. While nothing
// else is sent (a wait in the queue, a long prompt's prefill), a comment line goes out every
// `heartbeatMs`, so that clients and proxies with idle timeouts keep the connection.
import type { FastifyBaseLogger, FastifyReply } from "fastify";

import { ApiError } from "./errors.js";

export class SseStream {
  private readonly raw: FastifyReply["raw"];
  private readonly heartbeat: NodeJS.Timeout | null;
  private lastWrite = performance.now();
  /** What the heartbeat comment says the request is doing. */
  private phase: "queued" | "running" = "queued";

  constructor(reply: FastifyReply, heartbeatMs: number) {
    reply.hijack();
    this.raw = reply.raw;
    this.raw.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      // Reverse proxies must not buffer the stream: each step's final tokens are a chunk the client is waiting for.
      "x-accel-buffering": "no",
    });
    // Node holds headers back until the first body byte; a request waiting in the queue would look
    // unanswered to its client until its turn.
    this.raw.flushHeaders();
    this.heartbeat = heartbeatMs > 0 ? setInterval(() => this.beat(heartbeatMs), heartbeatMs) : null;
    this.raw.on("close", () => this.stopHeartbeat());
  }

  get open(): boolean {
    return !this.raw.writableEnded && !this.raw.destroyed;
  }

  /** The generation has left the queue: heartbeats from now on say so. */
  running(): void {
    this.phase = "running";
  }

  send(chunk: object): void {
    this.write(`data: ${JSON.stringify(chunk)}\n\n`);
  }

  /** An error after the headers went out: OpenAI's clients read an `error` object from the stream. */
  fail(error: unknown, log: FastifyBaseLogger): void {
    let apiError: ApiError;
    if (error instanceof ApiError) {
      apiError = error;
    } else {
      log.error({ err: error }, "generation failed");
      apiError = new ApiError("internal_error", "The server had an error while generating.");
    }
    this.send(apiError.body());
    this.end();
  }

  end(): void {
    this.stopHeartbeat();
    if (!this.open) return;
    this.raw.write("data: [DONE]\n\n");
    this.raw.end();
  }

  private write(text: string): void {
    if (!this.open) return;
    this.raw.write(text);
    this.lastWrite = performance.now();
  }

  private beat(intervalMs: number): void {
    // Only an idle stream needs one; a stream sending blocks is alive already.
    if (performance.now() - this.lastWrite >= intervalMs * 0.9) this.write(`: ${this.phase}\n\n`);
  }

  private stopHeartbeat(): void {
    if (this.heartbeat !== null) clearInterval(this.heartbeat);
  }
}

/**
 * Calls `onGone` if the client closes the connection before the response is complete, including a
 * client that is gone already: a request can spend a while being tokenized before this is called.
 */
export function onClientGone(reply: FastifyReply, onGone: () => void): void {
  const socket = reply.raw.socket;
  if (socket === null || socket.destroyed) {
    onGone();
    return;
  }
  reply.raw.on("close", () => {
    if (!reply.raw.writableFinished) onGone();
  });
}
