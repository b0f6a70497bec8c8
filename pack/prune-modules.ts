// app/node_modules holds only what the folder's commands load (issue 32, item 8): the packages the
// compiled CLI imports for them (pack/import-graph.ts) and everything those depend on, as the lockfile's tree
// says (every edge but dev ones: prod, optional and peer). The rest of the production tree (the packer's
// arborist, pacote, tar and their node-gyp and sigstore; the simulator's execa) goes, and so do the files
// inside the kept packages that Node never loads: tests, docs, examples, benchmarks, READMEs and
// changelogs, source maps and TypeScript sources and declarations. Licence files stay.
import type { Node } from "@npmcli/arborist";
import { lstat, readdir, readFile, rm } from "node:fs/promises";
import { dirname, join, relative, resolve, sep } from "node:path";

export class PruneError extends Error {}

/** Folders of a package that are documentation or development material, never runtime code. */
const DEV_DIRS = new Set(["test", "tests", "__tests__", "docs", "doc", "example", "examples", "benchmark", "benchmarks", ".github", "coverage"]);
/** Files never loaded at run time. Licence and notice files (LICENSE.md included) are kept. */
const DEV_FILE = /(\.map|\.d\.[cm]?ts|\.[cm]?ts|\.markdown)$|^(readme|changelog|history|contributing|code_of_conduct|security|upgrading|migrating)(\.(md|txt|rst|html))?$/i;
const KEPT_FILE = /^(licen[cs]e|notice|copying|authors|patents)([.-].*)?$/i;
const MARKDOWN = /\.md$/i;
const CODE = /\.(c|m)?js$/;
const RELATIVE_SPECIFIER = /(?:require(?:\.resolve)?\s*\(\s*|from\s+|import\s*\(\s*|import\s+)["'](\.{1,2}\/[^"']*)["']/g;

export interface FolderSize {
  bytes: number;
  files: number;
}

export interface PruneResult {
  packagesBefore: number;
  packagesKept: number;
  /** Package locations removed, e.g. node_modules/@npmcli/arborist. */
  removedPackages: string[];
  before: FolderSize;
  after: FolderSize;
}

export async function folderSize(dir: string): Promise<FolderSize> {
  const size: FolderSize = { bytes: 0, files: 0 };
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) {
      const inner = await folderSize(path);
      size.bytes += inner.bytes;
      size.files += inner.files;
    } else if (entry.isFile()) {
      size.bytes += (await lstat(path)).size;
      size.files += 1;
    }
  }
  return size;
}

/** The tree's nodes the folder needs: the imported packages, then along every non-dev edge. */
export function neededNodes(tree: Node, imported: Set<string>): Set<Node> {
  const needed = new Set<Node>();
  const queue: Node[] = [];
  for (const name of [...imported].sort()) {
    const edge = tree.edgesOut.get(name);
    if (!edge || edge.type === "dev") {
      throw new PruneError(`the compiled CLI imports ${name}, but package.json does not list it in dependencies: add it there (npm install ${name}), or the packed folder would lack it`);
    }
    if (!edge.to) throw new PruneError(`the compiled CLI imports ${name}, but it was not installed into the packed folder's node_modules`);
    queue.push(edge.to);
  }
  while (queue.length > 0) {
    const node = queue.pop()!;
    if (needed.has(node)) continue;
    needed.add(node);
    for (const edge of node.edgesOut.values()) if (edge.type !== "dev" && edge.to && edge.to !== tree) queue.push(edge.to);
  }
  return needed;
}

/** Files and folders of node_modules that are not runtime material (nested node_modules are walked as packages). */
async function devMaterial(dir: string, found: string[]): Promise<void> {
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) {
      if (entry.name !== "node_modules" && DEV_DIRS.has(entry.name.toLowerCase())) found.push(path);
      else await devMaterial(path, found);
    } else if (entry.isFile() && !KEPT_FILE.test(entry.name) && (DEV_FILE.test(entry.name) || MARKDOWN.test(entry.name))) {
      found.push(path);
    }
  }
}

