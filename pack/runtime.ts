// runtime/: the Node binary that runs the server (the official build, vendor/lock.json) and any shared
// library it or the engine addons load that a bare machine may lack. glibc, libstdc++/libgcc_s (for Node;
// the addons link their own) and the NVIDIA driver's libraries stay the host's: glibc cannot be swapped
// under a process that also loads the driver, the driver's user-space libraries must match its kernel
// module, and the packing machine's libstdc++ is newer than the glibc floor (pack/floors.ts).
import { execa } from "execa";
import { chmod, copyFile, mkdir } from "node:fs/promises";
import { basename, join } from "node:path";

import { isHostLibrary } from "./floors.js";

export class RuntimeError extends Error {}

export { isHostLibrary };

export interface SharedLibrary {
  soname: string;
  /** Where the packing machine resolves it; null when it does not. */
  path: string | null;
}

/** `libraryPath`: searched first, as LD_LIBRARY_PATH would be (the folder's runtime/lib). */
export async function sharedLibraries(binary: string, libraryPath?: string): Promise<SharedLibrary[]> {
  const env = libraryPath === undefined ? { LC_ALL: "C" } : { LC_ALL: "C", LD_LIBRARY_PATH: libraryPath };
  const result = await execa("ldd", [binary], { reject: false, env });
  if (result.exitCode !== 0 && !/not a dynamic executable/.test(`${result.stdout}${result.stderr}`)) {
    throw new RuntimeError(`ldd ${binary} failed: ${result.stderr || result.stdout}`);
  }
  const libraries: SharedLibrary[] = [];
  for (const line of result.stdout.split("\n")) {
    const found = /^\s*(\S+)\s+=>\s+(\S+)\s+\(0x[0-9a-f]+\)/.exec(line);
    const missing = /^\s*(\S+)\s+=>\s+not found/.exec(line);
    if (found) libraries.push({ soname: found[1]!, path: found[2]! });
    else if (missing) libraries.push({ soname: missing[1]!, path: null });
  }
  return libraries;
}

export interface RuntimeReport {
  nodeVersion: string;
  libraries: string[];
}

export async function nodeVersion(nodeBinary: string): Promise<string> {
  const result = await execa(nodeBinary, ["--version"], { reject: false, env: {}, extendEnv: false });
  const version = result.stdout.trim();
  const major = Number(/^v(\d+)\./.exec(version)?.[1] ?? NaN);
  if (result.exitCode !== 0 || !(major >= 20)) {
    throw new RuntimeError(`${nodeBinary} is not a usable Node.js >= 20 (it printed ${JSON.stringify(version || result.stderr)}); pass --node with a Node 20+ binary`);
  }
  return version;
}

/**
 * Copies the Node binary to runtime/bin/node and every non-host library that it or the addons need to
 * runtime/lib/<soname> (serve.sh puts runtime/lib first on LD_LIBRARY_PATH).
 */
export async function packRuntime(outDir: string, nodeBinary: string, addons: string[]): Promise<RuntimeReport> {
  const version = await nodeVersion(nodeBinary);
  await mkdir(join(outDir, "runtime", "bin"), { recursive: true });
  await mkdir(join(outDir, "runtime", "lib"), { recursive: true });
  await copyFile(nodeBinary, join(outDir, "runtime", "bin", "node"));
  await chmod(join(outDir, "runtime", "bin", "node"), 0o755);

  const bundled = new Map<string, string>();
  const unresolved: string[] = [];
  for (const binary of [nodeBinary, ...addons]) {
    for (const library of await sharedLibraries(binary)) {
      if (isHostLibrary(library.soname)) continue;
      if (library.path === null) unresolved.push(`${basename(binary)} needs ${library.soname}`);
      else bundled.set(library.soname, library.path);
    }
  }
  if (unresolved.length > 0) {
    throw new RuntimeError(
      `shared libraries not found on this machine: ${unresolved.join("; ")}. Pack on the machine that built the addon (or install the library there), or link it statically`,
    );
  }
  for (const [soname, path] of [...bundled].sort()) {
    await copyFile(path, join(outDir, "runtime", "lib", soname));
  }
  return { nodeVersion: version, libraries: [...bundled.keys()].sort() };
}
