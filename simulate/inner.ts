// Runs inside the simulator's fresh network namespace (`unshare -n node inner.js JOB`): brings loopback up,
// launches the traced, sandboxed serve.sh, polls /health from inside the namespace (nothing outside can
// reach it), and once ready reads which addresses the server listens on and chats with it (a short answer,
// then a long one, non-stream and stream); stops the server and prints what it saw as one JSON line.
import { execFileSync, spawn } from "node:child_process";
import { openSync, readFileSync } from "node:fs";
import http from "node:http";
import { setTimeout as sleep } from "node:timers/promises";

import { stopGroup } from "./process-group.js";
import { type ListenAddress, listeningSockets } from "./sockets.js";
import { type StreamEvents, parseEvents } from "./sse-events.js";

export interface InnerJob {
  command: string[];
  cwd: string;
  port: number;
  /** Hard limit: launch -> ready. */
  deadlineS: number;
  /**
   * Seconds the prediction adds to what this run measures (the GPU phases and the cold weights read of a
   * CUDA folder): once the time so far plus these exceeds budgetS the start cannot make it, and waiting
   * stops. Time after the addon loaded is not counted (the CPU backend's weights load is replaced on the GPU).
   */
  extraS: number;
  budgetS: number;
  /** The guard's event file: its dlopen of the engine addon marks where the counted host phases end. */
  guardReport: string;
  outputFile: string;
  /** Longest answer to ask for; the run asks for what fits in about 20 s at the speed of a short first answer. */
  longTokens: number;
}

export interface ChatProbe {
  status: number;
  seconds: number;
  body: unknown;
}

export interface StreamProbe extends StreamEvents {
  status: number;
  seconds: number;
}

export interface InnerResult {
  loopbackUp: boolean;
  launchT: number;
  firstResponseT: number | null;
  readyT: number | null;
  health: unknown;
  models: unknown;
  chat: ChatProbe | null;
  longChat: ChatProbe | null;
  stream: StreamProbe | null;
  maxTokensAsked: number | null;
  /** Every TCP socket listening in the namespace, read from /proc/net/tcp{,6} once ready (or at the end). */
  listening: ListenAddress[];
  exited: { code: number | null; signal: string | null; t: number } | null;
  timedOut: boolean;
  /** Stopped before the deadline: the host phases so far plus the predicted ones already exceed the budget. */
  stoppedOverPrediction: { atS: number; countedS: number } | null;
}

function now(): number {
  return (performance.timeOrigin + performance.now()) / 1000;
}

function request(port: number, method: string, path: string, body?: unknown, timeoutMs = 2000): Promise<{ status: number; body: unknown }> {
  return new Promise((resolve) => {
    const payload = body === undefined ? undefined : JSON.stringify(body);
    const req = http.request(
      {
        host: "127.0.0.1",
        port,
        method,
        path,
        timeout: timeoutMs,
        headers: payload ? { "content-type": "application/json", "content-length": Buffer.byteLength(payload) } : {},
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          const text = Buffer.concat(chunks).toString("utf8");
          let parsed: unknown = text;
          try {
            parsed = JSON.parse(text);
          } catch {
            // not JSON: keep the text
          }
          resolve({ status: res.statusCode ?? 0, body: parsed });
        });
      },
    );
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.on("error", () => resolve({ status: 0, body: null }));
    if (payload) req.write(payload);
    req.end();
  });
}

function streamRequest(port: number, body: unknown, timeoutMs: number): Promise<Omit<StreamProbe, "seconds">> {
  return new Promise((resolve) => {
    const payload = JSON.stringify(body);
    const result: Omit<StreamProbe, "seconds"> = { status: 0, chunks: [], done: false, malformed: [] };
    const req = http.request(
      {
        host: "127.0.0.1",
        port,
        method: "POST",
        path: "/v1/chat/completions",
        timeout: timeoutMs,
        headers: { "content-type": "application/json", accept: "text/event-stream", "content-length": Buffer.byteLength(payload) },
      },
      (res) => {
        result.status = res.statusCode ?? 0;
        let text = "";
        res.on("data", (c: Buffer) => (text += c.toString("utf8")));
        res.on("end", () => {
          Object.assign(result, parseEvents(text));
          resolve(result);
        });
      },
    );
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.on("error", () => resolve(result));
    req.write(payload);
    req.end();
  });
}

