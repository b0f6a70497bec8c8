// `a2d simulate-startup` and `a2d selfcheck` on a packed tiny folder: the good folder passes; broken copies
// fail and name the cause (a missing module, a serve.sh line that calls the network, a host library path,
// a missing weights file, a compile at start).
import { execFileSync, spawnSync } from "node:child_process";
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, unlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { afterAll, beforeAll, describe, expect, it } from "vitest";

import type { SimulationReport } from "../simulate/simulate.js";
import { ensureDistFresh } from "./pack-build.js";
import { CLI, makeTinyModel, ROOT, SELFCHECK_CHECKS } from "./server-harness.js";

const work = mkdtempSync(join(tmpdir(), "a2d-simulate-"));
const good = join(work, "good");

function simulate(folder: string, budget = 90): { status: number | null; report: SimulationReport } {
  const run = spawnSync(process.execPath, [CLI, "simulate-startup", folder, "--json", "--budget", String(budget)], { cwd: ROOT, encoding: "utf8", timeout: 300_000 });
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

/** Replaces a packed file by an edited copy (the good folder's inode stays as it was). */
function editFile(folder: string, rel: string, edit: (text: string) => string, mode = 0o644): void {
  const path = join(folder, rel);
  const text = edit(readFileSync(path, "utf8"));
  unlinkSync(path);
  writeFileSync(path, text, { mode });
  chmodSync(path, mode);
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
    // Still a range: the same start on another machine's CPU, judged at its slow end.
    expect(report.predicted_range).toMatchObject({ holds_at_slow_end: true, holds_at_fast_end: true });
    expect(report.predicted_range!.low_s).toBeLessThan(report.measured_ready_s!);
    expect(report.predicted_range!.high_s).toBeGreaterThan(report.measured_ready_s!);
    for (const p of [...report.phases, ...report.cuda_prediction!.phases]) {
      expect(p.low_s <= p.seconds && p.seconds <= p.high_s && p.uncertainty.length > 0, JSON.stringify(p)).toBe(true);
    }
    expect(report.cuda_prediction!.range.slowest_disk_MBps).toBeGreaterThan(0);
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
    // And in the bare root the tool is not even there, as on a fresh machine.
    expect(causes(report, "host-path")).toContainEqual(`serve.sh line ${line} runs curl, which this (bare) machine does not have`);
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
    expect(causes(report, "host-path")).toContainEqual(`serve.sh line ${line} runs cc, which this (bare) machine does not have`);
  });
});

// The grader's start: PORT of its choosing, another user, a bare root, no network; both branches of serve.sh.
describe("simulate-startup starts the folder the way the grader does", () => {
  it("passes the good folder with PORT set, on 0.0.0.0, with a long answer non-stream and streamed", () => {
    const { report } = simulate(good);
    expect(report.problems).toEqual([]);
    expect(report.notes.join("\n")).toMatch(/listening \(PORT=(\d+)\): 0\.0\.0\.0:\1/);
    expect(report.notes.join("\n")).toMatch(/long answer \(max_tokens \d+\): \d+ tokens in .* non-stream; streamed in \d+ chunks .*\[DONE\]/);
  });

  it("fails a serve.sh whose CUDA branch runs python3 (read though this machine runs the CPU branch)", () => {
    const copy = brokenCopy("cuda-python");
    const line = insertBeforeExec(copy, `if [[ $A2D_DEVICE == cuda ]]; then python3 -c 'import torch' || die "no torch"; fi`);
    const { report } = simulate(copy);
    expect(report.verdict).toBe("fail");
    expect(causes(report, "host-path")).toContainEqual(expect.stringMatching(new RegExp(`^serve\\.sh line ${line} runs python3, which a bare machine does not have`)));
  });

  it("fails a serve.sh that defaults CUDA_HOME to /usr/local/cuda", () => {
    const copy = brokenCopy("cuda-home");
    const line = insertBeforeExec(copy, 'export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"');
    const { report } = simulate(copy);
    expect(causes(report, "host-path")).toContainEqual(expect.stringMatching(new RegExp(`^serve\\.sh line ${line} points outside the folder at /usr/local/cuda`)));
  });

  it("fails a serve.sh that ignores $PORT, naming the port the server took", () => {
    const copy = brokenCopy("fixed-port");
    editFile(copy, "serve.sh", (t) => t.replace('--port "$PORT"', "--port 8000"), 0o755);
    const { report } = simulate(copy);
    expect(report.verdict).toBe("fail");
    expect(causes(report, "listen")).toContainEqual(expect.stringMatching(/^serve\.sh was started with PORT=\d+, but the server listens on 0\.0\.0\.0:8000/));
  });

  it("fails a server bound to 127.0.0.1 only", () => {
    const copy = brokenCopy("loopback-only");
    editFile(copy, "serve.sh", (t) => t.replace('--host "$A2D_HOST"', "--host 127.0.0.1"), 0o755);
    const { report } = simulate(copy);
    expect(report.verdict).toBe("fail");
    expect(causes(report, "listen")).toContainEqual(expect.stringMatching(/^the server listens on 127\.0\.0\.1:\d+ only/));
  });

  it("fails a folder another user cannot read (packed under umask 077)", () => {
    const copy = brokenCopy("umask-077");
    editFile(copy, "app/dist/cli/main.js", (t) => t, 0o600);
    const { report } = simulate(copy);
    expect(report.verdict).toBe("fail");
    const permissions = causes(report, "permissions").join("\n");
    expect(permissions).toMatch(/app\/dist\/cli\/main\.js \(mode 600\)/);
    expect(permissions).toMatch(/could not read app\/dist\/cli\/main\.js \(EACCES\) as an unprivileged user/);
  });

  it("fails a server whose stream breaks while the non-stream answer works", () => {
    const copy = brokenCopy("no-done");
    editFile(copy, "app/dist/server/sse.js", (t) => t.replace('this.raw.write("data: [DONE]\\n\\n");', ""));
    const { report } = simulate(copy);
    expect(report.verdict).toBe("fail");
    expect(causes(report, "chat")).toContainEqual(expect.stringMatching(/the streamed long answer .* is broken: no data: \[DONE\] at the end/));
  });

  it("fails a start that reads files of this machine (/usr/share, /root) a bare one lacks", () => {
    for (const [name, path] of [["usr-share", "/usr/share/zoneinfo/UTC"], ["root-home", "/root/.bashrc"]] as const) {
      const copy = brokenCopy(name);
      insertBeforeExec(copy, `cat ${path} >/dev/null`);
      const { report } = simulate(copy);
      expect(report.verdict).toBe("fail");
      expect(causes(report, "host-path").join("\n")).toContain(`points outside the folder at ${path}`);
      // And in the sandbox the file is not there: the start fails as it would on a fresh machine.
      expect(causes(report, "start-failed").join("\n")).toMatch(new RegExp(`cat: ${path.replace(/\./g, "\\.")}: No such file or directory`));
    }
  });

  it("labels a start that outlasts the budget over-budget, with the last phase it reached", () => {
    const copy = brokenCopy("slow");
    insertBeforeExec(copy, "sleep 400");
    const started = Date.now();
    const { report } = simulate(copy, 8);
    expect((Date.now() - started) / 1000).toBeLessThan(60);
    expect(report.verdict).toBe("fail");
    const over = causes(report, "over-budget").join("\n");
    expect(over).toMatch(/\/health did not turn 200 within the 8 s budget \(cpu backend; the last phase reached: shell, 0\.\d s after launch\)/);
    expect(causes(report, "start-failed")).toEqual([]);
    expect(JSON.stringify(report.problems)).not.toMatch(/SIGTERM/);
  });
});

