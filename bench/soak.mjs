#!/usr/bin/env node
// A soak run of `a2d serve`: many mixed requests from a seeded generator at a few concurrency levels, in
// rounds that alternate the levels, then a JSON report: requests served, answers by status and error code,
// what was not as expected (5xx, transport errors, a status other than the one the request calls for),
// p50/p99 latency per kind and per level, and the server's RSS (VmRSS of /proc/PID/status) at the start
// (ready, idle), after every round (idle again) and its peak. The middle is the end of the middle round,
// which ran at the same level as the last, so middle -> end compares like with like.
//   node bench/soak.mjs [--model .cache/demo/model] [--requests 20000] [--concurrency 8,32] [--rounds 4]
//        [--seed 1] [--threads N] [--out FILE]
// Run `npm run build:ts` first: the server is dist/cli/main.js. A fresh server is started and stopped.
import { spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";

const ROOT = join(import.meta.dirname, "..");
const { values } = parseArgs({
  options: {
    model: { type: "string", default: join(ROOT, ".cache", "demo", "model") },
    requests: { type: "string", default: "20000" },
    concurrency: { type: "string", default: "8,32" },
    rounds: { type: "string", default: "4" },
    seed: { type: "string", default: "1" },
    threads: { type: "string" },
    out: { type: "string" },
  },
});
const totalRequests = Number(values.requests);
const levels = values.concurrency.split(",").map(Number);
const rounds = Number(values.rounds);
const KEY = "soak-key";

/** mulberry32: small and seedable, so that a run's mix can be sent again. */
function rng(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const random = rng(Number(values.seed));
const pick = (items) => items[Math.floor(random() * items.length)];
const between = (low, high) => low + Math.floor(random() * (high - low + 1));

// ---- the server -------------------------------------------------------------------------------------
const serverArgs = ["serve", "--model", values.model, "--host", "127.0.0.1", "--port", "0", "--api-key", KEY];
if (values.threads) serverArgs.push("--threads", values.threads);
const child = spawn(process.execPath, [join(ROOT, "dist", "cli", "main.js"), ...serverArgs], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
let exit = null;
const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve((exit = { code, signal }))));
const logLevels = {};
const errorLines = [];
const stderr = [];
let onLog = () => {};
createInterface({ input: child.stdout }).on("line", (text) => {
  let line;
  try {
    line = JSON.parse(text);
  } catch {
    return;
  }
  logLevels[line.level] = (logLevels[line.level] ?? 0) + 1;
  // Warnings and errors, the first 20: what a run that "passed" still complained about.
  if (line.level >= 40 && errorLines.length < 20) errorLines.push(line);
  onLog(line);
});
createInterface({ input: child.stderr }).on("line", (text) => stderr.length < 50 && stderr.push(text));

function waitForLog(msg) {
  return new Promise((resolve, reject) => {
    onLog = (line) => line.msg === msg && resolve(line);
    void exited.then(() => reject(new Error(`server exited before "${msg}": ${stderr.join("\n")}`)));
  });
}
const url = String((await waitForLog("listening")).url);
await waitForLog("ready");
onLog = () => {};
const { hostname, port } = new URL(url);

function rssKiB() {
  const status = readFileSync(`/proc/${child.pid}/status`, "utf8");
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)[1]);
}
let peakKiB = rssKiB();
const sampler = setInterval(() => {
  if (exit === null) peakKiB = Math.max(peakKiB, rssKiB());
}, 500);

// ---- requests ---------------------------------------------------------------------------------------
const auth = { authorization: `Bearer ${KEY}`, "content-type": "application/json" };
const words = ["river", "stone", "seven", "lamp", "orange", "quiet", "north", "paper", "wheel", "cloud"];
const sentence = () => Array.from({ length: between(3, 12) }, () => pick(words)).join(" ");
// Most completions are one block or two (block 4 on the demo model): 20,000 requests must end on a CPU.
const chat = (extra = {}) => ({ messages: [{ role: "user", content: sentence() }], max_tokens: between(1, 4), ...extra });
const longPrompt = () => Array.from({ length: 3000 }, () => pick(words)).join(" ");
const hugeBody = JSON.stringify({ messages: [{ role: "user", content: "x".repeat(3 * 1024 * 1024) }] });

/** POST (or GET) through fetch; streams are read to [DONE] unless `cancel` says when to drop them. */
async function http(path, { method = "POST", headers = auth, body, cancel } = {}) {
  const controller = new AbortController();
  const response = await fetch(`${url}${path}`, {
    method,
    headers,
    ...(body === undefined ? {} : { body: typeof body === "string" ? body : JSON.stringify(body) }),
    signal: controller.signal,
  });
  const code = response.status >= 400 ? ((await response.json().catch(() => ({})))?.error?.code ?? "not_openai_shape") : null;
  if (code !== null) return { status: response.status, code };
  if (!(response.headers.get("content-type") ?? "").startsWith("text/event-stream")) {
    const parsed = await response.json();
    const ok = method === "GET" || Array.isArray(parsed.choices);
    return { status: response.status, code: ok ? null : "bad_body" };
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let text = "";
  let events = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    text += decoder.decode(value, { stream: true });
    events = text.split("\n\n").filter((event) => event.startsWith("data: ")).length;
    if (cancel !== undefined && cancel(text, events)) {
      controller.abort();
      return { status: response.status, code: "cancelled" };
    }
  }
  if (text.includes('"error"')) return { status: response.status, code: "error_event" };
  return { status: response.status, code: text.trimEnd().endsWith("data: [DONE]") ? null : "no_done" };
}

