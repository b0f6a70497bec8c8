// The compatibility floors of a packed folder (docs/packing.md, "Compatibility floors"): every ELF file in it
// needs at most GLIBC_2.28 (read by pack/elf.ts, checked against readelf), MANIFEST.json and the pack output
// state the floors, the CUDA addon is built with CUDA 12 (driver >= 525.60.13) with sm_90 machine code,
// serve.sh names the floor a machine misses, and the packer refuses a binary above the floor.
import { execFileSync, spawnSync } from "node:child_process";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { highestVersion, parseElfNeeds } from "../pack/elf.js";
import { folderFloors } from "../pack/floors.js";
import { listFolder } from "../pack/manifest.js";
import { renderServeScript } from "../pack/serve-script.js";
import { ensureDistFresh } from "./pack-build.js";
import { CLI, makeTinyModel, ROOT } from "./server-harness.js";

const work = mkdtempSync(join(tmpdir(), "a2d-floors-"));
const out = join(work, "out");
const cudaAddon = join(ROOT, "build", "engine-cuda", "a2d_cuda.node");
const cudaBuilt = existsSync(cudaAddon) && existsSync(join(ROOT, "build", "engine-cuda", "a2d_cuda.build.json"));
let model: string;
let packOutput: string;

function pack(args: string[]) {
  return spawnSync(process.execPath, [CLI, "pack", ...args], { cwd: ROOT, encoding: "utf8", timeout: 300_000 });
}

beforeAll(() => {
  ensureDistFresh();
  model = makeTinyModel(join(work, "tiny"), ["--seed", "7", "--layers", "2", "--hidden", "64"]);
  const result = pack(["--device", cudaBuilt ? "cuda" : "cpu", "--model", model, "--out", out]);
  packOutput = result.stdout + result.stderr;
  if (result.status !== 0) throw new Error(`pack failed (${result.status}):\n${packOutput}`);
});

afterAll(() => rmSync(work, { recursive: true, force: true }));

/** readelf's view of the version needs: { file: [versions] }. */
function readelfNeeds(path: string): Record<string, string[]> {
  const text = execFileSync("readelf", ["-V", "--wide", path], { encoding: "utf8", env: { ...process.env, LC_ALL: "C" }, maxBuffer: 256 << 20 });
  const section = text.slice(text.indexOf("Version needs section"));
  const needs: Record<string, string[]> = {};
  let file = "";
  for (const line of section.split("\n")) {
    const f = /File: (\S+)/.exec(line);
    const n = /Name: (\S+)/.exec(line);
    if (f) file = f[1]!;
    else if (n && file) (needs[file] ??= []).push(n[1]!);
  }
  return needs;
}

describe("the ELF reader", () => {
  it("reads the same version needs and libraries as readelf", () => {
    for (const binary of [join(out, "runtime/bin/node"), join(out, "engine/a2d_cpu.node")]) {
      const needs = parseElfNeeds(readFileSync(binary), binary);
      const sorted = (r: Record<string, string[]>) => Object.fromEntries(Object.entries(r).map(([k, v]) => [k, [...v].sort()]).sort());
      expect(sorted(needs.versions)).toEqual(sorted(readelfNeeds(binary)));
      const needed = execFileSync("readelf", ["-d", binary], { encoding: "utf8" }).match(/\[([^\]]+\.so[^\]]*)\]/g)!.map((m) => m.slice(1, -1));
      expect(needs.needed).toEqual(needed);
    }
  });
});