describe.runIf(existsSync(join(ROOT, "build", "engine-cuda", "a2d_cuda.build.json")))("simulate-startup on a CUDA folder", () => {
  it("stops waiting once the start so far plus the predicted GPU phases exceed the budget", () => {
    const model = makeTinyModel(join(work, "tiny-cuda"), ["--seed", "9", "--layers", "2", "--hidden", "64"]);
    const folder = join(work, "cuda");
    const packed = spawnSync(process.execPath, [CLI, "pack", "--device", "cuda", "--model", model, "--out", folder], { cwd: ROOT, encoding: "utf8", timeout: 300_000 });
    expect(packed.status, packed.stderr).toBe(0);
    // At 0.001 MB/s the cold read of the weights alone is minutes: no start can make a 60 s budget.
    const started = Date.now();
    const run = spawnSync(process.execPath, [CLI, "simulate-startup", folder, "--json", "--budget", "60", "--disk-mbps", "0.001"], { cwd: ROOT, encoding: "utf8", timeout: 300_000 });
    const report = JSON.parse(run.stdout) as SimulationReport;
    expect((Date.now() - started) / 1000).toBeLessThan(45);
    expect(report.floors).toMatchObject({ glibc: "2.28", nvidia_driver: "525.60.13", compute_capability: "9.0" });
    expect(causes(report, "over-budget").join("\n")).toMatch(/^stopped waiting after \d+\.\d s \(cpu backend\): .* plus the predicted phases still to come already exceed the 60 s budget \(the last phase reached: /);
  });
});

describe("selfcheck", () => {
  const selfcheckFolder = (folder: string) => {
    const run = spawnSync(process.execPath, [CLI, "selfcheck", folder, "--json", "--max-tokens", "64", "--budget", "90"], { cwd: ROOT, encoding: "utf8", timeout: 300_000 });
    return { status: run.status, report: JSON.parse(run.stdout) as { ok: boolean; rows: Array<{ check: string; ok: boolean; detail: string }>; tokens_per_s: number } };
  };

  it("starts the good folder as a user would; every check passes but the text of the random model's answers", () => {
    const { status, report } = selfcheckFolder(good);
    expect(report.rows.map((r) => r.check)).toEqual(SELFCHECK_CHECKS);
    // The tiny model's weights are random: what it says is not text, and selfcheck says so.
    expect(report.rows.filter((r) => !r.ok).map((r) => r.check)).toEqual(["answers are text"]);
    expect(report.rows.find((r) => r.check === "listens on all addresses")!.detail).toMatch(/^listens on 0\.0\.0\.0:\d+$/);
    expect(report.tokens_per_s).toBeGreaterThan(0);
    expect(status).toBe(1);
  });

  it("fails a folder whose server listens on 127.0.0.1 only", () => {
    const copy = brokenCopy("loopback-selfcheck");
    editFile(copy, "serve.sh", (t) => t.replace('--host "$A2D_HOST"', "--host 127.0.0.1"), 0o755);
    const { report } = selfcheckFolder(copy);
    expect(report.rows.find((r) => r.check === "listens on all addresses")).toEqual({
      check: "listens on all addresses",
      ok: false,
      detail: expect.stringMatching(/^listens on 127\.0\.0\.1:\d+ only: nothing outside this machine can reach it/),
    });
  });
});
