// model/ and evidence/: the files the server reads (docs/model-format.md) and the evidence files that travel
// with them. Weights are hard-linked when the output is on the same filesystem (a 5 GB copy for nothing
// otherwise) and copied with a progress bar when it is not.
import { createReadStream, createWriteStream } from "node:fs";
import { link, mkdir, readdir, readFile, stat } from "node:fs/promises";
import { join, relative } from "node:path";
import { pipeline } from "node:stream/promises";

import { startProgress } from "./progress.js";
import { lfsPointer } from "./safetensors.js";

export class ModelFolderError extends Error {}

const REQUIRED = ["config.json", "tokenizer.json", "tokenizer_config.json"];
const OPTIONAL = ["generation_config.json", "chat_template.jinja", "special_tokens_map.json", "model.safetensors.index.json"];
/** Evidence of how the weights were made (SPEC §1): carried in evidence/, never read by the server. */
const EVIDENCE = /^(lineage|data_manifest|decoder_config|filters?)([._-][\w.-]*)?\.(json|md|txt|jsonl)$/;

export interface ModelPlan {
  /** Paths relative to the model folder, to model/. */
  serving: string[];
  weights: string[];
  /** Paths relative to the model folder, to evidence/ (an evidence/ subfolder keeps its layout). */
  evidence: string[];
  skipped: string[];
  weightBytes: number;
  numLayers: number;
  /** config.json's a2d.precision (docs/model-format.md): "bf16" or "fp8-e4m3". */
  precision: Precision;
}

export const PRECISIONS = ["bf16", "fp8-e4m3"] as const;
export type Precision = (typeof PRECISIONS)[number];

async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch {
    return false;
  }
}

async function readJson(path: string): Promise<Record<string, unknown>> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (error) {
    throw new ModelFolderError(`${path} cannot be read (${(error as Error).message})`);
  }
  try {
    return JSON.parse(text) as Record<string, unknown>;
  } catch (error) {
    if (lfsPointer(Buffer.from(text.slice(0, 512)))) {
      throw new ModelFolderError(`${path} is a Git LFS pointer file, not the file itself: fetch it with \`git lfs pull\` in the repository the folder was cloned from (or download it again)`);
    }
    throw new ModelFolderError(`${path} cannot be read as JSON (${(error as Error).message}): the file is damaged; copy it again`);
  }
}

async function listRecursive(root: string, dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const full = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...(await listRecursive(root, full)));
    else out.push(relative(root, full));
  }
  return out;
}

export async function planModel(modelDir: string): Promise<ModelPlan> {
  if (!(await exists(modelDir))) throw new ModelFolderError(`model folder ${modelDir} does not exist`);
  for (const name of REQUIRED) {
    if (!(await exists(join(modelDir, name)))) {
      throw new ModelFolderError(`${join(modelDir, name)} is missing: an a2d model folder needs ${REQUIRED.join(", ")} and its weights (docs/model-format.md)`);
    }
  }
  const config = await readJson(join(modelDir, "config.json"));
  const a2d = config.a2d as { format_version?: unknown; precision?: unknown } | undefined;
  if (!a2d || typeof a2d !== "object") {
    throw new ModelFolderError(`${join(modelDir, "config.json")} has no "a2d" section: it is a plain AR model; make an a2d model of it first (\`python -m a2d_convert init --base ${modelDir} --out DIR\`)`);
  }
  if (a2d.format_version !== 1) {
    throw new ModelFolderError(`${join(modelDir, "config.json")}: a2d.format_version is ${JSON.stringify(a2d.format_version)}, this packer reads 1; re-export the model with this a2d version`);
  }
  const precision = (a2d.precision ?? "bf16") as Precision;
  if (!PRECISIONS.includes(precision)) {
    throw new ModelFolderError(`${join(modelDir, "config.json")}: a2d.precision is ${JSON.stringify(a2d.precision)}; use "bf16" or "fp8-e4m3" (python -m a2d_convert quantize makes FP8 folders)`);
  }
  const numLayers = Number(config.num_hidden_layers);
  if (!Number.isInteger(numLayers) || numLayers <= 0) {
    throw new ModelFolderError(`${join(modelDir, "config.json")}: num_hidden_layers is missing or not a positive integer`);
  }

  const indexPath = join(modelDir, "model.safetensors.index.json");
  let weights: string[];
  if (await exists(indexPath)) {
    const index = await readJson(indexPath);
    const map = index.weight_map as Record<string, string> | undefined;
    if (!map || typeof map !== "object") throw new ModelFolderError(`${indexPath} has no weight_map`);
    weights = [...new Set(Object.values(map))].sort();
  } else {
    weights = ["model.safetensors"];
  }
  let weightBytes = 0;
  for (const name of weights) {
    const path = join(modelDir, name);
    if (!(await exists(path))) {
      throw new ModelFolderError(`${path} is missing${name === "model.safetensors" ? "" : ` (listed in ${indexPath})`}: the model's weights must be in its folder`);
    }
    weightBytes += (await stat(path)).size;
  }

  const serving: string[] = [...REQUIRED];
  for (const name of OPTIONAL) if (await exists(join(modelDir, name))) serving.push(name);
  const known = new Set([...serving, ...weights]);
  const evidence: string[] = [];
  const skipped: string[] = [];
  for (const rel of (await listRecursive(modelDir, modelDir)).sort()) {
    if (known.has(rel)) continue;
    if (EVIDENCE.test(rel) || rel.startsWith("evidence/")) evidence.push(rel);
    else skipped.push(rel);
  }
  return { serving: serving.sort(), weights, evidence, skipped, weightBytes, numLayers, precision };
}

