#!/usr/bin/env node
// The GPU-run kit's tokenizer (bench/stage-gpu-run.sh): the tiny base's byte-level BPE, fitted to the random
// 2B-shape model whose config.json sits beside it. Random weights emit any id, so every id must decode to a
// whole UTF-8 text on its own, or the start checks' "answers are text" judges the tokenizer instead of the
// folder:
// - the random model's mask token is added at config.json's a2d.mask_token_id, as `a2d_convert init` adds it
//   (pack refuses a folder whose tokenizer does not give that id); a checkpoint before conversion (no a2d
//   section: the recipe's dry run, bench/device-recipe-dry-run.sh) gets none, as a real base has none;
// - every vocabulary entry whose bytes are not valid UTF-8 by themselves (the single bytes 0x80-0xff, merges
//   that end inside a character) and every id the tiny vocabulary does not reach gets the text "w<id>", which
//   no encoding produces (no merges lead there); merges that touch a renamed entry are dropped. The kit's
//   prompts are ASCII, which still encode as before.
//
//   node bench/kit-tokenizer.mjs CONFIG.json TOKENIZER.json     (rewrites TOKENIZER.json in place)
import { readFileSync, writeFileSync } from "node:fs";

/** GPT-2's byte-level alphabet: the character each byte is written as in a byte-level BPE vocabulary. */
function byteOfCharacter() {
  const printable = [];
  for (let b = 0x21; b <= 0x7e; b++) printable.push(b);
  for (let b = 0xa1; b <= 0xac; b++) printable.push(b);
  for (let b = 0xae; b <= 0xff; b++) printable.push(b);
  const map = new Map(printable.map((b) => [String.fromCodePoint(b), b]));
  let next = 256;
  for (let b = 0; b < 256; b++) if (!printable.includes(b)) map.set(String.fromCodePoint(next++), b);
  return map;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/** Whether a byte-level token is a whole UTF-8 text by itself. */
function wholeText(token, bytesOf) {
  const bytes = [];
  for (const ch of token) {
    const b = bytesOf.get(ch);
    if (b === undefined) return true; // not byte-level (an added token's own text)
    bytes.push(b);
  }
  try {
    utf8.decode(Uint8Array.from(bytes));
    return true;
  } catch {
    return false;
  }
}

export function fitKitTokenizer(config, tokenizer) {
  if (config.a2d) {
    const { mask_token: content, mask_token_id: id } = config.a2d;
    tokenizer.added_tokens = tokenizer.added_tokens.filter((t) => t.content !== content && t.id !== id);
    tokenizer.added_tokens.push({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
  }
  const added = new Set(tokenizer.added_tokens.map((t) => t.id));
  const bytesOf = byteOfCharacter();
  const vocab = {};
  const renamed = new Set();
  for (const [token, tokenId] of Object.entries(tokenizer.model.vocab)) {
    if (added.has(tokenId)) continue;
    if (wholeText(token, bytesOf)) {
      vocab[token] = tokenId;
    } else {
      renamed.add(token);
    }
  }
  const taken = new Set([...Object.values(vocab), ...added]);
  for (let i = 0; i < config.vocab_size; i++) if (!taken.has(i)) vocab[`w${i}`] = i;
  const pair = (merge) => (Array.isArray(merge) ? merge : merge.split(" "));
  tokenizer.model.merges = tokenizer.model.merges.filter((merge) => {
    const [left, right] = pair(merge);
    return !renamed.has(left) && !renamed.has(right) && !renamed.has(left + right);
  });
  tokenizer.model.vocab = vocab;
  return tokenizer;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const [configPath, tokenizerPath] = process.argv.slice(2);
  if (!configPath || !tokenizerPath) {
    console.error("usage: node bench/kit-tokenizer.mjs CONFIG.json TOKENIZER.json");
    process.exit(2);
  }
  const config = JSON.parse(readFileSync(configPath, "utf8"));
  const tokenizer = JSON.parse(readFileSync(tokenizerPath, "utf8"));
  writeFileSync(tokenizerPath, JSON.stringify(fitKitTokenizer(config, tokenizer)));
}
