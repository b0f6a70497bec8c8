// `a2d simulate-startup`: runs a packed folder's own serve.sh as cold and as cut off as this machine allows,
// names everything that would break a start on a fresh offline GPU machine, measures the phases it can
// run here and predicts the GPU ones (docs/cold-start.md).
import { execa } from "execa";
import { existsSync } from "node:fs";
import { chmod, copyFile, mkdir, mkdtemp, readdir, readFile, realpath, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { compareVersions } from "../pack/elf.js";
import { cudaFloorProblems, type Floors, folderFloors, formatFloors } from "../pack/floors.js";
import { listFolder, type Manifest, readManifest } from "../pack/manifest.js";
import { formatBytes } from "../pack/progress.js";
import { type GpuName, loadFigures, type PhaseKind, predictGpuPhases } from "./figures.js";
import type { InnerJob, InnerResult, StreamProbe } from "./inner.js";
import { evict, measureDiskRate, residentBytes } from "./page-cache.js";
import { describeRange, diskRead, HOST_SPREAD, predictionRange, type PredictionRange, type Ranged, spreadOf } from "./prediction.js";
import { BARE_PROGRAMS, handToSandboxUser, insideCommand, sandboxArgs } from "./sandbox.js";
import { listensOnAllAddresses } from "./sockets.js";
import { checkCudaCode, checkLibraries, checkManifest, checkPermissions, type Problem, scanConfigs, scanServeScript } from "./static-checks.js";
import { parseStrace, type StraceEvent, TRACED_SYSCALLS } from "./strace.js";

const HERE = fileURLToPath(new URL(".", import.meta.url));
const PROJECT_ROOT = fileURLToPath(new URL("../../", import.meta.url));

export interface SimulateOptions {
  folder: string;
  budgetS?: number;
  gpu?: GpuName;
  figuresPath?: string;
  /** The target's cold disk read rate, MB/s: the weights read is predicted at it instead of the rate measured here. */
  diskMBps?: number;
  /** Where a GPU exists: also start on it and time the first 200. */
  gpuRun?: boolean;
  log?: (line: string) => void;
}

export interface Phase extends Ranged {
  name: string;
  kind: PhaseKind;
  /** False for measured phases the GPU start replaces (the CPU backend's weights and first forward). */
  counted: boolean;
}

export interface Isolation {
  network_namespace: boolean;
  empty_environment: true;
  strace: boolean;
  guard: boolean;
  page_cache_evicted: boolean;
  eviction: string;
  weights_resident_after_eviction_bytes: number | null;
}

export interface GpuRun {
  ready_s: number | null;
  health: unknown;
  problems: Problem[];
}

export interface SimulationReport {
  verdict: "pass" | "fail";
  /** Measured from the folder's ELF files, with the CUDA ones MANIFEST.json recorded. */
  floors: Floors;
  folder: string;
  budget_s: number;
  gpu: GpuName;
  folder_device: "cuda" | "cpu";
  figures: string;
  isolation: Isolation;
  backend_run: "cpu" | "cuda";
  measured_ready_s: number | null;
  predicted_ready_s: number | null;
  /** The prediction's range (each counted phase at the low, then the high end of its uncertainty), judged against the budget. */
  predicted_range: PredictionRange | null;
  disk_read_MBps: number | null;
  weights_bytes: number;
  first_chat_s: number | null;
  phases: Phase[];
  problems: Problem[];
  notes: string[];
  gpu_run?: GpuRun;
  /** A CPU-only folder: what the same start would take with the CUDA engine packed (host phases + GPU phases). */
  cuda_prediction?: { predicted_ready_s: number; range: PredictionRange; phases: Phase[] };
  server_log_tail: string;
}

const PATH_DIRS = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"];
const COMPILER = /^(nvcc|ptxas|cicc|nvlink|fatbinary|cudafe\+\+|cc|gcc|g\+\+|c\+\+|cc1|cc1plus|collect2|as|ld|ld\.\w+|clang|clang\+\+|make|cmake|ninja|node-gyp|cargo|rustc|go)(-[\d.]+)?$/;

function isLoopback(address: string): boolean {
  return /^127\./.test(address) || address === "::1" || /^::ffff:127\./.test(address) || address === "0.0.0.0" || address === "::";
}

async function which(program: string): Promise<string | null> {
  for (const dir of (process.env.PATH ?? "").split(":").concat(PATH_DIRS)) {
    if (dir && existsSync(join(dir, program))) return join(dir, program);
  }
  return null;
}

interface RunOutcome {
  inner: InnerResult | null;
  innerError: string | null;
  events: StraceEvent[];
  guard: Array<Record<string, unknown>>;
  log: string;
  port: number;
}

interface RunSetup {
  folder: string;
  sandbox: string;
  device: "cpu" | "cuda";
  deadlineS: number;
  budgetS: number;
  /** Predicted seconds this run cannot measure (GPU phases, cold read); see InnerJob.extraS. */
  extraS: number;
  strace: string | null;
  bwrap: string | null;
  label: string;
  longTokens: number;
}

/** A port of the simulator's choosing, as the grader picks one: a serve.sh that ignores $PORT is caught. */
function pickPort(): number {
  return 20000 + Math.floor(Math.random() * 40000);
}

async function runServe(setup: RunSetup): Promise<RunOutcome> {
  const dir = join(setup.sandbox, setup.label);
  const home = join(dir, "home");
  const tmp = join(dir, "tmp");
  const instrument = join(dir, "instrument");
  for (const d of [home, tmp, instrument]) await mkdir(d, { recursive: true });
  // A .mjs copy: the guard is ESM and must not depend on a package.json around it.
  const guardFile = join(instrument, "guard.mjs");
  await copyFile(join(HERE, "guard.js"), guardFile);
  await chmod(guardFile, 0o644);
  const guardReport = join(instrument, "guard.jsonl");
  const straceLog = join(setup.sandbox, `${setup.label}-strace.log`);
  const outputFile = join(setup.sandbox, `${setup.label}-server.log`);
  await handToSandboxUser([home, tmp, instrument]);
  const port = pickPort();

  const env = {
    HOME: home,
    TMPDIR: tmp,
    PATH: "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
    PORT: String(port),
    A2D_DEVICE: setup.device,
    NODE_OPTIONS: `--import=${guardFile}`,
    A2D_GUARD_REPORT: guardReport,
  };
  const start = ["/bin/bash", join(setup.folder, "serve.sh")];
  const serve = setup.bwrap
    ? [setup.bwrap, ...(await sandboxArgs({ folder: setup.folder, home, tmp, instrument, etc: join(dir, "etc") }, env, setup.device === "cuda")), ...insideCommand(), ...start]
    : ["/usr/bin/env", "-i", ...Object.entries(env).map(([k, v]) => `${k}=${v}`), ...start];
  const command = setup.strace
    ? [setup.strace, "-f", "--seccomp-bpf", "-ttt", "-qq", "-s", "512", "-e", `trace=${TRACED_SYSCALLS.join(",")}`, "-o", straceLog, ...serve]
    : serve;
  // Started from a directory that is neither the folder nor its parent: serve.sh must work from any cwd.
  const job: InnerJob = {
    command,
    cwd: tmp,
    port,
    deadlineS: setup.deadlineS,
    extraS: setup.extraS,
    budgetS: setup.budgetS,
    guardReport,
    outputFile,
    longTokens: setup.longTokens,
  };
  const unshare = process.getuid?.() === 0 ? ["unshare", "--net", "--"] : ["unshare", "--map-root-user", "--net", "--"];
  const result = await execa(unshare[0]!, [...unshare.slice(1), process.execPath, join(HERE, "inner.js"), JSON.stringify(job)], {
    reject: false,
    timeout: (setup.deadlineS + 900) * 1000,
    all: true,
  });
  let inner: InnerResult | null = null;
  let innerError: string | null = null;
  try {
    inner = JSON.parse(result.stdout.trim().split("\n").pop() ?? "") as InnerResult;
  } catch {
    innerError = `the namespace runner failed (exit ${result.exitCode}): ${(result.all ?? "").slice(-2000)}`;
  }
  const read = (file: string) => readFile(file, "utf8").catch(() => "");
  const guard = (await read(guardReport))
    .split("\n")
    .filter(Boolean)
    .map((line) => JSON.parse(line) as Record<string, unknown>);
  return { inner, innerError, events: payloadEvents(parseStrace(await read(straceLog), tmp), setup.folder), guard, log: await read(outputFile), port };
}

/**
 * The events of the start itself: from the exec of serve.sh on, of every process but the harness's own
 * (bwrap's monitor and its init, which ran before it). What the harness does (setpriv, bwrap's mounts) is
 * not the folder's doing.
 */
function payloadEvents(events: StraceEvent[], folder: string): StraceEvent[] {
  const serveScript = join(folder, "serve.sh");
  const launch = events.find((e) => e.kind === "exec" && e.ok && /(^|\/)bash$/.test(e.path) && e.argv.includes(serveScript));
  if (!launch) return events;
  const harness = new Set(events.filter((e) => e.t < launch.t && e.pid !== launch.pid).map((e) => e.pid));
  return events.filter((e) => e.t >= launch.t && !harness.has(e.pid));
}

/** The program each traced pid (or thread) was running: its own last exec, else its parent's. */
function programOf(events: StraceEvent[]): (pid: number, t: number) => string {
  const parent = new Map<number, number>();
  const execs = new Map<number, Array<{ t: number; path: string }>>();
  for (const e of events) {
    if (e.kind === "spawn") parent.set(e.child, e.pid);
    if (e.kind === "exec" && e.ok) execs.set(e.pid, [...(execs.get(e.pid) ?? []), { t: e.t, path: e.path }]);
  }
  return (pid, t) => {
    for (let p: number | undefined = pid, hops = 0; p !== undefined && hops < 64; p = parent.get(p), hops++) {
      const last = (execs.get(p) ?? []).filter((x) => x.t <= t).pop();
      if (last) return last.path;
    }
    return `pid ${pid}`;
  };
}

function judgeRun(outcome: RunOutcome, folder: string, sandbox: string, label: string, budgetS: number, missingFromManifest: Set<string>): Problem[] {
  const problems: Problem[] = [];
  const add = (problem: Problem) => {
    if (!problems.some((p) => p.cause === problem.cause && p.detail === problem.detail)) problems.push(problem);
  };
  const program = programOf(outcome.events);
  const home = join(sandbox, label, "home");
  const allowedWrite = [join(folder, "state"), join(sandbox, label, "tmp"), join(sandbox, label, "instrument"), "/dev", "/proc", "/sys"];
  const inside = (path: string, dir: string) => path === dir || path.startsWith(`${dir}/`);
  const missingOutside: string[] = [];

  for (const e of outcome.events) {
    if (e.kind === "net" && (e.family === "AF_INET" || e.family === "AF_INET6")) {
      if (!isLoopback(e.address) || e.port === 53) {
        const what = e.port === 53 ? "a DNS query" : "a connection";
        add({ cause: "network", detail: `${basename(program(e.pid, e.t))} made ${what} to ${e.address}:${e.port} (${e.call})` });
      }
    } else if (e.kind === "exec") {
      const name = basename(e.path);
      if (COMPILER.test(name) || /\/triton\//.test(e.path)) {
        add({ cause: "compile", detail: `${e.path} ran at start (${e.argv.slice(0, 6).join(" ")}): a start must not compile anything` });
      } else if (e.ok && !inside(e.path, folder) && !BARE_PROGRAMS.has(name)) {
        add({ cause: "host-path", detail: `runs ${e.path} (${e.argv.slice(0, 4).join(" ")}), which a fresh machine may not have` });
      } else if (!e.ok && !inside(e.path, folder) && !BARE_PROGRAMS.has(name) && e.path.startsWith("/")) {
        missingOutside.push(e.path);
      }
    } else if ((e.kind === "open" && e.write) || e.kind === "modify") {
      if (e.kind === "modify" && e.errno === "EEXIST") continue; // mkdir -p of a directory that is there
      const path = e.path;
      if (allowedWrite.some((dir) => inside(path, dir))) {
        if (inside(path, join(folder, "state", "cuda-cache")) && e.kind === "open") {
          add({ cause: "compile", detail: `the CUDA JIT cache was written (${path}): the driver compiled PTX at start` });
        }
        continue;
      }
      if (/\/\.nv\/ComputeCache\b/.test(path) || /\/\.triton\//.test(path)) {
        add({ cause: "compile", detail: `a JIT compile cache was written at ${path}` });
      } else {
        const where = inside(path, home) ? "HOME" : inside(path, folder) ? "the folder (only state/ may change)" : "the host";
        add({
          cause: "write-outside",
          // The call as made (its name argument too where it was relative), so a report says exactly what ran.
          detail: `${basename(program(e.pid, e.t))} ${e.ok ? "wrote" : "tried to write"} ${path} in ${where}` +
            ` (${e.kind === "open" ? `open ${e.flags}` : e.call}${e.name === path ? "" : ` ${JSON.stringify(e.name)}`}` +
            `${e.ok ? "" : `: ${e.errno}`})`,
        });
      }
    } else if (e.kind === "open" && !e.ok && (e.errno === "EACCES" || e.errno === "EPERM") && inside(e.path, folder)) {
      add({
        cause: "permissions",
        detail: `${basename(program(e.pid, e.t))} could not read ${e.path.slice(folder.length + 1)} (${e.errno}) as an unprivileged user: the folder must be readable by everyone (chmod -R a+rX, or pack again: the packer sets the modes)`,
      });
    } else if (e.kind === "open" && !e.ok && e.errno === "ENOENT") {
      const rel = e.path.slice(folder.length + 1);
      if (inside(e.path, folder) && missingFromManifest.has(rel)) {
        add({ cause: "missing-file", detail: `the start needs ${rel} (opened by ${basename(program(e.pid, e.t))}), which is missing` });
      } else if (!inside(e.path, folder) && !/^\/(proc|sys|dev)\//.test(e.path) && !/\.so(\.[\d.]+)?$|\/glibc-hwcaps\/|\/tls\/|\/haswell\/|\/x86_64\//.test(e.path)) {
        missingOutside.push(e.path);
      }
    }
  }
  for (const g of outcome.guard) {
    if (g.kind === "network") {
      const frame = String(g.stack ?? "").split("\n").find((l) => l.includes("/")) ?? "";
      add({ cause: "network", detail: `the server called ${String(g.api)} to ${String(g.target)} (Node guard)${frame ? ` at ${frame.trim()}` : ""}` });
    }
  }
  for (const line of outcome.log.split("\n")) {
    const missingPackage = /Cannot find (?:package|module) '([^']+)'/.exec(line);
    if (missingPackage) add({ cause: "missing-module", detail: `the server cannot import ${missingPackage[1]}: ${line.trim().slice(0, 300)}` });
    const notFound = /line (\d+): ([^:]+): (?:command not found|No such file or directory)/.exec(line);
    if (notFound) add({ cause: "host-path", detail: `serve.sh line ${notFound[1]} runs ${notFound[2]}, which this (bare) machine does not have` });
    const serveMissing = /^serve\.sh: (.+ is missing: .*)$/.exec(line.trim());
    if (serveMissing) add({ cause: "missing-file", detail: serveMissing[1]! });
  }
  const inner = outcome.inner;
  if (!inner) {
    add({ cause: "isolation", detail: outcome.innerError ?? "the namespace runner gave no result" });
    return problems;
  }
  if (!inner.loopbackUp) add({ cause: "isolation", detail: "could not bring loopback up in the network namespace (`ip link set lo up`)" });
  const logLines = outcome.log.trim().split("\n");
  // The first error line names the cause; a stack trace's last lines only say where Node gave up.
  const firstError =
    logLines.find((l) => /^\s*\w*Error( \[\w+\])?: |"level":(50|60)|^serve\.sh: (?!starting)/.test(l)) ??
    logLines.find((l) => /Error/.test(l));
  const tail = (firstError ?? logLines.slice(-3).join(" | ")).trim().slice(0, 600);
  const marks = milestones(outcome.events, inner, folder);
  const last = marks[marks.length - 1];
  const reached = last ? `the last phase reached: ${last.name}, ${(last.t - inner.launchT).toFixed(1)} s after launch` : "no phase reached";
  const listen = judgeListening(inner, outcome.port);
  if (inner.readyT === null) {
    if (inner.stoppedOverPrediction) {
      const { atS, countedS } = inner.stoppedOverPrediction;
      add({
        cause: "over-budget",
        detail: `stopped waiting after ${atS.toFixed(1)} s (${label} backend): ${countedS.toFixed(1)} s of counted start so far plus the predicted phases still to come already exceed the ${budgetS} s budget (${reached})`,
      });
    } else if (inner.timedOut) {
      add({ cause: "over-budget", detail: `/health did not turn 200 within the ${budgetS} s budget (${label} backend; ${reached}): ${tail}` });
    } else if (inner.exited) {
      add({ cause: "start-failed", detail: `serve.sh exited (code ${inner.exited.code ?? inner.exited.signal}) before /health turned 200 (${reached}): ${tail}` });
    }
    if (listen) add(listen);
    if (missingOutside.length > 0) {
      add({ cause: "host-path", detail: `the start looked for paths outside the folder that a bare machine does not have: ${[...new Set(missingOutside)].slice(0, 6).join(", ")}` });
    }
  } else {
    if (listen) add(listen);
    for (const problem of judgeChats(inner)) add(problem);
  }
  return problems;
}

