#!/usr/bin/env node
// Fetches the pinned downloads of vendor/lock.json and wheels/lock.json (pack/locked.ts does the work):
//   node scripts/fetch-locked.mjs node    vendor/node-<version>/bin/node, the folder's runtime
//   node scripts/fetch-locked.mjs cuda    wheels/cuda-<version>/, the CUDA 12 toolkit of `npm run build:cuda`
// Needs the compiled TypeScript (`npm run build:ts`).
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const module = join(root, "dist", "pack", "locked.js");
if (!existsSync(module)) {
  console.error("fetch-locked: dist/pack/locked.js is missing; run `npm run build:ts` first");
  process.exit(1);
}
const { ensureNode, ensureToolkit } = await import(module);
const log = (line) => console.error(`fetch-locked: ${line}`);
const what = process.argv.slice(2);
if (what.length === 0 || what.some((w) => w !== "node" && w !== "cuda")) {
  console.error("usage: node scripts/fetch-locked.mjs node|cuda ...");
  process.exit(2);
}
try {
  for (const item of what) {
    const got = item === "node" ? await ensureNode({ log }) : await ensureToolkit({ log });
    console.log(item === "node" ? got.path : got.root);
  }
} catch (error) {
  console.error(`fetch-locked: ${error.message}`);
  process.exit(1);
}
