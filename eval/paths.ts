// Where eval's Python files and the project venv are, from the source tree (vitest runs eval/*.ts) and
// from the build (node runs dist/eval/*.js; tsc does not copy .py files, so they stay in eval/).
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const evalSourceDir = [here, resolve(here, "../../eval")].find((dir) => existsSync(join(dir, "grader_worker.py")));

function sourceDir(): string {
  if (evalSourceDir === undefined) {
    throw new Error(`cannot find eval/grader_worker.py near ${here}; run a2d from a checkout of the project`);
  }
  return evalSourceDir;
}

/** A file of eval/ in the source tree (the Python helpers, the fixtures). */
export function evalFile(name: string): string {
  return join(sourceDir(), name);
}

/** The project's Python venv interpreter (`npm run build:py` makes it). */
export function venvPython(): string {
  return join(dirname(sourceDir()), ".venv", "bin", "python");
}
