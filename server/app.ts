// The fastify application: TypeBox-typed routes, errors in OpenAI's shape, optional API key. Building it
// does not listen or load anything, so tests can drive it with inject() as well as over real sockets.
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type RawReplyDefaultExpression, type RawRequestDefaultExpression, type RawServerDefault } from "fastify";

import { requireApiKey } from "./auth.js";
import type { ServerContext } from "./context.js";
import { ApiError, sendError, toApiError } from "./errors.js";
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

/** Long conversations (a 32k-token prompt is ~150 kB of text) fit easily. */
const BODY_LIMIT = 16 * 1024 * 1024;

export function buildApp(ctx: ServerContext, logger: FastifyBaseLogger): App {
  const app = Fastify({
    loggerInstance: logger,
    bodyLimit: BODY_LIMIT,
    // A drain answers new requests itself (OpenAI-shaped 503), not with fastify's plain one.
    return503OnClosing: false,
    // Readiness probes poll /health many times a second: only the other routes get fastify's request lines.
    logController: new LogController({ disableRequestLogging: (request) => request.url.startsWith("/health") }),
    ajv: {
      // No coercion: "0.5" is not a temperature. Verbose errors carry the union descriptions shown to clients.
      customOptions: { coerceTypes: false, removeAdditional: false, useDefaults: false, verbose: true },
    },
  }).withTypeProvider<TypeBoxTypeProvider>();

  // Bodies are JSON only; a text/plain body would otherwise reach the schema as a string.
  app.removeContentTypeParser("text/plain");
  app.setErrorHandler((error, request, reply) => sendError(reply, toApiError(error as Error, request)));
  app.setNotFoundHandler((request, reply) =>
    sendError(reply, new ApiError("not_found", `Unknown route: ${request.method} ${request.url.split("?")[0]}.`)),
  );
  if (ctx.apiKey !== null) requireApiKey(app, ctx.apiKey);

  registerHealthRoute(app, ctx);
  registerModelsRoutes(app, ctx);
  registerChatRoute(app, ctx);
  registerCompletionsRoute(app, ctx);
  return app;
}
