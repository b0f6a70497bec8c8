// Server-sent events in OpenAI's framing: `data: <json>\n\n` per chunk, `data: [DONE]` at the end.
// The reply is hijacked so fastify leaves the socket to us for the life of the stream.
import type { FastifyBaseLogger, FastifyReply } from "fastify";

import { ApiError } from "./errors.js";

export class SseStream {
  private readonly raw: FastifyReply["raw"];

  constructor(reply: FastifyReply) {
    reply.hijack();
    this.raw = reply.raw;
    this.raw.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      connection: "keep-alive",
      // Reverse proxies must not buffer the stream: each block is a chunk the client is waiting for.
      "x-accel-buffering": "no",
    });
    // Node holds headers back until the first body byte; a request waiting in the queue would look
    // unanswered to its client until its turn.
    this.raw.flushHeaders();
  }

  get open(): boolean {
    return !this.raw.writableEnded && !this.raw.destroyed;
  }

  send(chunk: object): void {
    if (this.open) this.raw.write(`data: ${JSON.stringify(chunk)}\n\n`);
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
    if (!this.open) return;
    this.raw.write("data: [DONE]\n\n");
    this.raw.end();
  }
}

/** Calls `onGone` if the client closes the connection before the response is complete. */
export function onClientGone(reply: FastifyReply, onGone: () => void): void {
  reply.raw.on("close", () => {
    if (!reply.raw.writableFinished) onGone();
  });
}
