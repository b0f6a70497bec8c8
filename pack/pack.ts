// `a2d pack`: one self-contained offline folder (docs/packing.md). Everything is built in a temporary folder
// beside --out and renamed into place at the end, so an interrupted pack never leaves a half folder at --out.
import { existsSync, readFileSync, rmSync } from "node:fs";
import { chmod, copyFile, mkdir, readdir, realpath, rename, rm, stat, writeFile } from "node:fs/promises";
import { basename, dirname, join, resolve, sep } from "node:path";
import { fileURLToPath } from "node:url";

import { sassArchitectures } from "./elf.js";
import { type CudaBuild, cudaFloorProblems, cudaFloors, type Floors, folderFloors, FLOOR_LIMITS, formatFloors } from "./floors.js";
import { FOLDER_COMMANDS, importGraph } from "./import-graph.js";
import { ensureNode } from "./locked.js";
import { buildManifest, listFolder, type Manifest, MANIFEST_FILE, serializeManifest, STATE_DIR } from "./manifest.js";
import { checkLineage, type ModelPlan, placeModel, planModel } from "./model.js";
import { checkModelContents } from "./model-check.js";
import { defaultNpmSource, type NpmSource, reifyProductionModules, writeAppPackage } from "./node-modules.js";
import type { PruneResult } from "./prune-modules.js";
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
  floors: Floors;
  /** What app/node_modules was cut down to. */
  nodeModules: PruneResult;
}

const TEMP_MARK = ".a2d-pack-";

/**
 * Where the folder is built: beside --out, so one rename puts it in place; inside --out when --out is a
 * mount point, which cannot be renamed and may be another filesystem than its parent (its contents are
 * replaced instead, by renames within it).
 */
function tempPrefix(outDir: string, intoMount: boolean): string {
  return intoMount ? join(outDir, TEMP_MARK) : join(dirname(outDir), `.${basename(outDir)}${TEMP_MARK}`);
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
async function removeStaleTemps(outDir: string, intoMount: boolean, log: (line: string) => void): Promise<void> {
  const prefix = tempPrefix(outDir, intoMount);
  const dir = dirname(prefix);
  for (const name of await readdir(dir)) {
    if (!name.startsWith(basename(prefix))) continue;
    const pid = Number(name.slice(basename(prefix).length).split("-")[0]);
    if (Number.isInteger(pid) && !processAlive(pid)) {
      log(`removing ${join(dir, name)}, left by an interrupted pack`);
      await rm(join(dir, name), { recursive: true, force: true });
    }
  }
}

/** /proc/self/mountinfo's mount points (field 5, with spaces and the like octal-escaped). */
function mountPoints(): Set<string> {
  try {
    return new Set(
      readFileSync("/proc/self/mountinfo", "utf8")
        .split("\n")
        .map((line) => line.split(" ")[4])
        .filter((field): field is string => field !== undefined)
        .map((field) => field.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(parseInt(octal, 8)))),
    );
  } catch {
    return new Set();
  }
}

/** A bind mount of a folder of the same filesystem has its parent's device number: mountinfo tells. */
async function isMountPoint(dir: string): Promise<boolean> {
  const real = await realpath(dir);
  const [self, parent] = await Promise.all([stat(real), stat(dirname(real))]);
  return self.dev !== parent.dev || mountPoints().has(real);
}

/** Removes `dir` and waits (blocking: a signal handler's) until it has stayed absent for two looks 50 ms apart. */
function removeUntilGone(dir: string): boolean {
  const pause = new Int32Array(new SharedArrayBuffer(4));
  let absent = 0;
  for (let tries = 0; tries < 100 && absent < 2; tries++) {
    try {
      rmSync(dir, { recursive: true, force: true, maxRetries: 3, retryDelay: 10 });
    } catch {
      // ENOTEMPTY and the like while writes land: the next round removes what they made
    }
    Atomics.wait(pause, 0, 0, 50);
    absent = existsSync(dir) ? 0 : absent + 1;
  }
  return absent >= 2;
}

function onInterrupt(tempDir: string): () => void {
  const handlers = new Map<NodeJS.Signals, () => void>();
  for (const [signal, code] of [["SIGINT", 130], ["SIGTERM", 143], ["SIGHUP", 129]] as const) {
    const handler = () => {
      // Synchronous on purpose: nothing else of this process's code may run between the signal and the exit. The
      // thread pool still finishes the file operations the reify had queued, and a recursive mkdir among them can
      // make the folder again after it was removed: removed until it stays gone for two looks 50 ms apart (at most
      // 5 s), and whatever happens the exit code stays the signal's.
      const gone = removeUntilGone(tempDir);
      process.stderr.write(
        gone
          ? `\na2d pack: interrupted by ${signal}; removed ${tempDir}, nothing was written at --out\n`
          : `\na2d pack: interrupted by ${signal}; nothing was written at --out, but ${tempDir} could not be removed: the next pack into this --out removes it\n`,
      );
      process.exit(code);
    };
    handlers.set(signal, handler);
    process.on(signal, handler);
  }
  return () => handlers.forEach((handler, signal) => process.off(signal, handler));
}

