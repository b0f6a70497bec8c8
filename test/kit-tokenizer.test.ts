// The GPU-run kit's tokenizer (bench/kit-tokenizer.mjs): the random 2B-shape model emits any id, so every id
// of its vocabulary must decode to a whole UTF-8 text on its own, and ASCII prompts must still encode.
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";

import { fitKitTokenizer } from "../bench/kit-tokenizer.mjs";
import { ModelTokenizer } from "../server/tokenizer.js";
import { makeTinyModel } from "./server-harness.js";

const work = mkdtempSync(join(tmpdir(), "a2d-kit-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

/** The ids below vocabSize that do not decode, on their own, to a whole text. */
function brokenIds(tokenizer: ModelTokenizer, vocabSize: number): number[] {
  const broken = [];
  for (let id = 0; id < vocabSize; id++) {
    const text = tokenizer.decodeKeeping([id], new Set([id]));
    if (text.length === 0 || text.includes("\uFFFD")) broken.push(id);
  }
  return broken;
}

describe("the GPU-run kit's tokenizer", () => {
  it("gives every id of the random model's vocabulary a whole text and keeps ASCII encoding", async () => {
    const tiny = makeTinyModel(join(work, "tiny"));
    const folder = join(work, "kit");
    cpSync(tiny, folder, { recursive: true });
    const vocabSize = 600;
    const config = { vocab_size: vocabSize, a2d: { mask_token: "<|mask|>", mask_token_id: vocabSize - 8 } };
    const path = join(folder, "tokenizer.json");
    const before = await ModelTokenizer.load(folder);
    const prompt = "What is the capital of France? Answer in one word.";
    const ids = before.encodeRendered(prompt);
    writeFileSync(path, JSON.stringify(fitKitTokenizer(config, JSON.parse(readFileSync(path, "utf8")))));

    const tokenizer = await ModelTokenizer.load(folder);
    expect(brokenIds(tokenizer, vocabSize)).toEqual([]);
    expect(tokenizer.encodeRendered(prompt)).toEqual(ids);
    expect(tokenizer.decode(ids)).toBe(prompt);
    expect(tokenizer.encodeRendered("<|mask|>")).toEqual([vocabSize - 8]);
  });

  it("fits a checkpoint before conversion (no a2d section) without adding a mask token", async () => {
    const tiny = makeTinyModel(join(work, "tiny-base"));
    const folder = join(work, "base");
    cpSync(tiny, folder, { recursive: true });
    const vocabSize = 700;
    const path = join(folder, "tokenizer.json");
    const original = JSON.parse(readFileSync(path, "utf8"));
    const fitted = fitKitTokenizer({ vocab_size: vocabSize }, JSON.parse(readFileSync(path, "utf8")));
    expect(fitted.added_tokens).toEqual(original.added_tokens);
    writeFileSync(path, JSON.stringify(fitted));
    const tokenizer = await ModelTokenizer.load(folder);
    expect(brokenIds(tokenizer, vocabSize)).toEqual([]);
  });
});
