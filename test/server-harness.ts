// Shared by the CLI and server suites: tiny a2d models made by the converter, the built CLI, and a real
// `a2d serve` process on a free port whose pino log tells where it listens.
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";

export const ROOT = join(import.meta.dirname, "..");
export const PYTHON = join(ROOT, ".venv", "bin", "python");
export const CLI = join(ROOT, "dist", "cli", "main.js");

/** A tiny random a2d model: `tiny-base` with these flags, then `init`. Returns the a2d folder. */
export function makeTinyModel(dir: string, baseFlags: string[] = [], initFlags: string[] = []): string {
  const base = join(dir, "base");
  const model = join(dir, "model");
  execFileSync(PYTHON, ["-m", "a2d_convert", "tiny-base", "--out", base, ...baseFlags], { cwd: ROOT, stdio: "pipe" });
  execFileSync(PYTHON, ["-m", "a2d_convert", "init", "--base", base, "--out", model, ...initFlags], { cwd: ROOT, stdio: "pipe" });
  return model;
}

function newestMtime(dir: string): number {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) newest = Math.max(newest, newestMtime(path));
    else if (entry.name.endsWith(".ts") && !entry.name.endsWith(".test.ts")) newest = Math.max(newest, statSync(path).mtimeMs);
  }
  return newest;
}

/** The spawned CLI runs dist/: rebuild it when a source is newer, so a suite never tests stale code. */
export function ensureBuilt(): void {
  const sources = Math.max(...["cli", "server", "engine"].map((dir) => newestMtime(join(ROOT, dir))));
  if (existsSync(CLI) && statSync(CLI).mtimeMs >= sources) return;
  execFileSync("npm", ["run", "build:ts"], { cwd: ROOT, stdio: "pipe" });
}

export interface LogLine {
  level: number;
  msg: string;
  [key: string]: unknown;
}

export class ServerProcess {
  readonly logs: LogLine[] = [];
  readonly stderr: string[] = [];
  readonly exited: Promise<number | null>;
  private listeners: Array<(line: LogLine) => void> = [];

  constructor(readonly child: ChildProcess) {
    createInterface({ input: child.stdout! }).on("line", (text) => {
      let line: LogLine;
      try {
        line = JSON.parse(text) as LogLine;
      } catch {
        return;
      }
      this.logs.push(line);
      for (const listener of this.listeners) listener(line);
    });
    createInterface({ input: child.stderr! }).on("line", (text) => this.stderr.push(text));
    this.exited = new Promise((resolve) => child.on("exit", (code) => resolve(code)));
  }

  /** Resolves with the first log line whose msg is `msg`, among lines from index `since` on (past or future). */
  /** The first `msg` line from log index `since` on that `match` accepts, waiting for it if it has not come yet. */
  waitForLog(msg: string, timeoutMs = 60_000, since = 0, match: (line: LogLine) => boolean = () => true): Promise<LogLine> {
    const seen = this.logs.slice(since).find((line) => line.msg === msg && match(line));
    if (seen) return Promise.resolve(seen);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no "${msg}" log within ${timeoutMs} ms; stderr: ${this.stderr.join("\n")}`)), timeoutMs);
      const listener = (line: LogLine) => {
        if (line.msg !== msg || !match(line)) return;
        clearTimeout(timer);
        this.listeners = this.listeners.filter((l) => l !== listener);
        resolve(line);
      };
      this.listeners.push(listener);
      void this.exited.then((code) => {
        clearTimeout(timer);
        reject(new Error(`server exited (${code}) before "${msg}"; stderr: ${this.stderr.join("\n")}`));
      });
    });
  }

  async url(): Promise<string> {
    return String((await this.waitForLog("listening")).url);
  }

  /** SIGTERM, then SIGKILL if it has not exited within `graceMs` (printing where its log stopped). Returns the exit
   * code: null after a SIGKILL. */
  async stop(graceMs = 10_000): Promise<number | null> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return this.child.exitCode;
    this.child.kill("SIGTERM");
    const timer = setTimeout(() => {
      const tail = this.logs.slice(-12).map((line) => JSON.stringify(line));
      console.error(`server still running ${graceMs} ms after SIGTERM, killed; its last log lines:\n${tail.join("\n")}\nstderr: ${this.stderr.join("\n")}`);
      this.child.kill("SIGKILL");
    }, graceMs);
    const code = await this.exited;
    clearTimeout(timer);
    return code;
  }
}

/** `a2d serve` on 127.0.0.1 and a free port, one CPU thread (the test machines are small). */
export function startServer(modelDir: string, extraArgs: string[] = [], env: NodeJS.ProcessEnv = {}): ServerProcess {
  ensureBuilt();
  const child = spawn(
    process.execPath,
    [CLI, "serve", "--model", modelDir, "--port", "0", "--host", "127.0.0.1", "--threads", "1", ...extraArgs],
    { cwd: ROOT, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] },
  );
  return new ServerProcess(child);
}

/** Reads an SSE response body into its `data:` payloads, [DONE] included. */
export async function readSse(response: Response): Promise<string[]> {
  const text = await response.text();
  return text
    .split("\n\n")
    .filter((event) => event.startsWith("data: "))
    .map((event) => event.slice("data: ".length));
}

/** The checks `a2d selfcheck` reports, in its order (test/selfcheck.test.ts, test/simulate.test.ts). */
export const SELFCHECK_CHECKS = [
  "ready",
  "listens on all addresses",
  "/health reports iterative denoising",
  "/v1/models",
  "chat (non-stream)",
  "chat (stream)",
  "chat with reasoning",
  "single-stream tokens/s",
  "answers are text",
];
