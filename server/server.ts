// `a2d serve` end to end: listen at once (so /health can say 503 while loading), load the tokenizer and
// the engine, serve, and on SIGTERM/SIGINT drain: refuse new work, let running and queued generations
// finish within the grace period, cancel what is left, close the engine and exit 0.
import { existsSync } from "node:fs";
import type { Socket } from "node:net";
import { basename, resolve } from "node:path";

import { loadEngine } from "../engine/index.js";
import type { Device } from "../engine/types.js";
import { DEFAULT_LIMITS, buildApp } from "./app.js";
import { DEFAULT_HEARTBEAT_MS, ServerContext } from "./context.js";
import { serverLogger } from "./log.js";
import { startEncoderWorker } from "./prompt-encoder.js";
import { ModelTokenizer } from "./tokenizer.js";

export interface ServeOptions {
  modelDir: string;
  device: Device;
  host: string;
  port: number;
  apiKey: string | null;
  /** Requests that may wait behind the running ones before 429s start. */
  maxQueue: number;
  /** Generations decoded at once (one forward serving them all); the engine may hold fewer. */
  maxBatch: number;
  /** Seconds a drain waits for running generations before cancelling them. */
  shutdownGraceS: number;
  /** The id in /v1/models; default: the model folder's name. */
  modelName?: string;
  threads?: number;
  maxContext?: number;
  /** Largest request body in bytes; default: DEFAULT_LIMITS.bodyLimit. */
  bodyLimit?: number;
  /** Seconds a request's headers and body may take to arrive; default: DEFAULT_LIMITS. */
  requestTimeoutS?: number;
  /** Seconds between comment lines on an idle stream (0: none); default: DEFAULT_HEARTBEAT_MS. */
  sseHeartbeatS?: number;
  logLevel: string;
}

export async function serve(options: ServeOptions): Promise<void> {
  const modelDir = resolve(options.modelDir);
  // A wrong path is the commonest mistake: say so before binding a port.
  if (!existsSync(resolve(modelDir, "config.json"))) {
    throw new Error(`${modelDir}: no config.json there; --model must name an a2d model folder (docs/model-format.md)`);
  }
  const log = serverLogger(options.logLevel);
  const heartbeatMs = options.sseHeartbeatS !== undefined ? Math.round(options.sseHeartbeatS * 1000) : DEFAULT_HEARTBEAT_MS;
  const ctx = new ServerContext(options.modelName ?? basename(modelDir), options.apiKey, options.maxQueue, log, heartbeatMs);
  const app = buildApp(ctx, log, {
    bodyLimit: options.bodyLimit ?? DEFAULT_LIMITS.bodyLimit,
    requestTimeoutMs: options.requestTimeoutS !== undefined ? Math.round(options.requestTimeoutS * 1000) : DEFAULT_LIMITS.requestTimeoutMs,
  });

  try {
    await app.listen({ host: options.host, port: options.port });
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "EADDRINUSE") throw new Error(`port ${options.port} on ${options.host} is in use; pass another --port (or set PORT)`);
    if (code === "EACCES") throw new Error(`no permission to listen on port ${options.port}; use a port above 1023`);
    throw error;
  }
  const address = app.server.address();
  const port = typeof address === "object" && address !== null ? address.port : options.port;
  log.info({ url: `http://${options.host === "0.0.0.0" ? "127.0.0.1" : options.host}:${port}`, port }, "listening");

  // The open connections, for a drain: one that has not sent a byte (a client's pool may open one ahead of need
  // and leave it unused) is neither idle nor done for Node until its headers timeout, so the drain closes it (see
  // below). Read by bytesRead, not a 'data' listener, which would take the socket off Node's native HTTP parsing.
  const sockets = new Set<Socket>();
  app.server.on("connection", (socket: Socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
  });

  let draining: Promise<void> | null = null;
  const drain = (signal: string): void => {
    if (draining !== null) {
      log.warn({ signal }, "second signal: cancelling every generation now");
      for (const controller of ctx.inflight) controller.abort("shutdown");
      return;
    }
    ctx.state = "draining";
    log.info({ signal, running: ctx.queue.runningCount, waiting: ctx.queue.waitingCount }, "draining");
    const cancelTimer = setTimeout(() => {
      log.warn({ grace_s: options.shutdownGraceS }, "grace period over: cancelling the remaining generations");
      for (const controller of ctx.inflight) controller.abort("shutdown");
    }, options.shutdownGraceS * 1000);
    // close() closes the connections idle when it is called; one whose stream ends during the drain goes
    // idle later, and a keep-alive client (undici keeps one 71 s) would hold the exit until it left.
    // A connection still silent a tick after the drain began carries no request: it is closed too (a request it
    // sent later would only be refused).
    const silentAtStart = [...sockets].filter((socket) => socket.bytesRead === 0);
    const closeIdle = setInterval(() => {
      app.server.closeIdleConnections();
      for (const socket of silentAtStart) if (!socket.destroyed && socket.bytesRead === 0) socket.destroy();
    }, 100);
    draining = (async () => {
      await app.close();
      clearInterval(closeIdle);
      clearTimeout(cancelTimer);
      await ctx.model?.engine.close();
      await ctx.model?.encoder.close();
      log.info("stopped");
      log.flush();
      process.exit(0);
    })();
  };
  process.on("SIGTERM", () => drain("SIGTERM"));
  process.on("SIGINT", () => drain("SIGINT"));

  const started = performance.now();
  try {
    const files = await ModelTokenizer.readFiles(modelDir);
    const tokenizer = ModelTokenizer.fromFiles(files);
    // The encoder's thread builds its own tokenizer from the same files while the engine loads.
    const [engine, encoder] = await Promise.all([
      loadEngine({
        modelDir,
        device: options.device,
        ...(options.threads !== undefined ? { threads: options.threads } : {}),
        ...(options.maxContext !== undefined ? { maxContext: options.maxContext } : {}),
        maxBatch: options.maxBatch,
      }),
      startEncoderWorker(files),
    ]);
    if (draining !== null) {
      await engine.close();
      await encoder.close();
      return;
    }
    ctx.ready({ engine, tokenizer, encoder });
    const { info } = engine;
    log.info(
      {
        model: ctx.modelId,
        device: info.device,
        parameters: info.numParameters,
        max_context: info.maxContext,
        max_batch: info.maxBatch,
        decoding: info.decoding,
        load_s: Number(((performance.now() - started) / 1000).toFixed(2)),
      },
      "ready",
    );
  } catch (error) {
    log.fatal({ err: error }, "cannot load the model");
    log.flush();
    await app.close();
    throw error;
  }
}
