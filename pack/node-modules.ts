// The app's production node_modules, reified from package-lock.json by @npmcli/arborist with the network
// off: every tarball comes out of the npm cache through pacote and is checked against the lockfile's
// integrity, then cut down to what the folder's commands load. Copying the developer's node_modules
// instead would ship dev tools, stale installs and whatever was hand-edited there.
import Arborist from "@npmcli/arborist";
import { readFile, rm, writeFile } from "node:fs/promises";
import { homedir } from "node:os";
import { join } from "node:path";

import { startProgress } from "./progress.js";
import { type PruneResult, pruneModules } from "./prune-modules.js";

export class NodeModulesError extends Error {}

interface PackageJson {
  name: string;
  version: string;
  description?: string;
  type?: string;
  license?: string;
  engines?: Record<string, string>;
  dependencies?: Record<string, string>;
}

interface LockEntry {
  version?: string;
  dev?: boolean;
  hasInstallScript?: boolean;
}

interface Lockfile {
  lockfileVersion: number;
  packages: Record<string, LockEntry>;
}

export interface NpmSource {
  /** cacache directory holding the tarballs and packuments (npm's `<cache>/_cacache`). */
  cacheDir: string;
  registry: string;
}

/** The npm cache and registry npm itself would use: `npm run` exports its config as npm_config_* variables. */
export function defaultNpmSource(): NpmSource {
  const npmCache = process.env.npm_config_cache ?? join(homedir(), ".npm");
  return {
    cacheDir: join(npmCache, "_cacache"),
    registry: process.env.npm_config_registry ?? "https://registry.npmjs.org/",
  };
}

/** Writes app/package.json (runtime fields only) and the project's lockfile into appDir. */
export async function writeAppPackage(projectRoot: string, appDir: string): Promise<{ lockfile: Lockfile }> {
  const pkg = JSON.parse(await readFile(join(projectRoot, "package.json"), "utf8")) as PackageJson;
  const lockPath = join(projectRoot, "package-lock.json");
  let lockText: string;
  try {
    lockText = await readFile(lockPath, "utf8");
  } catch {
    throw new NodeModulesError(`${lockPath} is missing: the packer installs exactly what the lockfile pins; run \`npm install\` once to create it`);
  }
  const lockfile = JSON.parse(lockText) as Lockfile;
  if (lockfile.lockfileVersion < 2 || typeof lockfile.packages !== "object") {
    throw new NodeModulesError(`${lockPath} has lockfileVersion ${lockfile.lockfileVersion}; regenerate it with npm 7 or later (\`npm install --package-lock-only\`)`);
  }
  const scripted = Object.entries(lockfile.packages)
    .filter(([location, entry]) => location !== "" && !entry.dev && entry.hasInstallScript)
    .map(([location]) => location.replace(/^.*node_modules\//, ""));
  if (scripted.length > 0) {
    // Install scripts would compile or download on the packing machine, outside the lockfile's integrity.
    throw new NodeModulesError(`production dependencies with install scripts cannot be packed offline: ${scripted.join(", ")}`);
  }
  const appPackage: PackageJson = {
    name: pkg.name,
    version: pkg.version,
    ...(pkg.description ? { description: pkg.description } : {}),
    type: pkg.type ?? "commonjs",
    ...(pkg.license ? { license: pkg.license } : {}),
    ...(pkg.engines ? { engines: pkg.engines } : {}),
    dependencies: pkg.dependencies ?? {},
  };
  await writeFile(join(appDir, "package.json"), `${JSON.stringify(appPackage, null, 2)}\n`);
  await writeFile(join(appDir, "package-lock.json"), lockText);
  return { lockfile };
}

function explain(error: unknown, source: NpmSource): Error {
  const err = error as NodeJS.ErrnoException & { url?: string };
  const what = err.url ?? err.message;
  if (err.code === "ENOTCACHED") {
    return new NodeModulesError(
      `not in the npm cache at ${source.cacheDir}: ${what}. Run \`npm ci\` once with the network on (it fills the cache), then pack again`,
    );
  }
  if (err.code === "EINTEGRITY") {
    return new NodeModulesError(
      `a cached tarball does not match package-lock.json's integrity (${err.message}); run \`npm cache verify\`, then \`npm ci\` with the network on, and pack again`,
    );
  }
  return error instanceof Error ? error : new Error(String(error));
}

/**
 * Reifies the lockfile's production tree into appDir/node_modules, then keeps only the packages `imported`
 * reaches and their runtime files (pack/prune-modules.ts).
 */
export async function reifyProductionModules(appDir: string, lockfile: Lockfile, source: NpmSource, imported: Set<string>): Promise<PruneResult> {
  const expected = Object.entries(lockfile.packages).filter(([location, entry]) => location !== "" && !entry.dev).length;
  const progress = startProgress("node_modules (offline, from lock)", expected, "packages");
  // The lock carries no `resolved` URLs, so pacote resolves name@version from cached packuments. npm 11
  // caches the full documents; other npm versions may have cached the abbreviated ones, tried second.
  let tree;
  for (const fullMetadata of [true, false]) {
    const arborist = new Arborist({
      path: appDir,
      cache: source.cacheDir,
      registry: source.registry,
      offline: true,
      fullMetadata,
      ignoreScripts: true,
      binLinks: false,
      audit: false,
      fund: false,
      omit: ["dev"],
      progress: false,
    });
    try {
      tree = await arborist.reify({ omit: ["dev"], save: false });
      break;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOTCACHED" || !fullMetadata) throw explain(error, source);
      await rm(join(appDir, "node_modules"), { recursive: true, force: true });
    }
  }
  if (!tree) throw new NodeModulesError("arborist returned no tree");
  const installed = [...tree.inventory.values()].filter((node) => node !== tree && !node.isLink && !node.dev).length;
  progress.advance(installed);
  progress.done();
  if (installed !== expected) {
    throw new NodeModulesError(`package-lock.json pins ${expected} production packages but ${installed} were installed; run \`npm install\` to bring the lockfile in line with package.json`);
  }
  return pruneModules(appDir, tree, imported);
}