/** The grader connects from outside the machine: the server must listen on $PORT on every address. */
function judgeListening(inner: InnerResult, port: number): Problem | null {
  const onPort = inner.listening.filter((l) => l.port === port);
  const others = inner.listening.filter((l) => l.port !== port).map((l) => `${l.address}:${l.port}`);
  if (onPort.length === 0) {
    if (others.length === 0) return null; // nothing listening: the start failed, reported above
    return { cause: "listen", detail: `serve.sh was started with PORT=${port}, but the server listens on ${others.join(", ")}: serve.sh must pass $PORT to the server` };
  }
  if (onPort.some((l) => listensOnAllAddresses(l.address))) return null;
  return {
    cause: "listen",
    detail: `the server listens on ${onPort.map((l) => `${l.address}:${l.port}`).join(", ")} only: nothing outside this machine can reach it; listen on 0.0.0.0 (A2D_HOST)`,
  };
}

type Chunk = { id?: string; object?: string; choices?: Array<{ delta?: { content?: string | null }; finish_reason?: string | null }>; usage?: { completion_tokens?: number } | null };

function streamProblems(stream: StreamProbe): string[] {
  const chunks = stream.chunks as Chunk[];
  const ids = new Set(chunks.map((c) => c.id));
  const text = chunks.map((c) => c.choices?.[0]?.delta?.content ?? "").join("");
  return [
    ...(stream.status !== 200 ? [`HTTP ${stream.status}`] : []),
    ...(chunks.some((c) => c.object !== "chat.completion.chunk") ? ["a chunk is not a chat.completion.chunk"] : []),
    ...(stream.malformed.length > 0 ? [`malformed data lines: ${stream.malformed.slice(0, 2).join(" | ")}`] : []),
    ...(stream.done ? [] : ["no data: [DONE] at the end"]),
    ...(ids.size > 1 ? ["chunks carry different ids"] : []),
    ...(chunks.some((c) => c.choices?.some((ch) => typeof ch.finish_reason === "string")) ? [] : ["no chunk has a finish_reason"]),
    ...(chunks.some((c) => typeof c.usage?.completion_tokens === "number") ? [] : ["stream_options.include_usage gave no usage chunk"]),
    ...(text.length === 0 ? ["the streamed answer is empty"] : []),
  ];
}

