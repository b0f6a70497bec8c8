// The eval suites that run the built CLI (or a built module in a child process) need dist/ current.
import { execFileSync } from "node:child_process";
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";

import { CLI, ROOT, ensureBuilt } from "./server-harness.js";

/** ensureBuilt() watches cli/, server/ and engine/; eval/ runs from dist/ too. */
export function ensureEvalBuilt(): void {
  ensureBuilt();
  const built = statSync(CLI).mtimeMs;
  const sources = readdirSync(join(ROOT, "eval"), { recursive: true, encoding: "utf8" }).filter((name) => name.endsWith(".ts"));
  const newest = Math.max(...sources.map((name) => statSync(join(ROOT, "eval", name)).mtimeMs));
  if (newest > built) execFileSync("npm", ["run", "build:ts"], { cwd: ROOT, stdio: "pipe" });
}
