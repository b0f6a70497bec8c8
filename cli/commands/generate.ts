// `a2d generate`: one decode from the command line. Same flags and JSON as the PyTorch reference
// (`python -m a2d_convert generate`), so the two can be compared token for token; plus --device.
// Decoding flags left out take the model's a2d.block_size / a2d.decoding.
import { type Command, InvalidArgumentError, Option } from "commander";

import { loadEngine } from "../../engine/index.js";
import type { DecodeParams, Device, GenerateResult, TraceStep } from "../../engine/types.js";
import { ModelTokenizer } from "../../server/tokenizer.js";
import { integerIn, numberIn } from "../parse.js";

interface GenerateOptions {
  model: string;
  prompt: string;
  chat?: boolean;
  think: boolean;
  maxTokens: number;
  blockSize?: number;
  threshold?: number;
  minPerStep?: number;
  steps?: number;
  remasking?: DecodeParams["remasking"];
  commit?: DecodeParams["commit"];
  treeWidth?: number;
  lookupNgram?: number;
  temperature?: number;
  topP?: number;
  seed: bigint;
  threads?: number;
  trace?: boolean;
  json?: boolean;
  device: Device;
}

export function register(program: Command): void {
  program
    .command("generate")
    .description("Generate a completion for one prompt with the block-diffusion decoder")
    .requiredOption("--model <dir>", "a2d model folder (docs/model-format.md)")
    .requiredOption("--prompt <text>", "prompt text (a user message with --chat)")
    .option("--chat", "wrap the prompt in the model's chat template")
    .option("--no-think", "render the chat template with enable_thinking=false")
    .option("--max-tokens <n>", "most tokens to generate", integerIn("--max-tokens", 0, 1 << 24), 128)
    .option("--block-size <n>", "tokens per denoising block", integerIn("--block-size", 1, 64))
    .option("--threshold <t>", "reveal every candidate whose confidence is above this", numberIn("--threshold", 0, 1))
    .option("--min-per-step <k>", "reveal at least this many tokens per step", integerIn("--min-per-step", 1, 64))
    .option("--steps <s>", "linear top-k schedule over this many steps per block (0: off)", integerIn("--steps", 0, 64))
    .addOption(new Option("--remasking <r>", "candidate priority, or verify / tree (docs/decoding.md)").choices(["low_confidence", "random", "leftmost", "verify", "tree"]))
    .option("--tree-width <n>", "guesses for the first position with --remasking tree", integerIn("--tree-width", 1, 8))
    .option("--lookup-ngram <n>", "with --remasking verify or tree: drafts from the context's latest match of its last 1..n tokens (0: none)", integerIn("--lookup-ngram", 0, 8))
    .addOption(new Option("--commit <c>", "commit policy").choices(["fused", "separate"]))
    .option("--temperature <x>", "0: greedy", numberIn("--temperature", 0, 2))
    .option("--top-p <p>", "nucleus sampling mass", numberIn("--top-p", Number.MIN_VALUE, 1))
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
    if (promptIds.length + options.maxTokens > engine.info.maxContext) {
      throw new Error(
        `prompt (${promptIds.length} tokens) + --max-tokens ${options.maxTokens} exceeds the engine's context of ` +
          `${engine.info.maxContext} tokens; lower --max-tokens`,
      );
    }
    const params: DecodeParams = { maxTokens: options.maxTokens, seed: options.seed };
    if (options.blockSize !== undefined) params.blockSize = options.blockSize;
    if (options.threshold !== undefined) params.threshold = options.threshold;
    if (options.minPerStep !== undefined) params.minPerStep = options.minPerStep;
    if (options.steps !== undefined) params.steps = options.steps;
    if (options.remasking !== undefined) params.remasking = options.remasking;
    if (options.commit !== undefined) params.commit = options.commit;
    if (options.treeWidth !== undefined) params.treeWidth = options.treeWidth;
    if (options.lookupNgram !== undefined) params.lookupNgram = options.lookupNgram;
    if (options.temperature !== undefined) params.temperature = options.temperature;
    if (options.topP !== undefined) params.topP = options.topP;
    if (options.trace) params.trace = true;
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