function judgeChats(inner: InnerResult): Problem[] {
  const problems: Problem[] = [];
  const failed = (what: string, chat: { status: number; body: unknown } | null) =>
    chat === null
      ? `${what} was not sent`
      : chat.status !== 200 || !chatAnswered(chat.body)
        ? `${what} failed (HTTP ${chat.status}): ${JSON.stringify(chat.body).slice(0, 300)}`
        : null;
  for (const [what, chat] of [
    ["the first chat request", inner.chat],
    [`a long answer (max_tokens ${inner.maxTokensAsked ?? "?"}, non-stream)`, inner.longChat],
  ] as const) {
    const problem = failed(what, chat);
    if (problem) problems.push({ cause: "chat", detail: `ready, but ${problem}` });
  }
  if (inner.chat?.status === 200) {
    const issues = inner.stream ? streamProblems(inner.stream) : ["not sent"];
    if (issues.length > 0) problems.push({ cause: "chat", detail: `ready, but the streamed long answer (max_tokens ${inner.maxTokensAsked ?? "?"}) is broken: ${issues.join("; ")}` });
  }
  return problems;
}

/** An answer, or (content null, as OpenAI writes it) a completion that was all reasoning within its budget. */
function chatAnswered(body: unknown): boolean {
  const message = (body as { choices?: Array<{ message?: { content?: unknown; reasoning_content?: unknown } }> } | null)?.choices?.[0]?.message;
  return typeof message?.content === "string" || (message?.content === null && typeof message.reasoning_content === "string");
}

