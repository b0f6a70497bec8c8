// `a2d serve` end to end: listen at once (so /health can say 503 while loading), load the tokenizer and
// the engine, serve, and on SIGTERM/SIGINT drain: refuse new work, let running and queued generations
// finish within the grace period, cancel what is left, close the engine and exit 0.
import { existsSync } from "node:fs";
import { basename, resolve } from "node:path";

import { pino } from "pino";

import { loadEngine } from "../engine/index.js";
import type { Device } from "../engine/types.js";
import { buildApp } from "./app.js";
import { ServerContext } from "./context.js";
import { ModelTokenizer } from "./tokenizer.js";

export interface ServeOptions {
  modelDir: string;
  device: Device;
  host: string;
  port: number;
  apiKey: string | null;
  /** Requests that may wait behind the running one before 429s start. */
  maxQueue: number;
  /** Seconds a drain waits for running generations before cancelling them. */
  shutdownGraceS: number;
  /** The id in /v1/models; default: the model folder's name. */
  modelName?: string;
  threads?: number;
  maxContext?: number;
  logLevel: string;
}

export async function serve(options: ServeOptions): Promise<void> {
  const modelDir = resolve(options.modelDir);
  // A wrong path is the commonest mistake: say so before binding a port.
  if (!existsSync(resolve(modelDir, "config.json"))) {
    throw new Error(`${modelDir}: no config.json there; --model must name an a2d model folder (docs/model-format.md)`);
  }
  const log = pino({ level: options.logLevel, base: { service: "a2d" } });
  const ctx = new ServerContext(options.modelName ?? basename(modelDir), options.apiKey, options.maxQueue, log);
  const app = buildApp(ctx, log);

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
    draining = (async () => {
      await app.close();
      clearTimeout(cancelTimer);
      await ctx.model?.engine.close();
      log.info("stopped");
      log.flush();
      process.exit(0);
    })();
  };
  process.on("SIGTERM", () => drain("SIGTERM"));
  process.on("SIGINT", () => drain("SIGINT"));

  const started = performance.now();
  try {
    const tokenizer = await ModelTokenizer.load(modelDir);
    const engine = await loadEngine({
      modelDir,
      device: options.device,
      ...(options.threads !== undefined ? { threads: options.threads } : {}),
      ...(options.maxContext !== undefined ? { maxContext: options.maxContext } : {}),
    });
    if (draining !== null) {
      await engine.close();
      return;
    }
    ctx.ready({ engine, tokenizer });
    const { info } = engine;
    log.info(
      {
        model: ctx.modelId,
        device: info.device,
        parameters: info.numParameters,
        max_context: info.maxContext,
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
