// From a validated request body to the engine's DecodeParams: OpenAI fields a2d does not implement are
// refused by name, a2d's own decoding fields override the model's defaults, and the token budget is
// fitted to the context the engine was loaded with.
import { randomBytes } from "node:crypto";

import { brokenRule, roomForTokens } from "../engine/params.js";
import type { DecodeParams, ModelInfo } from "../engine/types.js";
import { ApiError } from "./errors.js";
import type { ChatRequest, SamplingRequest } from "./schemas.js";

export interface Resolved {
  params: DecodeParams;
  stops: string[];
}

export function resolveParams(
  body: SamplingRequest,
  info: ModelInfo,
  promptTokens: number,
  maxTokensField: number | null | undefined,
  /** The seed exactly as the request wrote it (JSON numbers past 2^53 lose digits); see json-body.ts. */
  exactSeed: bigint | null,
): Resolved {
  refuseUnsupported(body);

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
    revealOrder: body.reveal_order ?? d.revealOrder,
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
  if (body.reveal_order !== undefined) params.revealOrder = body.reveal_order as DecodeParams["revealOrder"];
  if (body.ignore_eos === true) params.eosTokenIds = [];
  params.seed = body.seed != null ? requestSeed(body.seed, exactSeed) : randomSeed();
  return { params, stops };
}

/**
 * Signed 64-bit seeds map onto a2d's unsigned RNG seed by their two's complement bits. Without a seed,
 * sampling is fresh per request, as OpenAI's is (the CLI's fixed default is for reproducing the reference).
 */
function requestSeed(parsed: number, exact: bigint | null): bigint {
  if (exact === null && !Number.isSafeInteger(parsed)) {
    throw new ApiError("invalid_value", "Write a seed beyond 2^53 as plain digits (no exponent or fraction), so that it is read exactly.", "seed");
  }
  const seed = exact ?? BigInt(parsed);
  if (seed < -(1n << 63n) || seed >= 1n << 64n) throw new ApiError("invalid_value", "seed must be an integer in [-2^63, 2^64).", "seed");
  return BigInt.asUintN(64, seed);
}

/** OpenAI fields this server does not implement, refused by name rather than ignored. */
function refuseUnsupported(body: SamplingRequest): void {
  if (body.n != null && body.n !== 1) {
    throw new ApiError("unsupported_value", "Only n=1 is supported: ask for more completions with more requests.", "n");
  }
  if (body.logprobs != null && body.logprobs !== false && body.logprobs !== 0) {
    throw new ApiError("unsupported_parameter", "logprobs are not available from the block-diffusion decoder.", "logprobs");
  }
  if (body.top_logprobs != null && body.top_logprobs !== 0) {
    throw new ApiError("unsupported_value", "top_logprobs are not available from the block-diffusion decoder.", "top_logprobs");
  }
  if (body.logit_bias != null && Object.keys(body.logit_bias).length > 0) {
    throw new ApiError("unsupported_value", "logit_bias is not supported; send an empty object or leave it out.", "logit_bias");
  }
  for (const name of ["presence_penalty", "frequency_penalty"] as const) {
    const value = body[name];
    if (value != null && value !== 0) throw new ApiError("unsupported_value", `${name} is not supported; leave it at 0.`, name);
  }
  for (const name of ["tree_width", "lookup_ngram"] as const) {
    if (body[name] !== undefined) {
      throw new ApiError(
        "unsupported_parameter",
        `${name} was removed with remasking 'verify' and 'tree', which kept a token only when a causal reading of the tokens ` +
          "before it chose it too (left-to-right decoding with a drafter); leave it out and decode by the denoiser's own " +
          "confidence (remasking low_confidence, random or leftmost).",
        name,
      );
    }
  }
}

function randomSeed(): bigint {
  return randomBytes(8).readBigUInt64LE();
}

/**
 * Chat fields for tool calling, structured output and audio. Their trivial values (no tools, tool_choice
 * "none" or "auto", response_format "text") mean plain text and pass; any other asks for something this
 * server cannot give, and a 400 says so instead of a 200 with plain text the client would misread.
 */
export function refuseUnsupportedChat(body: ChatRequest): void {
  const noTools = "Tool calling is not supported by this server";
  if (body.tools != null && body.tools.length > 0) throw new ApiError("unsupported_value", `${noTools}; send no tools.`, "tools");
  if (body.functions != null && body.functions.length > 0) throw new ApiError("unsupported_value", `${noTools}; send no functions.`, "functions");
  const choice = body.tool_choice;
  if (choice != null && choice !== "none" && choice !== "auto") {
    throw new ApiError("unsupported_value", `${noTools}: tool_choice may only be "none" or "auto".`, "tool_choice");
  }
  const functionCall = body.function_call;
  if (functionCall != null && functionCall !== "none" && functionCall !== "auto") {
    throw new ApiError("unsupported_value", `${noTools}: function_call may only be "none" or "auto".`, "function_call");
  }
  const format = body.response_format?.type;
  if (format === "json_object" || format === "json_schema") {
    throw new ApiError(
      "unsupported_value",
      `response_format '${format}' needs constrained decoding, which this block-diffusion decoder does not have (it reveals tokens ` +
        "in parallel, not left to right under a grammar); ask for JSON in the prompt and validate the reply yourself.",
      "response_format",
    );
  }
  if (format != null && format !== "text") {
    throw new ApiError("invalid_value", `Invalid value for 'response_format.type': must be "text", "json_object" or "json_schema".`, "response_format.type");
  }
  if (body.modalities != null && body.modalities.some((modality) => modality !== "text")) {
    throw new ApiError("unsupported_value", "This server answers in text only: modalities may only be [\"text\"].", "modalities");
  }
  if (body.audio != null) throw new ApiError("unsupported_value", "Audio output is not supported; leave audio out.", "audio");
}
