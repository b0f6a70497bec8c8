// The compatibility floors of a packed folder: the oldest glibc, C++ runtime, NVIDIA driver and GPU it runs
// on. The glibc and C++ floors are measured from the ELF version needs of every binary in the folder (the
// loader refuses a binary whose needs the machine lacks); the driver floor follows from the CUDA runtime the
// CUDA addon was built with (CUDA minor-version compatibility: any 12.x runtime runs on a driver that
// supports CUDA 12.0), and the compute capability from the machine code the addon carries.
import { existsSync } from "node:fs";
import { open } from "node:fs/promises";
import { basename, dirname, join } from "node:path";

import { compareVersions, type ElfNeeds, highestVersion, isElf, readElfNeeds, versionOf } from "./elf.js";

/** What the folder promises: H100 machines run Ubuntu 20.04/22.04, RHEL 8 and Debian 10+ (glibc 2.28+). */
export const FLOOR_LIMITS = {
  glibc: "2.28",
  // libstdc++ and libgcc_s of GCC 8 (RHEL 8 and Debian 10, the glibc 2.28 distributions); only the Node
  // binary uses them, the addons link theirs statically.
  glibcxx: "3.4.25",
  cxxabi: "1.3.11",
  libgcc: "7.0.0",
  nvidia_driver: "525.60.13",
} as const;

/** Loaded from the machine, never bundled: the C library family, the C++ runtime Node links, the driver. */
const HOST_LIBRARY = [
  /^linux-vdso\.so/,
  /^linux-gate\.so/,
  /^ld-linux[-\w.]*\.so/,
  /^lib(c|m|dl|pthread|rt|resolv|util|anl|nsl|BrokenLocale|mvec)\.so\.\d+$/,
  // Every glibc distribution has them: its package manager is written in C++. The copy on the packing
  // machine is newer than the floor (Debian 12's libstdc++ needs GLIBC_2.36), so bundling it would raise
  // the glibc floor of the whole folder.
  /^libstdc\+\+\.so\.6$/,
  /^libgcc_s\.so\.1$/,
  /^libcuda\.so/,
  /^libnvidia-[\w.-]+\.so/,
  /^libnvcuvid\.so/,
  /^libcudadebugger\.so/,
];

export function isHostLibrary(soname: string): boolean {
  return HOST_LIBRARY.some((pattern) => pattern.test(soname));
}

/** Each CUDA runtime major version and the oldest driver that runs it (NVIDIA's minor-version compatibility table). */
export const DRIVER_FOR_CUDA: Record<number, string> = { 11: "450.80.02", 12: "525.60.13", 13: "580.65.06" };

export interface CudaBuild {
  /** nvcc's version, e.g. "12.4.131". */
  toolkit: string;
  /** The CUDA runtime linked into the addon, e.g. "12.9.79". */
  runtime: string;
}

export interface Floors {
  glibc: string;
  glibcxx: string | null;
  cxxabi: string | null;
  libgcc: string | null;
  /** The CUDA fields are present when the folder carries the CUDA engine. */
  cuda_toolkit?: string;
  cuda_runtime?: string;
  nvidia_driver?: string;
  compute_capability?: string;
}

/** Imported by Node from the binary that loads the addon; unversioned by nature. */
const FROM_THE_LOADER = /^(napi_|node_|uv_|_ITM_|__gmon_start__$|__cxa_finalize$)/;

/** Problems with one ELF file's needs against the limits: a version above a floor, or a symbol no one provides. */
export function floorProblems(rel: string, needs: ElfNeeds, libraryInFolder: (soname: string) => boolean): string[] {
  const problems: string[] = [];
  const families: Array<[family: string, limit: string, what: string]> = [
    ["GLIBC", FLOOR_LIMITS.glibc, "glibc"],
    ["GLIBCXX", FLOOR_LIMITS.glibcxx, "libstdc++"],
    ["CXXABI", FLOOR_LIMITS.cxxabi, "libstdc++"],
    ["GCC", FLOOR_LIMITS.libgcc, "libgcc_s"],
  ];
  for (const [file, versions] of Object.entries(needs.versions)) {
    for (const name of versions) {
      for (const [family, limit, what] of families) {
        const version = versionOf(family, name);
        if (version && compareVersions(version, limit.split(".").map(Number)) > 0) {
          problems.push(`${rel} needs ${name} from ${file}, above the ${what} floor ${family}_${limit}: it fails to load on older machines`);
        }
      }
    }
  }
  for (const soname of needs.needed) {
    if (!isHostLibrary(soname) && !libraryInFolder(soname)) {
      problems.push(`${rel} needs ${soname}, which is neither in the folder nor part of glibc, libstdc++ or the NVIDIA driver`);
    }
  }
  const unresolved = needs.unversionedUndefined.filter((s) => !FROM_THE_LOADER.test(s));
  if (unresolved.length > 0 && rel !== "runtime/bin/node") {
    problems.push(`${rel} has undefined symbols no library versions (${unresolved.slice(0, 5).join(", ")}${unresolved.length > 5 ? ", …" : ""}): they resolve only by chance at load`);
  }
  return problems;
}

