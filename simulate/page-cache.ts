// Page-cache eviction, so the simulated start reads the folder from disk as a fresh machine would.
// posix_fadvise(DONTNEED) is the only per-file eviction Linux offers without privileges over the whole
// cache; Node cannot call it, so the system Python does (any Debian/Ubuntu has one), with `dd iflag=nocache`
// (the same call, from coreutils) when there is no Python.
import { execa } from "execa";
import { closeSync, openSync, readSync } from "node:fs";

const EVICT_PY = `
import os, sys
os.sync()  # dirty pages cannot be dropped, and a fresh pack leaves many; one sync beats an fdatasync per file
for path in sys.stdin.read().split("\\0"):
    if not path:
        continue
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
`;

async function systemPython(): Promise<string | null> {
  for (const candidate of ["/usr/bin/python3", "python3"]) {
    const probe = await execa(candidate, ["-c", "import os; os.posix_fadvise"], { reject: false });
    if (probe.exitCode === 0) return candidate;
  }
  return null;
}

export async function evict(files: string[]): Promise<"posix_fadvise" | "dd nocache"> {
  const python = await systemPython();
  if (python) {
    await execa(python, ["-c", EVICT_PY], { input: files.join("\0") });
    return "posix_fadvise";
  }
  for (const file of files) await execa("dd", [`if=${file}`, "iflag=nocache", "count=0", "status=none"]);
  return "dd nocache";
}

/** Bytes of the file in the page cache (util-linux fincore), or null where fincore is missing. */
export async function residentBytes(file: string): Promise<number | null> {
  const result = await execa("fincore", ["--bytes", "--noheadings", "--output", "RES", file], { reject: false });
  if (result.exitCode !== 0) return null;
  const value = Number(result.stdout.trim());
  return Number.isFinite(value) ? value : null;
}

export interface DiskRate {
  MBps: number;
  sampleBytes: number;
  seconds: number;
}

/** Cold sequential read rate of up to `maxBytes` of the file; the file is evicted before and after. */
export async function measureDiskRate(file: string, maxBytes = 2 * 1024 ** 3): Promise<DiskRate> {
  await evict([file]);
  const buffer = Buffer.allocUnsafe(16 << 20);
  const fd = openSync(file, "r");
  let total = 0;
  const started = performance.now();
  try {
    while (total < maxBytes) {
      const n = readSync(fd, buffer, 0, Math.min(buffer.length, maxBytes - total), total);
      if (n === 0) break;
      total += n;
    }
  } finally {
    closeSync(fd);
  }
  const seconds = (performance.now() - started) / 1000;
  await evict([file]);
  return { MBps: total / 1e6 / Math.max(seconds, 1e-6), sampleBytes: total, seconds };
}
