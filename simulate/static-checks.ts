// What can be judged without starting anything: the folder against its MANIFEST, serve.sh line by line,
// the configs, the shared libraries every binary resolves, and whether the CUDA addon carries machine code
// for the target card or only PTX the driver would compile at start.
import { readFile } from "node:fs/promises";
import { join } from "node:path";

import { ManifestError, verifyFolder } from "../pack/manifest.js";
import { isHostLibrary, sharedLibraries } from "../pack/runtime.js";

export type ProblemCause =
  | "network"
  | "missing-file"
  | "missing-module"
  | "host-path"
  | "compile"
  | "write-outside"
  | "manifest"
  | "start-failed"
  | "over-budget"
  | "isolation";

export interface Problem {
  cause: ProblemCause;
  detail: string;
}

const NETWORK_TOOLS =
  /(?:^|[;&|(`{]|\$\(|\b(?:then|do|else|exec|command|sudo|time|env|xargs|nohup)\s)\s*((?:\S*\/)?(?:curl|wget|pip[0-9.]*|npm|npx|yarn|pnpm|git|huggingface-cli|hf|apt|apt-get|conda|mamba|aria2c|nc|ncat|ssh|scp|rsync|ftp))(?=\s|$|;|\))/;
const COMPILERS =
  /(?:^|[;&|(`{]|\$\(|\b(?:then|do|else|exec|command|sudo|time|env|xargs|nohup)\s)\s*((?:\S*\/)?(?:nvcc|ptxas|cicc|nvlink|fatbinary|cc|gcc|g\+\+|c\+\+|clang|clang\+\+|ld|make|cmake|ninja|node-gyp|cargo|rustc|go))(?=\s|$|;|\))/;
const URL = /\b(?:https?|ftp|git|s3|hf):\/\/[^\s'"]+/;
/** An absolute path in a shell word: starts after whitespace, a quote, `=`, `:` or `(` (not after `$VAR` or `}`), ends at a list separator. */
const ABSOLUTE_PATH = /(?:^|[\s"'=:(])(\/[A-Za-z0-9._+-][^\s"'`;|&<>),:]*)/g;
/** Read-only probes of the NVIDIA driver, and the interpreter line: the only outside paths serve.sh may name. */
const ALLOWED_PATHS = [/^\/dev\/nvidia[\w-]*$/, /^\/proc\/driver\/nvidia(\/[\w.-]+)*$/, /^\/sbin\/ldconfig$/, /^\/usr\/bin\/env$/, /^\/dev\/null$/, /^\/bin\/(ba)?sh$/];

export async function scanServeScript(folder: string): Promise<Problem[]> {
  let text: string;
  try {
    text = await readFile(join(folder, "serve.sh"), "utf8");
  } catch {
    return [{ cause: "missing-file", detail: `${join(folder, "serve.sh")} is missing: the folder cannot be started` }];
  }
  const problems: Problem[] = [];
  text.split("\n").forEach((raw, index) => {
    const where = `serve.sh line ${index + 1}`;
    if (index === 0 && raw.startsWith("#!")) {
      if (!/^#!\s*(\/usr\/bin\/env\s+bash|\/bin\/bash|\/usr\/bin\/bash)\s*$/.test(raw)) {
        problems.push({ cause: "host-path", detail: `${where}: interpreter ${raw.slice(2).trim()} may not exist; use #!/usr/bin/env bash` });
      }
      return;
    }
    const line = raw.replace(/(^|\s)#.*$/, "");
    if (!line.trim()) return;
    const tool = NETWORK_TOOLS.exec(line)?.[1];
    const url = URL.exec(line)?.[0];
    if (tool || url) problems.push({ cause: "network", detail: `${where} calls the network (${tool ?? url}): ${line.trim()}` });
    const compiler = COMPILERS.exec(line)?.[1];
    if (compiler) problems.push({ cause: "compile", detail: `${where} runs a compiler at start (${compiler}): ${line.trim()}` });
    for (const match of line.matchAll(ABSOLUTE_PATH)) {
      const path = match[1]!.replace(/[.]+$/, "");
      if (ALLOWED_PATHS.some((allowed) => allowed.test(path))) continue;
      problems.push({ cause: "host-path", detail: `${where} points outside the folder at ${path}, which a fresh machine does not have: ${line.trim()}` });
    }
  });
  return problems;
}

const CONFIG_FILES = ["model/config.json", "model/generation_config.json", "model/tokenizer_config.json", "app/package.json"];
const HOST_PATH_VALUE = /^\/(?:[^/\s]+\/)+[^/\s]*$/;

export async function scanConfigs(folder: string): Promise<Problem[]> {
  const problems: Problem[] = [];
  for (const file of CONFIG_FILES) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(await readFile(join(folder, file), "utf8"));
    } catch {
      continue; // absence is the MANIFEST check's business
    }
    const walk = (value: unknown, key: string): void => {
      if (typeof value === "string") {
        if (key !== "chat_template" && HOST_PATH_VALUE.test(value)) {
          problems.push({ cause: "host-path", detail: `${file}: "${key}" points outside the folder at ${value}` });
        }
      } else if (Array.isArray(value)) value.forEach((v) => walk(v, key));
      else if (value && typeof value === "object") for (const [k, v] of Object.entries(value)) walk(v, k);
    };
    walk(parsed, "");
  }
  return problems;
}

export async function checkManifest(folder: string): Promise<{ problems: Problem[]; missing: string[] }> {
  let result;
  try {
    result = await verifyFolder(folder);
  } catch (error) {
    if (error instanceof ManifestError) return { problems: [{ cause: "manifest", detail: error.message }], missing: [] };
    throw error;
  }
  const problems: Problem[] = [];
  const missingModules = new Map<string, number>();
  for (const path of result.missing) {
    const module = /^app\/node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(path)?.[1];
    if (module) missingModules.set(module, (missingModules.get(module) ?? 0) + 1);
    else problems.push({ cause: "missing-file", detail: `${path} is listed in MANIFEST.json but missing` });
  }
  for (const [module, count] of missingModules) {
    problems.push({ cause: "missing-module", detail: `app/node_modules/${module} is incomplete or gone (${count} of its files missing)` });
  }
  for (const path of result.extra) problems.push({ cause: "manifest", detail: `${path} is not in MANIFEST.json (added after packing)` });
  for (const change of result.changed) problems.push({ cause: "manifest", detail: `${change.path} changed since packing: ${change.reason}` });
  return { problems, missing: result.missing };
}

/** Every binary's shared libraries as the folder's serve.sh makes the loader see them (runtime/lib first). */
export async function checkLibraries(folder: string, binaries: string[]): Promise<Problem[]> {
  const problems: Problem[] = [];
  for (const binary of binaries) {
    let libraries;
    try {
      libraries = await sharedLibraries(join(folder, binary), join(folder, "runtime", "lib"));
    } catch (error) {
      problems.push({ cause: "missing-file", detail: `${binary}: ${(error as Error).message}` });
      continue;
    }
    for (const library of libraries) {
      if (isHostLibrary(library.soname)) continue;
      if (library.path === null) {
        problems.push({ cause: "missing-file", detail: `${binary} needs ${library.soname}, which is neither in runtime/lib nor part of glibc or the driver` });
      } else if (!library.path.startsWith(`${folder}/`)) {
        problems.push({ cause: "host-path", detail: `${binary} loads ${library.path} from this machine; a fresh machine may lack it (pack again: the packer bundles it)` });
      }
    }
  }
  return problems;
}

export interface FatbinEntry {
  kind: "ptx" | "sass";
  sm: number;
}

/** The code entries of an ELF file's CUDA fat binaries (.nv_fatbin, __nv_relfatbin); null if it has none. */
export function fatbinEntries(elf: Buffer): FatbinEntry[] | null {
  if (elf.readUInt32BE(0) !== 0x7f454c46 || elf[4] !== 2) return null; // ELF64 only
  const sectionOffset = Number(elf.readBigUInt64LE(0x28));
  const sectionSize = elf.readUInt16LE(0x3a);
  const sectionCount = elf.readUInt16LE(0x3c);
  const namesIndex = elf.readUInt16LE(0x3e);
  const header = (i: number) => sectionOffset + i * sectionSize;
  const namesOffset = Number(elf.readBigUInt64LE(header(namesIndex) + 0x18));
  const entries: FatbinEntry[] = [];
  let found = false;
  for (let i = 0; i < sectionCount; i++) {
    const nameStart = namesOffset + elf.readUInt32LE(header(i));
    const name = elf.toString("latin1", nameStart, elf.indexOf(0, nameStart));
    if (name !== ".nv_fatbin" && name !== "__nv_relfatbin") continue;
    found = true;
    const start = Number(elf.readBigUInt64LE(header(i) + 0x18));
    const end = start + Number(elf.readBigUInt64LE(header(i) + 0x20));
    let container = start;
    while (container + 16 <= end) {
      const magic = elf.readUInt32LE(container);
      if (magic !== 0xba55ed50 && magic !== 0x466243b1) {
        container += 8; // containers are 8-byte aligned; padding between them is zero
        continue;
      }
      const headerSize = elf.readUInt16LE(container + 6);
      const containerEnd = container + headerSize + Number(elf.readBigUInt64LE(container + 8));
      let entry = container + headerSize;
      while (entry + 0x20 <= containerEnd) {
        const kind = elf.readUInt16LE(entry);
        const entryHeader = elf.readUInt32LE(entry + 4);
        const payload = Number(elf.readBigUInt64LE(entry + 8));
        const sm = elf.readUInt32LE(entry + 0x1c);
        if (kind === 1 || kind === 2) entries.push({ kind: kind === 1 ? "ptx" : "sass", sm });
        if (entryHeader === 0) break;
        entry += entryHeader + payload;
      }
      container = containerEnd;
    }
  }
  return found ? entries : null;
}

/** sm_90 (H100 and H200) must have machine code; PTX alone means a JIT compile at every cold start. */
export async function checkCudaCode(folder: string, addon: string, sm = 90): Promise<{ problems: Problem[]; summary: string }> {
  const entries = fatbinEntries(await readFile(join(folder, addon)));
  if (entries === null) return { problems: [], summary: `${addon}: no CUDA fat binary section found` };
  const sass = [...new Set(entries.filter((e) => e.kind === "sass").map((e) => e.sm))].sort((a, b) => a - b);
  const ptx = [...new Set(entries.filter((e) => e.kind === "ptx").map((e) => e.sm))].sort((a, b) => a - b);
  const summary = `${addon}: machine code for ${sass.map((s) => `sm_${s}`).join(", ") || "no arch"}; PTX for ${ptx.map((s) => `compute_${s}`).join(", ") || "none"}`;
  if (sass.includes(sm)) return { problems: [], summary };
  return {
    problems: [{ cause: "compile", detail: `${summary}: no sm_${sm} machine code, so the driver JIT-compiles PTX at every cold start; build with -gencode arch=compute_${sm},code=sm_${sm}` }],
    summary,
  };
}
