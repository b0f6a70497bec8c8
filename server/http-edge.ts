// What Node's HTTP layer would answer by itself, before fastify routes anything, answered in OpenAI's
// error shape instead of an empty or plain-text body: bytes that are not HTTP/1.1, headers too large, a
// request that does not arrive within the timeout, an Expect header it cannot meet, a missing Host.
import type { IncomingMessage, ServerResponse } from "node:http";
import { STATUS_CODES } from "node:http";
import type { Socket } from "node:net";

import type { FastifyRequest } from "fastify";

import { ApiError } from "./errors.js";

/**
 * A whole HTTP/1.1 response carrying `error`, for a socket that no request object owns or whose
 * connection closes after the answer; the body left out (but still counted) for a HEAD request.
 */
export function rawResponse(error: ApiError, withBody = true): string {
  const body = JSON.stringify(error.body());
  return (
    `HTTP/1.1 ${error.status} ${STATUS_CODES[error.status]}\r\nContent-Type: application/json; charset=utf-8\r\n` +
    `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${withBody ? body : ""}`
  );
}

/** fastify's clientErrorHandler: Node could not parse a request on this socket, or gave up waiting for it. */
export function answerClientError(error: NodeJS.ErrnoException, socket: Socket): void {
  if (error.code === "ECONNRESET" || socket.destroyed) return;
  let apiError: ApiError;
  if (error.code === "ERR_HTTP_REQUEST_TIMEOUT") {
    apiError = new ApiError("request_timeout", "The request did not arrive in time: send its headers and body without pausing.");
  } else if (error.code === "HPE_HEADER_OVERFLOW") {
    apiError = new ApiError("headers_too_large", "The request line and headers are too large.");
  } else {
    apiError = new ApiError("malformed_request", `The request is not valid HTTP/1.1 (${error.code ?? error.message}).`);
  }
  if (socket.writable) socket.end(rawResponse(apiError));
  // A client that keeps the connection open after the answer loses it.
  setTimeout(() => socket.destroy(), 1000).unref();
}

/** Node's checkExpectation event: an Expect header other than 100-continue, which HTTP says to refuse with 417. */
export function answerExpectation(request: IncomingMessage, response: ServerResponse): void {
  const error = new ApiError("expectation_failed", `Expect: ${request.headers.expect} is not supported; send the request without it.`);
  response.writeHead(error.status, { "content-type": "application/json; charset=utf-8", connection: "close" });
  response.end(JSON.stringify(error.body()));
}

/** HTTP/1.1 wants a Host header (RFC 9112, 3.2); Node's own check would answer with an empty body. */
export async function requireHost(request: FastifyRequest): Promise<void> {
  if (request.raw.httpVersion === "1.1" && request.headers.host === undefined) {
    throw new ApiError("malformed_request", "An HTTP/1.1 request needs a Host header.");
  }
}
