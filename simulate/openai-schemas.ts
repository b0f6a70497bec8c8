// The response shapes an OpenAI client relies on, as the selfcheck holds a server to them: the fields the
// official clients read are required with their types; extra fields are allowed, as OpenAI itself adds some.
import { type TSchema, Type } from "@sinclair/typebox";
import { Value } from "@sinclair/typebox/value";

const Nullable = <T extends TSchema>(schema: T) => Type.Union([schema, Type.Null()]);
const FinishReason = Type.Union([
  Type.Literal("stop"),
  Type.Literal("length"),
  Type.Literal("content_filter"),
  Type.Literal("tool_calls"),
  Type.Literal("function_call"),
]);

const Usage = Type.Object({
  prompt_tokens: Type.Integer({ minimum: 0 }),
  completion_tokens: Type.Integer({ minimum: 0 }),
  total_tokens: Type.Integer({ minimum: 0 }),
});

export const ChatCompletion = Type.Object({
  id: Type.String({ minLength: 1 }),
  object: Type.Literal("chat.completion"),
  created: Type.Integer({ minimum: 0 }),
  model: Type.String(),
  choices: Type.Array(
    Type.Object({
      index: Type.Integer({ minimum: 0 }),
      message: Type.Object({
        role: Type.Literal("assistant"),
        content: Nullable(Type.String()),
        reasoning_content: Type.Optional(Nullable(Type.String())),
      }),
      finish_reason: FinishReason,
      logprobs: Type.Optional(Type.Unknown()),
    }),
    { minItems: 1 },
  ),
  usage: Usage,
});

export const ChatCompletionChunk = Type.Object({
  id: Type.String({ minLength: 1 }),
  object: Type.Literal("chat.completion.chunk"),
  created: Type.Integer({ minimum: 0 }),
  model: Type.String(),
  choices: Type.Array(
    Type.Object({
      index: Type.Integer({ minimum: 0 }),
      delta: Type.Object({
        role: Type.Optional(Type.Literal("assistant")),
        content: Type.Optional(Nullable(Type.String())),
        reasoning_content: Type.Optional(Nullable(Type.String())),
      }),
      finish_reason: Type.Optional(Nullable(FinishReason)),
      logprobs: Type.Optional(Type.Unknown()),
    }),
  ),
  usage: Type.Optional(Nullable(Usage)),
});

export const ModelList = Type.Object({
  object: Type.Literal("list"),
  data: Type.Array(Type.Object({ id: Type.String({ minLength: 1 }), object: Type.Literal("model") }), { minItems: 1 }),
});

/** What /health must say about decoding (SPEC §1): the method and its parameters. */
export const HealthDecoding = Type.Object({
  decoding: Type.Object({
    method: Type.String({ minLength: 1 }),
    block_size: Type.Integer({ minimum: 1 }),
    threshold: Type.Number(),
    steps: Type.Integer({ minimum: 0 }),
  }),
});

/** The first few schema violations, as "path: message", or [] when the value conforms. */
export function schemaErrors(schema: TSchema, value: unknown): string[] {
  if (Value.Check(schema, value)) return [];
  return [...Value.Errors(schema, value)].slice(0, 3).map((e) => `${e.path || "/"}: ${e.message}`);
}
