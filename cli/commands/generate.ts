// `a2d generate`: one decode from the command line. Same flags and JSON as the PyTorch reference
// (`python -m a2d_convert generate`), so the two can be compared token for token; plus --device.
// Decoding flags left out take the model's a2d.block_size / a2d.decoding.
import { type Command, InvalidArgumentError, Option } from "commander";

import { loadEngine, positionsNeeded } from "../../engine/index.js";
import { camelName, DECODING_TABLE, type ParamSpec } from "../../engine/params.js";
import type { DecodeParams, Device, GenerateResult, TraceStep } from "../../engine/types.js";
import { ModelTokenizer } from "../../server/tokenizer.js";
import { integerIn, numberIn } from "../parse.js";

interface GenerateOptions {
  model: string;
  prompt: string;
  chat?: boolean;
  think: boolean;
  maxTokens: number;
  seed: bigint;
  threads?: number;
  trace?: boolean;
  json?: boolean;
  device: Device;
}

/**
 * One flag per decoding parameter of engine/decoding-params.json (left out: the model's default). The
 * engine checks what depends on other parameters (min_per_step <= block_size, the table's rules).
 */
export function decodingOption(spec: ParamSpec): Option {
  const flag = `--${spec.name.replace(/_/g, "-")}`;
  const option = new Option(`${flag} <${spec.type === "choice" ? "name" : "n"}>`, `${spec.doc} (docs/decoding.md)`);
  if (spec.type === "choice") return option.choices(spec.choices ?? []);
  const max = typeof spec.max === "number" ? spec.max : 64;  // "block_size": the largest block
  const low = spec.min_exclusive ? Number.MIN_VALUE : (spec.min ?? 0);
  return option.argParser(spec.type === "integer" ? integerIn(flag, low, max) : numberIn(flag, low, max));
}

export function register(program: Command): void {
  const command = program
    .command("generate")
    .description("Generate a completion for one prompt with the block-diffusion decoder")
    .requiredOption("--model <dir>", "a2d model folder (docs/model-format.md)")
    .requiredOption("--prompt <text>", "prompt text (a user message with --chat)")
    .option("--chat", "wrap the prompt in the model's chat template")
    .option("--no-think", "render the chat template with enable_thinking=false")
    .option("--max-tokens <n>", "most tokens to generate", integerIn("--max-tokens", 0, 1 << 24), 128);
  for (const spec of DECODING_TABLE.parameters) command.addOption(decodingOption(spec));
  command
    // The help shows "0": commander renders a default with JSON.stringify, which cannot take a BigInt.
    .addOption(new Option("--seed <s>", "RNG seed, an unsigned 64-bit integer").argParser(parseSeed).default(0n, "0"))
    .option("--threads <n>", "CPU worker threads (default: all cores)", integerIn("--threads", 1, 1024))
    .option("--trace", "include every denoising step in the JSON")
    .option("--json", "print the result as one JSON object")
    .addOption(new Option("--device <device>", "compute backend").choices(["cpu", "cuda"]).default("cpu"))
    .action(async (options: GenerateOptions) => {
      process.stdout.write(`${await generate(options)}\n`);
    });
}

async function generate(options: GenerateOptions): Promise<string> {
  // commander's --no-think sets think=false; the template's enable_thinking is left undefined otherwise.
  if (!options.think && !options.chat) throw new Error("--no-think only applies to a chat prompt; add --chat");
  const tokenizer = await ModelTokenizer.load(options.model);
  let promptIds: number[];
  if (options.chat) {
    if (tokenizer.chatTemplate === null) {
      throw new Error(`${options.model}: no chat template (tokenizer_config.json 'chat_template' or chat_template.jinja); add one or drop --chat`);
    }
    const rendered = tokenizer.chatTemplate.render([{ role: "user", content: options.prompt }], options.think ? {} : { enableThinking: false });
    promptIds = tokenizer.encodeRendered(rendered);
  } else {
    promptIds = tokenizer.encodePrompt(options.prompt);
  }
  if (promptIds.length === 0) throw new Error("--prompt encodes to no tokens; give a non-empty prompt");

  const engine = await loadEngine({
    modelDir: options.model,
    device: options.device,
    ...(options.threads !== undefined ? { threads: options.threads } : {}),
  });
  try {
    const params: DecodeParams = { maxTokens: options.maxTokens, seed: options.seed };
    const chosen = options as unknown as Record<string, unknown>;
    for (const spec of DECODING_TABLE.parameters) {
      const value = chosen[camelName(spec.name)];
      if (value !== undefined) (params as unknown as Record<string, unknown>)[camelName(spec.name)] = value;
    }
    if (options.trace) params.trace = true;
    const blockSize = params.blockSize ?? engine.info.decoding.blockSize;
    const needed = positionsNeeded(promptIds.length, options.maxTokens, blockSize);
    if (needed > engine.info.maxContext) {
      throw new Error(
        `prompt (${promptIds.length} tokens) + --max-tokens ${options.maxTokens} need ${needed} positions at block size ` +
          `${blockSize}, more than the engine's context of ${engine.info.maxContext}; lower --max-tokens`,
      );
    }
    const result = await engine.generate({ promptIds, params });
    const text = tokenizer.decode(result.tokenIds);
    if (!options.json) return text;
    const out = resultJson(result, text);
    if (options.trace) out.trace = (result.trace ?? []).map(traceStepJson);
    return JSON.stringify(out);
  } finally {
    await engine.close();
  }
}

/** A result under the reference decoder's JSON keys, in its order; `text` only where the caller decoded it. */
export function resultJson(result: GenerateResult, text?: string): Record<string, unknown> {
  return {
    token_ids: result.tokenIds,
    ...(text !== undefined ? { text } : {}),
    completion_tokens: result.completionTokens,
    forward_passes: result.forwardPasses,
    tokens_per_forward: result.tokensPerForward,
    steps: result.steps,
    revealed: result.revealed,
    topped_up: result.toppedUp,
    ms: result.ms,
    finish_reason: result.finishReason,
    prompt_tokens: result.promptTokens,
  };
}

function traceStepJson(step: TraceStep): object {
  return { forward: step.forward, block_start: step.blockStart, step: step.step, candidates: step.candidates, revealed: step.revealed };
}

function parseSeed(value: string): bigint {
  if (!/^\d+$/.test(value.trim())) throw new InvalidArgumentError("--seed must be an unsigned integer");
  const seed = BigInt(value.trim());
  if (seed >= 1n << 64n) throw new InvalidArgumentError("--seed must be below 2^64");
  return seed;
}
