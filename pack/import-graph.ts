// Which npm packages the packed folder's own commands import: the compiled CLI's import graph from
// dist/cli/main.js, static imports everywhere and `import("…")` calls too, except those of commands the
// folder never runs. Every command module is imported by main.js, so their static imports count; what a
// command loads lazily in its action (pack's arborist and pacote) is only reached when that command runs. The packages of node_modules the folder keeps are these and
// everything they depend on (pack/node-modules.ts).
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { basename, dirname, join, relative, resolve } from "node:path";

/**
 * The commands a packed folder runs: serve.sh starts `serve`, and it and docs/packing.md name `verify`;
 * `simulate-startup` and `selfcheck` prove the folder's start and answers on the machine it was copied to.
 */
export const FOLDER_COMMANDS = ["serve", "verify", "simulate-startup", "selfcheck"];

/** `import … from "x"`, `export … from "x"`, `import "x"` and `import("x")` with a literal specifier. */
const STATIC = /(?:^|[;\s])(?:import|export)\s+(?:[^;'"`]*?\s+from\s+)?["']([^"']+)["']/g;
const DYNAMIC = /\bimport\(\s*["']([^"']+)["']\s*\)/g;

export interface ImportGraph {
  /** Package names imported by the reached files of dist/ (`@scope/name` or `name`). */
  packages: Set<string>;
  /** dist/-relative files reached. */
  files: string[];
}

export function packageName(specifier: string): string | null {
  if (specifier.startsWith(".") || specifier.startsWith("/") || specifier.startsWith("node:") || specifier.startsWith("#")) return null;
  const parts = specifier.split("/");
  return specifier.startsWith("@") ? parts.slice(0, 2).join("/") : parts[0]!;
}

/** Whether the lazy imports of this dist file are followed: not in a command module the folder never runs. */
function followsDynamic(distDir: string, file: string, commands: string[]): boolean {
  const rel = relative(join(distDir, "cli", "commands"), file);
  if (rel.startsWith("..") || rel.includes("/")) return true;
  return commands.includes(basename(rel, ".js"));
}

export async function importGraph(distDir: string, entry = join(distDir, "cli", "main.js"), commands = FOLDER_COMMANDS): Promise<ImportGraph> {
  const packages = new Set<string>();
  const seen = new Set<string>();
  const queue = [resolve(entry)];
  while (queue.length > 0) {
    const file = queue.pop()!;
    if (seen.has(file)) continue;
    seen.add(file);
    const source = await readFile(file, "utf8");
    const specifiers = [...source.matchAll(STATIC)].map((m) => m[1]!);
    if (followsDynamic(distDir, file, commands)) specifiers.push(...[...source.matchAll(DYNAMIC)].map((m) => m[1]!));
    for (const specifier of specifiers) {
      const name = packageName(specifier);
      if (name !== null) packages.add(name);
      else if (specifier.startsWith(".")) {
        const target = resolve(dirname(file), specifier);
        // tsc keeps the specifier as written; JSON imported with attributes is data, not code.
        if (target.endsWith(".js") && existsSync(target)) queue.push(target);
      }
    }
  }
  return { packages, files: [...seen].map((f) => relative(distDir, f)).sort() };
}
