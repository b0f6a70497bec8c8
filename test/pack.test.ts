// `a2d pack` end to end on a tiny model: packed with the network off, started from its own serve.sh in a
// fresh network namespace with an empty environment and no node on PATH, verified against its MANIFEST,
// repeatable, and never leaving a half folder at --out when killed.
import { type ChildProcess, execFileSync, spawn, spawnSync } from "node:child_process";
import { appendFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, unlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { ensureDistFresh } from "./pack-build.js";
import { CLI, makeTinyModel, ROOT } from "./server-harness.js";

const work = mkdtempSync(join(tmpdir(), "a2d-pack-"));
const out = join(work, "out");
let model: string;
let packOutput: string;

/** Root can enter a new network namespace directly; anyone else through a user namespace. */
const UNSHARE_NET = process.getuid?.() === 0 ? ["unshare", "--net", "--"] : ["unshare", "--map-root-user", "--net", "--"];

function pack(args: string[], offline = true) {
  const argv = [...(offline ? UNSHARE_NET : []), process.execPath, CLI, "pack", "--device", "cpu", ...args];
  return spawnSync(argv[0]!, argv.slice(1), { cwd: ROOT, encoding: "utf8", timeout: 300_000 });
}

function leftovers(name: string): string[] {
  return readdirSync(work).filter((entry) => entry.startsWith(`.${name}.a2d-pack-`));
}

beforeAll(() => {
  ensureDistFresh();
  model = makeTinyModel(join(work, "tiny"), ["--seed", "5", "--layers", "2", "--hidden", "64"]);
  const result = pack(["--model", model, "--out", out]);
  packOutput = result.stdout + result.stderr;
  if (result.status !== 0) throw new Error(`pack failed (${result.status}):\n${packOutput}`);
});

afterAll(() => rmSync(work, { recursive: true, force: true }));

describe("the packed folder", () => {
  it("has the runtime, production node_modules only, the engine, the model, serve.sh and a size report", () => {
    for (const file of ["serve.sh", "MANIFEST.json", "runtime/bin/node", "app/dist/cli/main.js", "app/package.json", "engine/a2d_cpu.node", "model/config.json", "model/model.safetensors", "model/tokenizer.json"]) {
      expect(existsSync(join(out, file)), file).toBe(true);
    }
    expect(statSync(join(out, "serve.sh")).mode & 0o111).not.toBe(0);
    expect(existsSync(join(out, "app/node_modules/fastify/package.json"))).toBe(true);
    // Dev tools stay out: the lockfile's dev packages are omitted, not copied from the checkout.
    for (const dev of ["vitest", "typescript", "openai", "node-addon-api"]) expect(existsSync(join(out, "app/node_modules", dev)), dev).toBe(false);
    const app = JSON.parse(readFileSync(join(out, "app/package.json"), "utf8"));
    expect(app.devDependencies).toBeUndefined();
    expect(app.scripts).toBeUndefined();
    // Weights share the model folder's inode when on the same filesystem.
    expect(statSync(join(out, "model/model.safetensors")).ino).toBe(statSync(join(model, "model.safetensors")).ino);
    expect(JSON.parse(readFileSync(join(out, "MANIFEST.json"), "utf8")).precision).toBe("bf16");
    expect(packOutput).toMatch(/runtime\/bin\/node\s+\d/);
    expect(packOutput).toMatch(/app\/node_modules\s+\d/);
    expect(packOutput).toMatch(/\ntotal\s+\d/);
  });

  it("starts offline from serve.sh: new network namespace, env -i, HOME nowhere, no node on PATH", () => {
    // The client runs inside the same namespace (nothing outside can reach its loopback).
    const client = join(work, "client.mjs");
    writeFileSync(
      client,
      `import { execFileSync, spawn } from "node:child_process";
execFileSync("ip", ["link", "set", "lo", "up"]);
const server = spawn("/usr/bin/env", ["-i", "HOME=/nonexistent", "PATH=/nonexistent", "PORT=8000", "/bin/bash", ${JSON.stringify(join(out, "serve.sh"))}],
  { stdio: ["ignore", "pipe", "pipe"], detached: true });
let log = "";
server.stdout.on("data", (d) => (log += d));
server.stderr.on("data", (d) => (log += d));
const result = { health: null, chat: null, log: "" };
const deadline = Date.now() + 60_000;
while (Date.now() < deadline && server.exitCode === null) {
  try {
    const r = await fetch("http://127.0.0.1:8000/health");
    if (r.status === 200) { result.health = await r.json(); break; }
  } catch {}
  await new Promise((r) => setTimeout(r, 100));
}
if (result.health) {
  const r = await fetch("http://127.0.0.1:8000/v1/chat/completions", { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "model", messages: [{ role: "user", content: "Hello" }], max_tokens: 8 }) });
  result.chat = { status: r.status, body: await r.json() };
}
try { process.kill(-server.pid, "SIGTERM"); } catch {}
result.log = log;
console.log(JSON.stringify(result));
`,
    );
    const run = spawnSync(UNSHARE_NET[0]!, [...UNSHARE_NET.slice(1), process.execPath, client], { encoding: "utf8", timeout: 120_000 });
    expect(run.status, run.stderr).toBe(0);
    const result = JSON.parse(run.stdout.trim().split("\n").pop()!);
    expect(result.health, result.log).not.toBeNull();
    expect(result.health.decoding.method).toBe("block_diffusion");
    expect(result.chat.status).toBe(200);
    expect(result.chat.body.object).toBe("chat.completion");
    expect(typeof result.chat.body.choices[0].message.content).toBe("string");
    expect(result.chat.body.usage.completion_tokens).toBeGreaterThan(0);
    expect(result.log).toContain("serve.sh: starting a2d on 0.0.0.0:8000 (device cpu)");
  });

  it("serve.sh fails fast, naming the file, when one is missing", () => {
    const weights = join(out, "model/model.safetensors");
    const saved = join(work, "weights.bak");
    execFileSync("mv", [weights, saved]);
    try {
      const run = spawnSync("/usr/bin/env", ["-i", "PATH=/nonexistent", "/bin/bash", join(out, "serve.sh")], { encoding: "utf8", timeout: 30_000 });
      expect(run.status).toBe(1);
      expect(run.stdout).toContain(`${weights} is missing`);
    } finally {
      execFileSync("mv", [saved, weights]);
    }
  });

  it("verify passes, then names every changed, missing and extra file", () => {
    const ok = spawnSync(process.execPath, [CLI, "verify", out], { encoding: "utf8" });
    expect(ok.status, ok.stdout + ok.stderr).toBe(0);
    expect(ok.stdout).toMatch(/^ok: \d+ files match MANIFEST.json/m);

    const config = join(out, "model/config.json");
    const original = readFileSync(config);
    const helper = readdirSync(join(out, "app/eval")).find((f) => f.endsWith(".py"))!;
    const helperPath = join(out, "app/eval", helper);
    const helperText = readFileSync(helperPath);
    appendFileSync(config, " ");
    unlinkSync(helperPath);
    writeFileSync(join(out, "model/stray.txt"), "not packed");
    try {
      const bad = spawnSync(process.execPath, [CLI, "verify", out], { encoding: "utf8" });
      expect(bad.status).toBe(1);
      expect(bad.stdout).toContain("changed  model/config.json: size");
      expect(bad.stdout).toContain(`missing  app/eval/${helper}`);
      expect(bad.stdout).toContain("extra    model/stray.txt");
      expect(bad.stdout).toMatch(/FAILED: 1 missing, 1 extra, 1 changed/);
    } finally {
      writeFileSync(config, original);
      writeFileSync(helperPath, helperText);
      unlinkSync(join(out, "model/stray.txt"));
    }
    const sameSize = Buffer.from(original);
    sameSize[sameSize.indexOf(0x7b) + 1] ^= 0x01; // one flipped bit, same size: only the hash can tell
    writeFileSync(config, sameSize);
    try {
      const flipped = spawnSync(process.execPath, [CLI, "verify", out], { encoding: "utf8" });
      expect(flipped.status).toBe(1);
      expect(flipped.stdout).toContain("changed  model/config.json: content differs (sha256)");
    } finally {
      writeFileSync(config, original);
    }
  });
});

describe("an FP8 model folder", () => {
  it("packs like any other, and MANIFEST.json says its precision", () => {
    const fp8 = join(work, "fp8");
    execFileSync(join(ROOT, ".venv", "bin", "python"), ["-m", "a2d_convert", "quantize", "--model", model, "--out", fp8], { cwd: ROOT, stdio: "pipe" });
    const packed = join(work, "fp8-out");
    const result = pack(["--model", fp8, "--out", packed]);
    expect(result.status, result.stdout + result.stderr).toBe(0);
    expect(JSON.parse(readFileSync(join(packed, "MANIFEST.json"), "utf8")).precision).toBe("fp8-e4m3");
    expect(JSON.parse(readFileSync(join(packed, "model", "config.json"), "utf8")).a2d.precision).toBe("fp8-e4m3");
    const verified = spawnSync(process.execPath, [CLI, "verify", packed], { encoding: "utf8" });
    expect(verified.status, verified.stdout + verified.stderr).toBe(0);
  });
});

describe("packing is atomic and repeatable", () => {
  async function packUntilMidway(name: string): Promise<ChildProcess> {
    const child = spawn(process.execPath, [CLI, "pack", "--device", "cpu", "--model", model, "--out", join(work, name)], { cwd: ROOT, stdio: "ignore" });
    // Midway: the temporary folder exists and node_modules is being reified into it.
    for (let waited = 0; waited < 120_000; waited += 50) {
      const temp = leftovers(name)[0];
      if (temp && existsSync(join(work, temp, "app", "node_modules"))) return child;
      if (child.exitCode !== null) throw new Error(`pack exited (${child.exitCode}) before reaching node_modules`);
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error("pack never reached node_modules");
  }

  it("SIGTERM midway removes the temporary folder and leaves nothing at --out", async () => {
    const child = await packUntilMidway("interrupted");
    const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
    child.kill("SIGTERM");
    expect(await exited).toBe(143);
    expect(existsSync(join(work, "interrupted"))).toBe(false);
    expect(leftovers("interrupted")).toEqual([]);
  });

  it("SIGKILL midway leaves nothing at --out; the next pack cleans up and gives the same MANIFEST", async () => {
    const child = await packUntilMidway("again");
    const exited = new Promise((resolve) => child.on("exit", resolve));
    child.kill("SIGKILL");
    await exited;
    expect(existsSync(join(work, "again"))).toBe(false);
    expect(leftovers("again")).toHaveLength(1);

    const result = pack(["--model", model, "--out", join(work, "again")]);
    expect(result.status, result.stderr).toBe(0);
    expect(result.stderr).toMatch(/left by an interrupted pack/);
    expect(leftovers("again")).toEqual([]);
    expect(readFileSync(join(work, "again", "MANIFEST.json"), "utf8")).toBe(readFileSync(join(out, "MANIFEST.json"), "utf8"));
  });
});

describe("bad input is refused with the fix named", () => {
  const refuse = (args: string[]) => {
    const result = pack(args, false);
    expect(result.status).toBe(1);
    return result.stderr;
  };

  it("a missing model folder, a plain AR model, an existing --out, missing addons, missing wheels", () => {
    expect(refuse(["--model", join(work, "nope"), "--out", join(work, "x")])).toMatch(/model folder .*nope does not exist/);
    expect(refuse(["--model", join(work, "tiny", "base"), "--out", join(work, "x")])).toMatch(/has no "a2d" section.*a2d_convert init/);
    expect(refuse(["--model", model, "--out", out])).toMatch(/already exists; pass --force/);
    expect(refuse(["--model", model, "--out", join(work, "x"), "--cpu-addon", join(work, "none.node")])).toMatch(/npm run build:engine/);
    expect(refuse(["--model", model, "--out", join(work, "x"), "--with-wheels", "--wheels", join(work, "no-wheels")])).toMatch(
      /no-wheels lacks wheels for torch==2\.13\.0, .*pip download -r convert\/requirements\.txt/,
    );
    const cuda = spawnSync(process.execPath, [CLI, "pack", "--device", "cuda", "--cuda-addon", join(work, "none.node"), "--model", model, "--out", join(work, "x")], { encoding: "utf8" });
    expect(cuda.status).toBe(1);
    expect(cuda.stderr).toMatch(/npm run build:cuda/);
    expect(existsSync(join(work, "x"))).toBe(false);
    expect(leftovers("x")).toEqual([]);
  });

  it("an a2d.precision that no engine reads", () => {
    const odd = join(work, "odd-precision");
    execFileSync("cp", ["-r", model, odd]);
    const config = JSON.parse(readFileSync(join(odd, "config.json"), "utf8"));
    config.a2d.precision = "int4";
    writeFileSync(join(odd, "config.json"), JSON.stringify(config));
    expect(refuse(["--model", odd, "--out", join(work, "z")])).toMatch(/a2d\.precision is "int4"; use "bf16" or "fp8-e4m3"/);
    expect(existsSync(join(work, "z"))).toBe(false);
  });

  it("an npm cache without the locked packages: names what is missing and how to fill the cache", () => {
    const emptyCache = join(work, "empty-npm-cache");
    const argv = [...UNSHARE_NET, process.execPath, CLI, "pack", "--device", "cpu", "--model", model, "--out", join(work, "y")];
    const result = spawnSync(argv[0]!, argv.slice(1), { cwd: ROOT, encoding: "utf8", env: { ...process.env, npm_config_cache: emptyCache } });
    expect(result.status).toBe(1);
    expect(result.stderr).toMatch(/not in the npm cache at .*empty-npm-cache\/_cacache: .*registry\.npmjs\.org\/.*Run `npm ci` once with the network on/);
    expect(existsSync(join(work, "y"))).toBe(false);
    expect(leftovers("y")).toEqual([]);
  });
});