/** Raw bytes on a new connection; the status of the (final) answer. */
function raw(bytes) {
  return new Promise((resolve) => {
    const socket = connect({ host: hostname, port: Number(port) });
    let data = "";
    const timer = setTimeout(() => finish("timeout"), 60_000);
    const finish = (transport) => {
      clearTimeout(timer);
      socket.destroy();
      const statuses = [...data.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((match) => Number(match[1]));
      const status = statuses.at(-1) ?? 0;
      const code = /"code":"([a-z_]+)"/.exec(data)?.[1] ?? null;
      resolve(status === 0 ? { status: 0, code: transport } : { status, code: statuses.includes(100) ? "sent_100_continue" : code });
    };
    socket.on("connect", () => socket.write(bytes));
    socket.on("data", (chunk) => {
      data += chunk.toString("latin1");
      const head = data.indexOf("\r\n\r\n", data.lastIndexOf("HTTP/1.1 "));
      const length = /content-length: (\d+)/i.exec(data.slice(data.lastIndexOf("HTTP/1.1 ")));
      if (head !== -1 && length !== null && data.length - head - 4 >= Number(length[1])) finish(null);
    });
    socket.on("error", (error) => finish(error.code ?? "socket_error"));
    socket.on("close", () => finish("closed"));
  });
}

const rawHead = (lines) => `${[...lines, `Host: ${hostname}:${port}`].join("\r\n")}\r\n\r\n`;

/**
 * [weight, kind, expected status, send]: about a quarter generations (stream and not, a few dropped by the
 * client), the rest what a hostile or careless client sends; a prompt of ~3,000 words now and then.
 */
const KINDS = [
  [6, "chat", 200, () => http("/v1/chat/completions", { body: chat() })],
  [5, "chat stream", 200, () => http("/v1/chat/completions", { body: chat({ max_tokens: between(1, 8), stream: true, stream_options: { include_usage: random() < 0.5 } }) })],
  [2.5, "completion", 200, () => http("/v1/completions", { body: { prompt: sentence(), max_tokens: between(1, 4) } })],
  [2.5, "completion stream", 200, () => http("/v1/completions", { body: { prompt: sentence(), max_tokens: between(1, 8), stream: true } })],
  // Dropped after the first event (often still queued) or the first text (running): the cancel flag.
  [2.5, "stream cancelled", 200, () => {
    const afterText = random() < 0.5;
    return http("/v1/chat/completions", {
      body: chat({ max_tokens: 64, ignore_eos: true, stream: true }),
      cancel: (text, events) => (afterText ? /"content":"[^"]/.test(text) : events >= 1),
    });
  }],
  [1, "non-stream abandoned", 0, async () => {
    const controller = new AbortController();
    setTimeout(() => controller.abort(), between(20, 400));
    try {
      const response = await fetch(`${url}/v1/chat/completions`, { method: "POST", headers: auth, body: JSON.stringify(chat({ max_tokens: 64, ignore_eos: true })), signal: controller.signal });
      await response.text();
      return { status: response.status, code: "finished_first" };
    } catch {
      return { status: 0, code: "cancelled" };
    }
  }],
  [8, "health", 200, () => http("/health", { method: "GET", headers: {} })],
  [6, "models", 200, () => http("/v1/models", { method: "GET" })],
  [10, "malformed JSON", 400, () => http("/v1/chat/completions", { body: pick(['{"messages": [', "", "{,}", '{"messages":[{"role":"user","content":"hi"}]}x', "nul", "[[[[[[[[["]) })],
  [10, "invalid field", 400, () => http("/v1/chat/completions", { body: pick([
    { messages: "hi" },
    { messages: [{ role: "robot", content: "x" }] },
    { ...chat(), temperature: "0.5" },
    { ...chat(), max_tokens: 0 },
    { ...chat(), remasking: "verify" },
    { ...chat(), tree_width: "abc" },
    { ...chat(), lookup_ngram: 3 },
    { ...chat(), tools: [{ type: "function", function: { name: "f" } }] },
    { ...chat(), block_size: 65 },
    { ...chat(), n: 2 },
  ]) })],
  [10, "wrong or missing key", 401, () => http("/v1/chat/completions", { headers: pick([{ "content-type": "application/json" }, { ...auth, authorization: "Bearer nope" }, { ...auth, authorization: KEY }]), body: chat() })],
  [2, "two keys", 400, () => raw(rawHead(["GET /v1/models HTTP/1.1", `Authorization: Bearer ${KEY}`, "Authorization: Bearer nope", "Connection: close"]))],
  [5, "unknown route", 404, () => http(pick(["/v1/embeddings", "/v2/models", "/admin"]), { body: { input: "x" } })],
  [3, "declared oversize", 413, () => raw(rawHead(["POST /v1/chat/completions HTTP/1.1", "Content-Type: application/json", `Authorization: Bearer ${KEY}`, ...(random() < 0.5 ? ["Expect: 100-continue"] : []), `Content-Length: ${pick([3_000_000, 99_999_999_999])}`]))],
  [0.5, "oversize body", 413, () => http("/v1/chat/completions", { body: hugeBody })],
  [0.06, "long prompt", 200, () => http("/v1/chat/completions", { body: { messages: [{ role: "user", content: longPrompt() }], max_tokens: 4 } })],
];
const totalWeight = KINDS.reduce((sum, [weight]) => sum + weight, 0);
function nextKind() {
  let roll = random() * totalWeight;
  return KINDS.find(([weight]) => (roll -= weight) < 0) ?? KINDS[0];
}

