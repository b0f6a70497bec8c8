// The model folder's contents checked before anything is written: a folder that packs must load. Every
// weights file must be a whole safetensors file (not cut short, not a Git LFS pointer), the tokenizer must
// build the way the server builds it, config.json's vocab_size must agree with the embedding, lm_head
// and every id the tokenizer can produce, and its decoding defaults must be ones the engine accepts. A lineage.json, when there is one, checks hashes later; these
// checks hold for every folder, with a lineage or without.
import { readFile } from "node:fs/promises";
import { join } from "node:path";

import { brokenRule, DECODING_TABLE, valueProblem } from "../engine/params.js";
import { ModelTokenizer } from "../server/tokenizer.js";
import { type ModelPlan, ModelFolderError } from "./model.js";
import { lfsPointer, readFileHead, readSafetensorsHeader, SafetensorsError, type TensorInfo } from "./safetensors.js";

interface ModelConfig {
  vocab_size?: unknown;
  hidden_size?: unknown;
  num_hidden_layers?: unknown;
  tie_word_embeddings?: unknown;
  a2d?: { mask_token_id?: unknown; mask_token?: unknown; eos_token_ids?: unknown; block_size?: unknown; decoding?: unknown };
}

/** How to get the real file behind a Git LFS pointer. */
const LFS_FIX = "fetch the real file: `git lfs install && git lfs pull` in the repository the folder was cloned from (or download the file again)";

async function lfsProblem(modelDir: string, rel: string): Promise<string | null> {
  const { head } = await readFileHead(join(modelDir, rel), 512);
  const pointer = lfsPointer(head);
  if (!pointer) return null;
  return `${join(modelDir, rel)} is a Git LFS pointer file (${head.length} bytes${pointer.size ? ` standing for ${pointer.size} bytes` : ""}), not the file itself: ${LFS_FIX}`;
}

/** Every id a tokenizer.json can produce: its model's vocabulary and its added tokens. */
function tokenizerIds(tokenizerJson: Record<string, unknown>): { maxId: number; maxToken: string } {
  let maxId = -1;
  let maxToken = "";
  const see = (id: unknown, token: string) => {
    if (typeof id === "number" && id > maxId) {
      maxId = id;
      maxToken = token;
    }
  };
  const vocab = (tokenizerJson.model as { vocab?: unknown } | undefined)?.vocab;
  if (Array.isArray(vocab)) vocab.forEach((entry, id) => see(id, String((entry as unknown[])?.[0] ?? "")));
  else if (vocab && typeof vocab === "object") for (const [token, id] of Object.entries(vocab)) see(id, token);
  for (const added of (tokenizerJson.added_tokens as Array<{ id?: unknown; content?: unknown }> | undefined) ?? []) see(added.id, String(added.content));
  return { maxId, maxToken };
}

async function weightTensors(modelDir: string, plan: ModelPlan, problems: string[]): Promise<Map<string, TensorInfo & { file: string }> | null> {
  const tensors = new Map<string, TensorInfo & { file: string }>();
  let complete = true;
  for (const rel of plan.weights) {
    const path = join(modelDir, rel);
    const lfs = await lfsProblem(modelDir, rel);
    if (lfs) {
      problems.push(lfs);
      complete = false;
      continue;
    }
    try {
      const header = await readSafetensorsHeader(path);
      for (const [name, info] of header.tensors) tensors.set(name, { ...info, file: rel });
    } catch (error) {
      if (!(error instanceof SafetensorsError)) throw error;
      problems.push(`${path}: ${error.message}. Copy or download the weights again (an interrupted download or copy leaves a short file); \`a2d_convert export\` writes them whole`);
      complete = false;
    }
  }
  if (!complete) return null;
  const indexRel = "model.safetensors.index.json";
  if (plan.serving.includes(indexRel)) {
    const index = JSON.parse(await readFile(join(modelDir, indexRel), "utf8")) as { weight_map: Record<string, string> };
    const misplaced = Object.entries(index.weight_map).filter(([name, file]) => tensors.get(name)?.file !== file);
    if (misplaced.length > 0) {
      const [name, file] = misplaced[0]!;
      problems.push(
        `${join(modelDir, indexRel)} places ${misplaced.length} tensors where they are not (${name} in ${file}${tensors.has(name) ? `, but it is in ${tensors.get(name)!.file}` : ", which lacks it"}): the index belongs to other weights; use the index that came with these shards`,
      );
    }
  }
  return tensors;
}

