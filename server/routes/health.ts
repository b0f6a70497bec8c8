// GET /health: 503 (OpenAI error shape) while the model loads or the server drains; 200 once a request
// can be served, saying how the model decodes: block diffusion, its parameters, forward passes so far.
import type { App } from "../app.js";
import type { ServerContext } from "../context.js";
import { ApiError, sendError } from "../errors.js";

export function registerHealthRoute(app: App, ctx: ServerContext): void {
  app.get("/health", async (_request, reply) => {
    if (ctx.state === "draining") return sendError(reply, new ApiError("shutting_down", "The server is shutting down."));
    if (ctx.model === null) return sendError(reply, new ApiError("model_loading", "The model is still loading."));
    const { info } = ctx.model.engine;
    const d = info.decoding;
    return {
      status: "ok",
      model: ctx.modelId,
      device: info.device,
      decoding: {
        method: "block_diffusion",
        description:
          d.advance === "slide"
            ? "iterative denoising of a window of masked positions that slides past every revealed prefix (confidence-threshold parallel reveal, at least min_tokens_per_step a step; KV cache of committed tokens)"
            : "iterative denoising of masked blocks (confidence-threshold parallel reveal, at least min_tokens_per_step a step; KV cache of committed blocks)",
        block_size: d.blockSize,
        threshold: d.threshold,
        min_tokens_per_step: d.minPerStep,
        steps: d.steps,
        temperature: d.temperature,
        top_p: d.topP,
        remasking: d.remasking,
        advance: d.advance,
        commit: d.commit,
        reveal_order: d.revealOrder,
        mask_token_id: info.maskTokenId,
      },
      forward_passes: ctx.model.engine.totalForwardPasses(),
      max_context: info.maxContext,
      queue: {
        running: ctx.queue.runningCount,
        waiting: ctx.queue.waitingCount,
        max_running: ctx.queue.maxRunning,
        max_waiting: ctx.queue.maxWaiting,
      },
    };
  });
}
