// What can be judged without starting anything: the folder against its MANIFEST, serve.sh line by line,
// the configs, the shared libraries every binary resolves, and whether the CUDA addon carries machine code
// for the target card or only PTX the driver would compile at start.
import { lstat, readFile } from "node:fs/promises";
import { join } from "node:path";

import { fatbinEntries } from "../pack/elf.js";
import { ManifestError, verifyFolder } from "../pack/manifest.js";
import { isHostLibrary, sharedLibraries } from "../pack/runtime.js";
import { BARE_PROGRAMS } from "./sandbox.js";

export { type FatbinEntry, fatbinEntries } from "../pack/elf.js";

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
  | "isolation"
  | "floors"
  | "permissions"
  | "listen"
  | "chat";

export interface Problem {
  cause: ProblemCause;
  detail: string;
}

const NETWORK_TOOLS =
  /(?:^|[;&|(`{]|\$\(|\b(?:then|do|else|exec|command|sudo|time|env|xargs|nohup)\s)\s*((?:\S*\/)?(?:curl|wget|pip[0-9.]*|npm|npx|yarn|pnpm|git|huggingface-cli|hf|apt|apt-get|conda|mamba|aria2c|nc|ncat|ssh|scp|rsync|ftp))(?=\s|$|;|\))/;
const COMPILERS =
  /(?:^|[;&|(`{]|\$\(|\b(?:then|do|else|exec|command|sudo|time|env|xargs|nohup)\s)\s*((?:\S*\/)?(?:nvcc|ptxas|cicc|nvlink|fatbinary|cc|gcc|g\+\+|c\+\+|clang|clang\+\+|ld|make|cmake|ninja|node-gyp|cargo|rustc|go))(?=\s|$|;|\))/;
const URL = /\b(?:https?|ftp|git|s3|hf):\/\/[^\s'"]+/;
/**
 * An absolute path in a shell word: starts after whitespace, a quote, `=`, `:` or `(`, or as the default of
 * an expansion (`${CUDA_HOME:-/usr/local/cuda}`), not after `$VAR` or `}`; ends at a list separator.
 */
const ABSOLUTE_PATH = /(?:^|[\s"'=:(]|:[-=+])(\/[A-Za-z0-9._+-][^\s"'`;|&<>),:}]*)/g;
/** A word in command position: at the start, after a list operator or an opening of a command substitution. */
const COMMAND_WORD = /(?<=^|[;&|(!]|\{\s|\$\(|`|\b(?:then|do|else|elif|if|while|until|exec|command|time|nohup|env|xargs)\s)\s*([A-Za-z_./][\w./+-]*)(\+?=)?/g;
const SHELL_WORDS = new Set(
  ("if then else elif fi for in do done case esac while until function select time local export declare readonly typeset read " +
    "printf echo cd exit return set shift true false test [ [[ ]] command exec source . eval trap wait type unset let mapfile " +
    "readarray pushd popd getopts hash kill ulimit umask builtin caller shopt enable alias unalias").split(" "),
);

/** A line without its quoted text (but with the command substitutions inside double quotes) and arithmetic. */
function unquote(line: string): string {
  return line
    .replace(/'[^']*'/g, "'Q'")
    .replace(/"(?:[^"\\]|\\.)*"/g, (quoted) => ['"Q"', ...(quoted.match(/\$\([^()]*\)/g) ?? [])].join(";"))
    .replace(/\(\([^)]*\)\)/g, "");
}

/** The commands a line runs (assignments, shell words and the script's own functions left out). */
function commandsOf(line: string, functions: Set<string>): string[] {
  const words: string[] = [];
  for (const match of unquote(line).matchAll(COMMAND_WORD)) {
    const word = match[1]!;
    if (match[2] || SHELL_WORDS.has(word) || functions.has(word)) continue;
    words.push(word);
  }
  return words;
}
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
  const functions = new Set([...text.matchAll(/^\s*(?:function\s+)?([A-Za-z_][\w-]*)\s*\(\)\s*\{/gm)].map((m) => m[1]!));
  const lines = text.split("\n");
  lines.forEach((raw, index) => {
    const where = `serve.sh line ${index + 1}`;
    const continued = index > 0 && /\\$/.test(lines[index - 1]!);
    if (index === 0 && raw.startsWith("#!")) {
      if (!/^#!\s*(\/usr\/bin\/env\s+bash|\/bin\/bash|\/usr\/bin\/bash)\s*$/.test(raw)) {
        problems.push({ cause: "host-path", detail: `${where}: interpreter ${raw.slice(2).trim()} may not exist; use #!/usr/bin/env bash` });
      }
      return;
    }
    const line = raw.replace(/(^|\s)#.*$/, "");
    if (!line.trim()) return;
    const tool = NETWORK_TOOLS.exec(unquote(line))?.[1];
    const url = URL.exec(line)?.[0];
    if (tool || url) problems.push({ cause: "network", detail: `${where} calls the network (${tool ?? url}): ${line.trim()}` });
    const compiler = COMPILERS.exec(unquote(line))?.[1];
    if (compiler) problems.push({ cause: "compile", detail: `${where} runs a compiler at start (${compiler}): ${line.trim()}` });
    // Both device branches are read, whichever this machine runs: a program a bare machine lacks fails there.
    for (const word of continued ? [] : commandsOf(line, functions)) {
      const name = word.split("/").pop()!;
      if (word.startsWith("/") || word.startsWith(".") || BARE_PROGRAMS.has(name) || (tool && name === tool.split("/").pop()) || (compiler && name === compiler.split("/").pop())) continue;
      problems.push({ cause: "host-path", detail: `${where} runs ${word}, which a bare machine does not have (only the folder's own files and ${[...BARE_PROGRAMS].slice(0, 6).join(", ")}, … are there): ${line.trim()}` });
    }
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

/** Everyone must be able to read the folder: the grader may start it as another user than the one who packed it. */
export async function checkPermissions(folder: string, files: string[]): Promise<Problem[]> {
  const unreadable: string[] = [];
  const seenDirs = new Set<string>();
  for (const rel of files) {
    const parts = rel.split("/");
    for (let i = 1; i < parts.length; i++) {
      const dir = parts.slice(0, i).join("/");
      if (seenDirs.has(dir)) continue;
      seenDirs.add(dir);
      const mode = (await lstat(join(folder, dir))).mode;
      if ((mode & 0o005) !== 0o005) unreadable.push(`${dir}/ (mode ${(mode & 0o777).toString(8)})`);
    }
    const mode = (await lstat(join(folder, rel)).catch(() => null))?.mode;
    if (mode === undefined) continue;
    if ((mode & 0o004) === 0 || ((mode & 0o100) !== 0 && (mode & 0o001) === 0)) unreadable.push(`${rel} (mode ${(mode & 0o777).toString(8)})`);
  }
  if (unreadable.length === 0) return [];
  return [
    {
      cause: "permissions",
      detail: `${unreadable.length} paths are not readable by other users, so the folder fails for anyone but its owner: ${unreadable.slice(0, 5).join(", ")}${unreadable.length > 5 ? ", …" : ""}; chmod -R a+rX the folder, or pack it again (the packer sets the modes)`,
    },
  ];
}
