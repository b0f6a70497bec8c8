// Request bodies as TypeBox schemas, checked by fastify at the edge. Unknown fields are ignored, as
// OpenAI's API does; types and ranges are enforced (no type coercion: "0.5" is not a number). Limits
// that depend on the loaded model (context length, block size) are checked in params.ts.
import { type Static, type TInteger, type TNumber, type TString, Type } from "@fastify/type-provider-typebox";

import { paramSpec, valueProblem } from "../engine/params.js";

const TextPart = Type.Object({ type: Type.String(), text: Type.Optional(Type.String()) });

const Message = Type.Object({
  // "tool" and "function" turns are valid OpenAI input; the chat route refuses them by name (no tool calling).
  role: Type.Enum(["system", "developer", "user", "assistant", "tool", "function"]),
  content: Type.Optional(
    Type.Union([Type.String(), Type.Null(), Type.Array(TextPart)], {
      description: "a string or an array of content parts",
    }),
  ),
  name: Type.Optional(Type.String()),
  reasoning_content: Type.Optional(Type.Union([Type.String(), Type.Null()], { description: "a string" })),
  tool_calls: Type.Optional(Type.Union([Type.Array(Type.Unknown()), Type.Null()], { description: "an array of tool calls" })),
  function_call: Type.Optional(Type.Unknown()),
});
export type ChatMessage = Static<typeof Message>;

const Stop = Type.Optional(
  Type.Union([Type.String(), Type.Array(Type.String(), { maxItems: 16 }), Type.Null()], {
    description: "a string or an array of at most 16 strings",
  }),
);

/** An a2d decoding field's schema from its entry in engine/decoding-params.json ("block_size" bounds: 64). */
function decodingField(name: "block_size" | "min_per_step" | "steps"): TInteger;
function decodingField(name: "threshold"): TNumber;
function decodingField(name: "remasking" | "advance" | "commit" | "reveal_order"): TString;
function decodingField(name: string): TInteger | TNumber | TString {
  const spec = paramSpec(name);
  const description = `${valueProblem(spec, undefined, 64)}: ${spec.doc}`;
  if (spec.type === "choice") return Type.String({ enum: spec.choices, description });
  const max = typeof spec.max === "number" ? spec.max : 64;
  const low = spec.min_exclusive ? { exclusiveMinimum: spec.min } : { minimum: spec.min };
  return spec.type === "integer" ? Type.Integer({ ...low, maximum: max, description }) : Type.Number({ ...low, maximum: max, description });
}

/** Sampling and a2d's decoding parameters, shared by both generation endpoints. */
const Sampling = {
  model: Type.Optional(Type.String()),
  max_tokens: Type.Optional(Type.Union([Type.Integer({ minimum: 1 }), Type.Null()], { description: "a positive integer" })),
  temperature: Type.Optional(Type.Union([Type.Number({ minimum: 0, maximum: 2 }), Type.Null()], { description: "a number in [0, 2]" })),
  top_p: Type.Optional(Type.Union([Type.Number({ exclusiveMinimum: 0, maximum: 1 }), Type.Null()], { description: "a number in (0, 1]" })),
  // OpenAI seeds are signed 64-bit; a2d's RNG takes the same 64 bits unsigned (two's complement).
  seed: Type.Optional(
    Type.Union([Type.Integer({ minimum: -9223372036854775808, maximum: 18446744073709551615 }), Type.Null()], {
      description: "an integer in [-2^63, 2^64)",
    }),
  ),
  n: Type.Optional(Type.Union([Type.Integer({ minimum: 1 }), Type.Null()], { description: "an integer" })),
  stop: Stop,
  stream: Type.Optional(Type.Union([Type.Boolean(), Type.Null()], { description: "a boolean" })),
  stream_options: Type.Optional(
    Type.Union([Type.Object({ include_usage: Type.Optional(Type.Boolean()) }), Type.Null()], {
      description: "an object {include_usage: boolean}",
    }),
  ),
  logprobs: Type.Optional(Type.Union([Type.Boolean(), Type.Integer({ minimum: 0 }), Type.Null()], { description: "a boolean" })),
  top_logprobs: Type.Optional(Type.Union([Type.Integer({ minimum: 0, maximum: 20 }), Type.Null()], { description: "an integer in [0, 20]" })),
  logit_bias: Type.Optional(
    Type.Union([Type.Record(Type.String(), Type.Number({ minimum: -100, maximum: 100 })), Type.Null()], {
      description: "an object from token ids to numbers in [-100, 100]",
    }),
  ),
  presence_penalty: Type.Optional(Type.Union([Type.Number({ minimum: -2, maximum: 2 }), Type.Null()], { description: "a number in [-2, 2]" })),
  frequency_penalty: Type.Optional(Type.Union([Type.Number({ minimum: -2, maximum: 2 }), Type.Null()], { description: "a number in [-2, 2]" })),
  // a2d extensions (docs/decoding.md, "Parameters"), from engine/decoding-params.json; absent means the
  // model's default.
  block_size: Type.Optional(decodingField("block_size")),
  threshold: Type.Optional(decodingField("threshold")),
  min_per_step: Type.Optional(decodingField("min_per_step")),
  steps: Type.Optional(decodingField("steps")),
  remasking: Type.Optional(decodingField("remasking")),
  advance: Type.Optional(decodingField("advance")),
  commit: Type.Optional(decodingField("commit")),
  reveal_order: Type.Optional(decodingField("reveal_order")),
  // As in vLLM: generate max_tokens whatever the model says, for throughput measurements.
  ignore_eos: Type.Optional(Type.Boolean()),
  // Fields of the retired remasking 'verify' and 'tree': any value is refused by name (params.ts).
  tree_width: Type.Optional(Type.Unknown()),
  lookup_ngram: Type.Optional(Type.Unknown()),
};

