// One generation from admission to the last text delta: waits its turn in the queue, runs the engine,
// turns each committed block into text (detokenizer, then stop strings) and reports how it ended.
// The engine is cancelled when the client goes away, when a stop string appears, or when a drain ends.
import type { DecodeParams, GenerateResult } from "../engine/types.js";
import type { ServerContext } from "./context.js";
import { IncrementalDecoder } from "./detokenizer.js";
import { ApiError } from "./errors.js";
import { StopMatcher } from "./stop.js";

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export interface GenerationOutcome {
  finishReason: "stop" | "length";
  usage: Usage;
  /** The client went away; nothing more can be sent. */
  clientGone: boolean;
}

export interface GenerationJob {
  promptIds: number[];
  params: DecodeParams;
  stops: string[];
  decode: (ids: readonly number[]) => string;
  /** Called with text that is final: never taken back, never past a stop string. */
  onText: (text: string) => void;
  /** Called when the generation leaves the queue for the engine. */
  onStart?: () => void;
}

type CancelReason = "client" | "stop" | "shutdown";

/** A place in the queue, taken before any response byte is sent so that a full queue is a clean 429. */
export class Admission {
  private readonly controller = new AbortController();
  private readonly turn: Promise<void>;
  private readonly done: () => void;

  constructor(private readonly ctx: ServerContext) {
    const { turn, done } = ctx.queue.enter(this.controller.signal);
    this.turn = turn;
    this.done = done;
    ctx.inflight.add(this.controller);
  }

  /** The client closed its connection: leave the queue or stop the engine within one step. */
  clientGone(): void {
    this.cancel("client");
  }

  private release(): void {
    this.ctx.inflight.delete(this.controller);
    this.done();
  }

  async run(job: GenerationJob): Promise<GenerationOutcome> {
    const signal = this.controller.signal;
    try {
      try {
        await this.turn;
      } catch {
        return this.cancelled(job, null);
      }
      job.onStart?.();
      const model = this.ctx.loadedModel();
      const detokenizer = new IncrementalDecoder(job.decode);
      const stopper = new StopMatcher(job.stops);
      const emit = (text: string) => {
        if (text !== "") job.onText(text);
      };
      const result = await model.engine.generate({
        promptIds: job.promptIds,
        params: job.params,
        signal,
        onBlock: (event) => {
          if (stopper.stopped || signal.aborted) return;
          emit(stopper.push(detokenizer.push(event.tokens)));
          if (stopper.stopped) this.cancel("stop");
        },
      });
      if (!stopper.stopped && signal.reason !== "client") {
        emit(stopper.push(detokenizer.flush()));
        emit(stopper.flush());
      }
      this.ctx.log.info(
        {
          prompt_tokens: result.promptTokens,
          completion_tokens: result.completionTokens,
          forward_passes: result.forwardPasses,
          tokens_per_forward: Number(result.tokensPerForward.toFixed(3)),
          ms: Math.round(result.ms),
          tokens_per_s: result.ms > 0 ? Math.round((result.completionTokens * 1000) / result.ms) : null,
          finish_reason: stopper.stopped ? "stop_string" : result.finishReason,
          // Enough to replay a sampled request: the seed it actually ran with.
          seed: String(job.params.seed ?? 0),
        },
        "generation",
      );
      if (stopper.stopped) return this.outcome(job, result, "stop");
      if (result.finishReason === "cancelled") return this.cancelled(job, result);
      return this.outcome(job, result, result.finishReason);
    } finally {
      this.release();
    }
  }

  private cancel(reason: CancelReason): void {
    if (!this.controller.signal.aborted) this.controller.abort(reason);
  }

  private cancelled(job: GenerationJob, result: GenerateResult | null): GenerationOutcome {
    if (this.controller.signal.reason === "shutdown") {
      throw new ApiError("shutting_down", "The server shut down before this generation finished; retry it.");
    }
    return { ...this.outcome(job, result, "stop"), clientGone: true };
  }

  private outcome(job: GenerationJob, result: GenerateResult | null, finishReason: "stop" | "length"): GenerationOutcome {
    const completion = result?.completionTokens ?? 0;
    return {
      finishReason,
      usage: { prompt_tokens: job.promptIds.length, completion_tokens: completion, total_tokens: job.promptIds.length + completion },
      clientGone: false,
    };
  }
}