interface Milestone {
  name: string;
  t: number;
}

function milestones(events: StraceEvent[], inner: InnerResult, folder: string): Milestone[] {
  const node = join(folder, "runtime", "bin", "node");
  const serverExec = events.find((e) => e.kind === "exec" && e.path === node && e.argv.some((a) => a.endsWith("app/dist/cli/main.js")));
  const list: Milestone[] = [{ name: "shell", t: inner.launchT }];
  if (!serverExec) return list;
  list.push({ name: "node start", t: serverExec.t });
  const after = events.filter((e) => e.t >= serverExec.t);
  const firstOpen = (test: (path: string) => boolean) => after.find((e) => e.kind === "open" && test(e.path))?.t;
  const found: Array<[string, number | undefined]> = [
    ["server modules", firstOpen((p) => p.startsWith(join(folder, "app") + "/"))],
    ["listening (503)", after.find((e) => e.kind === "listen")?.t],
    ["tokenizer + template", firstOpen((p) => p === join(folder, "model", "tokenizer.json"))],
    ["addon load", firstOpen((p) => p.startsWith(join(folder, "engine") + "/") && p.endsWith(".node"))],
    [WEIGHTS_PHASE, firstOpen((p) => p.startsWith(join(folder, "model") + "/") && p.endsWith(".safetensors"))],
  ];
  for (const [name, t] of found) if (t !== undefined) list.push({ name, t });
  return list.sort((a, b) => a.t - b.t);
}

