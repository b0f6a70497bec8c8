// MANIFEST.json: every file of a packed folder with its size, sha256 and executable bit, sorted by path and
// free of timestamps, so the same inputs give a byte-identical manifest and `verify` can name every
// missing, extra or changed file.
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { lstat, readdir, readFile } from "node:fs/promises";
import { join } from "node:path";

import type { Floors } from "./floors.js";
import { startProgress } from "./progress.js";

export const MANIFEST_FILE = "MANIFEST.json";
/** Written by the running server (the folder-local CUDA cache), never part of what was packed. */
export const STATE_DIR = "state";

export interface ManifestEntry {
  path: string;
  size: number;
  sha256: string;
  executable?: true;
}

export interface Manifest {
  format: "a2d-folder";
  format_version: 1;
  a2d_version: string;
  device: "cuda" | "cpu";
  /** The model's weight format (config.json's a2d.precision). */
  precision: "bf16" | "fp8-e4m3";
  node_version: string;
  /** The oldest machine the folder runs on (pack/floors.ts); absent in folders packed before floors were recorded. */
  floors?: Floors;
  files: ManifestEntry[];
}

export interface FolderFile {
  path: string;
  size: number;
  executable: boolean;
}

export class ManifestError extends Error {}

const SMALL_FILE = 4 << 20;

function isManaged(relPath: string): boolean {
  return relPath !== MANIFEST_FILE && relPath !== STATE_DIR && !relPath.startsWith(`${STATE_DIR}/`);
}

/** Every regular file of the folder except the manifest and state/, sorted. Symlinks are reported as such. */
export async function listFolder(root: string): Promise<{ files: FolderFile[]; symlinks: string[] }> {
  const files: FolderFile[] = [];
  const symlinks: string[] = [];
  async function walk(rel: string): Promise<void> {
    const entries = await readdir(join(root, rel), { withFileTypes: true });
    for (const entry of entries) {
      const childRel = rel ? `${rel}/${entry.name}` : entry.name;
      if (!isManaged(childRel)) continue;
      if (entry.isSymbolicLink()) symlinks.push(childRel);
      else if (entry.isDirectory()) await walk(childRel);
      else if (entry.isFile()) {
        const stat = await lstat(join(root, childRel));
        files.push({ path: childRel, size: stat.size, executable: (stat.mode & 0o111) !== 0 });
      }
    }
  }
  await walk("");
  const byPath = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);
  files.sort((a, b) => byPath(a.path, b.path));
  symlinks.sort(byPath);
  return { files, symlinks };
}

export async function sha256File(path: string, onBytes?: (n: number) => void, size = Infinity): Promise<string> {
  const hash = createHash("sha256");
  if (size <= SMALL_FILE) {
    // Streams allocate highWaterMark-sized buffers per file; node_modules is thousands of tiny files.
    const content = await readFile(path);
    onBytes?.(content.length);
    return hash.update(content).digest("hex");
  }
  for await (const chunk of createReadStream(path, { highWaterMark: 8 << 20 }) as AsyncIterable<Buffer>) {
    hash.update(chunk);
    onBytes?.(chunk.length);
  }
  return hash.digest("hex");
}

/** Hash files with a few reads in flight: node_modules is thousands of small files, weights a few huge ones. */
async function hashAll(root: string, files: FolderFile[], label: string): Promise<Map<string, string>> {
  const total = files.reduce((sum, f) => sum + f.size, 0);
  const progress = startProgress(label, total, "bytes");
  const hashes = new Map<string, string>();
  let next = 0;
  async function worker(): Promise<void> {
    while (next < files.length) {
      const file = files[next++]!;
      hashes.set(file.path, await sha256File(join(root, file.path), (n) => progress.advance(n), file.size));
    }
  }
  await Promise.all(Array.from({ length: 4 }, worker));
  progress.done();
  return hashes;
}

export async function buildManifest(
  root: string,
  info: Omit<Manifest, "format" | "format_version" | "files">,
): Promise<Manifest> {
  const { files, symlinks } = await listFolder(root);
  if (symlinks.length > 0) {
    throw new ManifestError(`the folder must hold plain files only, but these are symlinks: ${symlinks.join(", ")}`);
  }
  const hashes = await hashAll(root, files, "hashing for MANIFEST.json");
  return {
    format: "a2d-folder",
    format_version: 1,
    ...info,
    files: files.map((f) => ({
      path: f.path,
      size: f.size,
      sha256: hashes.get(f.path)!,
      ...(f.executable ? { executable: true as const } : {}),
    })),
  };
}

/** One file per line: readable in a diff, and a quarter the size of fully indented JSON. */
export function serializeManifest(manifest: Manifest): string {
  const { files, ...header } = manifest;
  const head = JSON.stringify(header, null, 1).replace(/\n}$/, "");
  return `${head},\n "files": [\n${files.map((f) => `  ${JSON.stringify(f)}`).join(",\n")}\n ]\n}\n`;
}

export async function readManifest(root: string): Promise<Manifest> {
  const path = join(root, MANIFEST_FILE);
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch {
    throw new ManifestError(`${path} is missing: this is not a folder made by \`a2d pack\` (or it was damaged); pack it again`);
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (error) {
    throw new ManifestError(`${path} is not valid JSON (${(error as Error).message}); pack the folder again`);
  }
  const manifest = parsed as Partial<Manifest>;
  if (manifest.format !== "a2d-folder" || manifest.format_version !== 1 || !Array.isArray(manifest.files)) {
    throw new ManifestError(`${path} is not an a2d folder manifest of format_version 1; pack the folder again with this a2d`);
  }
  return manifest as Manifest;
}

export interface ChangedFile {
  path: string;
  reason: string;
}

export interface VerifyResult {
  checked: number;
  missing: string[];
  extra: string[];
  changed: ChangedFile[];
  ok: boolean;
}

export async function verifyFolder(root: string): Promise<VerifyResult> {
  const manifest = await readManifest(root);
  const { files, symlinks } = await listFolder(root);
  const onDisk = new Map(files.map((f) => [f.path, f]));
  const expected = new Map(manifest.files.map((f) => [f.path, f]));

  const missing = manifest.files.filter((f) => !onDisk.has(f.path)).map((f) => f.path);
  const extra = [...files.filter((f) => !expected.has(f.path)).map((f) => f.path), ...symlinks.map((s) => `${s} (symlink)`)];
  const changed: ChangedFile[] = [];
  const toHash: FolderFile[] = [];
  for (const want of manifest.files) {
    const have = onDisk.get(want.path);
    if (!have) continue;
    if (have.size !== want.size) changed.push({ path: want.path, reason: `size ${have.size} bytes, expected ${want.size}` });
    else if (have.executable !== (want.executable === true))
      changed.push({ path: want.path, reason: want.executable ? "lost its executable bit" : "became executable" });
    else toHash.push(have);
  }
  const hashes = await hashAll(root, toHash, "verifying sha256");
  for (const file of toHash) {
    const want = expected.get(file.path)!;
    if (hashes.get(file.path) !== want.sha256) changed.push({ path: file.path, reason: "content differs (sha256)" });
  }
  changed.sort((a, b) => (a.path < b.path ? -1 : 1));
  return {
    checked: manifest.files.length,
    missing,
    extra,
    changed,
    ok: missing.length === 0 && extra.length === 0 && changed.length === 0,
  };
}
