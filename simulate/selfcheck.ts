// `a2d selfcheck`: start a packed folder the way a user does (`bash serve.sh` with PORT set) or use a running
// server, then check what the evaluation relies on: readiness in budget, a socket on all addresses, /health
// naming iterative denoising, chat answers in the OpenAI shape (non-stream, stream, with reasoning) for the
// model asked for, answers that are text, and single-stream speed counted with the model's own tokenizer
// (the server's usage is compared with that count, never taken on trust). Every request has a time limit,
// and whatever happens the report comes back with every check made so far.
import { type ChildProcess, spawn } from "node:child_process";
import { closeSync, existsSync, openSync, readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

import { Agent, fetch } from "undici";

import { ModelTokenizer } from "../server/tokenizer.js";
import { judgeAnswerText, preview } from "./answer-text.js";
import { groupAlive, stopGroup } from "./process-group.js";
import { ChatCompletion, ChatCompletionChunk, HealthDecoding, ModelList, schemaErrors } from "./openai-schemas.js";
import { listeningSockets, listensOnAllAddresses } from "./sockets.js";
import { parseEvents } from "./sse-events.js";

export interface SelfcheckOptions {
  /** A packed folder to start with its serve.sh. */
  folder?: string;
  /** Or a running server. */
  url?: string;
  /**
   * With `url`: a packed folder (its model/) or a model folder whose tokenizer counts the answers' tokens.
   * Without one the server's own usage cannot be checked, and the speed check fails.
   */
  tokenizerFrom?: string;
  budgetS?: number;
  /** Fail below this many generated tokens/s; default 450 on a CUDA server, not judged on the CPU. */
  minTps?: number;
  maxTokens?: number;
  /** Every request's bound, seconds (default 120): a request that never returns is reported, not waited on. */
  requestTimeoutS?: number;
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

// undici's own header and body timeouts (300 s) are off: each request's AbortSignal bounds it, so a server
// that never answers is reported after the stated time instead of failing as a bare `fetch failed`.
const dispatcher = new Agent({ headersTimeout: 0, bodyTimeout: 0 });

type Reply = { ok: true; status: number; text: string; seconds: number } | { ok: false; error: string; seconds: number };

async function send(url: string, body: unknown, timeoutMs: number): Promise<Reply> {
  const started = performance.now();
  const seconds = () => (performance.now() - started) / 1000;
  try {
    const response = await fetch(url, {
      dispatcher,
      method: body === undefined ? "GET" : "POST",
      headers: body === undefined ? {} : { "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(timeoutMs),
    });
    const text = await response.text();
    return { ok: true, status: response.status, text, seconds: seconds() };
  } catch (error) {
    const err = error as Error & { cause?: { code?: string; message?: string } };
    const timedOut = err.name === "TimeoutError" || err.name === "AbortError";
    return {
      ok: false,
      error: timedOut ? `no complete answer within ${timeoutMs / 1000} s` : `the request failed (${err.cause?.code ?? err.cause?.message ?? err.message})`,
      seconds: seconds(),
    };
  }
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
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

async function stop(started: Started): Promise<void> {
  if (started.child.pid !== undefined) await stopGroup(started.child.pid, 10_000);
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

const LOOPBACK_HOSTS = new Set(["127.0.0.1", "localhost", "[::1]", "::1"]);

/**
 * A usage no generation of this text can have. Every generated token decodes to at least one byte (byte-level
 * BPE, SentencePiece's byte fallback), save the special tokens that end or frame an answer (the slack), so
 * the text's UTF-8 length bounds an honest count. The re-encoded count is no bound: a model that emits a
 * non-canonical tokenization (a run of "." one dot a token, say) generated more tokens than its text
 * re-encodes to, honestly.
 */
function usageOverstated(usage: number, text: string): boolean {
  return usage > Buffer.byteLength(text, "utf8") + 16;
}

interface Answer {
  what: string;
  text: string;
}

type Message = { content?: string | null; reasoning_content?: string | null };
type Completion = { model?: unknown; choices?: Array<{ message?: Message }>; usage?: { completion_tokens?: number } };
type Chunk = { id?: string; model?: unknown; choices?: Array<{ delta?: Message; finish_reason?: string | null }>; usage?: { completion_tokens?: number } | null };

/** The tokenizer of the served model, from a packed folder (model/) or a model folder. */
async function loadTokenizer(dir: string): Promise<ModelTokenizer> {
  const modelDir = existsSync(join(dir, "model", "tokenizer.json")) ? join(dir, "model") : dir;
  return ModelTokenizer.load(modelDir);
}

class Checks {
  readonly rows: CheckRow[] = [];
  readonly answers: Answer[] = [];

  constructor(
    private readonly log: (line: string) => void,
    private readonly tokenizer: ModelTokenizer | null,
  ) {}

  row(check: string, ok: boolean, detail: string): void {
    this.rows.push({ check, ok, detail });
    this.log(`${ok ? "ok  " : "FAIL"} ${check}: ${detail}`);
  }

  count(text: string): number | null {
    return this.tokenizer ? this.tokenizer.encodeRendered(text).length : null;
  }

  /** Problems of one answer's usage and model field; records the answer for the text check. */
  answer(what: string, text: string, usage: number | null, model: unknown, wanted: string): string[] {
    this.answers.push({ what, text });
    const problems: string[] = [];
    if (model !== wanted) problems.push(`it answers as model ${JSON.stringify(model)}, but the request asked for ${JSON.stringify(wanted)} (the id /v1/models lists)`);
    if (usage !== null && usageOverstated(usage, text)) {
      const counted = this.count(text);
      problems.push(
        `its usage says ${usage} completion tokens, but the answer is ${Buffer.byteLength(text, "utf8")} bytes of text${counted === null ? "" : ` (${counted} tokens by the model's tokenizer)`}: the server overstates its usage`,
      );
    }
    return problems;
  }

  judgeAnswers(): void {
    if (this.answers.length === 0) return this.row("answers are text", false, "no answer came back to judge");
    const problems: string[] = [];
    for (const { what, text } of this.answers) {
      const judged = judgeAnswerText(text, this.tokenizer?.encodeRendered(text) ?? []);
      if (judged.problems.length > 0) problems.push(`${what}: ${judged.problems.join("; ")} (${preview(text)})`);
    }
    this.row(
      "answers are text",
      problems.length === 0,
      problems.join(" | ") || `${this.answers.length} answers: non-empty, valid UTF-8, printable, not one token repeated${this.tokenizer ? "" : " (repetition not judged: no tokenizer)"}`,
    );
  }
}

function messageText(message: Message | undefined): string {
  return `${message?.reasoning_content ?? ""}${message?.content ?? ""}`;
}

/** A completion's problems and its message, or the failed reply. */
function readCompletion(reply: Reply): { problems: string[]; body: Completion | null } {
  if (!reply.ok) return { problems: [reply.error], body: null };
  const body = parseJson(reply.text);
  if (reply.status !== 200) return { problems: [`HTTP ${reply.status}: ${reply.text.slice(0, 200)}`], body: null };
  return { problems: schemaErrors(ChatCompletion, body), body: body as Completion };
}

/** The grader connects from outside the machine: a server on 127.0.0.1 only cannot be reached. */
function listenCheck(port: number, startedHere: boolean): { ok: boolean; detail: string } {
  const onPort = listeningSockets().filter((l) => l.port === port);
  const where = onPort.map((l) => `${l.address}:${l.port}`).join(", ");
  if (onPort.some((l) => listensOnAllAddresses(l.address))) return { ok: true, detail: `listens on ${where}` };
  if (onPort.length > 0) return { ok: false, detail: `listens on ${where} only: nothing outside this machine can reach it; listen on 0.0.0.0 (serve.sh's A2D_HOST)` };
  return startedHere
    ? { ok: false, detail: `nothing listens on port ${port} in /proc/net/tcp, yet /health answered there` }
    : { ok: true, detail: `not judged: no socket listens on port ${port} in this network namespace (the server runs in another one, a container say)` };
}

export async function selfcheck(options: SelfcheckOptions): Promise<SelfcheckReport> {
  if (!options.folder === !options.url) throw new Error("give either a packed folder or --url of a running server, not both");
  const log = options.log ?? (() => {});
  const budgetS = options.budgetS ?? 300;
  const timeoutMs = (options.requestTimeoutS ?? 120) * 1000;
  const tokenizerFrom = options.folder ?? options.tokenizerFrom;
  let tokenizer: ModelTokenizer | null = null;
  let tokenizerError: string | null = tokenizerFrom ? null : "no folder given, so the model's tokenizer is not at hand (a2d selfcheck --url URL DIR)";
  if (tokenizerFrom) {
    try {
      tokenizer = await loadTokenizer(resolve(tokenizerFrom));
    } catch (error) {
      tokenizerError = (error as Error).message;
    }
  }
  const checks = new Checks(log, tokenizer);

  let started: Started | null = null;
  let base = options.url?.replace(/\/+$/, "") ?? "";
  let readyS: number | null = null;
  let tps: number | null = null;
  let serverLogTail: string | undefined;
  const onSignal = () => {
    if (started?.child.pid !== undefined && groupAlive(started.child.pid)) process.kill(-started.child.pid, "SIGKILL");
    process.exit(130);
  };
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  try {
    let port: number;
    if (options.folder) {
      port = await freePort();
      base = `http://127.0.0.1:${port}`;
      started = await startFolder(resolve(options.folder), port);
      log(`started bash ${join(resolve(options.folder), "serve.sh")} with PORT=${port}`);
    } else {
      const url = new URL(base);
      port = Number(url.port || (url.protocol === "https:" ? 443 : 80));
    }
    const launched = performance.now();
    let health: unknown = null;
    let exited = false;
    started?.child.once("exit", () => (exited = true));
    while ((performance.now() - launched) / 1000 < budgetS && !exited) {
      const h = await send(`${base}/health`, undefined, 2000);
      if (h.ok && h.status === 200) {
        readyS = (performance.now() - launched) / 1000;
        health = parseJson(h.text);
        break;
      }
      await sleep(100);
    }
    if (readyS === null) {
      checks.row("ready", false, exited ? "serve.sh exited before /health turned 200" : `/health did not turn 200 within ${budgetS} s`);
      return report();
    }
    checks.row("ready", readyS <= budgetS, `/health 200 after ${readyS.toFixed(2)} s${options.url ? " (already running)" : ""} (budget ${budgetS} s)`);

    const host = new URL(base).hostname;
    if (started || LOOPBACK_HOSTS.has(host)) {
      const listen = listenCheck(port, started !== null);
      checks.row("listens on all addresses", listen.ok, listen.detail);
    } else {
      checks.row("listens on all addresses", true, `reached over the network at ${host}`);
    }

    const decodingErrors = schemaErrors(HealthDecoding, health);
    const decoding = (health as { decoding?: { method?: string; description?: string; block_size?: number; threshold?: number; steps?: number } }).decoding;
    const denoising = decoding !== undefined && /diffusion|denois/i.test(`${decoding.method} ${decoding.description ?? ""}`) && !/autoregress/i.test(String(decoding.method));
    checks.row(
      "/health reports iterative denoising",
      decodingErrors.length === 0 && denoising,
      decodingErrors.length > 0
        ? decodingErrors.join("; ")
        : `method ${decoding?.method}, block_size ${decoding?.block_size}, threshold ${decoding?.threshold}, steps ${decoding?.steps}`,
    );

    const models = await send(`${base}/v1/models`, undefined, timeoutMs);
    const modelList = models.ok ? parseJson(models.text) : null;
    const modelErrors = models.ok ? schemaErrors(ModelList, modelList) : [models.error];
    checks.row(
      "/v1/models",
      models.ok && models.status === 200 && modelErrors.length === 0,
      models.ok && models.status !== 200 ? `HTTP ${models.status}` : modelErrors.join("; ") || `lists ${(modelList as { data: Array<{ id: string }> }).data.map((m) => m.id).join(", ")}`,
    );
    const model = (modelList as { data?: Array<{ id?: string }> } | null)?.data?.[0]?.id ?? "a2d";
    const chatUrl = `${base}/v1/chat/completions`;

    const plain = await send(chatUrl, { model, messages: [{ role: "user", content: "What is the capital of France?" }], max_tokens: 32 }, timeoutMs);
    const plainRead = readCompletion(plain);
    const plainMessage = plainRead.body?.choices?.[0]?.message;
    const plainProblems = [...plainRead.problems];
    if (plainRead.problems.length === 0 && plainRead.body) {
      plainProblems.push(...checks.answer("chat (non-stream)", messageText(plainMessage), plainRead.body.usage?.completion_tokens ?? null, plainRead.body.model, model));
    }
    checks.row("chat (non-stream)", plainProblems.length === 0, plainProblems.join("; ") || `answered ${preview(plainMessage?.content ?? "")} in ${plain.seconds.toFixed(2)} s`);

    const stream = await send(chatUrl, { model, messages: [{ role: "user", content: "Count from one to five." }], max_tokens: 32, stream: true, stream_options: { include_usage: true } }, timeoutMs);
    const streamProblems: string[] = [];
    let streamDetail = "";
    if (!stream.ok) streamProblems.push(stream.error);
    else if (stream.status !== 200) streamProblems.push(`HTTP ${stream.status}: ${stream.text.slice(0, 200)}`);
    else {
      const events = parseEvents(stream.text);
      const chunks = events.chunks as Chunk[];
      const ids = new Set(chunks.map((c) => c.id));
      const usage = chunks.find((c) => typeof c.usage?.completion_tokens === "number")?.usage?.completion_tokens ?? null;
      const text = chunks.map((c) => messageText(c.choices?.[0]?.delta)).join("");
      const models = new Set(chunks.map((c) => c.model));
      streamProblems.push(
        ...chunks.flatMap((c) => schemaErrors(ChatCompletionChunk, c)).slice(0, 3),
        ...(events.malformed.length ? [`malformed data lines: ${events.malformed.join(" | ")}`] : []),
        ...(events.done ? [] : ["no data: [DONE] at the end"]),
        ...(chunks.length === 0 ? ["no chunks"] : []),
        ...(ids.size > 1 ? ["chunks carry different ids"] : []),
        ...(chunks.some((c) => c.choices?.some((ch) => typeof ch.finish_reason === "string")) ? [] : ["no chunk has a finish_reason"]),
        ...(usage === null ? ["stream_options.include_usage gave no usage chunk"] : []),
      );
      if (chunks.length > 0) streamProblems.push(...checks.answer("chat (stream)", text, usage, models.size === 1 ? [...models][0] : [...models].join(", "), model));
      streamDetail = `${chunks.length} chunks, [DONE], usage, in ${stream.seconds.toFixed(2)} s`;
    }
    checks.row("chat (stream)", streamProblems.length === 0, streamProblems.join("; ") || streamDetail);

    const thinking = await send(
      chatUrl,
      { model, messages: [{ role: "user", content: "Is 91 a prime number? Think first." }], max_tokens: 256, chat_template_kwargs: { enable_thinking: true } },
      timeoutMs,
    );
    const thinkingRead = readCompletion(thinking);
    const thought = thinkingRead.body?.choices?.[0]?.message;
    const thinkingProblems = [...thinkingRead.problems];
    if (thinkingRead.problems.length === 0 && thinkingRead.body) {
      if (LEADING_THINK.test(thought?.content ?? "")) thinkingProblems.push("the content starts with <think>: the reasoning block was not split out");
      thinkingProblems.push(...checks.answer("chat with reasoning", messageText(thought), thinkingRead.body.usage?.completion_tokens ?? null, thinkingRead.body.model, model));
    }
    checks.row(
      "chat with reasoning",
      thinkingProblems.length === 0,
      thinkingProblems.join("; ") || `reasoning_content ${thought?.reasoning_content ? `${thought.reasoning_content.length} chars` : "absent"}, content ${(thought?.content ?? "").length} chars`,
    );

    const maxTokens = options.maxTokens ?? 1024;
    const long = await send(chatUrl, { model, messages: [{ role: "user", content: "Write a long, detailed story about a lighthouse keeper." }], max_tokens: maxTokens, temperature: 0 }, timeoutMs);
    const longRead = readCompletion(long);
    const device = (health as { device?: string }).device;
    const minTps = options.minTps ?? (device === "cuda" ? 450 : 0);
    const bar = minTps > 0 ? `needs >= ${minTps}` : `not judged on device ${device ?? "?"}`;
    if (longRead.problems.length > 0 || !longRead.body) {
      checks.row("single-stream tokens/s", false, `the long generation failed: ${longRead.problems.join("; ")}`);
    } else {
      const text = messageText(longRead.body.choices?.[0]?.message);
      const usage = longRead.body.usage?.completion_tokens ?? null;
      const problems = checks.answer("the long generation", text, usage, longRead.body.model, model);
      const counted = checks.count(text);
      if (counted === null) {
        checks.row("single-stream tokens/s", false, `cannot count the tokens: ${tokenizerError}; the server's usage (${usage}) is not taken on trust`);
      } else {
        // The smaller of the two: a usage above the text cannot inflate the speed, a re-encoding above the ids neither.
        const tokens = Math.min(counted, usage ?? counted);
        tps = tokens > 0 ? tokens / long.seconds : 0;
        checks.row(
          "single-stream tokens/s",
          problems.length === 0 && tps >= minTps && tokens > 0,
          `${problems.length > 0 ? `${problems.join("; ")}; ` : ""}${tps.toFixed(1)} tokens/s (${tokens} tokens in ${long.seconds.toFixed(2)} s: ${counted} by the model's tokenizer, usage ${usage}; max_tokens ${maxTokens}); ${bar}`,
        );
      }
    }
    checks.judgeAnswers();
    return report();
  } catch (error) {
    checks.row("selfcheck", false, `stopped: ${error instanceof Error ? error.message : String(error)}`);
    return report();
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    if (started) await stop(started);
  }

  function report(): SelfcheckReport {
    serverLogTail ??= logTail(started);
    return { ok: checks.rows.length > 0 && checks.rows.every((r) => r.ok), url: base, ready_s: readyS, tokens_per_s: tps, rows: checks.rows, server_log_tail: serverLogTail };
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
