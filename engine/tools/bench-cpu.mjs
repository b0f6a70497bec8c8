#!/usr/bin/env node
// CPU speed of the engine on one model folder: prefill, ms per denoising forward, tokens per forward.
// Usage: node engine/tools/bench-cpu.mjs MODEL_DIR [--threads N] [--prompt N] [--max-tokens N]
//        [--block-size B] [--threshold T]    (run `npm run build:ts && npm run build:engine` first)
import { parseArgs } from "node:util";
import { loadEngine } from "../../dist/engine/index.js";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    threads: { type: "string", default: "0" },
    prompt: { type: "string", default: "64" },
    "max-tokens": { type: "string", default: "128" },
    "block-size": { type: "string" },
    threshold: { type: "string" },
    repeats: { type: "string", default: "3" },
  },
});
if (positionals.length !== 1) {
  console.error("usage: node engine/tools/bench-cpu.mjs MODEL_DIR [--threads N] [--prompt N] [--max-tokens N] [--block-size B] [--threshold T]");
  process.exit(2);
}

const engine = await loadEngine({ modelDir: positionals[0], device: "cpu", threads: Number(values.threads) });
const { info } = engine;
const promptLength = Number(values.prompt);
// A fixed pseudo-random prompt of ordinary tokens (never the mask).
const promptIds = Array.from({ length: promptLength }, (_, i) => (i * 7919 + 13) % info.vocabSize).map((id) =>
  id === info.maskTokenId ? 1 : id,
);
const params = { maxTokens: Number(values["max-tokens"]), eosTokenIds: [] };
if (values["block-size"] !== undefined) params.blockSize = Number(values["block-size"]);
if (values.threshold !== undefined) params.threshold = Number(values.threshold);

const time = async (fn) => {
  const start = performance.now();
  await fn();
  return performance.now() - start;
};
await engine.generate({ promptIds, params: { maxTokens: 4 } }); // warm-up: page in the weights

// Steady-state ms per denoising forward: a long and a one-block generation differ only in denoising
// forwards over the same prompt, so their difference excludes the prompt's prefill.
const oneBlock = { ...params, maxTokens: params.blockSize ?? info.decoding.blockSize };
const prefill = [];
const perForward = [];
const runs = [];
for (let i = 0; i < Number(values.repeats); i++) {
  prefill.push(await time(() => engine.forwardLogits([], promptIds, [])));
  const short = await engine.generate({ promptIds, params: oneBlock });
  const long = await engine.generate({ promptIds, params });
  perForward.push((long.ms - short.ms) / (long.forwardPasses - short.forwardPasses));
  runs.push(long);
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const run = runs[runs.length - 1];
const generateMs = median(runs.map((r) => r.ms));
console.log(
  JSON.stringify(
    {
      model: positionals[0],
      parameters: info.numParameters,
      threads: Number(values.threads) || "all",
      prompt_tokens: promptLength,
      prefill_ms: Number(median(prefill).toFixed(2)),
      ms_per_denoising_forward: Number(median(perForward).toFixed(3)),
      generate: {
        block_size: params.blockSize ?? info.decoding.blockSize,
        threshold: params.threshold ?? info.decoding.threshold,
        completion_tokens: run.completionTokens,
        forward_passes: run.forwardPasses,
        tokens_per_forward: Number(run.tokensPerForward.toFixed(3)),
        ms: Number(generateMs.toFixed(1)),
        ms_per_forward_incl_prefill: Number((generateMs / run.forwardPasses).toFixed(3)),
        tokens_per_s: Number(((run.completionTokens / generateMs) * 1000).toFixed(1)),
      },
    },
    null,
    2,
  ),
);
await engine.close();
