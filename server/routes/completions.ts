// POST /v1/completions: a plain prompt (text, or token ids), encoded with the tokenizer's special tokens.
import { randomUUID } from "node:crypto";

import type { App } from "../app.js";
import type { LoadedModel, ServerContext } from "../context.js";
import { ApiError } from "../errors.js";
import { Admission, type GenerationOutcome } from "../generation.js";
import { exactSeed } from "../json-body.js";
import { resolveParams } from "../params.js";
import { CompletionBody, type CompletionRequest } from "../schemas.js";
import { SseStream, onClientGone } from "../sse.js";

export function registerCompletionsRoute(app: App, ctx: ServerContext): void {
  app.post("/v1/completions", { schema: { body: CompletionBody } }, async (request, reply) => {
    const model = ctx.requireModel();
    const body = request.body;
    if (body.echo === true) throw new ApiError("unsupported_parameter", "echo is not supported.", "echo");
    if (body.suffix != null && body.suffix !== "") throw new ApiError("unsupported_parameter", "suffix is not supported.", "suffix");
    if (body.best_of != null && body.best_of !== 1) throw new ApiError("unsupported_value", "Only best_of=1 is supported.", "best_of");
    const promptIds = await promptTokenIds(body, model);
    const { params, stops } = resolveParams(body, model.engine.info, promptIds.length, body.max_tokens, exactSeed(body));
    // Whatever the engine would refuse is refused now, while the answer can still be a 400.
    model.engine.checkRequest({ promptIds, params });
    const head = { id: `cmpl-${randomUUID().replaceAll("-", "")}`, created: Math.floor(Date.now() / 1000), model: ctx.modelId };
    const job = { promptIds, params, stops, decode: (ids: readonly number[]) => model.tokenizer.decode(ids) };
    const chunk = (text: string, finishReason: string | null) => ({
      ...head,
      object: "text_completion",
      choices: [{ index: 0, text, logprobs: null, finish_reason: finishReason }],
    });

    const admission = new Admission(ctx);
    onClientGone(reply, () => admission.clientGone());

    if (body.stream) {
      const includeUsage = body.stream_options?.include_usage === true;
      const withUsage = (value: object) => (includeUsage ? { ...value, usage: null } : value);
      const sse = new SseStream(reply, ctx.heartbeatMs);
      let outcome: GenerationOutcome;
      try {
        outcome = await admission.run({ ...job, onStart: () => sse.running(), onText: (text) => sse.send(withUsage(chunk(text, null))) });
      } catch (error) {
        sse.fail(error, ctx.log);
        return reply;
      }
      if (outcome.clientGone) return reply;
      sse.send(withUsage(chunk("", outcome.finishReason)));
      if (includeUsage) sse.send({ ...head, object: "text_completion", choices: [], usage: outcome.usage });
      sse.end();
      return reply;
    }

    let text = "";
    const outcome = await admission.run({ ...job, onText: (delta) => (text += delta) });
    if (outcome.clientGone) return reply.hijack();
    return { ...chunk(text, outcome.finishReason), usage: outcome.usage };
  });
}

/** One prompt per request, as text or as token ids (checked against the vocabulary). */
async function promptTokenIds(body: CompletionRequest, model: LoadedModel): Promise<number[]> {
  const prompt = body.prompt;
  if (typeof prompt === "string") return model.encoder.encode(prompt, "prompt");
  if (prompt.length > 1 && typeof prompt[0] !== "number") {
    throw new ApiError("unsupported_value", "Send one prompt per request; batches of prompts are not supported.", "prompt");
  }
  const first = prompt[0];
  if (typeof first === "string") return model.encoder.encode(first, "prompt");
  const ids = (Array.isArray(first) ? first : prompt) as number[];
  const info = model.engine.info;
  const bad = ids.findIndex((id) => id >= info.vocabSize || id === info.maskTokenId);
  if (bad !== -1) {
    throw new ApiError(
      "invalid_value",
      `Token id ${ids[bad]} at prompt position ${bad} is not a valid input token (vocabulary size ${info.vocabSize}, mask token ${info.maskTokenId}).`,
      "prompt",
    );
  }
  return ids;
}
