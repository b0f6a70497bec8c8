// `a2d serve` on bad input: it must say what is wrong and exit non-zero, never hang or crash.
import { execFile } from "node:child_process";
import { cpSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";

import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { CLI, ensureBuilt, makeTinyModel, startServer } from "./server-harness.js";

const run = promisify(execFile);
const work = mkdtempSync(join(tmpdir(), "a2d-cli-serve-"));
let model: string;

beforeAll(() => {
  ensureBuilt();
  model = makeTinyModel(join(work, "tiny"), ["--seed", "9"]);
});
afterAll(() => rmSync(work, { recursive: true, force: true }));

async function serveFails(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    await run(process.execPath, [CLI, "serve", "--port", "0", "--host", "127.0.0.1", ...args], { cwd: work, timeout: 60_000 });
  } catch (error) {
    const failure = error as { code: number; stdout: string; stderr: string; killed: boolean };
    expect(failure.killed, "a2d serve hung").toBe(false);
    return failure;
  }
  throw new Error(`a2d serve ${args.join(" ")} exited 0`);
}

describe("a2d serve on bad input", () => {
  it("names a model folder that does not exist, before binding a port", async () => {
    const { code, stderr } = await serveFails(["--model", join(work, "nowhere")]);
    expect(code).not.toBe(0);
    expect(stderr).toContain(`${join(work, "nowhere")}: no config.json there`);
  });

  it("names the broken file of a model that fails to load, and exits", async () => {
    const broken = join(work, "broken");
    cpSync(model, broken, { recursive: true });
    writeFileSync(join(broken, "model.safetensors"), "not a safetensors file");
    const { code, stdout, stderr } = await serveFails(["--model", broken]);
    expect(code).not.toBe(0);
    expect(stderr + stdout).toContain(join(broken, "model.safetensors"));
  });

  it("says which port is taken", async () => {
    const first = startServer(model);
    const port = Number((await first.waitForLog("listening")).port);
    try {
      const { code, stderr } = await serveFails(["--model", model, "--port", String(port)]);
      expect(code).not.toBe(0);
      expect(stderr).toContain(`port ${port} on 127.0.0.1 is in use`);
    } finally {
      expect(await first.stop()).toBe(0);
    }
  });

  it("refuses bad flags by name", async () => {
    expect((await serveFails(["--model", model, "--port", "70000"])).stderr).toContain("--port must be in [0, 65535]");
    expect((await serveFails(["--model", model, "--device", "tpu"])).stderr).toContain("tpu");
    expect((await serveFails(["--model", model, "--shutdown-grace", "-1"])).stderr).toContain("--shutdown-grace");
  });
});