describe("a packed folder", () => {
  it("needs at most GLIBC_2.28 from every ELF file, bundles no C++ runtime, and states its floors", async () => {
    const { files } = await listFolder(out);
    const measured = await folderFloors(out, files.map((f) => f.path));
    expect(measured.problems).toEqual([]);
    expect(measured.elfs).toContain("runtime/bin/node");
    expect(measured.elfs).toContain("engine/a2d_cpu.node");
    for (const rel of measured.elfs) {
      const needs = parseElfNeeds(readFileSync(join(out, rel)), rel);
      const glibc = highestVersion(needs, "GLIBC")!.split(".").map(Number);
      expect(glibc[0] === 2 && glibc[1]! <= 28, `${rel} needs GLIBC_${glibc.join(".")}`).toBe(true);
      if (rel.startsWith("engine/")) expect(highestVersion(needs, "GLIBCXX"), `${rel} links libstdc++ statically`).toBeNull();
    }
    // The packing machine's libstdc++ needs GLIBC_2.36: shipping it would raise the whole folder's floor.
    expect(files.filter((f) => f.path.startsWith("runtime/lib/"))).toEqual([]);
    const manifest = JSON.parse(readFileSync(join(out, "MANIFEST.json"), "utf8"));
    expect(manifest.node_version).toBe(JSON.parse(readFileSync(join(ROOT, "vendor", "lock.json"), "utf8")).node.version);
    expect(manifest.floors).toMatchObject({ glibc: "2.28", glibcxx: "3.4.21" });
    expect(packOutput).toMatch(/floors: glibc >= 2\.28; libstdc\+\+ >= GLIBCXX_3\.4\.21/);
  });

  it.runIf(cudaBuilt)("carries a CUDA addon built with CUDA 12 (driver >= 525.60.13), sm_90 machine code, glibc <= 2.28", () => {
    const needs = parseElfNeeds(readFileSync(join(out, "engine/a2d_cuda.node")), "a2d_cuda.node");
    const glibc = highestVersion(needs, "GLIBC")!.split(".").map(Number);
    expect(glibc[0] === 2 && glibc[1]! <= 28, `a2d_cuda.node needs GLIBC_${glibc.join(".")}`).toBe(true);
    expect(needs.needed.filter((n) => /cudart|cublas/.test(n))).toEqual([]);
    const manifest = JSON.parse(readFileSync(join(out, "MANIFEST.json"), "utf8"));
    expect(manifest.floors).toMatchObject({ nvidia_driver: "525.60.13", compute_capability: "9.0" });
    expect(manifest.floors.cuda_toolkit).toMatch(/^12\./);
    expect(manifest.floors.cuda_runtime).toMatch(/^12\./);
    expect(packOutput).toMatch(/NVIDIA driver >= 525\.60\.13/);
  });

  it("is readable by everyone, whatever the umask of the pack", () => {
    const umask = spawnSync("sh", ["-c", `umask 077 && exec "$0" "$@"`, process.execPath, CLI, "pack", "--device", "cpu", "--model", model, "--out", join(work, "private")], {
      cwd: ROOT,
      encoding: "utf8",
      timeout: 300_000,
    });
    expect(umask.status, umask.stderr).toBe(0);
    const modes = execFileSync("find", [join(work, "private"), "!", "-perm", "-o+r", "-print"], { encoding: "utf8" }).trim();
    expect(modes).toBe("");
  });
});

describe("the floors are enforced", () => {
  it("pack refuses an addon that needs a newer glibc, naming the symbol version", () => {
    const source = join(work, "new.c");
    writeFileSync(source, "#include <sys/random.h>\nunsigned a2d_probe(void) { return arc4random(); }\n");
    const addon = join(work, "new.node");
    execFileSync("gcc", ["-shared", "-fPIC", "-o", addon, source]);
    const result = pack(["--device", "cpu", "--cpu-addon", addon, "--model", model, "--out", join(work, "refused")]);
    expect(result.status).toBe(1);
    expect(result.stderr).toMatch(/engine\/new\.node needs GLIBC_2\.36 from libc\.so\.6, above the glibc floor GLIBC_2\.28/);
    expect(existsSync(join(work, "refused"))).toBe(false);
  });

  it("serve.sh names the glibc floor on an older glibc, and the driver floor on an older driver", () => {
    const folder = join(work, "script");
    mkdirSync(join(folder, "bin"), { recursive: true });
    const floors = { glibc: "2.28", glibcxx: "3.4.21", cxxabi: "1.3.9", libgcc: "3.4", cuda_toolkit: "12.4.131", cuda_runtime: "12.9.79", nvidia_driver: "525.60.13", compute_capability: "9.0" };
    writeFileSync(join(folder, "serve.sh"), renderServeScript({ defaultDevice: "cuda", hasCuda: true, requiredFiles: ["serve.sh"], a2dVersion: "0", modelName: "m", floors }));
    const fake = (name: string, output: string) => {
      writeFileSync(join(folder, "bin", name), `#!/bin/sh\necho '${output}'\n`);
      chmodSync(join(folder, "bin", name), 0o755);
    };
    const env = ["/usr/bin/env", "-i", `PATH=${join(folder, "bin")}:/usr/bin:/bin`, "/bin/bash", join(folder, "serve.sh")];
    const run = (extra: string[] = []) =>
      extra.length === 0 ? spawnSync(env[0]!, env.slice(1), { encoding: "utf8" }) : spawnSync("bwrap", ["--dev-bind", "/", "/", ...extra, ...env], { encoding: "utf8" });
    fake("getconf", "glibc 2.27");
    const old = run();
    expect(old.status, old.stdout + old.stderr).toBe(1);
    expect(old.stdout).toContain("this machine's glibc is 2.27; the folder needs glibc >= 2.28");
    // A driver is visible (a /dev/nvidiactl) and reports 520: below the CUDA 12 floor.
    fake("getconf", "glibc 2.31");
    fake("nvidia-smi", "520.61.05");
    const driver = run(["--dev-bind", "/dev/null", "/dev/nvidiactl"]);
    expect(driver.status, `${driver.stdout}${driver.stderr}${String(driver.error ?? "")}`).toBe(1);
    expect(driver.stdout).toContain("the NVIDIA driver is 520.61.05, older than 525.60.13, the oldest that runs this folder's CUDA 12.9.79 runtime");
  });
});
