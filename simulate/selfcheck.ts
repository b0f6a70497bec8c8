// `a2d selfcheck`: start a packed folder the way a user does (`bash serve.sh` with PORT set) or use a running
// server, then check what the evaluation relies on: readiness in budget, /health naming iterative
// denoising, chat answers in the OpenAI shape (non-stream, stream, with reasoning) and single-stream speed.
import { type ChildProcess, spawn } from "node:child_process";
import { closeSync, existsSync, openSync, readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

import { ChatCompletion, ChatCompletionChunk, HealthDecoding, ModelList, schemaErrors } from "./openai-schemas.js";

export interface SelfcheckOptions {
  folder?: string;
  url?: string;
  budgetS?: number;
  /** Fail below this many generated tokens/s; default 450 on a CUDA server, not judged on the CPU. */
  minTps?: number;
  maxTokens?: number;
  log?: (line: string) => void;
}

export interface CheckRow {
  check: string;
  ok: boolean;
  detail: string;
}

export interface SelfcheckReport {
  ok: boolean;
  url: string;
  ready_s: number | null;
  tokens_per_s: number | null;
  rows: CheckRow[];
  server_log_tail?: string;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address ? address.port : 0;
      server.close(() => resolvePort(port));
    });
  });
}

async function getJson(url: string, timeoutMs = 5000): Promise<{ status: number; body: unknown }> {
  const response = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
  const text = await response.text();
  try {
    return { status: response.status, body: JSON.parse(text) };
  } catch {
    return { status: response.status, body: text };
  }
}

async function postJson(url: string, body: unknown, timeoutMs: number): Promise<{ status: number; body: unknown; seconds: number }> {
  const started = performance.now();
  const response = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(timeoutMs),
  });
  const text = await response.text();
  const seconds = (performance.now() - started) / 1000;
  try {
    return { status: response.status, body: JSON.parse(text), seconds };
  } catch {
    return { status: response.status, body: text, seconds };
  }
}

interface StreamResult {
  status: number;
  chunks: unknown[];
  done: boolean;
  malformed: string[];
  seconds: number;
}

async function postStream(url: string, body: unknown, timeoutMs: number): Promise<StreamResult> {
  const started = performance.now();
  const response = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", accept: "text/event-stream" },
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(timeoutMs),
  });
  const result: StreamResult = { status: response.status, chunks: [], done: false, malformed: [], seconds: 0 };
  const text = await response.text();
  for (const event of text.split(/\r?\n\r?\n/)) {
    const data = event
      .split(/\r?\n/)
      .filter((line) => line.startsWith("data:"))
      .map((line) => line.slice(5).trimStart())
      .join("\n");
    if (!data) continue;
    if (data === "[DONE]") {
      result.done = true;
      continue;
    }
    try {
      result.chunks.push(JSON.parse(data));
    } catch {
      result.malformed.push(data.slice(0, 80));
    }
  }
  result.seconds = (performance.now() - started) / 1000;
  return result;
}

interface Started {
  child: ChildProcess;
  logFile: string;
  workDir: string;
}

async function startFolder(folder: string, port: number): Promise<Started> {
  const serveScript = join(folder, "serve.sh");
  if (!existsSync(serveScript)) throw new Error(`${serveScript} is missing: pass a folder made by \`a2d pack\` (or --url for a running server)`);
  const workDir = await mkdtemp(join(tmpdir(), "a2d-selfcheck-"));
  const logFile = join(workDir, "serve.log");
  const out = openSync(logFile, "w");
  // As a user starts it: their environment, PORT set, from another directory.
  const child = spawn("bash", [serveScript], { cwd: workDir, env: { ...process.env, PORT: String(port) }, stdio: ["ignore", out, out], detached: true });
  closeSync(out);
  return { child, logFile, workDir };
}

