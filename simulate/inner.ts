// Runs inside the simulator's fresh network namespace (`unshare -n node inner.js JOB`): brings loopback up,
// launches the traced serve.sh, polls /health from inside the namespace (nothing outside can reach it),
// sends one chat request once ready, stops the server and prints what it saw as one JSON line.
import { execFileSync, spawn } from "node:child_process";
import { openSync } from "node:fs";
import http from "node:http";

export interface InnerJob {
  command: string[];
  cwd: string;
  port: number;
  deadlineS: number;
  outputFile: string;
}

export interface InnerResult {
  loopbackUp: boolean;
  launchT: number;
  firstResponseT: number | null;
  readyT: number | null;
  health: unknown;
  models: unknown;
  chat: { status: number; seconds: number; body: unknown } | null;
  exited: { code: number | null; signal: string | null; t: number } | null;
  timedOut: boolean;
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

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch {
    return false;
  }
}

/** SIGTERM to the whole group (strace, bash, the server), SIGKILL whatever is left after 5 s. */
async function stopGroup(pgid: number): Promise<void> {
  if (!groupAlive(pgid)) return;
  process.kill(-pgid, "SIGTERM");
  for (let waited = 0; waited < 5000 && groupAlive(pgid); waited += 100) await sleep(100);
  if (groupAlive(pgid)) process.kill(-pgid, "SIGKILL");
  for (let waited = 0; waited < 2000 && groupAlive(pgid); waited += 50) await sleep(50);
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
    exited: null,
    timedOut: false,
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
  while (result.exited === null) {
    if (now() > deadline) {
      result.timedOut = true;
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
  if (result.readyT !== null) {
    const models = await request(job.port, "GET", "/v1/models");
    result.models = models.body;
    const id = (models.body as { data?: Array<{ id?: string }> } | null)?.data?.[0]?.id ?? "a2d";
    const started = now();
    const chat = await request(
      job.port,
      "POST",
      "/v1/chat/completions",
      { model: id, messages: [{ role: "user", content: "Say hello." }], max_tokens: 8 },
      120_000,
    );
    result.chat = { status: chat.status, seconds: now() - started, body: chat.body };
  }
  if (child.pid !== undefined) await stopGroup(child.pid);
  await exited;
  process.stdout.write(`${JSON.stringify(result)}\n`);
}

await main();