function checkShapes(modelDir: string, config: ModelConfig, tensors: Map<string, TensorInfo & { file: string }>, problems: string[]): void {
  const configPath = join(modelDir, "config.json");
  const vocab = config.vocab_size;
  if (!Number.isInteger(vocab) || (vocab as number) <= 0) {
    problems.push(`${configPath}: vocab_size is ${JSON.stringify(vocab)}, not a positive integer; set it to the embedding's row count`);
    return;
  }
  const rowsOf = (name: string) => {
    const tensor = tensors.get(name);
    if (!tensor) return null;
    return { rows: tensor.shape[0], cols: tensor.shape[1], where: `${name} in ${join(modelDir, tensor.file)}` };
  };
  const embed = rowsOf("model.embed_tokens.weight");
  if (!embed) {
    problems.push(`the weights have no model.embed_tokens.weight (docs/model-format.md, "Tensors"): these are not the weights of a supported model; export them again`);
  } else {
    if (embed.rows !== vocab) {
      problems.push(`${configPath}: vocab_size is ${vocab}, but ${embed.where} has ${embed.rows} rows: set vocab_size to ${embed.rows} (or use the config that came with these weights)`);
    }
    if (Number.isInteger(config.hidden_size) && embed.cols !== config.hidden_size) {
      problems.push(`${configPath}: hidden_size is ${String(config.hidden_size)}, but ${embed.where} is ${embed.cols} wide: the config and the weights belong to different models`);
    }
  }
  if (config.tie_word_embeddings !== true) {
    const head = rowsOf("lm_head.weight");
    if (!head) problems.push(`${configPath}: tie_word_embeddings is not true, but the weights have no lm_head.weight: set "tie_word_embeddings": true if the model ties them, or export the weights again`);
    else if (head.rows !== vocab) problems.push(`${configPath}: vocab_size is ${vocab}, but ${head.where} has ${head.rows} rows: the config and the weights disagree; use the config that came with these weights`);
  }
  const layers = new Set([...tensors.keys()].map((name) => /^model\.layers\.(\d+)\./.exec(name)?.[1]).filter((i): i is string => i !== undefined).map(Number));
  if (Number.isInteger(config.num_hidden_layers) && layers.size !== config.num_hidden_layers) {
    problems.push(`${configPath}: num_hidden_layers is ${String(config.num_hidden_layers)}, but the weights hold ${layers.size} layers: the config and the weights belong to different models`);
  }
}

async function checkTokenizer(modelDir: string, config: ModelConfig, problems: string[]): Promise<void> {
  const tokenizerPath = join(modelDir, "tokenizer.json");
  let tokenizerJson: Record<string, unknown>;
  let tokenizer: ModelTokenizer;
  try {
    const files = await ModelTokenizer.readFiles(modelDir);
    tokenizerJson = files.tokenizerJson;
    tokenizer = ModelTokenizer.fromFiles(files);
  } catch (error) {
    // The server's own loader: what fails here fails at start. Its message names the file.
    problems.push(`${(error as Error).message} The folder's server could not start with it: copy the tokenizer files of the base model again (tokenizer.json, tokenizer_config.json)`);
    return;
  }
  const { maxId, maxToken } = tokenizerIds(tokenizerJson);
  if (maxId < 0) {
    problems.push(`${tokenizerPath} holds no vocabulary (model.vocab is empty or missing): it is not the model's tokenizer; copy it again`);
    return;
  }
  const vocab = config.vocab_size;
  if (Number.isInteger(vocab) && maxId >= (vocab as number)) {
    problems.push(
      `${tokenizerPath} can produce id ${maxId} (${JSON.stringify(maxToken)}), but ${join(modelDir, "config.json")} gives vocab_size ${String(vocab)}: ` +
        "the embedding has no row for it; use the tokenizer that came with these weights (or re-run `a2d_convert init`, which adds the mask row)",
    );
  }
  const { mask_token: maskToken, mask_token_id: maskId, eos_token_ids: eos } = config.a2d ?? {};
  if (typeof maskToken === "string" && Number.isInteger(maskId)) {
    const id = tokenizer.tokenId(maskToken);
    if (id !== maskId) {
      problems.push(
        `${join(modelDir, "config.json")}: a2d.mask_token_id is ${String(maskId)}, but ${tokenizerPath} gives ${JSON.stringify(maskToken)} ${id === undefined ? "no id" : `id ${id}`}: ` +
          "the tokenizer is not the one `a2d_convert init` wrote; copy it from the same export as config.json",
      );
    }
  }
  if (Array.isArray(eos) && Number.isInteger(vocab)) {
    const outside = eos.filter((id) => !Number.isInteger(id) || id < 0 || id >= (vocab as number));
    if (outside.length > 0) problems.push(`${join(modelDir, "config.json")}: a2d.eos_token_ids ${JSON.stringify(outside)} are outside the vocabulary (vocab_size ${String(vocab)}); fix them (generation_config.json's eos_token_id)`);
  }
}

