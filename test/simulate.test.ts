// `a2d simulate-startup` and `a2d selfcheck` on a packed tiny folder: the good folder passes; broken copies
// fail and name the cause (a missing module, a serve.sh line that calls the network, a host library path,
// a missing weights file, a compile at start).
import { execFileSync, spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, unlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { afterAll, beforeAll, describe, expect, it } from "vitest";

import type { SimulationReport } from "../simulate/simulate.js";
import { ensureDistFresh } from "./pack-build.js";
import { CLI, makeTinyModel, ROOT } from "./server-harness.js";

const work = mkdtempSync(join(tmpdir(), "a2d-simulate-"));
const good = join(work, "good");

function simulate(folder: string): { status: number | null; report: SimulationReport } {
  const run = spawnSync(process.execPath, [CLI, "simulate-startup", folder, "--json", "--budget", "90"], { cwd: ROOT, encoding: "utf8", timeout: 300_000 });
  try {
    return { status: run.status, report: JSON.parse(run.stdout) as SimulationReport };
  } catch {
    throw new Error(`simulate-startup printed no JSON (exit ${run.status}):\n${run.stdout}\n${run.stderr}`);
  }
}

/** A copy that shares file contents with the good folder (hard links); edits below replace files, never write through. */
function brokenCopy(name: string): string {
  const copy = join(work, name);
  execFileSync("cp", ["-al", good, copy]);
  return copy;
}

function insertBeforeExec(folder: string, line: string): number {
  const path = join(folder, "serve.sh");
  const lines = readFileSync(path, "utf8").split("\n");
  const at = lines.findLastIndex((l) => l.startsWith("exec "));
  lines.splice(at, 0, line);
  unlinkSync(path);
  writeFileSync(path, lines.join("\n"), { mode: 0o755 });
  return at + 1;
}

const causes = (report: SimulationReport, cause: string) => report.problems.filter((p) => p.cause === cause).map((p) => p.detail);

beforeAll(() => {
  ensureDistFresh();
  const model = makeTinyModel(join(work, "tiny"), ["--seed", "9", "--layers", "2", "--hidden", "64"]);
  const packed = spawnSync(process.execPath, [CLI, "pack", "--device", "cpu", "--model", model, "--out", good], { cwd: ROOT, encoding: "utf8", timeout: 300_000 });
  if (packed.status !== 0) throw new Error(`pack failed:\n${packed.stdout}\n${packed.stderr}`);
});

afterAll(() => rmSync(work, { recursive: true, force: true }));

describe("simulate-startup", () => {
  it("passes a good folder, with every isolation on and the phases measured", () => {
    const { status, report } = simulate(good);
    expect(report.problems).toEqual([]);
    expect(report.verdict).toBe("pass");
    expect(status).toBe(0);
    expect(report.isolation).toMatchObject({ network_namespace: true, strace: true, guard: true, page_cache_evicted: true });
    expect(report.measured_ready_s).toBeGreaterThan(0);
    expect(report.measured_ready_s).toBeLessThan(90);
    expect(report.predicted_ready_s).toBe(report.measured_ready_s); // a CPU folder: nothing to predict
    const names = report.phases.map((p) => p.name);
    for (const phase of ["shell", "node start", "server modules", "listening (503)", "tokenizer + template", "addon load", "weights load → ready (CPU)"]) {
      expect(names).toContain(phase);
    }
    expect(report.phases.every((p) => p.kind === "measured" && p.seconds >= 0)).toBe(true);
    expect(report.first_chat_s).toBeGreaterThan(0);
  });

  it("fails a folder with a module missing from node_modules, naming it", () => {
    const copy = brokenCopy("no-fastify");
    rmSync(join(copy, "app/node_modules/fastify"), { recursive: true });
    const { status, report } = simulate(copy);
    expect(status).toBe(1);
    expect(report.verdict).toBe("fail");
    expect(causes(report, "missing-module").join("\n")).toMatch(/app\/node_modules\/fastify/);
    expect(causes(report, "missing-module").join("\n")).toMatch(/cannot import fastify/);
  });

  it("fails a serve.sh line that calls the network, naming the line and the attempt", () => {
    const copy = brokenCopy("curl");
    const line = insertBeforeExec(copy, "curl -sS --max-time 3 https://huggingface.co/api/models/openbmb/MiniCPM5-2B -o /dev/null || true");
    const { report } = simulate(copy);
    expect(report.verdict).toBe("fail");
    const network = causes(report, "network");
    expect(network).toContainEqual(expect.stringMatching(new RegExp(`^serve\\.sh line ${line} calls the network \\(curl\\)`)));
    // And the attempt itself, seen by strace in the empty network namespace.
    expect(network).toContainEqual(expect.stringMatching(/^curl made a (DNS query|connection) to /));
  });

  it("fails a serve.sh that points at a host library path", () => {
    const copy = brokenCopy("cuda-path");
    const line = insertBeforeExec(copy, 'export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"');
    const { report } = simulate(copy);
    expect(report.verdict).toBe("fail");
    expect(causes(report, "host-path")).toContainEqual(expect.stringMatching(new RegExp(`^serve\\.sh line ${line} points outside the folder at /usr/local/cuda/lib64`)));
  });

  it("fails a folder whose weights file is missing, naming it", () => {
    const copy = brokenCopy("no-weights");
    rmSync(join(copy, "model/model.safetensors"));
    const { report } = simulate(copy);
    expect(report.verdict).toBe("fail");
    const missing = causes(report, "missing-file").join("\n");
    expect(missing).toContain("model/model.safetensors is listed in MANIFEST.json but missing");
    expect(missing).toMatch(/model\/model\.safetensors is missing: the folder is incomplete/); // serve.sh's own fail-fast
  });

  it("fails a start that compiles something", () => {
    const copy = brokenCopy("compile");
    const line = insertBeforeExec(copy, `printf 'int main(void){return 0;}\\n' > "$TMPDIR/probe.c" && cc "$TMPDIR/probe.c" -o "$TMPDIR/probe"`);
    const { report } = simulate(copy);
    expect(report.verdict).toBe("fail");
    const compile = causes(report, "compile");
    expect(compile).toContainEqual(expect.stringMatching(new RegExp(`^serve\\.sh line ${line} runs a compiler at start \\(cc\\)`)));
    expect(compile).toContainEqual(expect.stringMatching(/\/cc ran at start/));
  });
});

describe("selfcheck", () => {
  it("starts the good folder as a user would and passes every check", () => {
    const run = spawnSync(process.execPath, [CLI, "selfcheck", good, "--json", "--max-tokens", "64", "--budget", "90"], { cwd: ROOT, encoding: "utf8", timeout: 300_000 });
    const report = JSON.parse(run.stdout) as { ok: boolean; rows: Array<{ check: string; ok: boolean; detail: string }>; tokens_per_s: number };
    expect(report.rows.filter((r) => !r.ok)).toEqual([]);
    expect(report.rows.map((r) => r.check)).toEqual([
      "ready",
      "/health reports iterative denoising",
      "/v1/models",
      "chat (non-stream)",
      "chat (stream)",
      "chat with reasoning",
      "single-stream tokens/s",
    ]);
    expect(report.tokens_per_s).toBeGreaterThan(0);
    expect(run.status).toBe(0);
  });
});