export const ChatBody = Type.Object({
  ...Sampling,
  messages: Type.Array(Message, { minItems: 1 }),
  max_completion_tokens: Type.Optional(
    Type.Union([Type.Integer({ minimum: 1 }), Type.Null()], { description: "a positive integer" }),
  ),
  // Tool calling, structured output and audio: typed here, refused unless trivial (params.ts, refuseUnsupportedChat).
  tools: Type.Optional(Type.Union([Type.Array(Type.Unknown()), Type.Null()], { description: "an array of tools" })),
  tool_choice: Type.Optional(Type.Union([Type.String(), Type.Object({}), Type.Null()], { description: "a string or an object" })),
  functions: Type.Optional(Type.Union([Type.Array(Type.Unknown()), Type.Null()], { description: "an array of functions" })),
  function_call: Type.Optional(Type.Union([Type.String(), Type.Object({}), Type.Null()], { description: "a string or an object" })),
  response_format: Type.Optional(
    Type.Union([Type.Object({ type: Type.String() }), Type.Null()], { description: "an object {type: string}" }),
  ),
  modalities: Type.Optional(Type.Union([Type.Array(Type.String()), Type.Null()], { description: "an array of strings" })),
  audio: Type.Optional(Type.Unknown()),
  chat_template_kwargs: Type.Optional(
    Type.Union([Type.Object({ enable_thinking: Type.Optional(Type.Boolean()) }), Type.Null()], {
      description: "an object {enable_thinking: boolean}",
    }),
  ),
});
export type ChatRequest = Static<typeof ChatBody>;

export const CompletionBody = Type.Object({
  ...Sampling,
  prompt: Type.Union(
    [
      Type.String(),
      Type.Array(Type.String(), { minItems: 1 }),
      Type.Array(Type.Integer({ minimum: 0 }), { minItems: 1 }),
      Type.Array(Type.Array(Type.Integer({ minimum: 0 }), { minItems: 1 }), { minItems: 1 }),
    ],
    { description: "a string, an array of strings, an array of token ids or an array of token id arrays" },
  ),
  echo: Type.Optional(Type.Union([Type.Boolean(), Type.Null()], { description: "a boolean" })),
  suffix: Type.Optional(Type.Union([Type.String(), Type.Null()], { description: "a string" })),
  best_of: Type.Optional(Type.Union([Type.Integer({ minimum: 1 }), Type.Null()], { description: "an integer" })),
});
export type CompletionRequest = Static<typeof CompletionBody>;

export type SamplingRequest = Pick<ChatRequest, keyof typeof Sampling>;
