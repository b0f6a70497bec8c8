// POST /v1/chat/completions: the conversation goes through the model's chat template; the completion
// is split into reasoning (`reasoning_content` and `reasoning`, both names being in use) and `content`.
import { randomUUID } from "node:crypto";

import type { App } from "../app.js";
import { ChatTemplateError, type ChatTemplate, type TemplateMessage } from "../chat-template.js";
import type { ServerContext } from "../context.js";
import { ApiError } from "../errors.js";
import { Admission, type GenerationOutcome } from "../generation.js";
import { exactSeed } from "../json-body.js";
import { refuseUnsupportedChat, resolveParams } from "../params.js";
import { THINK_CLOSE, THINK_OPEN, type ReasoningDelta, ReasoningSplitter } from "../reasoning.js";
import { type ChatMessage, ChatBody, type ChatRequest } from "../schemas.js";
import { SseStream, onClientGone } from "../sse.js";

export function registerChatRoute(app: App, ctx: ServerContext): void {
  app.post("/v1/chat/completions", { schema: { body: ChatBody } }, async (request, reply) => {
    const model = ctx.requireModel();
    const body = request.body;
    const template = model.tokenizer.chatTemplate;
    if (template === null) {
      throw new ApiError("invalid_request", "This model has no chat template; send a plain prompt to /v1/completions instead.", "messages");
    }
    refuseUnsupportedChat(body);
    const rendered = renderChat(template, body);
    const promptIds = await model.encoder.encode(rendered, "rendered");
    const { params, stops } = resolveParams(body, model.engine.info, promptIds.length, body.max_completion_tokens ?? body.max_tokens, exactSeed(body));
    // Whatever the engine would refuse is refused now, while the answer can still be a 400.
    model.engine.checkRequest({ promptIds, params });
    // Reasoning tags must survive decoding even where the tokenizer marks them special.
    const keep = new Set([THINK_OPEN, THINK_CLOSE].map((tag) => model.tokenizer.tokenId(tag)).filter((id) => id !== undefined));
    const splitter = new ReasoningSplitter(ReasoningSplitter.promptOpensReasoning(rendered));
    const head = { id: `chatcmpl-${randomUUID().replaceAll("-", "")}`, created: Math.floor(Date.now() / 1000), model: ctx.modelId };
    const job = { promptIds, params, stops, decode: (ids: readonly number[]) => model.tokenizer.decodeKeeping(ids, keep) };

    const admission = new Admission(ctx);
    onClientGone(reply, () => admission.clientGone());

    if (body.stream) {
      const includeUsage = body.stream_options?.include_usage === true;
      const chunk = (delta: object, finishReason: string | null) => ({
        ...head,
        object: "chat.completion.chunk",
        choices: [{ index: 0, delta, logprobs: null, finish_reason: finishReason }],
        ...(includeUsage ? { usage: null } : {}),
      });
      const sse = new SseStream(reply, ctx.heartbeatMs);
      sse.send(chunk({ role: "assistant", content: "" }, null));
      const sendDelta = (delta: ReasoningDelta) => {
        const fields = deltaFields(delta);
        if (fields !== null) sse.send(chunk(fields, null));
      };
      let outcome: GenerationOutcome;
      try {
        outcome = await admission.run({ ...job, onStart: () => sse.running(), onText: (text) => sendDelta(splitter.push(text)) });
      } catch (error) {
        sse.fail(error, ctx.log);
        return reply;
      }
      if (outcome.clientGone) return reply;
      sendDelta(splitter.flush());
      sse.send(chunk({}, outcome.finishReason));
      if (includeUsage) sse.send({ ...head, object: "chat.completion.chunk", choices: [], usage: outcome.usage });
      sse.end();
      return reply;
    }

    let reasoning = "";
    let content = "";
    const collect = (delta: ReasoningDelta) => {
      reasoning += delta.reasoning;
      content += delta.content;
    };
    const outcome = await admission.run({ ...job, onText: (text) => collect(splitter.push(text)) });
    if (outcome.clientGone) return reply.hijack();
    collect(splitter.flush());
    // A completion that never left its reasoning has no content, which OpenAI writes as null.
    const message = {
      role: "assistant",
      content: content === "" && reasoning !== "" ? null : content,
      ...(reasoning !== "" ? { reasoning_content: reasoning, reasoning } : {}),
    };
    return {
      ...head,
      object: "chat.completion",
      choices: [{ index: 0, message, logprobs: null, finish_reason: outcome.finishReason }],
      usage: outcome.usage,
    };
  });
}

function renderChat(template: ChatTemplate, body: ChatRequest): string {
  const messages = body.messages.map(toTemplateMessage);
  try {
    return template.render(messages, { enableThinking: body.chat_template_kwargs?.enable_thinking });
  } catch (error) {
    if (error instanceof ChatTemplateError) {
      throw new ApiError("invalid_request", `The model's chat template refused these messages: ${error.message}`, "messages");
    }
    throw error;
  }
}

/** OpenAI message -> what chat templates expect: string content, and no "developer" role. */
function toTemplateMessage(message: ChatMessage, index: number): TemplateMessage {
  const where = `messages[${index}]`;
  // Tool turns are valid OpenAI input, but without tool calling there is nothing honest to render them as.
  if (message.role === "tool" || message.role === "function") {
    throw new ApiError(
      "unsupported_value",
      `Messages with role '${message.role}' carry tool results, and this server does not do tool calling; send the result as a user message.`,
      `${where}.role`,
    );
  }
  if ((message.tool_calls != null && message.tool_calls.length > 0) || message.function_call != null) {
    throw new ApiError(
      "unsupported_value",
      "Assistant messages with tool calls are not supported, as this server does not do tool calling; send the assistant's text as content.",
      message.tool_calls != null ? `${where}.tool_calls` : `${where}.function_call`,
    );
  }
  let content: string;
  if (typeof message.content === "string") {
    content = message.content;
  } else if (Array.isArray(message.content)) {
    content = message.content
      .map((part, partIndex) => {
        if (part.type !== "text") {
          throw new ApiError("unsupported_content", `Content parts of type '${part.type}' are not supported; send text parts only.`, `${where}.content[${partIndex}].type`);
        }
        if (typeof part.text !== "string") {
          throw new ApiError("missing_required_parameter", "A text content part needs a 'text' string.", `${where}.content[${partIndex}].text`);
        }
        return part.text;
      })
      .join("\n");
  } else {
    throw new ApiError("missing_required_parameter", `Missing content for the ${message.role} message: send a string or text parts.`, `${where}.content`);
  }
  const result: TemplateMessage = { role: message.role === "developer" ? "system" : message.role, content };
  if (message.role === "assistant" && typeof message.reasoning_content === "string") result.reasoning_content = message.reasoning_content;
  return result;
}

function deltaFields(delta: ReasoningDelta): Record<string, string> | null {
  if (delta.reasoning === "" && delta.content === "") return null;
  const fields: Record<string, string> = {};
  if (delta.reasoning !== "") {
    fields.reasoning_content = delta.reasoning;
    fields.reasoning = delta.reasoning;
  }
  if (delta.content !== "") fields.content = delta.content;
  return fields;
}
