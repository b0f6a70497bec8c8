// `a2d pack`: one self-contained offline folder (docs/packing.md). Everything is built in a temporary folder
// beside --out and renamed into place at the end, so an interrupted pack never leaves a half folder at --out.
import { existsSync, readFileSync, rmSync } from "node:fs";
import { chmod, copyFile, mkdir, readdir, realpath, rename, rm, stat, writeFile } from "node:fs/promises";
import { basename, dirname, join, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

import { buildManifest, type Manifest, MANIFEST_FILE, serializeManifest, STATE_DIR } from "./manifest.js";
import { checkLineage, type ModelPlan, placeModel, planModel } from "./model.js";
import { defaultNpmSource, type NpmSource, reifyProductionModules, writeAppPackage } from "./node-modules.js";
import { formatBytes } from "./progress.js";
import { packRuntime } from "./runtime.js";
import { renderServeScript } from "./serve-script.js";
import { packWheels, planWheels } from "./wheels.js";

export class PackError extends Error {}

/** The project root: this file runs from <root>/dist/pack/pack.js. */
export const PROJECT_ROOT = fileURLToPath(new URL("../../", import.meta.url));

export interface PackOptions {
  modelDir: string;
  outDir: string;
  /** Undefined: cuda when the CUDA addon is built, else cpu with a loud warning. */
  device?: "cuda" | "cpu";
  nodeBinary?: string;
  cpuAddon?: string;
  cudaAddon?: string;
  /** The id /v1/models lists (default: the model folder's name). */
  modelName?: string;
  withWheels?: boolean;
  wheelsDir?: string;
  force?: boolean;
  npm?: NpmSource;
  log?: (line: string) => void;
}

export interface SizeRow {
  part: string;
  bytes: number;
  files: number;
}

export interface PackResult {
  outDir: string;
  device: "cuda" | "cpu";
  warnings: string[];
  sizes: SizeRow[];
  totalBytes: number;
  /** Bytes shared with the model folder through hard links (no extra disk). */
  linkedBytes: number;
  manifest: Manifest;
}

const TEMP_MARK = ".a2d-pack-";

function tempPrefix(outDir: string): string {
  return join(dirname(outDir), `.${basename(outDir)}${TEMP_MARK}`);
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** A pack killed with SIGKILL cannot clean up after itself; the next pack for the same --out does. */
async function removeStaleTemps(outDir: string, log: (line: string) => void): Promise<void> {
  const prefix = basename(tempPrefix(outDir));
  for (const name of await readdir(dirname(outDir))) {
    if (!name.startsWith(prefix)) continue;
    const pid = Number(name.slice(prefix.length).split("-")[0]);
    if (Number.isInteger(pid) && !processAlive(pid)) {
      log(`removing ${join(dirname(outDir), name)}, left by an interrupted pack`);
      await rm(join(dirname(outDir), name), { recursive: true, force: true });
    }
  }
}

function onInterrupt(tempDir: string): () => void {
  const handlers = new Map<NodeJS.Signals, () => void>();
  for (const [signal, code] of [["SIGINT", 130], ["SIGTERM", 143], ["SIGHUP", 129]] as const) {
    const handler = () => {
      // Synchronous on purpose: nothing else may run between the signal and the exit.
      rmSync(tempDir, { recursive: true, force: true });
      process.stderr.write(`\na2d pack: interrupted by ${signal}; removed ${tempDir}, nothing was written at --out\n`);
      process.exit(code);
    };
    handlers.set(signal, handler);
    process.on(signal, handler);
  }
  return () => handlers.forEach((handler, signal) => process.off(signal, handler));
}

async function isFile(path: string): Promise<boolean> {
  try {
    return (await stat(path)).isFile();
  } catch {
    return false;
  }
}

interface Addons {
  device: "cuda" | "cpu";
  cpu: string;
  cuda: string | null;
  warnings: string[];
}

async function findAddons(options: PackOptions): Promise<Addons> {
  const cpu = resolve(options.cpuAddon ?? join(PROJECT_ROOT, "build", "engine", "a2d_cpu.node"));
  const cudaPath = resolve(options.cudaAddon ?? join(PROJECT_ROOT, "build", "engine-cuda", "a2d_cuda.node"));
  if (!(await isFile(cpu))) {
    throw new PackError(`the CPU engine addon ${cpu} is missing: build it with \`npm run build:engine\` (or pass --cpu-addon)`);
  }
  const hasCuda = await isFile(cudaPath);
  if (options.device === "cuda" && !hasCuda) {
    throw new PackError(`--device cuda, but the CUDA engine addon ${cudaPath} is missing: build it with \`npm run build:cuda\` on a machine with the CUDA toolkit (or pass --cuda-addon)`);
  }
  if (options.device === "cpu") return { device: "cpu", cpu, cuda: null, warnings: [] };
  if (hasCuda) return { device: "cuda", cpu, cuda: cudaPath, warnings: [] };
  return {
    device: "cpu",
    cpu,
    cuda: null,
    warnings: [
      `NO CUDA ENGINE: ${cudaPath} does not exist, so this folder runs on the CPU only and will not meet any GPU ` +
        `budget. Build it with \`npm run build:cuda\` and pack again, or pass --device cpu to say a CPU folder is intended.`,
    ],
  };
}

async function copyCompiledApp(outDir: string): Promise<void> {
  const distDir = join(PROJECT_ROOT, "dist");
  const entry = join(distDir, "cli", "main.js");
  if (!(await isFile(entry))) {
    throw new PackError(`${entry} is missing: compile the TypeScript first (\`npm run build:ts\`; \`npm run pack\` does it for you)`);
  }
  async function walk(rel: string): Promise<void> {
    for (const entry of await readdir(join(distDir, rel), { withFileTypes: true })) {
      const childRel = join(rel, entry.name);
      if (entry.isDirectory()) await walk(childRel);
      else if (entry.isFile() && /\.(js|mjs|cjs|json|js\.map)$/.test(entry.name)) {
        await mkdir(join(outDir, "app", "dist", rel), { recursive: true });
        await copyFile(join(distDir, childRel), join(outDir, "app", "dist", childRel));
      }
    }
  }
  await walk("");
  // dist/eval finds its Python helpers at ../../eval (eval/paths.ts); tsc does not copy .py files.
  // `serve` never reads them, but `a2d eval` run from the packed folder does.
  const evalDir = join(PROJECT_ROOT, "eval");
  const helpers = existsSync(evalDir) ? (await readdir(evalDir)).filter((f) => f.endsWith(".py")) : [];
  if (helpers.length > 0) await mkdir(join(outDir, "app", "eval"), { recursive: true });
  for (const helper of helpers) await copyFile(join(evalDir, helper), join(outDir, "app", "eval", helper));
}

function sizeBreakdown(manifest: Manifest, plan: ModelPlan): SizeRow[] {
  const weights = new Set(plan.weights.map((w) => `model/${w}`));
  const rows = new Map<string, SizeRow>();
  for (const file of manifest.files) {
    const part =
      file.path === "runtime/bin/node"
        ? "runtime/bin/node"
        : file.path.startsWith("runtime/lib/")
          ? "runtime/lib"
          : file.path.startsWith("app/node_modules/")
            ? "app/node_modules"
            : file.path.startsWith("app/")
              ? "app (server code)"
              : file.path.startsWith("engine/")
                ? file.path
                : weights.has(file.path)
                  ? "model weights"
                  : file.path.startsWith("model/")
                    ? "model config + tokenizer"
                    : file.path.split("/")[0]!;
    const row = rows.get(part) ?? { part, bytes: 0, files: 0 };
    row.bytes += file.size;
    row.files += 1;
    rows.set(part, row);
  }
  return [...rows.values()].sort((a, b) => b.bytes - a.bytes);
}

export function formatSizeReport(result: PackResult): string {
  const lines = [`${"part".padEnd(28)} ${"size".padStart(10)} ${"files".padStart(7)}`];
  for (const row of result.sizes) {
    lines.push(`${row.part.padEnd(28)} ${formatBytes(row.bytes).padStart(10)} ${String(row.files).padStart(7)}`);
  }
  const files = result.sizes.reduce((sum, row) => sum + row.files, 0);
  lines.push(`${"total".padEnd(28)} ${formatBytes(result.totalBytes).padStart(10)} ${String(files).padStart(7)}`);
  if (result.linkedBytes > 0) {
    lines.push(`(${formatBytes(result.linkedBytes)} of weights are hard links to the model folder: no extra disk used)`);
  }
  return lines.join("\n");
}

function a2dVersion(): string {
  return (JSON.parse(readFileSync(join(PROJECT_ROOT, "package.json"), "utf8")) as { version: string }).version;
}

export async function pack(options: PackOptions): Promise<PackResult> {
  const log = options.log ?? ((line: string) => process.stderr.write(`${line}\n`));
  const outDir = resolve(options.outDir);
  const modelDir = resolve(options.modelDir);
  if (!existsSync(dirname(outDir))) throw new PackError(`the parent of --out (${dirname(outDir)}) does not exist; create it first`);
  const modelReal = await realpath(modelDir).catch(() => modelDir);
  const outParentReal = await realpath(dirname(outDir));
  if (join(outParentReal, basename(outDir)) === modelReal || `${outParentReal}${sep}`.startsWith(`${modelReal}${sep}`)) {
    throw new PackError(`--out ${outDir} is the model folder or inside it; choose an output folder outside ${modelDir}`);
  }
  if (existsSync(outDir) && !options.force) {
    throw new PackError(`${outDir} already exists; pass --force to replace it (it is replaced only once the new folder is complete)`);
  }

  const modelName = options.modelName ?? basename(modelDir).replace(/[^A-Za-z0-9._:@/-]/g, "-");
  if (!/^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$/.test(modelName)) {
    throw new PackError(`--model-name "${modelName}" must start with a letter or digit and use only letters, digits and . _ : @ / - (at most 128)`);
  }
  const plan = await planModel(modelDir);
  const addons = await findAddons(options);
  const wheels = options.withWheels ? await planWheels(resolve(options.wheelsDir ?? join(PROJECT_ROOT, "wheels"))) : null;
  const nodeBinary = resolve(options.nodeBinary ?? process.execPath);
  const version = a2dVersion();
  for (const warning of addons.warnings) log(`\n!!! ${warning}\n`);
  if (plan.skipped.length > 0) log(`not packed (not part of the model format): ${plan.skipped.join(", ")}`);

  await removeStaleTemps(outDir, log);
  const tempDir = `${tempPrefix(outDir)}${process.pid}-${Date.now().toString(36)}`;
  await mkdir(tempDir);
  const stopInterruptHandling = onInterrupt(tempDir);
  try {
    log(`packing ${modelDir} -> ${outDir} (device ${addons.device})`);
    const addonPaths = [addons.cpu, ...(addons.cuda ? [addons.cuda] : [])];
    const runtime = await packRuntime(tempDir, nodeBinary, addonPaths);
    log(`runtime: node ${runtime.nodeVersion}${runtime.libraries.length ? ` + ${runtime.libraries.join(", ")}` : ""}`);

    await mkdir(join(tempDir, "app"));
    await copyCompiledApp(tempDir);
    const { lockfile } = await writeAppPackage(PROJECT_ROOT, join(tempDir, "app"));
    await reifyProductionModules(join(tempDir, "app"), lockfile, options.npm ?? defaultNpmSource());

    await mkdir(join(tempDir, "engine"));
    for (const addon of addonPaths) await copyFile(addon, join(tempDir, "engine", basename(addon)));

    const placed = await placeModel(modelDir, tempDir, plan);
    if (wheels) await packWheels(tempDir, wheels, log);

    await mkdir(join(tempDir, STATE_DIR, "cuda-cache"), { recursive: true });
    const requiredFiles = [
      "runtime/bin/node",
      "app/dist/cli/main.js",
      "app/package.json",
      ...addonPaths.map((addon) => `engine/${basename(addon)}`),
      ...[...plan.serving, ...plan.weights].map((file) => `model/${file}`),
    ];
    await writeFile(
      join(tempDir, "serve.sh"),
      renderServeScript({ defaultDevice: addons.device, hasCuda: addons.cuda !== null, requiredFiles, a2dVersion: version, modelName }),
    );
    await chmod(join(tempDir, "serve.sh"), 0o755);

    const manifest = await buildManifest(tempDir, {
      a2d_version: version,
      device: addons.device,
      precision: plan.precision,
      node_version: runtime.nodeVersion,
    });
    const manifestText = serializeManifest(manifest);
    await writeFile(join(tempDir, MANIFEST_FILE), manifestText);
    const warnings = [...addons.warnings, ...(await checkLineage(modelDir, plan, new Map(manifest.files.map((f) => [f.path, f.sha256]))))];

    if (existsSync(outDir)) {
      const replaced = `${tempPrefix(outDir)}${process.pid}-replaced`;
      await rename(outDir, replaced);
      await rename(tempDir, outDir);
      await rm(replaced, { recursive: true, force: true });
    } else {
      await rename(tempDir, outDir);
    }
    const sizes = [...sizeBreakdown(manifest, plan), { part: MANIFEST_FILE, bytes: Buffer.byteLength(manifestText), files: 1 }].sort((a, b) => b.bytes - a.bytes);
    return {
      outDir,
      device: addons.device,
      warnings,
      sizes,
      totalBytes: sizes.reduce((sum, row) => sum + row.bytes, 0),
      linkedBytes: placed.linkedBytes,
      manifest,
    };
  } catch (error) {
    await rm(tempDir, { recursive: true, force: true });
    throw error;
  } finally {
    stopInterruptHandling();
  }
}