const WEIGHTS_PHASE = "weights load → ready (CPU)";

const round3 = (x: number) => Math.round(x * 1000) / 1000;

function measuredPhases(marks: Milestone[], endT: number, countWeights: boolean): Phase[] {
  return marks.map((mark, i) => {
    const seconds = Math.max(0, (marks[i + 1]?.t ?? endT) - mark.t);
    const counted = countWeights || mark.name !== WEIGHTS_PHASE;
    return {
      name: mark.name,
      ...spreadOf(seconds, counted ? HOST_SPREAD : { low: 1, high: 1, why: "not counted: the GPU phases replace it" }),
      kind: "measured" as const,
      counted,
    };
  });
}

async function weightFiles(folder: string, manifest: Manifest | null): Promise<Array<{ path: string; size: number }>> {
  const files = manifest?.files ?? (await listFolder(folder)).files;
  return files.filter((f) => /^model\/[^/]+\.safetensors$/.test(f.path)).map((f) => ({ path: join(folder, f.path), size: f.size }));
}

async function numLayers(folder: string): Promise<number> {
  try {
    const config = JSON.parse(await readFile(join(folder, "model", "config.json"), "utf8")) as { num_hidden_layers?: number };
    return config.num_hidden_layers ?? 1;
  } catch {
    return 1;
  }
}

/**
 * The ELF version needs of everything the start loads, measured here, against the floors and against what
 * MANIFEST.json recorded at pack time (a binary swapped in later raises the floor without saying so).
 */
