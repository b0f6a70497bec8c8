// The body limit (--body-limit). A body whose headers declare more is refused with 413 as soon as the
// headers are in, none of it read and no `100 Continue` sent for it; a body that streams past the limit
// (chunked, so no length was declared) is refused once it has; in both cases the answer reaches the
// client, however much of the body it is still sending.
import type { IncomingMessage, Server, ServerResponse } from "node:http";

import type { FastifyReply, FastifyRequest } from "fastify";

import { ApiError, payloadTooLarge, sendError } from "./errors.js";
import { rawResponse } from "./http-edge.js";

/** True when the request's Content-Length is over `limit` (Node has already refused malformed lengths). */
function declaresTooLarge(request: IncomingMessage, limit: number): boolean {
  return Number(request.headers["content-length"]) > limit;
}

/**
 * Node's checkContinue event, a request with `Expect: 100-continue`: the go-ahead only for a body within
 * the limit, then the request goes to fastify as any other (whose first hook refuses the rest).
 */
export function continueWithinLimit(server: Server, limit: number): (request: IncomingMessage, response: ServerResponse) => void {
  return (request, response) => {
    if (!declaresTooLarge(request, limit)) response.writeContinue();
    server.emit("request", request, response);
  };
}

/**
 * fastify's first onRequest hook: a declared body over the limit is answered at once, before the API
 * key or the route, and the connection closes after the answer. What the client sends meanwhile is read
 * and dropped (drainRefusedBody) until it stops, closes or the request timeout ends the connection.
 */
export function refuseDeclaredTooLarge(limit: number): (request: FastifyRequest, reply: FastifyReply) => Promise<void> {
  return async (request, reply) => {
    if (!declaresTooLarge(request.raw, limit)) return;
    request.log.info({ content_length: request.headers["content-length"], body_limit: limit }, "declared body over the limit refused");
    // The answer is written on the socket itself: through the response, Node would destroy the
    // connection as soon as the answer is out, with the client's data unread.
    reply.hijack();
    const socket = request.raw.socket;
    socket.end(rawResponse(payloadTooLarge(limit), request.method !== "HEAD"));
    void drainRefusedBody(request.raw).then(() => socket.destroy());
  };
}

/** The error handler's answer to a body that streamed past the limit: read off first, then answered. */
export async function refuseStreamedTooLarge(request: FastifyRequest, reply: FastifyReply, error: ApiError): Promise<FastifyReply> {
  await drainRefusedBody(request.raw);
  return sendError(reply, error);
}

/** A refused body is read and dropped up to this much (see drainRefusedBody). */
const DRAIN_MAX_BYTES = 64 * 1024 * 1024;

/**
 * Reads and drops the rest of a request body that was refused for its size, up to 64 MiB. Closed while
 * the client is still sending, the connection would have data unread, which TCP turns into a reset, and
 * the client would see that instead of the answer.
 */
function drainRefusedBody(request: IncomingMessage): Promise<void> {
  if (request.complete || request.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    let left = DRAIN_MAX_BYTES;
    const finish = () => {
      request.off("data", onData);
      resolve();
    };
    const onData = (chunk: Buffer) => {
      left -= chunk.length;
      if (left < 0) finish();
    };
    request.on("data", onData);
    request.once("end", finish);
    request.once("close", finish);
    request.resume();
  });
}
