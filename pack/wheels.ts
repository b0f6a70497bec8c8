// wheels/ (pack --with-wheels): the converter as a wheel plus every wheel its pinned requirements need, so a
// user can re-train on a machine without network: `pip install --no-index --find-links wheels -r
// wheels/requirements.txt wheels/a2d_convert-*.whl`.
import { execa } from "execa";
import { copyFile, mkdir, readdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

export class WheelsError extends Error {}

const PROJECT_ROOT = fileURLToPath(new URL("../../", import.meta.url));

function normalizeName(name: string): string {
  return name.toLowerCase().replace(/[-_.]+/g, "_");
}

interface Requirement {
  name: string;
  version: string;
}

export function parseRequirements(text: string): Requirement[] {
  const requirements: Requirement[] = [];
  for (const raw of text.split("\n")) {
    const line = raw.replace(/#.*/, "").trim();
    if (!line) continue;
    const pinned = /^([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;]+)/.exec(line);
    if (!pinned) throw new WheelsError(`convert/requirements.txt: "${line}" is not pinned with ==; offline wheels need exact versions`);
    requirements.push({ name: normalizeName(pinned[1]!), version: pinned[2]! });
  }
  return requirements;
}

/** name and version from a wheel file name (PEP 427): {name}-{version}(-{build})?-{python}-{abi}-{platform}.whl */
export function parseWheelName(file: string): Requirement | null {
  const parts = file.replace(/\.whl$/, "").split("-");
  if (!file.endsWith(".whl") || parts.length < 5) return null;
  return { name: normalizeName(parts[0]!), version: parts[1]!.split("+")[0]! };
}

export interface WheelsPlan {
  dir: string;
  wheels: string[];
  requirementsPath: string;
}

/** Checked before anything is built: every pinned requirement needs its wheel in `wheelsDir`. */
export async function planWheels(wheelsDir: string): Promise<WheelsPlan> {
  const requirementsPath = join(PROJECT_ROOT, "convert", "requirements.txt");
  const requirements = parseRequirements(await readFile(requirementsPath, "utf8"));
  const wheels = (await readdir(wheelsDir).catch(() => [] as string[])).filter((f) => f.endsWith(".whl")).sort();
  const have = new Set(wheels.map(parseWheelName).filter((w) => w !== null).map((w) => `${w.name}==${w.version}`));
  const missing = requirements.filter((r) => !have.has(`${r.name}==${r.version}`)).map((r) => `${r.name}==${r.version}`);
  if (missing.length > 0) {
    throw new WheelsError(
      `--with-wheels: ${wheelsDir} lacks wheels for ${missing.join(", ")}; fill it with ` +
        `\`.venv/bin/python -m pip download -r convert/requirements.txt -d ${wheelsDir}\` (network on), or pass --wheels DIR`,
    );
  }
  return { dir: wheelsDir, wheels, requirementsPath };
}

export async function packWheels(outDir: string, plan: WheelsPlan, log: (line: string) => void): Promise<void> {
  const target = join(outDir, "wheels");
  await mkdir(target, { recursive: true });
  for (const wheel of plan.wheels) await copyFile(join(plan.dir, wheel), join(target, wheel));
  await copyFile(plan.requirementsPath, join(target, "requirements.txt"));
  const python = join(PROJECT_ROOT, ".venv", "bin", "python");
  const built = await execa(
    python,
    ["-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--wheel-dir", target, join(PROJECT_ROOT, "convert")],
    // A fixed SOURCE_DATE_EPOCH keeps the wheel (a zip with timestamps) identical across packs of the same source.
    { reject: false, all: true, env: { SOURCE_DATE_EPOCH: "315532800" } },
  );
  if (built.exitCode !== 0) {
    throw new WheelsError(`building the a2d_convert wheel with ${python} failed (run \`npm run build:py\` first):\n${built.all}`);
  }
  await writeFile(
    join(target, "INSTALL.txt"),
    "Offline install of the a2d converter (Python >= 3.10):\n" +
      "  python -m pip install --no-index --find-links wheels -r wheels/requirements.txt wheels/a2d_convert-*.whl\n",
  );
  log(`wheels: ${plan.wheels.length} dependency wheels + a2d_convert`);
}
