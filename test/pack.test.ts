// `a2d pack` end to end on a tiny model: packed with the network off, started from its own serve.sh in a
// fresh network namespace with an empty environment and no node on PATH, verified against its MANIFEST,
// repeatable, and never leaving a half folder at --out when killed.
import { type ChildProcess, execFileSync, spawn, spawnSync } from "node:child_process";
import { appendFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, truncateSync, unlinkSync, writeFileSync } from "node:fs";
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

function editJson(path: string, edit: (value: Record<string, unknown>) => Record<string, unknown>): void {
  writeFileSync(path, JSON.stringify(edit(JSON.parse(readFileSync(path, "utf8")) as Record<string, unknown>)));
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
    // So do the production packages only the packer loads, and what Node never reads.
    for (const unused of ["@npmcli/arborist", "pacote", "tar", "node-gyp", "@sigstore/sign", "@npmcli"]) {
      expect(existsSync(join(out, "app/node_modules", unused)), unused).toBe(false);
    }
    // The start checks run from the folder too (simulate-startup: execa; selfcheck: undici).
    for (const used of ["fastify", "pino", "@huggingface/tokenizers", "@huggingface/jinja", "@fastify/type-provider-typebox", "cli-progress", "execa", "undici"]) {
      expect(existsSync(join(out, "app/node_modules", used, "package.json")), used).toBe(true);
    }
    const modules = readdirSync(join(out, "app/node_modules"), { recursive: true, encoding: "utf8" });
    expect(modules.filter((f) => /\.map$|(^|\/)(README|CHANGELOG)\.md$|(^|\/)(test|tests|docs|\.github)$/i.test(f))).toEqual([]);
    expect(packOutput).toMatch(/node_modules: the \d+ of \d+ production packages that `serve`, `verify`, `simulate-startup` and `selfcheck` load, [\d.]+ MiB in \d+ files -> [\d.]+ MiB in \d+/);
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

  it("its own CLI finds the folder's engine without serve.sh (no A2D_ADDON_DIR)", () => {
    const run = spawnSync(
      "/usr/bin/env",
      ["-i", "HOME=/nonexistent", "PATH=/nonexistent", join(out, "runtime/bin/node"), join(out, "app/dist/cli/main.js"), "generate",
        "--model", join(out, "model"), "--prompt", "Hello", "--max-tokens", "4", "--json"],
      { encoding: "utf8", timeout: 60_000 },
    );
    expect(run.status, run.stdout + run.stderr).toBe(0);
    expect(JSON.parse(run.stdout.trim().split("\n").pop()!).forward_passes).toBeGreaterThan(0);
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
    // The folder's own verify (serve.sh names it) runs on what its pruned node_modules holds.
    const own = spawnSync(join(out, "runtime/bin/node"), [join(out, "app/dist/cli/main.js"), "verify", out], { encoding: "utf8", env: {} });
    expect(own.status, own.stdout + own.stderr).toBe(0);
    expect(own.stdout).toMatch(/^ok: \d+ files match MANIFEST.json/m);

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

/** A private mount namespace: root makes one directly, anyone else inside a user namespace (where tmpfs and bind mounts are allowed). */
const MOUNT_NS = process.getuid?.() === 0 ? ["unshare", "--mount", "--propagation", "private", "--net", "--"] : ["unshare", "--map-root-user", "--mount", "--propagation", "private", "--net", "--"];
const mountProbe = mkdtempSync(join(tmpdir(), "a2d-mount-probe-"));
const canMount = spawnSync(MOUNT_NS[0]!, [...MOUNT_NS.slice(1), "mount", "-t", "tmpfs", "tmpfs", mountProbe], { stdio: "ignore" }).status === 0;
rmSync(mountProbe, { recursive: true, force: true });

describe.skipIf(!canMount)("--out is a mount point", () => {
  it("packs into its contents, keeps the mount, and replaces them on the next --force: a tmpfs and a bind mount of the same filesystem", () => {
    const tmpfsOut = join(work, "mnt-tmpfs");
    const bindOut = join(work, "mnt-bind");
    const bindSource = join(work, "mnt-bind-source");
    const packCommand = (target: string) => `${JSON.stringify(process.execPath)} ${JSON.stringify(CLI)} pack --device cpu --model ${JSON.stringify(model)} --out ${JSON.stringify(target)} --force`;
    const verify = (target: string) => `${JSON.stringify(process.execPath)} ${JSON.stringify(CLI)} verify ${JSON.stringify(target)} | tail -n 1`;
    const report = (label: string, target: string) => `echo "${label}: $(mountpoint -q ${JSON.stringify(target)} && echo mounted || echo NOT-mounted) $(ls -A ${JSON.stringify(target)} | tr '\\n' ' ')"; ${verify(target)}`;
    const script = [
      "set -e",
      `mkdir -p ${tmpfsOut} ${bindOut} ${bindSource}`,
      `mount -t tmpfs tmpfs ${tmpfsOut}`,
      `mount --bind ${bindSource} ${bindOut}`,
      packCommand(tmpfsOut),
      report("tmpfs first", tmpfsOut),
      packCommand(tmpfsOut),
      report("tmpfs again", tmpfsOut),
      packCommand(bindOut),
      report("bind", bindOut),
    ].join("\n");
    const run = spawnSync(MOUNT_NS[0]!, [...MOUNT_NS.slice(1), "bash", "-c", script], { cwd: ROOT, encoding: "utf8", timeout: 300_000 });
    expect(run.status, run.stdout + run.stderr).toBe(0);
    const folder = "MANIFEST.json app engine model runtime serve.sh state ";
    for (const label of ["tmpfs first", "tmpfs again", "bind"]) expect(run.stdout).toContain(`${label}: mounted ${folder}`);
    expect(run.stdout.match(/^ok: \d+ files match MANIFEST.json$/gm)).toHaveLength(3);
    // Built beside --out as usual only when --out can be renamed: nothing was left beside either mount.
    expect(leftovers("mnt-tmpfs")).toEqual([]);
    expect(leftovers("mnt-bind")).toEqual([]);
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

  it("--force never deletes what is not a pack: the model's parent, a folder of other files", () => {
    // The model lives in work/tiny/model: --out work/tiny holds it.
    const parent = join(work, "tiny");
    expect(refuse(["--model", model, "--out", parent, "--force"])).toMatch(/holds the input .*--force would delete it/);
    expect(existsSync(join(model, "model.safetensors"))).toBe(true);
    const mine = join(work, "mine");
    execFileSync("mkdir", ["-p", mine]);
    writeFileSync(join(mine, "notes.txt"), "keep me");
    expect(refuse(["--model", model, "--out", mine, "--force"])).toMatch(/is not a folder made by `a2d pack` .*nothing of yours is deleted/);
    expect(readFileSync(join(mine, "notes.txt"), "utf8")).toBe("keep me");
  });

  // Each a copy of the good model with one thing broken the way downloads and hand edits break it.
  const brokenModels: Array<[name: string, breakIt: (dir: string) => void, message: RegExp]> = [
    [
      "truncated weights",
      (dir) => truncateSync(join(dir, "model.safetensors"), Math.floor(statSync(join(dir, "model.safetensors")).size / 2)),
      /model\.safetensors: it is truncated: its header describes \d+ bytes, the file holds \d+ .*Copy or download the weights again/,
    ],
    [
      "a Git LFS pointer instead of the weights",
      (dir) =>
        writeFileSync(
          join(dir, "model.safetensors"),
          `version https://git-lfs.github.com/spec/v1\noid sha256:${"ab".repeat(32)}\nsize 248568\n`,
        ),
      /model\.safetensors is a Git LFS pointer file \(\d+ bytes standing for 248568 bytes\), not the file itself: .*git lfs pull/,
    ],
    [
      "a corrupt tokenizer.json",
      (dir) => writeFileSync(join(dir, "tokenizer.json"), readFileSync(join(dir, "tokenizer.json"), "utf8").slice(0, 4000)),
      /tokenizer\.json: not valid JSON .*copy the tokenizer files of the base model again/,
    ],
    [
      "a vocab_size that disagrees with the weights",
      (dir) => editJson(join(dir, "config.json"), (config) => ({ ...config, vocab_size: 400 })),
      /config\.json: vocab_size is 400, but model\.embed_tokens\.weight in .*model\.safetensors has 384 rows: set vocab_size to 384/,
    ],
    [
      "a tokenizer with ids past vocab_size",
      (dir) =>
        editJson(join(dir, "tokenizer.json"), (tokenizer) => ({
          ...tokenizer,
          added_tokens: [...(tokenizer.added_tokens as unknown[]), { id: 500, content: "<|extra|>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }],
        })),
      /tokenizer\.json can produce id 500 \("<\|extra\|>"\), but .*config\.json gives vocab_size 384: the embedding has no row for it/,
    ],
    [
      "a decoding default the engine refuses",
      (dir) =>
        editJson(join(dir, "config.json"), (config) => {
          const a2d = config.a2d as { decoding: Record<string, unknown> };
          return { ...config, a2d: { ...a2d, decoding: { ...a2d.decoding, remasking: "verify", lookup_ngram: 3 } } };
        }),
      /config\.json: a2d\.decoding\.remasking is "verify"; it must be one of 'low_confidence', 'random', 'leftmost' .*a2d_convert redecode --model .* --remasking low_confidence[\s\S]*a2d\.decoding\.lookup_ngram is not a decoding parameter the engine reads/,
    ],
  ];

  it.each(brokenModels)("a model folder with %s: refused before anything is written, the file and the fix named", (name, breakIt, message) => {
    const dir = join(work, `broken-${name.replace(/\W+/g, "-")}`);
    execFileSync("cp", ["-r", model, dir]);
    breakIt(dir);
    // No lineage.json: nothing else would notice.
    expect(existsSync(join(dir, "lineage.json"))).toBe(false);
    const target = join(work, "from-broken");
    const stderr = refuse(["--model", dir, "--out", target]);
    expect(stderr).toMatch(/would not load; nothing was written/);
    expect(stderr).toMatch(message);
    expect(existsSync(target)).toBe(false);
    expect(leftovers("from-broken")).toEqual([]);
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
