// The pack, simulate and selfcheck suites run the built CLI (dist/): rebuild when any TypeScript source is
// newer than the build, so they never judge stale code. tsc emits even when another module has a type
// error; the suites judge what was emitted.
import { spawnSync } from "node:child_process";
import { existsSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";

import { CLI, ROOT } from "./server-harness.js";

const SOURCE_DIRS = ["pack", "simulate", "cli", "server", "engine", "eval"];

function newestSource(dir: string): number {
  const files = readdirSync(dir, { recursive: true, encoding: "utf8" }).filter((f) => f.endsWith(".ts") && !f.endsWith(".test.ts"));
  return Math.max(0, ...files.map((f) => statSync(join(dir, f)).mtimeMs));
}

export function ensureDistFresh(): void {
  const built = [CLI, join(ROOT, "dist", "pack", "pack.js"), join(ROOT, "dist", "simulate", "simulate.js"), join(ROOT, "dist", "simulate", "guard.js")];
  const oldestBuilt = Math.min(...built.map((file) => (existsSync(file) ? statSync(file).mtimeMs : 0)));
  if (oldestBuilt >= Math.max(...SOURCE_DIRS.map((dir) => newestSource(join(ROOT, dir))))) return;
  spawnSync("npx", ["tsc", "-p", "tsconfig.json"], { cwd: ROOT, stdio: "pipe" });
}
