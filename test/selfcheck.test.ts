// `a2d selfcheck --url` against a real `a2d serve` (passes) and against a server that answers in the wrong
// shapes (fails, naming each check). Folder mode (`selfcheck DIR`) runs in simulate.test.ts on a packed folder.
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { ensureDistFresh } from "./pack-build.js";
import { CLI, makeTinyModel, ROOT, type ServerProcess, startServer } from "./server-harness.js";

const work = mkdtempSync(join(tmpdir(), "a2d-selfcheck-"));
let server: ServerProcess;
let url: string;

interface Report {
  ok: boolean;
  rows: Array<{ check: string; ok: boolean; detail: string }>;
  tokens_per_s: number | null;
}

function selfcheck(args: string[]): { status: number | null; report: Report } {
  const run = spawnSync(process.execPath, [CLI, "selfcheck", "--json", ...args], { cwd: ROOT, encoding: "utf8", timeout: 120_000 });
  try {
    return { status: run.status, report: JSON.parse(run.stdout) as Report };
  } catch {
    throw new Error(`selfcheck printed no JSON (exit ${run.status}):\n${run.stdout}\n${run.stderr}`);
  }
}

beforeAll(async () => {
  ensureDistFresh();
  const model = makeTinyModel(join(work, "tiny"), ["--seed", "3", "--layers", "2", "--hidden", "64"]);
  server = startServer(model);
  url = await server.url();
  await server.waitForLog("ready");
});

afterAll(async () => {
  await server?.stop();
  rmSync(work, { recursive: true, force: true });
});

describe("selfcheck --url", () => {
  it("passes a real a2d server and reports its single-stream speed", () => {
    const { status, report } = selfcheck(["--url", url, "--max-tokens", "64"]);
    expect(report.rows.filter((r) => !r.ok)).toEqual([]);
    expect(status).toBe(0);
    expect(report.rows.find((r) => r.check === "single-stream tokens/s")!.detail).toMatch(/tokens\/s .*not judged on device cpu/);
    expect(report.tokens_per_s).toBeGreaterThan(0);
  });

  it("fails the speed check when the bar is above what the server does", () => {
    const { status, report } = selfcheck(["--url", url, "--max-tokens", "16", "--min-tps", "1e9"]);
    expect(status).toBe(1);
    expect(report.rows.filter((r) => !r.ok).map((r) => r.check)).toEqual(["single-stream tokens/s"]);
  });

  it("fails a server that answers in the wrong shapes, naming each check", async () => {
    // An OpenAI look-alike that gets the details wrong the way real servers do.
    const wrong = http.createServer((req, res) => {
      res.setHeader("content-type", "application/json");
      if (req.url === "/health") return res.end(JSON.stringify({ status: "ok", decoding: { method: "autoregressive" } }));
      if (req.url === "/v1/models") return res.end(JSON.stringify({ object: "list", data: [] }));
      let body = "";
      req.on("data", (c) => (body += c));
      req.on("end", () => {
        if (JSON.parse(body).stream) {
          res.setHeader("content-type", "text/event-stream");
          return res.end(`data: ${JSON.stringify({ id: "x", object: "chat.completion.chunk", created: 1, model: "m", choices: [{ index: 0, delta: { content: "hi" } }] })}\n\n`);
        }
        res.end(JSON.stringify({ id: "x", object: "text_completion", choices: [{ text: "<think>hmm</think>hi" }] }));
      });
    });
    await new Promise<void>((resolve) => wrong.listen(0, "127.0.0.1", resolve));
    try {
      const port = (wrong.address() as AddressInfo).port;
      // Spawned asynchronously: this process must keep serving the look-alike while selfcheck runs.
      const { status, report } = await selfcheckAsync(["--url", `http://127.0.0.1:${port}`, "--max-tokens", "8"]);
      expect(status).toBe(1);
      const failed = Object.fromEntries(report.rows.filter((r) => !r.ok).map((r) => [r.check, r.detail]));
      expect(Object.keys(failed)).toEqual([
        "/health reports iterative denoising",
        "/v1/models",
        "chat (non-stream)",
        "chat (stream)",
        "chat with reasoning",
        "single-stream tokens/s",
      ]);
      expect(failed["/health reports iterative denoising"]).toMatch(/decoding\/block_size/);
      expect(failed["chat (stream)"]).toMatch(/no data: \[DONE\] at the end; no chunk has a finish_reason/);
    } finally {
      wrong.close();
    }
  });

  it("fails fast when nothing answers within the budget", () => {
    const { status, report } = selfcheck(["--url", "http://127.0.0.1:9", "--budget", "2"]);
    expect(status).toBe(1);
    expect(report.rows).toEqual([{ check: "ready", ok: false, detail: "/health did not turn 200 within 2 s" }]);
  });
});

async function selfcheckAsync(args: string[]): Promise<{ status: number | null; report: Report }> {
  const child = spawn(process.execPath, [CLI, "selfcheck", "--json", ...args], { cwd: ROOT });
  let stdout = "";
  child.stdout.on("data", (d) => (stdout += d));
  const status = await new Promise<number | null>((resolve) => child.on("exit", resolve));
  return { status, report: JSON.parse(stdout) as Report };
}