/** The highest version of each family that any of the files needs. */
export function measureFloors(files: Array<{ rel: string; needs: ElfNeeds }>): Floors {
  const highest = (family: string) =>
    files
      .map((f) => highestVersion(f.needs, family))
      .filter((v): v is string => v !== null)
      .sort((a, b) => compareVersions(a.split(".").map(Number), b.split(".").map(Number)))
      .pop() ?? null;
  return { glibc: highest("GLIBC") ?? "2.2.5", glibcxx: highest("GLIBCXX"), cxxabi: highest("CXXABI"), libgcc: highest("GCC") };
}

export function cudaFloors(build: CudaBuild, sassArchitectures: number[]): Pick<Floors, "cuda_toolkit" | "cuda_runtime" | "nvidia_driver" | "compute_capability"> {
  const major = Number(build.runtime.split(".")[0]);
  const lowest = Math.min(...sassArchitectures);
  return {
    cuda_toolkit: build.toolkit,
    cuda_runtime: build.runtime,
    nvidia_driver: DRIVER_FOR_CUDA[major] ?? `unknown (CUDA ${major})`,
    compute_capability: Number.isFinite(lowest) ? `${Math.floor(lowest / 10)}.${lowest % 10}` : "unknown",
  };
}

/** Problems with the CUDA floors themselves: a runtime that needs a newer driver than the limit. */
export function cudaFloorProblems(addon: string, floors: Floors): string[] {
  const driver = floors.nvidia_driver;
  if (!driver) return [];
  const known = /^\d+(\.\d+)*$/.test(driver);
  if (known && compareVersions(driver.split(".").map(Number), FLOOR_LIMITS.nvidia_driver.split(".").map(Number)) <= 0) return [];
  return [
    `${basename(addon)} was built with CUDA ${floors.cuda_toolkit} (runtime ${floors.cuda_runtime}), which needs NVIDIA driver ${driver}; ` +
      `the floor is ${FLOOR_LIMITS.nvidia_driver} (CUDA 12.x): build it with \`npm run build:cuda\`, which uses the CUDA 12 toolkit of wheels/lock.json`,
  ];
}

export function formatFloors(floors: Floors): string {
  const parts = [`glibc >= ${floors.glibc}`];
  if (floors.glibcxx) parts.push(`libstdc++ >= GLIBCXX_${floors.glibcxx} (the machine's own, for Node)`);
  if (floors.nvidia_driver) {
    parts.push(`NVIDIA driver >= ${floors.nvidia_driver} (CUDA runtime ${floors.cuda_runtime}, built with nvcc ${floors.cuda_toolkit})`);
    parts.push(`GPU compute capability ${floors.compute_capability} (sm_${floors.compute_capability?.replace(".", "")} machine code)`);
  }
  return parts.join("; ");
}

export interface FolderFloors {
  floors: Floors;
  problems: string[];
  /** Folder-relative paths of the ELF files found. */
  elfs: string[];
}

async function startsLikeElf(path: string): Promise<boolean> {
  const handle = await open(path, "r");
  try {
    const head = Buffer.alloc(4);
    const { bytesRead } = await handle.read(head, 0, 4, 0);
    return bytesRead === 4 && isElf(head);
  } finally {
    await handle.close();
  }
}

/** The version needs of every ELF file among `rels` (folder-relative), measured and judged against the limits. */
export async function folderFloors(root: string, rels: string[]): Promise<FolderFloors> {
  const measured: Array<{ rel: string; needs: ElfNeeds }> = [];
  const problems: string[] = [];
  for (const rel of rels) {
    const path = join(root, rel);
    if (!(await startsLikeElf(path).catch(() => false))) continue;
    let needs: ElfNeeds;
    try {
      needs = await readElfNeeds(path);
    } catch (error) {
      problems.push(`${rel}: ${(error as Error).message}`);
      continue;
    }
    const origin = dirname(path);
    const runpath = (needs.runpath ?? "").split(":").map((d) => d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin));
    const inFolder = (soname: string) =>
      existsSync(join(root, "runtime", "lib", soname)) || runpath.some((d) => d.startsWith(`${root}/`) && existsSync(join(d, soname)));
    measured.push({ rel, needs });
    problems.push(...floorProblems(rel, needs, inFolder));
  }
  return { floors: measureFloors(measured), problems, elfs: measured.map((m) => m.rel) };
}