/** When the guard saw the engine addon loaded (seconds since the epoch), or null. */
function addonLoadedAt(guardReport: string): number | null {
  let text = "";
  try {
    text = readFileSync(guardReport, "utf8");
  } catch {
    return null;
  }
  for (const line of text.split("\n")) {
    if (!line.includes('"dlopen-end"')) continue;
    try {
      const event = JSON.parse(line) as { file?: string; t?: number };
      if (event.file?.endsWith(".node") && typeof event.t === "number") return event.t;
    } catch {
      // a line being written
    }
  }
  return null;
}

/** Python's ioctl for machines without iproute2: SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP. */
const LO_UP_PY = `
import fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH14s", fcntl.ioctl(s, 0x8913, struct.pack("16sH14s", b"lo", 0, b"")))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 1, b""))
`;

function loopbackUp(): boolean {
  for (const [program, args] of [["ip", ["link", "set", "lo", "up"]], ["python3", ["-c", LO_UP_PY]]] as const) {
    try {
      execFileSync(program, args, { stdio: "ignore" });
      return true;
    } catch {
      // try the next way; without any, the caller reports an isolation problem
    }
  }
  return false;
}

async function main(): Promise<void> {
  const job = JSON.parse(process.argv[2]!) as InnerJob;
  const result: InnerResult = {
    loopbackUp: false,
    launchT: 0,
    firstResponseT: null,
    readyT: null,
    health: null,
    models: null,
    chat: null,
    longChat: null,
    stream: null,
    maxTokensAsked: null,
    listening: [],
    exited: null,
    timedOut: false,
    stoppedOverPrediction: null,
  };
  result.loopbackUp = loopbackUp();
  const output = openSync(job.outputFile, "w");
  result.launchT = now();
  const child = spawn(job.command[0]!, job.command.slice(1), { cwd: job.cwd, stdio: ["ignore", output, output], detached: true });
  const exited = new Promise<void>((resolve) =>
    child.on("exit", (code, signal) => {
      result.exited = { code, signal, t: now() };
      resolve();
    }),
  );
  const deadline = result.launchT + job.deadlineS;
  let wrongPortSince: number | null = null;
  while (result.exited === null) {
    const t = now();
    if (t > deadline) {
      result.timedOut = true;
      break;
    }
    // A server listening elsewhere but not on $PORT for a few seconds will never answer there.
    const sockets = listeningSockets();
    if (sockets.length > 0 && !sockets.some((l) => l.port === job.port)) {
      wrongPortSince ??= t;
      if (t - wrongPortSince > 5) break;
    } else wrongPortSince = null;
    const counted = (addonLoadedAt(job.guardReport) ?? t) - result.launchT;
    if (job.extraS > 0 && counted + job.extraS > job.budgetS) {
      result.stoppedOverPrediction = { atS: t - result.launchT, countedS: counted };
      break;
    }
    const health = await request(job.port, "GET", "/health", undefined, 1000);
    if (health.status !== 0 && result.firstResponseT === null) result.firstResponseT = now();
    if (health.status === 200) {
      result.readyT = now();
      result.health = health.body;
      break;
    }
    await sleep(50);
  }
  result.listening = listeningSockets();
  if (result.readyT !== null) {
    const models = await request(job.port, "GET", "/v1/models");
    result.models = models.body;
    const id = (models.body as { data?: Array<{ id?: string }> } | null)?.data?.[0]?.id ?? "a2d";
    const chat = async (maxTokens: number, content: string): Promise<ChatProbe> => {
      const started = now();
      const response = await request(job.port, "POST", "/v1/chat/completions", { model: id, messages: [{ role: "user", content }], max_tokens: maxTokens }, 300_000);
      return { status: response.status, seconds: now() - started, body: response.body };
    };
    result.chat = await chat(16, "Say hello.");
    const tokens = (result.chat.body as { usage?: { completion_tokens?: number } } | null)?.usage?.completion_tokens ?? 0;
    const perToken = tokens > 0 ? result.chat.seconds / tokens : 1;
    // Long enough to cross many blocks and stream many chunks; bounded so a slow CPU run stays in minutes.
    const longTokens = Math.max(32, Math.min(job.longTokens, Math.floor(20 / perToken)));
    result.maxTokensAsked = longTokens;
    const prompt = "Write a long, detailed story about a lighthouse keeper.";
    if (result.chat.status === 200) {
      result.longChat = await chat(longTokens, prompt);
      const started = now();
      const stream = await streamRequest(
        job.port,
        { model: id, messages: [{ role: "user", content: prompt }], max_tokens: longTokens, stream: true, stream_options: { include_usage: true } },
        300_000,
      );
      result.stream = { ...stream, seconds: now() - started };
    }
  }
  if (child.pid !== undefined) await stopGroup(child.pid, 5000);
  await exited;
  process.stdout.write(`${JSON.stringify(result)}\n`);
}

await main();