/** Code files and package.json manifests outside `skip` (what is about to be removed does not count). */
async function runtimeFiles(dir: string, skip: Set<string>, code: string[], manifests: string[]): Promise<void> {
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (skip.has(path)) continue;
    if (entry.isDirectory()) await runtimeFiles(path, skip, code, manifests);
    else if (entry.isFile() && CODE.test(entry.name)) code.push(path);
    else if (entry.isFile() && entry.name === "package.json") manifests.push(path);
  }
}

/** Every string in a package.json's main, module, bin, exports and imports: entry points, whatever folder they are in. */
function entryPoints(pkg: Record<string, unknown>): string[] {
  const out: string[] = [];
  // Type declarations named by a condition ("types") are for compilers, never loaded.
  const walk = (value: unknown) => {
    if (typeof value === "string") out.push(value);
    else if (value && typeof value === "object") for (const [key, inner] of Object.entries(value)) if (key !== "types" && key !== "typings") walk(inner);
  };
  for (const field of ["main", "module", "bin", "exports", "imports"]) walk(pkg[field]);
  return out;
}

/**
 * A file or folder the kept code names (a relative require or import, a package entry point) is never
 * removed, whatever its name: a package may keep code in a folder called docs/ or load its own README.
 */
async function namedByCode(modules: string, material: Set<string>): Promise<Set<string>> {
  const named = new Set<string>();
  const code: string[] = [];
  const manifests: string[] = [];
  await runtimeFiles(modules, material, code, manifests);
  for (const file of code) {
    for (const match of (await readFile(file, "utf8")).matchAll(RELATIVE_SPECIFIER)) named.add(resolve(dirname(file), match[1]!));
  }
  for (const manifest of manifests) {
    try {
      const pkg = JSON.parse(await readFile(manifest, "utf8")) as Record<string, unknown>;
      for (const entry of entryPoints(pkg)) if (!entry.includes(":")) named.add(resolve(dirname(manifest), entry));
    } catch {
      // a package.json that does not parse is npm's problem, not a reason to remove files
    }
  }
  return named;
}

/** Named itself, holding something named, or named without its extension (require("./lib/x") for lib/x.js). */
function namedTest(named: Set<string>): (path: string) => boolean {
  const holders = new Set<string>();
  for (const target of named) for (let dir = target; dir.length > 1 && !holders.has(dir); dir = dirname(dir)) holders.add(dir);
  return (path) =>
    holders.has(path) || named.has(path.replace(/\.([cm]?js|json)$/, "")) || (/[/\\]index\.[cm]?js$/.test(path) && named.has(dirname(path)));
}

export async function pruneModules(appDir: string, tree: Node, imported: Set<string>): Promise<PruneResult> {
  const modules = join(appDir, "node_modules");
  const before = await folderSize(modules);
  const needed = neededNodes(tree, imported);
  const installed = [...tree.inventory.values()].filter((node) => node !== tree && !node.isLink);
  const removed = installed.filter((node) => !needed.has(node));
  // Deepest first, so a nested package goes before the folder around it; rm of a gone path is a no-op.
  for (const node of removed.sort((a, b) => b.location.length - a.location.length)) {
    await rm(node.path, { recursive: true, force: true });
    // A scope folder (node_modules/@npmcli) whose every package went.
    if (/^@/.test(relative(dirname(dirname(node.path)), dirname(node.path))) && (await readdir(dirname(node.path))).length === 0) await rm(dirname(node.path), { recursive: true });
  }

  const material: string[] = [];
  await devMaterial(modules, material);
  const isNamed = namedTest(await namedByCode(modules, new Set(material)));
  for (const path of material) if (!isNamed(path)) await rm(path, { recursive: true, force: true });
  return {
    packagesBefore: installed.length,
    packagesKept: installed.length - removed.length,
    removedPackages: removed.map((node) => relative(appDir, node.path)).sort(),
    before,
    after: await folderSize(modules),
  };
}