/**
 * a2d.decoding, the defaults the engine decodes with, held to engine/decoding-params.json as the engine's
 * config reader (engine/src/config.cpp, read_decoding_defaults) holds it at start: every parameter with a
 * default (seed aside) in range, the cross-field rules kept, nothing else.
 */
function checkDecoding(modelDir: string, config: ModelConfig, problems: string[]): void {
  const decoding = config.a2d?.decoding ?? {};
  const where = `${join(modelDir, "config.json")}: a2d.decoding`;
  if (typeof decoding !== "object" || decoding === null || Array.isArray(decoding)) {
    problems.push(`${where} must be an object (docs/model-format.md)`);
    return;
  }
  const given = decoding as Record<string, unknown>;
  const blockSize = Number.isInteger(config.a2d?.block_size) ? (config.a2d!.block_size as number) : 4;
  const specs = DECODING_TABLE.parameters.filter((spec) => spec.default !== undefined && spec.name !== "seed");
  const values: Record<string, unknown> = {};
  const redecode = (flags: string) => `\`python -m a2d_convert redecode --model ${modelDir} ${flags}\` rewrites the model's defaults`;
  for (const spec of specs) {
    const value = given[spec.name] ?? spec.default;
    values[spec.name] = value;
    const problem = valueProblem(spec, value, blockSize);
    if (problem) {
      const example = spec.choices?.[0] ?? spec.default;
      problems.push(`${where}.${spec.name} is ${JSON.stringify(value)}; it must be ${problem}. The server refuses it at start: ${redecode(`--${spec.name.replace(/_/g, "-")} ${String(example)}`)}`);
    }
  }
  const known = new Set(specs.map((spec) => spec.name));
  for (const key of Object.keys(given).filter((k) => !known.has(k))) {
    problems.push(`${where}.${key} is not a decoding parameter the engine reads (docs/decoding.md), and the server refuses the folder at start: remove it (${redecode("--remasking low_confidence")})`);
  }
  if (problems.some((p) => p.startsWith(where))) return;
  const rule = brokenRule({
    blockSize,
    threshold: values.threshold as number,
    minPerStep: values.min_per_step as number,
    steps: values.steps as number,
    remasking: values.remasking as string,
    advance: values.advance as string,
  });
  if (rule) problems.push(`${where} breaks the rule ${rule.id}: ${rule.message}. The server refuses it at start; choose other defaults (${redecode("--remasking low_confidence")})`);
}

/** Throws ModelFolderError listing every problem, each with its file and fix. */
export async function checkModelContents(modelDir: string, plan: ModelPlan): Promise<void> {
  const problems: string[] = [];
  const pointers = new Set<string>();
  for (const rel of plan.serving) {
    const lfs = await lfsProblem(modelDir, rel);
    if (lfs) {
      problems.push(lfs);
      pointers.add(rel);
    }
  }
  const config = JSON.parse(await readFile(join(modelDir, "config.json"), "utf8")) as ModelConfig;
  const tensors = await weightTensors(modelDir, plan, problems);
  if (tensors) checkShapes(modelDir, config, tensors, problems);
  checkDecoding(modelDir, config, problems);
  // A pointer in place of a tokenizer file is reported above; building the tokenizer from it says nothing more.
  if (!pointers.has("tokenizer.json") && !pointers.has("tokenizer_config.json")) await checkTokenizer(modelDir, config, problems);
  if (problems.length > 0) {
    throw new ModelFolderError(`the model folder ${modelDir} would not load; nothing was written:\n  ${problems.join("\n  ")}`);
  }
}