async function checkFolderFloors(folder: string, files: string[], manifest: Manifest | null, problems: Problem[], notes: string[]): Promise<Floors> {
  const measured = await folderFloors(folder, files);
  problems.push(...measured.problems.map((detail) => ({ cause: "floors" as const, detail })));
  const recorded = manifest?.floors;
  const floors: Floors = { ...(recorded ?? {}), ...measured.floors };
  if (!recorded) {
    notes.push("MANIFEST.json records no floors (packed by an older a2d): pack again to state the driver floor");
  } else {
    const v = (x: string) => x.split(".").map(Number);
    for (const key of ["glibc", "glibcxx", "cxxabi", "libgcc"] as const) {
      const have = measured.floors[key];
      const said = recorded[key];
      if (have && (!said || compareVersions(v(have), v(said)) > 0)) {
        problems.push({ cause: "floors", detail: `the folder's binaries need ${key} ${have}, but MANIFEST.json states ${said ?? "nothing"}: a binary was replaced after packing; pack again` });
      }
    }
    problems.push(...cudaFloorProblems("engine/a2d_cuda.node", floors).map((detail) => ({ cause: "floors" as const, detail })));
  }
  notes.push(`floors: ${formatFloors(floors)} (ELF version needs of ${measured.elfs.length} files: ${measured.elfs.slice(0, 4).join(", ")}${measured.elfs.length > 4 ? ", …" : ""})`);
  return floors;
}

function hasNvidiaGpu(): boolean {
  return existsSync("/dev/nvidiactl") || existsSync("/proc/driver/nvidia/version");
}

