// The fastify application: TypeBox-typed routes, errors in OpenAI's shape, optional API key. Building it
// does not listen or load anything, so tests can drive it with inject() as well as over real sockets.
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type RawReplyDefaultExpression, type RawRequestDefaultExpression, type RawServerDefault } from "fastify";

import { requireApiKey } from "./auth.js";
import type { ServerContext } from "./context.js";
import { ApiError, sendError, toApiError } from "./errors.js";
import { continueWithinLimit, refuseDeclaredTooLarge, refuseStreamedTooLarge } from "./body-limit.js";
import { answerClientError, answerExpectation, requireHost } from "./http-edge.js";
import { registerJsonParser } from "./json-body.js";
import { registerChatRoute } from "./routes/chat.js";
import { registerCompletionsRoute } from "./routes/completions.js";
import { registerHealthRoute } from "./routes/health.js";
import { registerModelsRoutes } from "./routes/models.js";

export type App = FastifyInstance<
  RawServerDefault,
  RawRequestDefaultExpression,
  RawReplyDefaultExpression,
  FastifyBaseLogger,
  TypeBoxTypeProvider
>;

export interface HttpLimits {
  /** Largest request body, bytes. */
  bodyLimit: number;
  /** How long a request's headers and body may take to arrive, milliseconds. */
  requestTimeoutMs: number;
}

export const DEFAULT_LIMITS: HttpLimits = {
  // A 36,864-token context (32k generated + 4k prompt) is ~150 kB of English and at most ~450 kB of
  // JSON-escaped text (\uXXXX surrogate pairs, 12 bytes for a one-token emoji); 2 MiB leaves room for
  // history the template drops. A larger body is refused before it is read whole (body-limit.ts).
  bodyLimit: 2 * 1024 * 1024,
  requestTimeoutMs: 30_000,
};

export function buildApp(ctx: ServerContext, logger: FastifyBaseLogger, limits: HttpLimits = DEFAULT_LIMITS): App {
  const app = Fastify({
    loggerInstance: logger,
    bodyLimit: limits.bodyLimit,
    requestTimeout: limits.requestTimeoutMs,
    http: {
      // Checked in requireHost instead, so that the answer is in OpenAI's shape.
      requireHostHeader: false,
      headersTimeout: limits.requestTimeoutMs,
      requestTimeout: limits.requestTimeoutMs,
      // Node looks for timed-out requests this often (30 s by default, which would stretch a short timeout).
      connectionsCheckingInterval: Math.min(1000, limits.requestTimeoutMs),
    },
    clientErrorHandler: answerClientError,
    frameworkErrors: (error, request, reply) => sendError(reply, toApiError(error, request)),
    // A drain answers new requests itself (OpenAI-shaped 503), not with fastify's plain one.
    return503OnClosing: false,
    // Readiness probes poll /health many times a second: only the other routes get fastify's request lines.
    logController: new LogController({ disableRequestLogging: (request) => request.url.startsWith("/health") }),
    ajv: {
      // No coercion: "0.5" is not a temperature. Verbose errors carry the union descriptions shown to clients.
      customOptions: { coerceTypes: false, removeAdditional: false, useDefaults: false, verbose: true },
    },
  }).withTypeProvider<TypeBoxTypeProvider>();

  app.server.on("checkExpectation", answerExpectation);
  app.server.on("checkContinue", continueWithinLimit(app.server, limits.bodyLimit));
  // Bodies are JSON only; a text/plain body would otherwise reach the schema as a string.
  app.removeContentTypeParser("text/plain");
  registerJsonParser(app);
  app.setErrorHandler(async (error, request, reply) => {
    const apiError = toApiError(error as Error, request);
    if (apiError.code === "payload_too_large") return refuseStreamedTooLarge(request, reply, apiError);
    return sendError(reply, apiError);
  });
  app.setNotFoundHandler((request, reply) =>
    sendError(reply, new ApiError("not_found", `Unknown route: ${request.method} ${request.url.split("?")[0]}.`)),
  );
  app.addHook("onRequest", refuseDeclaredTooLarge(limits.bodyLimit));
  app.addHook("onRequest", requireHost);

  registerHealthRoute(app, ctx);
  // The /v1 routes live in a scope of their own, whose hooks fastify runs for the route its router
  // matched: the key is checked on whatever spelling of the path (percent-encoded, absolute-form) the
  // router decoded to a /v1 route, not on the raw URL.
  app.register(async (v1: App) => {
    if (ctx.apiKey !== null) requireApiKey(v1, ctx.apiKey);
    registerModelsRoutes(v1, ctx);
    registerChatRoute(v1, ctx);
    registerCompletionsRoute(v1, ctx);
  });
  return app;
}
