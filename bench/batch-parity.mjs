#!/usr/bin/env node
// Batched against alone through the engine's public surface: N greedy generations of different prompts, first
// one after another, then all submitted at once to an engine loaded with --max-batch; prints per stream whether
// the tokens are identical and where they first differ, and both wall times, as JSON.
//   node bench/batch-parity.mjs --engine DIST/engine/index.js --model DIR [--device cpu|cuda] [--max-batch 8]
//        [--streams 8] [--max-tokens 128]
// On the CPU backend the tokens must be identical (docs/decoding.md, "Several sequences at once").
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

const { values } = parseArgs({
  options: {
    engine: { type: "string" },
    model: { type: "string" },
    device: { type: "string", default: "cpu" },
    "max-batch": { type: "string", default: "8" },
    streams: { type: "string", default: "8" },
    "max-tokens": { type: "string", default: "128" },
  },
});
if (!values.engine || !values.model) {
  console.error("usage: node bench/batch-parity.mjs --engine DIST/engine/index.js --model DIR [--device cpu|cuda] [--max-batch N] [--streams N] [--max-tokens N]");
  process.exit(2);
}
const { loadEngine } = await import(pathToFileURL(values.engine).href);
const maxBatch = Number(values["max-batch"]);
const streams = Number(values.streams);
const maxTokens = Number(values["max-tokens"]);

const alone = await loadEngine({ modelDir: values.model, device: values.device });
const vocab = alone.info.vocabSize;
// Prompts of different lengths and tokens, so the streams sit at different positions and windows.
const prompts = Array.from({ length: streams }, (_, s) => Array.from({ length: 8 + 5 * s }, (_, i) => (97 + 31 * s + 7 * i) % (vocab - 2)));
const params = { maxTokens, temperature: 0 };
let started = performance.now();
const single = [];
for (const promptIds of prompts) single.push(await alone.generate({ promptIds, params }));
const aloneS = (performance.now() - started) / 1000;
await alone.close();

const batched = await loadEngine({ modelDir: values.model, device: values.device, maxBatch });
started = performance.now();
const together = await Promise.all(prompts.map((promptIds) => batched.generate({ promptIds, params })));
const togetherS = (performance.now() - started) / 1000;
const engineMaxBatch = batched.info.maxBatch;
await batched.close();

const perStream = together.map((result, s) => {
  const want = single[s].tokenIds;
  const got = result.tokenIds;
  let first = 0;
  while (first < Math.min(want.length, got.length) && want[first] === got[first]) first += 1;
  const identical = first === want.length && first === got.length;
  return { stream: s, tokens: got.length, identical, firstDifference: identical ? null : first };
});
const tokens = together.reduce((sum, r) => sum + r.completionTokens, 0);
console.log(
  JSON.stringify({
    device: values.device,
    requestedMaxBatch: maxBatch,
    engineMaxBatch,
    streams,
    maxTokens,
    identical: perStream.filter((s) => s.identical).length,
    aloneS: Number(aloneS.toFixed(3)),
    togetherS: Number(togetherS.toFixed(3)),
    aloneTokensPerS: Number((tokens / aloneS).toFixed(1)),
    togetherTokensPerS: Number((tokens / togetherS).toFixed(1)),
    perStream,
  }),
);
process.exit(perStream.every((s) => s.identical) ? 0 : 1);