function groupAlive(pid: number): boolean {
  try {
    process.kill(-pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function stop(started: Started): Promise<void> {
  const pid = started.child.pid;
  if (pid !== undefined && groupAlive(pid)) {
    process.kill(-pid, "SIGTERM");
    for (let waited = 0; waited < 10_000 && groupAlive(pid); waited += 100) await sleep(100);
    if (groupAlive(pid)) process.kill(-pid, "SIGKILL");
  }
  await rm(started.workDir, { recursive: true, force: true });
}

function logTail(started: Started | null): string | undefined {
  if (!started) return undefined;
  try {
    return readFileSync(started.logFile, "utf8").trim().split("\n").slice(-15).join("\n");
  } catch {
    return undefined;
  }
}

/** A think block at the start of the content was not split into reasoning (later tags are ordinary text). */
const LEADING_THINK = /^\s*<think>/;

export async function selfcheck(options: SelfcheckOptions): Promise<SelfcheckReport> {
  if (!options.folder === !options.url) throw new Error("give either a packed folder or --url of a running server, not both");
  const log = options.log ?? (() => {});
  const budgetS = options.budgetS ?? 300;
  const rows: CheckRow[] = [];
  const row = (check: string, ok: boolean, detail: string) => {
    rows.push({ check, ok, detail });
    log(`${ok ? "ok  " : "FAIL"} ${check}: ${detail}`);
  };

  let started: Started | null = null;
  let base = options.url?.replace(/\/+$/, "") ?? "";
  const onSignal = () => {
    if (started?.child.pid !== undefined && groupAlive(started.child.pid)) process.kill(-started.child.pid, "SIGKILL");
    process.exit(130);
  };
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  try {
    if (options.folder) {
      const port = await freePort();
      base = `http://127.0.0.1:${port}`;
      started = await startFolder(resolve(options.folder), port);
      log(`started bash ${join(resolve(options.folder), "serve.sh")} with PORT=${port}`);
    }
    const launched = performance.now();
    let readyS: number | null = null;
    let health: unknown = null;
    let exited = false;
    started?.child.once("exit", () => (exited = true));
    while ((performance.now() - launched) / 1000 < budgetS && !exited) {
      try {
        const h = await getJson(`${base}/health`, 2000);
        if (h.status === 200) {
          readyS = (performance.now() - launched) / 1000;
          health = h.body;
          break;
        }
      } catch {
        // not listening yet
      }
      await sleep(100);
    }
    if (readyS === null) {
      row("ready", false, exited ? "serve.sh exited before /health turned 200" : `/health did not turn 200 within ${budgetS} s`);
      return { ok: false, url: base, ready_s: null, tokens_per_s: null, rows, server_log_tail: logTail(started) };
    }
    row("ready", readyS <= budgetS, `/health 200 after ${readyS.toFixed(2)} s${options.url ? " (already running)" : ""} (budget ${budgetS} s)`);

    const decodingErrors = schemaErrors(HealthDecoding, health);
    const decoding = (health as { decoding?: { method?: string; description?: string; block_size?: number; threshold?: number; steps?: number } }).decoding;
    const denoising = decoding !== undefined && /diffusion|denois/i.test(`${decoding.method} ${decoding.description ?? ""}`) && !/autoregress/i.test(String(decoding.method));
    row(
      "/health reports iterative denoising",
      decodingErrors.length === 0 && denoising,
      decodingErrors.length > 0
        ? decodingErrors.join("; ")
        : `method ${decoding?.method}, block_size ${decoding?.block_size}, threshold ${decoding?.threshold}, steps ${decoding?.steps}`,
    );

    const models = await getJson(`${base}/v1/models`);
    const modelErrors = schemaErrors(ModelList, models.body);
    row("/v1/models", models.status === 200 && modelErrors.length === 0, models.status !== 200 ? `HTTP ${models.status}` : modelErrors.join("; ") || `lists ${(models.body as { data: Array<{ id: string }> }).data.map((m) => m.id).join(", ")}`);
    const model = (models.body as { data?: Array<{ id?: string }> }).data?.[0]?.id ?? "a2d";
    const timeoutMs = Math.max(budgetS, 600) * 1000;
    const chatUrl = `${base}/v1/chat/completions`;

    const plain = await postJson(chatUrl, { model, messages: [{ role: "user", content: "What is the capital of France?" }], max_tokens: 32 }, timeoutMs);
    const plainErrors = schemaErrors(ChatCompletion, plain.body);
    const plainMessage = (plain.body as { choices?: Array<{ message?: { content?: string } }> }).choices?.[0]?.message;
    row(
      "chat (non-stream)",
      plain.status === 200 && plainErrors.length === 0,
      plain.status !== 200 ? `HTTP ${plain.status}: ${JSON.stringify(plain.body).slice(0, 200)}` : plainErrors.join("; ") || `answered ${JSON.stringify(plainMessage?.content ?? "").slice(0, 60)} in ${plain.seconds.toFixed(2)} s`,
    );

    const stream = await postStream(chatUrl, { model, messages: [{ role: "user", content: "Count from one to five." }], max_tokens: 32, stream: true, stream_options: { include_usage: true } }, timeoutMs);
    const chunkErrors = stream.chunks.flatMap((c) => schemaErrors(ChatCompletionChunk, c)).slice(0, 3);
    const ids = new Set(stream.chunks.map((c) => (c as { id?: string }).id));
    const finished = stream.chunks.some((c) => (c as { choices?: Array<{ finish_reason?: string | null }> }).choices?.some((ch) => typeof ch.finish_reason === "string"));
    const usageChunk = stream.chunks.some((c) => typeof (c as { usage?: { completion_tokens?: number } | null }).usage?.completion_tokens === "number");
    const streamProblems = [
      ...(stream.status !== 200 ? [`HTTP ${stream.status}`] : []),
      ...chunkErrors,
      ...(stream.malformed.length ? [`malformed data lines: ${stream.malformed.join(" | ")}`] : []),
      ...(stream.done ? [] : ["no data: [DONE] at the end"]),
      ...(stream.chunks.length === 0 ? ["no chunks"] : []),
      ...(ids.size > 1 ? ["chunks carry different ids"] : []),
      ...(finished ? [] : ["no chunk has a finish_reason"]),
      ...(usageChunk ? [] : ["stream_options.include_usage gave no usage chunk"]),
    ];
    row("chat (stream)", streamProblems.length === 0, streamProblems.join("; ") || `${stream.chunks.length} chunks, [DONE], usage, in ${stream.seconds.toFixed(2)} s`);

    const thinking = await postJson(
      chatUrl,
      { model, messages: [{ role: "user", content: "Is 91 a prime number? Think first." }], max_tokens: 256, chat_template_kwargs: { enable_thinking: true } },
      timeoutMs,
    );
    const thinkingErrors = schemaErrors(ChatCompletion, thinking.body);
    const thought = (thinking.body as { choices?: Array<{ message?: { content?: string | null; reasoning_content?: string | null } }> }).choices?.[0]?.message;
    const leaked = LEADING_THINK.test(thought?.content ?? "");
    row(
      "chat with reasoning",
      thinking.status === 200 && thinkingErrors.length === 0 && !leaked,
      thinking.status !== 200
        ? `HTTP ${thinking.status}: ${JSON.stringify(thinking.body).slice(0, 200)}`
        : thinkingErrors.join("; ") ||
            (leaked
              ? "the content starts with <think>: the reasoning block was not split out"
              : `reasoning_content ${thought?.reasoning_content ? `${thought.reasoning_content.length} chars` : "absent"}, content ${(thought?.content ?? "").length} chars`),
    );

    const maxTokens = options.maxTokens ?? 1024;
    const long = await postJson(
      chatUrl,
      { model, messages: [{ role: "user", content: "Write a long, detailed story about a lighthouse keeper." }], max_tokens: maxTokens, temperature: 0 },
      timeoutMs,
    );
    const completionTokens = (long.body as { usage?: { completion_tokens?: number } }).usage?.completion_tokens ?? 0;
    const tps = long.status === 200 && completionTokens > 0 ? completionTokens / long.seconds : null;
    const device = (health as { device?: string }).device;
    const minTps = options.minTps ?? (device === "cuda" ? 450 : 0);
    row(
      "single-stream tokens/s",
      tps !== null && tps >= minTps,
      tps === null
        ? `the long generation failed (HTTP ${long.status})`
        : `${tps.toFixed(1)} tokens/s (${completionTokens} tokens in ${long.seconds.toFixed(2)} s, max_tokens ${maxTokens}); ${minTps > 0 ? `needs >= ${minTps}` : `not judged on device ${device ?? "?"}`}`,
    );

    return { ok: rows.every((r) => r.ok), url: base, ready_s: readyS, tokens_per_s: tps, rows, server_log_tail: logTail(started) };
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    if (started) await stop(started);
  }
}

export function formatSelfcheck(report: SelfcheckReport): string {
  const width = Math.max(...report.rows.map((r) => r.check.length), 5);
  const lines = [`a2d selfcheck ${report.url}`, "", `  ${"check".padEnd(width)}  result  detail`];
  for (const r of report.rows) lines.push(`  ${r.check.padEnd(width)}  ${r.ok ? "pass  " : "FAIL  "}  ${r.detail}`);
  lines.push("", `  ${report.ok ? "PASS" : "FAIL"}: ${report.rows.filter((r) => r.ok).length} of ${report.rows.length} checks passed`);
  if (!report.ok && report.server_log_tail) lines.push("", "  server log (last lines):", ...report.server_log_tail.split("\n").map((l) => `    ${l}`));
  return lines.join("\n");
}