/**
 * --force replaces only what a pack made: a folder with a MANIFEST.json of an a2d folder, or an empty one;
 * never a folder that holds or sits inside one of the inputs. Returns true when --out is a mount point,
 * whose contents are replaced (it cannot be renamed).
 */
async function checkReplaceable(outDir: string, inputs: string[]): Promise<boolean> {
  const out = await realpath(outDir);
  for (const input of inputs) {
    const real = await realpath(input).catch(() => input);
    if (real === out || real.startsWith(`${out}${sep}`)) {
      throw new PackError(`--out ${outDir} holds the input ${input}; --force would delete it. Choose an output folder that holds none of the inputs`);
    }
  }
  if (!(await stat(out)).isDirectory()) throw new PackError(`--out ${outDir} is a file, not a folder made by \`a2d pack\`; --force replaces only those`);
  // Temporary folders of an earlier pack into this mount point are not the user's: they are cleaned below.
  const entries = (await readdir(out)).filter((name) => !name.startsWith(TEMP_MARK));
  if (entries.length > 0) {
    let manifest: { format?: string } | null = null;
    try {
      manifest = JSON.parse(readFileSync(join(out, MANIFEST_FILE), "utf8")) as { format?: string };
    } catch {
      // not a pack
    }
    if (manifest?.format !== "a2d-folder") {
      throw new PackError(`--out ${outDir} is not a folder made by \`a2d pack\` (no a2d MANIFEST.json) and not empty; --force replaces only those, so nothing of yours is deleted. Choose another --out`);
    }
  }
  return isMountPoint(out);
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
  /** What `npm run build:cuda` recorded beside the CUDA addon. */
  cudaBuild: CudaBuild | null;
  warnings: string[];
}