async function copyWithProgress(from: string, to: string, onBytes: (n: number) => void): Promise<void> {
  const source = createReadStream(from, { highWaterMark: 8 << 20 });
  source.on("data", (chunk) => onBytes(chunk.length));
  await pipeline(source, createWriteStream(to, { flags: "wx" }));
}

export interface PlacedModel {
  linkedBytes: number;
  copiedBytes: number;
}

/** Hard-links, else copies, each planned file; returns how many bytes share the model folder's inodes. */
export async function placeModel(modelDir: string, outDir: string, plan: ModelPlan): Promise<PlacedModel> {
  // Only weights are linked: small files are copied so that editing one in either folder cannot change the other.
  const targets: Array<[from: string, to: string, linkable: boolean]> = [
    ...plan.weights.map((rel): [string, string, boolean] => [join(modelDir, rel), join(outDir, "model", rel), true]),
    ...plan.serving.map((rel): [string, string, boolean] => [join(modelDir, rel), join(outDir, "model", rel), false]),
    ...plan.evidence.map((rel): [string, string, boolean] => [
      join(modelDir, rel),
      join(outDir, "evidence", rel.replace(/^evidence\//, "")),
      false,
    ]),
  ];
  let linkedBytes = 0;
  const toCopy: Array<[string, string, number]> = [];
  for (const [from, to, linkable] of targets) {
    await mkdir(join(to, ".."), { recursive: true });
    const size = (await stat(from)).size;
    if (!linkable) {
      toCopy.push([from, to, size]);
      continue;
    }
    try {
      await link(from, to);
      linkedBytes += size;
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code !== "EXDEV" && code !== "EPERM" && code !== "EMLINK") throw error;
      toCopy.push([from, to, size]);
    }
  }
  const copiedBytes = toCopy.reduce((sum, [, , size]) => sum + size, 0);
  if (toCopy.length > 0) {
    const progress = startProgress("copying model files", copiedBytes, "bytes");
    for (const [from, to] of toCopy) await copyWithProgress(from, to, (n) => progress.advance(n));
    progress.done();
  }
  return { linkedBytes, copiedBytes };
}

/** Where a file of the model folder lands in the packed folder, or null when it is not packed. */
export function packedPath(plan: ModelPlan, rel: string): string | null {
  if (plan.serving.includes(rel) || plan.weights.includes(rel)) return `model/${rel}`;
  if (plan.evidence.includes(rel)) return `evidence/${rel.replace(/^evidence\//, "")}`;
  return null;
}

interface Lineage {
  shipped?: { files?: Record<string, { sha256?: string }> };
}

/**
 * The lineage's `shipped` list is the export's own record of every file it wrote; a packed file that differs
 * from it means the weights or configs were changed after export, and the evidence would no longer describe
 * the folder. Returns warnings for shipped files the packer leaves out.
 */
export async function checkLineage(modelDir: string, plan: ModelPlan, packedHashes: Map<string, string>): Promise<string[]> {
  const lineageRel = plan.evidence.find((rel) => /(^|\/)lineage\.json$/.test(rel));
  if (!lineageRel) return [];
  const lineage = (await readJson(join(modelDir, lineageRel))) as Lineage;
  const shipped = lineage.shipped?.files ?? {};
  const warnings: string[] = [];
  for (const [rel, record] of Object.entries(shipped)) {
    const packed = packedPath(plan, rel);
    if (packed === null) {
      warnings.push(`${lineageRel} lists ${rel} as shipped, but it is not part of the packed folder`);
      continue;
    }
    const actual = packedHashes.get(packed);
    if (record.sha256 && actual && actual !== record.sha256) {
      throw new ModelFolderError(
        `${join(modelDir, rel)} does not match ${lineageRel} (sha256 ${actual.slice(0, 12)}…, shipped ${record.sha256.slice(0, 12)}…): ` +
          "it was changed after export; export again (python -m a2d_convert export) so the lineage describes the weights",
      );
    }
  }
  return warnings;
}
