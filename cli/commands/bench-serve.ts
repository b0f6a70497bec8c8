// `a2d bench-serve`: tokens/s, time to first token and inter-token latency of any OpenAI-compatible endpoint
// at several concurrency levels (docs/eval.md).
import { readFileSync } from "node:fs";

import { type Command, InvalidArgumentError } from "commander";

import { DEFAULT_CONCURRENCY, DEFAULT_PROMPT, benchServe, formatBenchServe } from "../../eval/bench-serve.js";
import { jsonObject, nonNegativeNumber, positiveInt } from "./eval.js";

interface BenchServeFlags {
  url: string;
  promptFile?: string;
  promptTokens?: number;
  maxTokens: number;
  concurrency: number[];
  model?: string;
  apiKey?: string;
  temperature?: number;
  extraBody?: Record<string, unknown>;
  json?: boolean;
}

function readPrompt(file: string): string {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (error) {
    throw new Error(`--prompt-file ${file}: ${(error as Error).message}`);
  }
  if (text.trim() === "") throw new Error(`--prompt-file ${file} is empty; put the user message in it`);
  return text;
}

function concurrencyList(value: string): number[] {
  const levels = value.split(",").map((part) => Number(part.trim()));
  if (levels.length === 0 || levels.some((level) => !Number.isInteger(level) || level < 1 || level > 1024)) {
    throw new InvalidArgumentError("expected positive integers up to 1024, comma-separated, e.g. 1,8,32");
  }
  return levels;
}

export function register(program: Command): void {
  program
    .command("bench-serve")
    .description("Measure aggregate and per-stream tokens/s, time to first token and inter-token latency of an OpenAI-compatible server at several concurrency levels")
    .requiredOption("--url <url>", "server base URL, e.g. http://127.0.0.1:8000")
    .option("--prompt-file <file>", "user message to send (default: a prompt asking for a long story)")
    .option("--prompt-tokens <n>", "repeat the prompt until the server counts about this many prompt tokens (TTFT at a prompt length)", positiveInt)
    .option("--max-tokens <n>", "max_tokens of each generation", positiveInt, 1024)
    .option("--concurrency <list>", `streams at once, one level after another (default: ${DEFAULT_CONCURRENCY.join(",")})`, concurrencyList, DEFAULT_CONCURRENCY)
    .option("--model <id>", "model id to request (default: the first one /v1/models lists)")
    .option("--api-key <key>", "bearer token, if the server wants one")
    .option("--temperature <t>", "sampling temperature (default: the server's)", nonNegativeNumber)
    .option("--extra-body <json>", `JSON object merged into every request, e.g. '{"ignore_eos": true}' for vLLM`, jsonObject)
    .option("--json", "print the measurements as JSON")
    .action(async (flags: BenchServeFlags) => {
      const result = await benchServe(
        {
          url: flags.url,
          model: flags.model,
          apiKey: flags.apiKey ?? process.env.OPENAI_API_KEY,
          prompt: flags.promptFile ? readPrompt(flags.promptFile) : DEFAULT_PROMPT,
          promptTokens: flags.promptTokens,
          maxTokens: flags.maxTokens,
          concurrency: flags.concurrency,
          temperature: flags.temperature,
          extraBody: flags.extraBody,
        },
        (line) => process.stderr.write(`${line}\n`),
      );
      process.stdout.write(flags.json ? `${JSON.stringify(result)}\n` : formatBenchServe(result));
    });
}