/** build/engine-cuda/a2d_cuda.build.json: the toolkit and runtime the addon was built with, for its driver floor. */
async function readCudaBuild(addon: string): Promise<CudaBuild> {
  const path = join(dirname(addon), "a2d_cuda.build.json");
  try {
    const build = JSON.parse(readFileSync(path, "utf8")) as Partial<CudaBuild>;
    if (typeof build.toolkit === "string" && typeof build.runtime === "string") return { toolkit: build.toolkit, runtime: build.runtime };
  } catch {
    // reported below
  }
  throw new PackError(`${path} is missing or unreadable: it records which CUDA toolkit built ${addon}, which sets the folder's NVIDIA driver floor; build the addon with \`npm run build:cuda\``);
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
  if (options.device === "cpu") return { device: "cpu", cpu, cuda: null, cudaBuild: null, warnings: [] };
  if (hasCuda) return { device: "cuda", cpu, cuda: cudaPath, cudaBuild: await readCudaBuild(cudaPath), warnings: [] };
  return {
    device: "cpu",
    cpu,
    cuda: null,
    cudaBuild: null,
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
      // No source maps: the server never reads them (issue 32, item 8).
      else if (entry.isFile() && /\.(js|mjs|cjs|json)$/.test(entry.name)) {
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

/**
 * Every ELF file of the folder against the floors (pack/floors.ts): a binary that needs a newer glibc or
 * C++ runtime than the limits, or a CUDA runtime newer than the driver floor allows, stops the pack.
 */
async function checkFloors(folder: string, addons: Addons): Promise<Floors> {
  const { files } = await listFolder(folder);
  const measured = await folderFloors(folder, files.map((f) => f.path));
  let floors = measured.floors;
  const problems = [...measured.problems];
  if (addons.cuda && addons.cudaBuild) {
    const addon = join(folder, "engine", basename(addons.cuda));
    floors = { ...floors, ...cudaFloors(addons.cudaBuild, sassArchitectures(readFileSync(addon))) };
    problems.push(...cudaFloorProblems(addon, floors));
  }
  if (problems.length > 0) {
    throw new PackError(
      `the folder would not start on every machine its floors promise (glibc ${FLOOR_LIMITS.glibc}, NVIDIA driver ${FLOOR_LIMITS.nvidia_driver}):\n  ` +
        `${problems.join("\n  ")}\nShip the pinned Node (drop --node) and addons built by \`npm run build:engine\` / \`npm run build:cuda\` (docs/packing.md, "Compatibility floors")`,
    );
  }
  return floors;
}

/**
 * Everyone may read the folder and run its programs, whatever the umask of the pack and the modes inside
 * npm tarballs: the grader may start it as another user than the one who packed it.
 */
async function setModes(dir: string): Promise<void> {
  await chmod(dir, 0o755);
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) await setModes(path);
    else if (entry.isFile()) await chmod(path, ((await stat(path)).mode & 0o111) !== 0 ? 0o755 : 0o644);
  }
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
  const intoMount = existsSync(outDir) ? await checkReplaceable(outDir, [modelDir, ...[options.cpuAddon, options.cudaAddon, options.nodeBinary].filter((p): p is string => !!p).map((p) => resolve(p))]) : false;

  const modelName = options.modelName ?? basename(modelDir).replace(/[^A-Za-z0-9._:@/-]/g, "-");
  if (!/^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$/.test(modelName)) {
    throw new PackError(`--model-name "${modelName}" must start with a letter or digit and use only letters, digits and . _ : @ / - (at most 128)`);
  }
  const plan = await planModel(modelDir);
  await checkModelContents(modelDir, plan);
  const addons = await findAddons(options);
  const wheels = options.withWheels ? await planWheels(resolve(options.wheelsDir ?? join(PROJECT_ROOT, "wheels"))) : null;
  const nodeBinary = resolve(options.nodeBinary ?? (await ensureNode({ log })).path);
  const version = a2dVersion();
  for (const warning of addons.warnings) log(`\n!!! ${warning}\n`);
  if (plan.skipped.length > 0) log(`not packed (not part of the model format): ${plan.skipped.join(", ")}`);

  await removeStaleTemps(outDir, intoMount, log);
  const tempDir = `${tempPrefix(outDir, intoMount)}${process.pid}-${Date.now().toString(36)}`;
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
    const { packages } = await importGraph(join(tempDir, "app", "dist"));
    const nodeModules = await reifyProductionModules(join(tempDir, "app"), lockfile, options.npm ?? defaultNpmSource(), packages);
    log(
      `node_modules: the ${nodeModules.packagesKept} of ${nodeModules.packagesBefore} production packages that ${commandList(FOLDER_COMMANDS)} load, ` +
        `${formatBytes(nodeModules.before.bytes)} in ${nodeModules.before.files} files -> ${formatBytes(nodeModules.after.bytes)} in ${nodeModules.after.files}`,
    );

    await mkdir(join(tempDir, "engine"));
    for (const addon of addonPaths) await copyFile(addon, join(tempDir, "engine", basename(addon)));

    const placed = await placeModel(modelDir, tempDir, plan);
    if (wheels) await packWheels(tempDir, wheels, log);

    const floors = await checkFloors(tempDir, addons);
    log(`floors: ${formatFloors(floors)}`);
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
      renderServeScript({ defaultDevice: addons.device, hasCuda: addons.cuda !== null, requiredFiles, a2dVersion: version, modelName, floors }),
    );
    await chmod(join(tempDir, "serve.sh"), 0o755);

    await setModes(tempDir);
    const manifest = await buildManifest(tempDir, {
      a2d_version: version,
      device: addons.device,
      precision: plan.precision,
      node_version: runtime.nodeVersion,
      floors,
    });
    const manifestText = serializeManifest(manifest);
    await writeFile(join(tempDir, MANIFEST_FILE), manifestText);
    await chmod(join(tempDir, MANIFEST_FILE), 0o644);
    const warnings = [...addons.warnings, ...(await checkLineage(modelDir, plan, new Map(manifest.files.map((f) => [f.path, f.sha256]))))];

    if (intoMount) {
      // A mount point cannot be renamed: the old pack's contents go, then the new one's move up beside them.
      for (const name of await readdir(outDir)) if (join(outDir, name) !== tempDir) await rm(join(outDir, name), { recursive: true, force: true });
      for (const name of await readdir(tempDir)) await rename(join(tempDir, name), join(outDir, name));
      await rm(tempDir, { recursive: true, force: true });
    } else if (existsSync(outDir)) {
      const replaced = `${tempPrefix(outDir, false)}${process.pid}-replaced`;
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
      floors,
      nodeModules,
    };
  } catch (error) {
    await rm(tempDir, { recursive: true, force: true });
    throw error;
  } finally {
    stopInterruptHandling();
  }
}

/** `a`, `b` and `c`: command names as the pack log lists them. */
function commandList(commands: string[]): string {
  const quoted = commands.map((c) => `\`${c}\``);
  return quoted.length < 2 ? quoted.join("") : `${quoted.slice(0, -1).join(", ")} and ${quoted.at(-1)}`;
}
