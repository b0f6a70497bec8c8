// From a validated request body to the engine's DecodeParams: OpenAI fields a2d does not implement are
// refused by name, a2d's own decoding fields override the model's defaults, and the token budget is
// fitted to the context the engine was loaded with.
import { randomBytes } from "node:crypto";

import { brokenRule, roomForTokens } from "../engine/params.js";
import type { DecodeParams, ModelInfo } from "../engine/types.js";
import { ApiError } from "./errors.js";
import type { SamplingRequest } from "./schemas.js";

export interface Resolved {
  params: DecodeParams;
  stops: string[];
}

export function resolveParams(body: SamplingRequest, info: ModelInfo, promptTokens: number, maxTokensField: number | null | undefined): Resolved {
  if (body.n != null && body.n !== 1) {
    throw new ApiError("unsupported_value", "Only n=1 is supported: ask for more completions with more requests.", "n");
  }
  if (body.logprobs != null && body.logprobs !== false && body.logprobs !== 0) {
    throw new ApiError("unsupported_parameter", "logprobs are not available from the block-diffusion decoder.", "logprobs");
  }
  for (const name of ["presence_penalty", "frequency_penalty"] as const) {
    const value = body[name];
    if (value != null && value !== 0) throw new ApiError("unsupported_value", `${name} is not supported; leave it at 0.`, name);
  }

  const blockSize = body.block_size ?? info.decoding.blockSize;
  if (body.min_per_step !== undefined && body.min_per_step > blockSize) {
    throw new ApiError("invalid_value", `min_per_step (${body.min_per_step}) must not exceed the block size (${blockSize}).`, "min_per_step");
  }
  if (body.steps !== undefined && body.steps > blockSize) {
    throw new ApiError("invalid_value", `steps (${body.steps}) must not exceed the block size (${blockSize}).`, "steps");
  }

  const d = info.decoding;
  const rule = brokenRule({
    blockSize,
    threshold: body.threshold ?? d.threshold,
    minPerStep: body.min_per_step ?? Math.min(d.minPerStep, blockSize),
    steps: body.steps ?? Math.min(d.steps, blockSize),
    remasking: body.remasking ?? d.remasking,
    advance: body.advance ?? d.advance,
  });
  if (rule !== null) throw new ApiError("invalid_value", `These decoding parameters break the rule ${rule.id}: ${rule.message}.`, rule.id);

  if (promptTokens === 0) throw new ApiError("invalid_value", "The prompt must hold at least one token.", null);
  // The engine's window reaches block_size - 1 positions past the last token: positionsNeeded's rule.
  const room = roomForTokens(promptTokens, blockSize, info.maxContext);
  if (room <= 0) {
    throw new ApiError(
      "context_length_exceeded",
      `This model's maximum context length is ${info.maxContext} tokens; the prompt has ${promptTokens}, which leaves no room ` +
        `for a block of ${blockSize} tokens. Shorten the prompt.`,
      "messages",
    );
  }
  // A budget past the context is cut to what fits, and the completion ends with finish_reason "length"
  // there: clients ask for "up to N tokens" (32768 for long reasoning) whatever their prompt's length.
  const maxTokens = Math.min(maxTokensField ?? room, room);

  const stop = body.stop;
  const stops = stop == null ? [] : typeof stop === "string" ? [stop] : stop;
  if (stops.some((text) => text.length === 0)) throw new ApiError("invalid_value", "Stop strings must not be empty.", "stop");

  const params: DecodeParams = { maxTokens, blockSize };
  if (body.temperature != null) params.temperature = body.temperature;
  if (body.top_p != null) params.topP = body.top_p;
  if (body.threshold !== undefined) params.threshold = body.threshold;
  // A request's smaller block would otherwise inherit a per-step minimum or schedule larger than itself.
  params.minPerStep = body.min_per_step ?? Math.min(info.decoding.minPerStep, blockSize);
  params.steps = body.steps ?? Math.min(info.decoding.steps, blockSize);
  if (body.remasking !== undefined) params.remasking = body.remasking as DecodeParams["remasking"];
  if (body.advance !== undefined) params.advance = body.advance as DecodeParams["advance"];
  if (body.commit !== undefined) params.commit = body.commit as DecodeParams["commit"];
  if (body.ignore_eos === true) params.eosTokenIds = [];
  // Signed 64-bit seeds map onto a2d's unsigned RNG seed by their two's complement bits. Without a seed,
  // sampling is fresh per request, as OpenAI's is (the CLI's fixed default is for reproducing the reference).
  params.seed = body.seed != null ? BigInt.asUintN(64, BigInt(body.seed)) : randomSeed();
  return { params, stops };
}

function randomSeed(): bigint {
  return randomBytes(8).readBigUInt64LE();
}
