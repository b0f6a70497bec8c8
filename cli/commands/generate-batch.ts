// `a2d generate-batch` (hidden): many decodes from one loaded engine, for callers that tokenize and
// detokenize themselves (python -m a2d_convert evaluate-probes --engine cpu). Reads JSONL requests
// {"prompt_ids": [...], "params": DecodeParams} (engine/types.ts, camelCase) and writes one JSONL
// result per request, in order, with the key names of `a2d generate --json` (less `text`, which the
// caller decodes). The engine validates every id and parameter; a bad line stops the batch.
import { createReadStream } from "node:fs";
import { createInterface } from "node:readline";

import { type Command, Option } from "commander";

import { loadEngine } from "../../engine/index.js";
import type { DecodeParams, Device, GenerateResult } from "../../engine/types.js";
import { integerIn } from "../parse.js";
import { resultJson } from "./generate.js";

interface BatchOptions {
  model: string;
  input: string;
  threads?: number;
  device: Device;
}

export function register(program: Command): void {
  program
    .command("generate-batch", { hidden: true })
    .description("Decode JSONL requests {prompt_ids, params} from one loaded engine; JSONL results on stdout")
    .requiredOption("--model <dir>", "a2d model folder (docs/model-format.md)")
    .option("--input <file>", "JSONL requests ('-': stdin)", "-")
    .option("--threads <n>", "CPU worker threads (default: all cores)", integerIn("--threads", 1, 1024))
    .addOption(new Option("--device <device>", "compute backend").choices(["cpu", "cuda"]).default("cpu"))
    .action(async (options: BatchOptions) => {
      await generateBatch(options);
    });
}

async function generateBatch(options: BatchOptions): Promise<void> {
  const engine = await loadEngine({
    modelDir: options.model,
    device: options.device,
    ...(options.threads !== undefined ? { threads: options.threads } : {}),
  });
  try {
    const input = options.input === "-" ? process.stdin : createReadStream(options.input);
    let lineNo = 0;
    for await (const line of createInterface({ input, crlfDelay: Infinity })) {
      lineNo += 1;
      if (line.trim() === "") continue;
      const { prompt_ids: promptIds, params } = parseRequest(line, `${options.input}:${lineNo}`);
      let result: GenerateResult;
      try {
        result = await engine.generate({ promptIds, params });
      } catch (error) {
        throw new Error(`${options.input}:${lineNo}: ${error instanceof Error ? error.message : String(error)}`);
      }
      process.stdout.write(`${JSON.stringify(resultJson(result))}\n`);
    }
  } finally {
    await engine.close();
  }
}

function parseRequest(line: string, where: string): { prompt_ids: number[]; params: DecodeParams } {
  let request: unknown;
  try {
    request = JSON.parse(line);
  } catch (error) {
    throw new Error(`${where}: not JSON (${error instanceof Error ? error.message : String(error)})`);
  }
  if (typeof request !== "object" || request === null || !("prompt_ids" in request) || !("params" in request)) {
    throw new Error(`${where}: a request is {"prompt_ids": [...], "params": {"maxTokens": ...}}`);
  }
  return request as { prompt_ids: number[]; params: DecodeParams };
}
