// `a2d serve`: the OpenAI-compatible HTTP server over one model folder. Every path comes from the
// arguments, none from the working directory, so any launcher (serve.sh, the packed folder's) can call it.
import { type Command, InvalidArgumentError, Option } from "commander";

import { integerIn, numberIn } from "../parse.js";

/**
 * Generations decoded together by default on the CPU: where aggregate tokens/s stops rising on the demo model
 * (bench/NOTES.md, "Continuous batching").
 */
export const DEFAULT_MAX_BATCH = 8;
/**
 * On CUDA: a KV cache slot each, as many of these as fit in the GPU's memory beside the model (the engine takes
 * fewer where they do not fit, and /health's max_batch says how many it holds).
 */
export const DEFAULT_CUDA_MAX_BATCH = 32;

export function register(program: Command): void {
  program
    .command("serve")
    .description("Serve a model through an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /health)")
    .requiredOption("--model <dir>", "model folder (docs/model-format.md)")
    .addOption(new Option("--device <device>", "compute backend").choices(["cpu", "cuda"]).default("cpu"))
    .option("--port <port>", "TCP port (0: any free port)", integerIn("--port", 0, 65535), 8000)
    .option("--host <host>", "address to listen on", "0.0.0.0")
    .addOption(new Option("--api-key <key>", "require 'Authorization: Bearer <key>' on /v1 routes").env("A2D_API_KEY"))
    .option("--model-name <id>", "model id shown in /v1/models (default: the folder's name)")
    .option("--max-batch <n>", `generations decoded at once, one forward serving them all (default: ${DEFAULT_MAX_BATCH} on cpu; on cuda ${DEFAULT_CUDA_MAX_BATCH}, or as many as fit in the GPU's memory)`, integerIn("--max-batch", 1, 256))
    .option("--max-queue <n>", "requests that may wait behind the running ones before 429", integerIn("--max-queue", 0, 1_000_000), 256)
    .option("--shutdown-grace <seconds>", "on SIGTERM, how long running generations may finish before they are cancelled", seconds, 30)
    .option("--threads <n>", "CPU worker threads (cpu device; default: all cores)", integerIn("--threads", 1, 1024))
    .option("--max-context <tokens>", "longest prompt + completion (default: the engine's)", integerIn("--max-context", 1, 1 << 24))
    .option("--body-limit <bytes>", "largest request body (default: 2 MiB, room for a 32k-token conversation)", integerIn("--body-limit", 1024, 1 << 30))
    .option("--request-timeout <seconds>", "how long a request's headers and body may take to arrive (default: 30)", numberIn("--request-timeout", 0.01, 3600))
    .option("--sse-heartbeat <seconds>", "comment line on a stream idle this long, e.g. waiting in the queue (0: none; default: 15)", numberIn("--sse-heartbeat", 0, 3600))
    .addOption(new Option("--log-level <level>", "pino log level").choices(["fatal", "error", "warn", "info", "debug", "trace"]).default("info").env("A2D_LOG_LEVEL"))
    .action(async (opts) => {
      // fastify, ajv and pino take a second to import; other commands should not pay for them.
      const { serve } = await import("../../server/server.js");
      await serve({
        modelDir: opts.model,
        device: opts.device,
        host: opts.host,
        port: opts.port,
        apiKey: opts.apiKey && opts.apiKey !== "" ? opts.apiKey : null,
        maxBatch: opts.maxBatch ?? (opts.device === "cuda" ? DEFAULT_CUDA_MAX_BATCH : DEFAULT_MAX_BATCH),
        maxQueue: opts.maxQueue,
        shutdownGraceS: opts.shutdownGrace,
        modelName: opts.modelName,
        threads: opts.threads,
        maxContext: opts.maxContext,
        bodyLimit: opts.bodyLimit,
        requestTimeoutS: opts.requestTimeout,
        sseHeartbeatS: opts.sseHeartbeat,
        logLevel: opts.logLevel,
      });
    });
}

function seconds(value: string): number {
  const parsed = Number(value);
  if (!Number.isFinite(parsed) || parsed < 0) throw new InvalidArgumentError("expected a number of seconds >= 0");
  return parsed;
}