export async function simulateStartup(options: SimulateOptions): Promise<SimulationReport> {
  const log = options.log ?? (() => {});
  const folder = await realpath(resolve(options.folder)).catch(() => {
    throw new Error(`${options.folder} does not exist; pass the folder made by \`a2d pack\``);
  });
  if (!(await stat(folder)).isDirectory()) throw new Error(`${folder} is not a folder`);
  const budgetS = options.budgetS ?? 300;
  const gpu = options.gpu ?? "h100";
  const figuresPath = options.figuresPath ?? join(PROJECT_ROOT, "bench", "NOTES.md");
  const problems: Problem[] = [];
  const notes: string[] = [];

  let manifest: Manifest | null = null;
  try {
    manifest = await readManifest(folder);
  } catch {
    // checkManifest reports it
  }
  const folderDevice = manifest?.device ?? (existsSync(join(folder, "engine", "a2d_cuda.node")) ? "cuda" : "cpu");

  log("static checks: MANIFEST, serve.sh, configs, shared libraries");
  const manifestCheck = await checkManifest(folder);
  problems.push(...manifestCheck.problems, ...(await scanServeScript(folder)), ...(await scanConfigs(folder)));
  const engineDir = join(folder, "engine");
  const addons = existsSync(engineDir) ? (await readdir(engineDir)).filter((f) => f.endsWith(".node")).map((f) => `engine/${f}`) : [];
  const binaries = ["runtime/bin/node", ...addons].filter((b) => existsSync(join(folder, b)));
  problems.push(...(await checkLibraries(folder, binaries)));
  if (addons.includes("engine/a2d_cuda.node")) {
    const cuda = await checkCudaCode(folder, "engine/a2d_cuda.node");
    notes.push(cuda.summary);
    problems.push(...cuda.problems);
  }
  const { files: folderFiles } = await listFolder(folder);
  const floors = await checkFolderFloors(folder, folderFiles.map((f) => f.path), manifest, problems, notes);
  problems.push(...(await checkPermissions(folder, folderFiles.map((f) => f.path))));

  const weights = await weightFiles(folder, manifest);
  const weightBytes = weights.reduce((sum, w) => sum + w.size, 0);
  const layers = await numLayers(folder);
  const existingWeights = weights.filter((w) => existsSync(w.path)).sort((a, b) => b.size - a.size);

  let measuredMBps: number | undefined;
  if (options.diskMBps === undefined && existingWeights[0] && existingWeights[0].size >= 64 << 20) {
    log(`measuring the cold read rate on ${basename(existingWeights[0].path)}`);
    const rate = await measureDiskRate(existingWeights[0].path);
    measuredMBps = rate.MBps;
    notes.push(`cold read: ${formatBytes(rate.sampleBytes)} in ${rate.seconds.toFixed(2)} s = ${rate.MBps.toFixed(0)} MB/s (on a VM the host may cache the disk: an upper bound)`);
  } else if (options.diskMBps === undefined) {
    notes.push("weights under 64 MiB: cold read rate not measured, 100 MB/s assumed for the prediction");
  }

  const figures = await loadFigures(figuresPath, gpu);
  const read = diskRead(weightBytes, { givenMBps: options.diskMBps, measuredMBps });
  const readPhase: Phase = { ...read, counted: true };
  const gpuOnly: Phase[] = predictGpuPhases(figures, gpu, weightBytes, layers).map((p) => ({ name: p.name, ...spreadOf(p.seconds, p.spread), kind: p.kind, counted: true }));
  const gpuPhases = [readPhase, ...gpuOnly];
  const predictGpu = folderDevice === "cuda";
  // Waiting stops early only when even the fast end of what is still to come cannot make the budget.
  const extraS = predictGpu ? gpuPhases.reduce((sum, p) => sum + p.low_s, 0) : 0;

  const strace = await which("strace");
  const bwrap = await which("bwrap");
  if (bwrap && process.getuid?.() === 0 && insideCommand().length === 0) {
    problems.push({ cause: "isolation", detail: "setpriv (util-linux) is missing: the sandboxed start would run as root, so file permissions go unchecked" });
  }
  if (!bwrap) {
    problems.push({ cause: "isolation", detail: "bubblewrap is not installed: the start would see this machine's whole filesystem and run as this user (apt-get install bubblewrap)" });
  }
  if (!strace) problems.push({ cause: "isolation", detail: "strace is not installed: network, compile and write checks of child processes are off (apt-get install strace)" });
  // Loopback comes up through `ip` or, without iproute2, through python3's ioctl (simulate/inner.ts).
  if (!(await which("unshare"))) {
    problems.push({ cause: "isolation", detail: "unshare is missing (util-linux): cannot run in a fresh network namespace" });
  } else if (!(await which("ip")) && !(await which("python3"))) {
    problems.push({ cause: "isolation", detail: "neither ip (iproute2) nor python3 is here to bring loopback up in the network namespace" });
  }

  const sandbox = await mkdtemp(join(tmpdir(), "a2d-simulate-"));
  try {
    await chmod(sandbox, 0o755);
    const files = folderFiles;
    log(`evicting ${files.length} files from the page cache`);
    const eviction = await evict(files.map((f) => join(folder, f.path)));
    const resident = existingWeights[0] ? await residentBytes(existingWeights[0].path) : null;
    const evicted = resident === null ? true : resident <= (existingWeights[0]?.size ?? 0) * 0.01 + 65536;
    if (!evicted) notes.push(`page cache: ${formatBytes(resident ?? 0)} of the weights stayed resident after eviction`);

    log(`starting serve.sh (cpu) sandboxed as an unprivileged user in a fresh network namespace, budget ${budgetS} s`);
    const cpu = await runServe({ folder, sandbox, device: "cpu", deadlineS: budgetS, budgetS, extraS, strace, bwrap, label: "cpu", longTokens: 512 });
    problems.push(...judgeRun(cpu, folder, sandbox, "cpu", budgetS, new Set(manifestCheck.missing)));

    const isolation: Isolation = {
      network_namespace: cpu.inner?.loopbackUp ?? false,
      empty_environment: true,
      strace: strace !== null,
      guard: cpu.guard.some((g) => g.kind === "preload"),
      page_cache_evicted: evicted,
      eviction,
      weights_resident_after_eviction_bytes: resident,
    };
    if (cpu.inner && cpu.inner.readyT !== null && !isolation.guard) {
      problems.push({ cause: "isolation", detail: "the Node guard did not load (NODE_OPTIONS is cleared or overridden on the way to node)" });
    }

    const inner = cpu.inner;
    const measuredReady = inner?.readyT != null ? round3(inner.readyT - inner.launchT) : null;
    const marks = inner ? milestones(cpu.events, inner, folder) : [];
    const phases = inner ? measuredPhases(marks, inner.readyT ?? inner.exited?.t ?? inner.launchT, !predictGpu) : [];

    let predictedReady: number | null = null;
    let range: PredictionRange | null = null;
    let cudaPrediction: SimulationReport["cuda_prediction"];
    if (measuredReady !== null) {
      const hostPhases = phases.filter((p) => p.name !== WEIGHTS_PHASE);
      const withGpu = round3([...hostPhases, ...gpuPhases].reduce((sum, p) => sum + p.seconds, 0));
      const gpuRange = predictionRange([...hostPhases, ...gpuOnly], read, weightBytes, budgetS);
      if (predictGpu) {
        phases.push(...gpuPhases);
        predictedReady = withGpu;
        range = gpuRange;
      } else {
        predictedReady = measuredReady;
        range = predictionRange(phases, null, weightBytes, budgetS);
        cudaPrediction = { predicted_ready_s: withGpu, range: gpuRange, phases: gpuPhases };
        notes.push(`a CPU-only folder: the measured CPU start is its prediction; packed with the CUDA engine it would be ready in about ${withGpu.toFixed(1)} s on ${gpu} (${describeRange(gpuRange, budgetS)})`);
      }
      if (!range.holds_at_slow_end) {
        problems.push({ cause: "over-budget", detail: `predicted ready in ${predictedReady.toFixed(1)} s on ${gpu}, range ${describeRange(range, budgetS)}` });
      }
    }
    if (inner?.chat) notes.push(`first chat request after ready: HTTP ${inner.chat.status} in ${inner.chat.seconds.toFixed(2)} s`);
    if (inner?.longChat && inner.stream) {
      const tokens = (inner.longChat.body as { usage?: { completion_tokens?: number } } | null)?.usage?.completion_tokens ?? 0;
      notes.push(
        `long answer (max_tokens ${inner.maxTokensAsked}): ${tokens} tokens in ${inner.longChat.seconds.toFixed(2)} s non-stream; ` +
          `streamed in ${inner.stream.chunks.length} chunks in ${inner.stream.seconds.toFixed(2)} s${inner.stream.done ? ", [DONE]" : ""}`,
      );
    }
    if (inner) notes.push(`listening (PORT=${cpu.port}): ${inner.listening.map((l) => `${l.address}:${l.port}`).join(", ") || "nothing"}`);

    let gpuRun: GpuRun | undefined;
    if (options.gpuRun) {
      if (!hasNvidiaGpu()) {
        problems.push({ cause: "isolation", detail: "--gpu-run: no NVIDIA GPU on this machine (/dev/nvidiactl missing)" });
      } else {
        await evict(files.map((f) => join(folder, f.path)));
        log("starting serve.sh (cuda) for real on this GPU");
        const run = await runServe({ folder, sandbox, device: "cuda", deadlineS: budgetS, budgetS, extraS: 0, strace, bwrap, label: "cuda", longTokens: 1024 });
        const judged = judgeRun(run, folder, sandbox, "cuda", budgetS, new Set(manifestCheck.missing));
        problems.push(...judged);
        gpuRun = {
          ready_s: run.inner?.readyT != null ? run.inner.readyT - run.inner.launchT : null,
          health: run.inner?.health ?? null,
          problems: judged,
        };
      }
    }

    const unique = problems.filter((p, i) => problems.findIndex((q) => q.cause === p.cause && q.detail === p.detail) === i);
    return {
      verdict: unique.length === 0 && measuredReady !== null ? "pass" : "fail",
      folder,
      budget_s: budgetS,
      gpu,
      folder_device: folderDevice,
      figures: figures.description,
      floors,
      isolation,
      backend_run: "cpu",
      measured_ready_s: measuredReady,
      predicted_ready_s: predictedReady,
      predicted_range: range,
      disk_read_MBps: options.diskMBps ?? measuredMBps ?? null,
      weights_bytes: weightBytes,
      first_chat_s: inner?.chat?.seconds ?? null,
      phases,
      problems: unique,
      notes,
      ...(gpuRun ? { gpu_run: gpuRun } : {}),
      ...(cudaPrediction ? { cuda_prediction: cudaPrediction } : {}),
      server_log_tail: cpu.log.trim().split("\n").slice(-15).join("\n"),
    };
  } finally {
    await rm(sandbox, { recursive: true, force: true });
  }
}