// ---- the run ----------------------------------------------------------------------------------------
const results = []; // { kind, level, round, ms, status, code, expected }
async function client(queue, level, round) {
  while (queue.length > 0 && exit === null) {
    const [, kind, expected, send] = queue.pop();
    const started = performance.now();
    let outcome;
    try {
      outcome = await send();
    } catch (error) {
      outcome = { status: 0, code: `transport: ${error.cause?.code ?? error.name}` };
    }
    results.push({ kind, level, round, ms: performance.now() - started, expected, ...outcome });
  }
}

const idle = () => new Promise((resolve) => setTimeout(resolve, 2000));
await idle();
const rss = [{ at: "start (ready, idle)", kib: rssKiB() }];
const startedAt = performance.now();
for (let round = 0; round < rounds && exit === null; round++) {
  const level = levels[round % levels.length];
  const count = Math.round(totalRequests / rounds);
  const queue = Array.from({ length: count }, nextKind);
  const roundStarted = performance.now();
  await Promise.all(Array.from({ length: level }, () => client(queue, level, round)));
  await idle();
  if (exit !== null) break;
  rss.push({ at: `after round ${round + 1} (${level} clients, ${count} requests, ${((performance.now() - roundStarted) / 1000).toFixed(0)} s)`, kib: rssKiB() });
  console.error(`soak: ${rss.at(-1).at}: RSS ${(rss.at(-1).kib / 1024).toFixed(1)} MiB`);
}
const wallS = (performance.now() - startedAt) / 1000;
clearInterval(sampler);
const crashed = exit !== null;
if (!crashed) child.kill("SIGTERM");
const stopped = await exited;

// ---- the report -------------------------------------------------------------------------------------
function percentile(sorted, p) {
  return sorted.length === 0 ? null : Number(sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))].toFixed(1));
}
function latency(rows) {
  const sorted = rows.map((row) => row.ms).sort((a, b) => a - b);
  return { n: rows.length, p50_ms: percentile(sorted, 50), p99_ms: percentile(sorted, 99) };
}
/** As the request calls for: its status, an error in OpenAI's shape (no 100 Continue first), a whole answer or stream. */
function expectedOf(row) {
  if (row.expected === 0) return ["cancelled", "finished_first"].includes(row.code);
  if (row.status !== row.expected) return false;
  if (row.status >= 400) return !["not_openai_shape", "sent_100_continue", null].includes(row.code);
  return row.code === null || row.code === "cancelled";
}
const count = (rows, key) => rows.reduce((tally, row) => ((tally[key(row)] = (tally[key(row)] ?? 0) + 1), tally), {});
const middle = rss[Math.floor(rounds / 2)];
const end = rss[rounds];
const report = {
  server: { model: values.model, args: serverArgs.slice(3).join(" "), exit: stopped, crashed, log_lines_by_level: logLevels, warn_and_error_lines: errorLines, stderr },
  requests: results.length,
  wall_s: Number(wallS.toFixed(1)),
  served: results.filter((row) => row.status > 0 || row.code === "cancelled").length,
  status_5xx: results.filter((row) => row.status >= 500).length,
  not_as_expected: count(results.filter((row) => !expectedOf(row)), (row) => `${row.kind}: ${row.status} ${row.code}`),
  answers: count(results, (row) => (row.status === 0 ? row.code : row.code === null ? String(row.status) : `${row.status} ${row.code}`)),
  latency: {
    all: latency(results),
    by_level: Object.fromEntries(levels.map((level) => [level, latency(results.filter((row) => row.level === level))])),
    by_kind: Object.fromEntries(KINDS.map(([, kind]) => [kind, latency(results.filter((row) => row.kind === kind))])),
  },
  rss_mib: Object.fromEntries(rss.map(({ at, kib }) => [at, Number((kib / 1024).toFixed(1))])),
  rss_peak_mib: Number((peakKiB / 1024).toFixed(1)),
  rss_growth_middle_to_end_pct: middle && end ? Number((((end.kib - middle.kib) / middle.kib) * 100).toFixed(2)) : null,
};
const text = JSON.stringify(report, null, 2);
if (values.out) writeFileSync(values.out, `${text}\n`);
console.log(text);
process.exit(crashed || report.status_5xx > 0 ? 1 : 0);
