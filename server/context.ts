// What the routes share: the model (absent while it loads), its tokenizer, the admission queue, and the
// set of running generations that a shutdown may have to cancel.
import type { FastifyBaseLogger } from "fastify";

import type { Engine } from "../engine/types.js";
import { ApiError } from "./errors.js";
import type { PromptEncoder } from "./prompt-encoder.js";
import { GenerationQueue } from "./queue.js";
import type { ModelTokenizer } from "./tokenizer.js";

export interface LoadedModel {
  engine: Engine;
  /** Chat template and decoding, on the main thread. */
  tokenizer: ModelTokenizer;
  /** Prompt encoding, off the main thread. */
  encoder: PromptEncoder;
}

export type ServerState = "loading" | "ready" | "draining";

/** How often an idle stream gets a comment line, by default (`a2d serve --sse-heartbeat`). */
export const DEFAULT_HEARTBEAT_MS = 15_000;

export class ServerContext {
  state: ServerState = "loading";
  model: LoadedModel | null = null;
  readonly queue: GenerationQueue;
  /** Aborting these cancels every running or waiting generation (used at the end of a drain). */
  readonly inflight = new Set<AbortController>();
  readonly created = Math.floor(Date.now() / 1000);

  constructor(
    /** The id clients see in /v1/models and in every response. */
    readonly modelId: string,
    readonly apiKey: string | null,
    maxWaiting: number,
    readonly log: FastifyBaseLogger,
    /** Comment lines on an idle stream this often (0: none). */
    readonly heartbeatMs = DEFAULT_HEARTBEAT_MS,
  ) {
    this.queue = new GenerationQueue(maxWaiting);
  }

  ready(model: LoadedModel): void {
    this.model = model;
    // As many at once as the engine decodes together (1 where its backend does not batch).
    this.queue.setMaxRunning(model.engine.info.maxBatch);
    this.state = "ready";
  }

  /** The model for a generation admitted earlier: a drain lets those run to the end. */
  loadedModel(): LoadedModel {
    if (this.model === null) throw new ApiError("model_loading", "The model is still loading; retry when GET /health answers 200.");
    return this.model;
  }

  /** The model, or the reason no new generation can start now. */
  requireModel(): LoadedModel {
    if (this.state === "draining") throw new ApiError("shutting_down", "The server is shutting down; retry on another instance.");
    if (this.model === null) throw new ApiError("model_loading", "The model is still loading; retry when GET /health answers 200.");
    return this.model;
  }
}
