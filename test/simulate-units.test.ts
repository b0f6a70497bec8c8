// The simulator's parts that need no packed folder: the Node network guard in a real process, the strace
// reader, the GPU figures and their scaling, the serve.sh and config scanners, and the sm_90 check on real
// nvcc fat binaries.
import { spawnSync } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { afterAll, describe, expect, it } from "vitest";

import { renderServeScript } from "../pack/serve-script.js";
import { ESTIMATES, loadFigures, parseFigures, predictGpuPhases } from "../simulate/figures.js";
import { describeRange, diskRead, HOST_SPREAD, predictionRange, SLOW_DISK_MBPS, spreadOf } from "../simulate/prediction.js";
import { checkCudaCode, fatbinEntries, scanConfigs, scanServeScript } from "../simulate/static-checks.js";
import { parseStrace } from "../simulate/strace.js";
import { ensureDistFresh } from "./pack-build.js";
import { ROOT } from "./server-harness.js";

const work = mkdtempSync(join(tmpdir(), "a2d-simulate-units-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));
const FIXTURES = join(import.meta.dirname, "simulate-fixtures");
const FLOORS = { glibc: "2.28", glibcxx: "3.4.21", cxxabi: "1.3.9", libgcc: "3.4", cuda_toolkit: "12.4.131", cuda_runtime: "12.9.79", nvidia_driver: "525.60.13", compute_capability: "9.0" };

describe("the Node guard", () => {
  it("refuses outbound sockets and lookups, records them, and lets loopback through", () => {
    ensureDistFresh();
    const report = join(work, "guard.jsonl");
    const script = `
import net from "node:net";
import dns from "node:dns";
const outcome = {};
const attempt = async (name, fn) => { try { await fn(); outcome[name] = "allowed"; } catch (e) { outcome[name] = e.code ?? e.message; } };
await attempt("tcp", () => net.connect(443, "203.0.113.7"));
await attempt("lookup", () => dns.promises.lookup("example.com"));
await attempt("fetch", () => fetch("http://203.0.113.7/").catch((e) => { throw e.cause ?? e; }));
const server = net.createServer((s) => s.end("hi")).listen(0, "127.0.0.1");
await new Promise((r) => server.once("listening", r));
await attempt("loopback", () => new Promise((resolve, reject) => {
  const socket = net.connect(server.address().port, "127.0.0.1", () => { socket.end(); resolve(); });
  socket.on("error", reject);
}));
server.close();
console.log(JSON.stringify(outcome));
`;
    const run = spawnSync(process.execPath, ["--import", join(ROOT, "dist/simulate/guard.js"), "--input-type=module", "-e", script], {
      env: { ...process.env, A2D_GUARD_REPORT: report },
      encoding: "utf8",
      timeout: 30_000,
    });
    expect(run.status, run.stderr).toBe(0);
    expect(JSON.parse(run.stdout)).toEqual({ tcp: "A2D_OFFLINE", lookup: "A2D_OFFLINE", fetch: "A2D_OFFLINE", loopback: "allowed" });
    const events = readFileSync(report, "utf8").trim().split("\n").map((l) => JSON.parse(l));
    expect(events[0].kind).toBe("preload");
    expect(events.filter((e) => e.kind === "network").map((e) => `${e.api} ${e.target}`)).toEqual([
      "net connect 203.0.113.7:443",
      "dns.promises.lookup example.com",
      "net connect 203.0.113.7:80",
    ]);
  });
});

describe("the strace reader", () => {
  it("joins resumed calls, follows cwd, fchdir and directory fds across forks, and reads addresses", () => {
    const log = [
      `100 10.000001 execve("/bin/bash", ["bash", "/f/serve.sh"], 0x7ffc /* 5 vars */) = 0`,
      `100 10.100000 chdir("/f") = 0`,
      `100 10.200000 clone(child_stack=NULL, flags=CLONE_CHILD_CLEARTID|SIGCHLD) = 101`,
      `101 10.300000 openat(AT_FDCWD, "model/config.json", O_RDONLY|O_CLOEXEC) = 3`,
      `101 10.310000 openat(AT_FDCWD, "/home/u", O_RDONLY|O_DIRECTORY) = 4`,
      `101 10.320000 mkdirat(4, ".cache", 0777) = 0`,
      `101 10.330000 fchdir(4) = 0`,
      `101 10.340000 mkdir("a2d", 0777) = -1 EEXIST (File exists)`,
      `101 10.350000 openat(AT_FDCWD, "log.txt", O_WRONLY|O_CREAT|O_TRUNC, 0666) = 5`,
      // Empty names touch nothing: the kernel refuses them with ENOENT.
      `101 10.360000 unlink("") = -1 ENOENT (No such file or directory)`,
      `101 10.370000 openat(AT_FDCWD, "", O_RDWR|O_CREAT, 0600) = -1 ENOENT (No such file or directory)`,
      `101 10.400000 connect(6, {sa_family=AF_INET, sin_port=htons(53), sin_addr=inet_addr("10.0.0.2")}, 16 <unfinished ...>`,
      `100 10.410000 listen(7, 511) = 0`,
      `101 10.420000 <... connect resumed>) = -1 ENETUNREACH (Network is unreachable)`,
      `101 10.430000 connect(8, {sa_family=AF_INET6, sin6_port=htons(443), sin6_flowinfo=htonl(0), inet_pton(AF_INET6, "2001:db8::1", &sin6_addr), sin6_scope_id=0}, 28) = -1 ENETUNREACH (Network is unreachable)`,
    ].join("\n");
    const events = parseStrace(log, "/start");
    expect(events).toEqual([
      { kind: "exec", pid: 100, t: 10.000001, path: "/bin/bash", argv: ["bash", "/f/serve.sh"], ok: true },
      { kind: "spawn", pid: 100, t: 10.2, child: 101 },
      { kind: "open", pid: 101, t: 10.3, path: "/f/model/config.json", name: "model/config.json", write: false, flags: "O_RDONLY|O_CLOEXEC", ok: true },
      { kind: "open", pid: 101, t: 10.31, path: "/home/u", name: "/home/u", write: false, flags: "O_RDONLY|O_DIRECTORY", ok: true },
      { kind: "modify", pid: 101, t: 10.32, call: "mkdirat", path: "/home/u/.cache", name: ".cache", ok: true },
      { kind: "modify", pid: 101, t: 10.34, call: "mkdir", path: "/home/u/a2d", name: "a2d", ok: false, errno: "EEXIST" },
      { kind: "open", pid: 101, t: 10.35, path: "/home/u/log.txt", name: "log.txt", write: true, flags: "O_WRONLY|O_CREAT|O_TRUNC", ok: true },
      { kind: "listen", pid: 100, t: 10.41 },
      { kind: "net", pid: 101, t: 10.4, call: "connect", family: "AF_INET", address: "10.0.0.2", port: 53, ok: false },
      { kind: "net", pid: 101, t: 10.43, call: "connect", family: "AF_INET6", address: "2001:db8::1", port: 443, ok: false },
    ]);
  });
});

const h200 = {
  gpu: "NVIDIA H200",
  hbm_TBps: 4.8,
  command: "bench",
  model: { num_layers: 42, weight_bytes: 5e9 },
  context_s: 0.5,
  upload_GBps: 20,
  graph_capture_s: 1.2,
  warmup_s: 0.4,
};
const notes = `# notes\n\n\`\`\`a2d-startup-figures\n${JSON.stringify({ schema: 1, cards: { h200 } }, null, 2)}\n\`\`\`\n`;

describe("GPU figures", () => {
  it("reads the last block and scales its figures to the folder's model and the target card", async () => {
    expect(parseFigures(notes, "NOTES.md")?.cards.h200).toEqual(h200);
    const file = join(work, "NOTES.md");
    writeFileSync(file, notes);
    const own = await loadFigures(file, "h200");
    expect(own.kind).toBe("predicted");
    const phases = predictGpuPhases(own, "h200", 10e9, 21);
    expect(phases.map((p) => [p.name, Number(p.seconds.toFixed(6))])).toEqual([
      ["cuda context", 0.5],
      ["weights upload", 0.5], // 10 GB at 20 GB/s
      ["graph capture", 0.6], // half the layers
      ["warm-up", 0.8], // twice the weights, same card
    ]);
    const other = await loadFigures(file, "h100");
    expect(other.description).toMatch(/no h100 entry/);
    const warmup = predictGpuPhases(other, "h100", 5e9, 42).find((p) => p.name === "warm-up")!;
    expect(warmup.seconds).toBeCloseTo((0.4 * 4.8) / 3.35, 6); // slower memory, longer warm-up
  });

  it("falls back to labelled conservative estimates, and rejects a malformed block naming the field", async () => {
    const none = await loadFigures(join(work, "absent.md"), "h100");
    expect(none.kind).toBe("estimate");
    expect(none.description).toMatch(/CONSERVATIVE ESTIMATES/);
    const total = predictGpuPhases(none, "h100", 5.03e9, 42).reduce((sum, p) => sum + p.seconds, 0);
    expect(total).toBeCloseTo(ESTIMATES.context_s + 5.03 / ESTIMATES.upload_GBps + 0.25 * 42 + ESTIMATES.warmup_s * 1.006, 3);
    expect(() => parseFigures(notes.replace('"upload_GBps": 20', '"upload_GBps": "fast"'), "NOTES.md")).toThrow(/cards\.h200\.upload_GBps/);
  });
  it("gives every predicted term its uncertainty: tight on the card measured, wider scaled to another, widest for estimates", async () => {
    const file = join(work, "NOTES-spread.md");
    writeFileSync(file, notes);
    const spreads = async (gpu: "h100" | "h200", path = file) =>
      Object.fromEntries(predictGpuPhases(await loadFigures(path, gpu), gpu, 5e9, 42).map((p) => [p.name, [p.spread.low, p.spread.high]]));
    expect(await spreads("h200")).toEqual({ "cuda context": [0.8, 1.25], "weights upload": [0.8, 1.25], "graph capture": [0.8, 1.25], "warm-up": [0.8, 1.25] });
    expect(await spreads("h100")).toEqual({ "cuda context": [0.7, 1.5], "weights upload": [0.5, 1.5], "graph capture": [0.7, 1.5], "warm-up": [0.7, 1.5] });
    expect(Object.values(await spreads("h100", join(work, "absent.md")))).toEqual(Array(4).fill([0.1, 1]));
  });
});

describe("the prediction's range", () => {
  const weights = 5.03e9; // the 2B shape

  it("reads the weights at the given disk rate, or from the rate measured here down to a slow disk", () => {
    expect(diskRead(weights, { givenMBps: 50 })).toMatchObject({ kind: "given", seconds: 100.6, low_s: 100.6, high_s: 100.6 });
    expect(diskRead(weights, { measuredMBps: 900 })).toMatchObject({ kind: "measured", seconds: 5.589, low_s: 5.589, high_s: weights / 1e6 / SLOW_DISK_MBPS });
    // A disk measured slower than the slow-end assumption is its own slow end.
    expect(diskRead(weights, { measuredMBps: 40 })).toMatchObject({ low_s: 125.75, high_s: 125.75 });
    expect(diskRead(1e6, {})).toMatchObject({ kind: "estimate", seconds: 0.01 });
  });

  it("sums the low and the high ends, judges the budget at the slow end, and names the slowest disk that still fits", async () => {
    const file = join(work, "NOTES-range.md");
    writeFileSync(file, notes);
    const gpu = predictGpuPhases(await loadFigures(file, "h100"), "h100", weights, 42).map((p) => spreadOf(p.seconds, p.spread));
    const host = spreadOf(2, HOST_SPREAD);
    expect(host).toMatchObject({ low_s: 1, high_s: 4 });
    const counted = [host, ...gpu];
    const read = diskRead(weights, { measuredMBps: 900 });
    const range = predictionRange(counted, read, weights, 300);
    const sum = (key: "low_s" | "high_s") => counted.reduce((s, p) => s + p[key], 0) + read[key];
    expect(range.low_s).toBeCloseTo(sum("low_s"), 2);
    expect(range.high_s).toBeCloseTo(sum("high_s"), 2);
    expect(range).toMatchObject({ holds_at_slow_end: true, holds_at_fast_end: true });
    // At exactly the slowest rate it names, the slow end lands on the budget.
    expect(predictionRange(counted, diskRead(weights, { givenMBps: range.slowest_disk_MBps! }), weights, 300).high_s).toBeCloseTo(300, 0);
    expect(describeRange(range, 300)).toMatch(/^\d+\.\d–\d+\.\d s: the 300 s budget holds at the slow end; it holds for cold reads down to \d+(\.\d+)? MB\/s$/);

    // A budget between the ends: over at the slow end, which is what counts.
    const tight = predictionRange(counted, read, weights, (range.low_s + range.high_s) / 2);
    expect(tight).toMatchObject({ holds_at_slow_end: false, holds_at_fast_end: true });
    expect(describeRange(tight, 40)).toMatch(/holds at the fast end only: over at the slow end/);
    const hopeless = predictionRange(counted, read, weights, range.low_s / 2);
    expect(describeRange(hopeless, 1)).toMatch(/over the 1 s budget even at the fast end; no disk is fast enough/);
  });
});

describe("static checks", () => {
  it("the packer's own serve.sh passes the serve.sh scan, with and without the CUDA engine", async () => {
    for (const hasCuda of [true, false]) {
      const folder = join(work, `serve-${hasCuda}`);
      mkdirSync(folder, { recursive: true });
      const script = renderServeScript({
        defaultDevice: hasCuda ? "cuda" : "cpu",
        hasCuda,
        requiredFiles: ["runtime/bin/node", "model/model.safetensors"],
        a2dVersion: "0.0.0",
        modelName: "m",
        floors: FLOORS,
      });
      writeFileSync(join(folder, "serve.sh"), script);
      expect(await scanServeScript(folder)).toEqual([]);
      const syntax = spawnSync("bash", ["-n", join(folder, "serve.sh")], { encoding: "utf8" });
      expect(syntax.status, syntax.stderr).toBe(0);
    }
  });

  it("names network tools, compilers and host paths in serve.sh, and host paths in configs", async () => {
    const folder = join(work, "bad");
    mkdirSync(join(folder, "model"), { recursive: true });
    writeFileSync(
      join(folder, "serve.sh"),
      [
        "#!/usr/bin/env bash",
        "# curl in a comment is fine: https://example.com",
        'wget -q "https://huggingface.co/x" || true',
        'if true; then pip install torch; fi',
        'nvcc -o "$TMPDIR/k" k.cu',
        'export LD_LIBRARY_PATH="/usr/local/cuda/lib64:$DIR/runtime/lib"',
        '[[ -e /dev/nvidiactl ]] && echo "$DIR/engine/a2d_cuda.node"',
      ].join("\n"),
    );
    const problems = await scanServeScript(folder);
    expect(problems.map((p) => `${p.cause}: ${p.detail.split(":")[0]}`)).toEqual([
      "network: serve.sh line 3 calls the network (wget)",
      "network: serve.sh line 4 calls the network (pip)",
      "compile: serve.sh line 5 runs a compiler at start (nvcc)",
      "host-path: serve.sh line 6 points outside the folder at /usr/local/cuda/lib64, which a fresh machine does not have",
    ]);
    writeFileSync(join(folder, "model", "config.json"), JSON.stringify({ _name_or_path: "/home/me/models/base", a2d: { mask_token: "<|mask|>" } }));
    expect(await scanConfigs(folder)).toEqual([{ cause: "host-path", detail: 'model/config.json: "_name_or_path" points outside the folder at /home/me/models/base' }]);
  });

  it("reads real nvcc fat binaries: sm_90 machine code passes, PTX only is a start-time compile", async () => {
    const fat = fatbinEntries(readFileSync(join(FIXTURES, "fat_sm90_sm80_ptx90.o")));
    expect(fat).toEqual([
      { kind: "sass", sm: 90 },
      { kind: "sass", sm: 80 },
      { kind: "ptx", sm: 90 },
      { kind: "sass", sm: 90 },
      { kind: "sass", sm: 80 },
    ]);
    expect(fatbinEntries(readFileSync(join(FIXTURES, "ptx_only_80.o")))).toEqual([{ kind: "ptx", sm: 80 }]);
    expect(fatbinEntries(readFileSync(process.execPath))).toBeNull();

    const folder = join(work, "cuda");
    mkdirSync(join(folder, "engine"), { recursive: true });
    copyFileSync(join(FIXTURES, "fat_sm90_sm80_ptx90.o"), join(folder, "engine", "a2d_cuda.node"));
    const good = await checkCudaCode(folder, "engine/a2d_cuda.node");
    expect(good.problems).toEqual([]);
    expect(good.summary).toBe("engine/a2d_cuda.node: machine code for sm_80, sm_90; PTX for compute_90");
    copyFileSync(join(FIXTURES, "ptx_only_80.o"), join(folder, "engine", "a2d_cuda.node"));
    const ptx = await checkCudaCode(folder, "engine/a2d_cuda.node");
    expect(ptx.problems).toHaveLength(1);
    expect(ptx.problems[0]!.cause).toBe("compile");
    expect(ptx.problems[0]!.detail).toMatch(/no sm_90 machine code, so the driver JIT-compiles PTX/);
  });
});