export function formatReport(report: SimulationReport): string {
  const yes = (b: boolean) => (b ? "yes" : "NO");
  const lines = [
    `a2d simulate-startup ${report.folder}`,
    `  folder device ${report.folder_device}, target ${report.gpu}, budget ${report.budget_s} s, weights ${formatBytes(report.weights_bytes)}`,
    `  isolation: network namespace ${yes(report.isolation.network_namespace)} | env -i yes | strace ${yes(report.isolation.strace)} | ` +
      `node guard ${yes(report.isolation.guard)} | page cache evicted ${yes(report.isolation.page_cache_evicted)} (${report.isolation.eviction})`,
    `  run here: CPU backend (no GPU); GPU phases: ${report.figures}`,
    "",
    `  ${"phase".padEnd(52)} ${"seconds".padStart(8)} ${"range".padStart(15)}  kind: uncertainty`,
  ];
  let lastReason = "";
  // A reason is printed where it changes: the host phases share one, the GPU phases another.
  const row = (phase: Phase) => {
    const reason = phase.uncertainty === lastReason ? "〃" : phase.uncertainty;
    lastReason = phase.uncertainty;
    return `  ${phase.name.padEnd(52)} ${phase.seconds.toFixed(2).padStart(8)} ${`${phase.low_s.toFixed(2)}–${phase.high_s.toFixed(2)}`.padStart(15)}  ${phase.kind}: ${reason}`;
  };
  for (const phase of report.phases) lines.push(row(phase));
  if (report.cuda_prediction) {
    lines.push("", `  if packed with the CUDA engine (this folder is CPU-only), instead of the CPU weights load:`);
    for (const phase of report.cuda_prediction.phases) lines.push(row(phase));
  }
  const fmt = (s: number | null) => (s === null ? "n/a" : `${s.toFixed(2)} s`);
  lines.push("");
  lines.push(`  measured ready here (CPU):  ${fmt(report.measured_ready_s)}`);
  lines.push(`  predicted ready on ${report.gpu}:    ${fmt(report.predicted_ready_s)}${report.predicted_range ? `, range ${describeRange(report.predicted_range, report.budget_s)}` : ""}`);
  if (report.cuda_prediction) {
    lines.push(`  predicted with CUDA engine:  ${fmt(report.cuda_prediction.predicted_ready_s)}, range ${describeRange(report.cuda_prediction.range, report.budget_s)}`);
  }
  if (report.gpu_run) lines.push(`  measured ready on this GPU: ${fmt(report.gpu_run.ready_s)}`);
  for (const note of report.notes) lines.push(`  note: ${note}`);
  lines.push("");
  if (report.problems.length === 0) lines.push("  problems: none");
  for (const problem of report.problems) lines.push(`  PROBLEM [${problem.cause}] ${problem.detail}`);
  lines.push("", `  verdict: ${report.verdict.toUpperCase()}`);
  return lines.join("\n");
}
