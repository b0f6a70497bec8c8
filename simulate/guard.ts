// Preloaded into the packed server by the cold-start simulator (NODE_OPTIONS=--import=<this file>): any
// outbound socket to a non-loopback address, and any DNS lookup of a name other than localhost, throws and is
// recorded. It also timestamps the process start and every native addon load for the phase table. The events
// go, one JSON object per line, to the file named by A2D_GUARD_REPORT.
import dgram from "node:dgram";
import dns from "node:dns";
import { appendFileSync } from "node:fs";
import net from "node:net";

const reportFile = process.env.A2D_GUARD_REPORT;

function now(): number {
  return (performance.timeOrigin + performance.now()) / 1000;
}

function record(event: Record<string, unknown>): void {
  if (!reportFile) return;
  // Synchronous, so the event is on disk even when the throw below ends the process.
  appendFileSync(reportFile, `${JSON.stringify({ ...event, pid: process.pid, t: now() })}\n`);
}

export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, "").toLowerCase();
  return (
    h === "localhost" ||
    h.endsWith(".localhost") ||
    h === "::1" ||
    h === "0.0.0.0" ||
    h === "::" ||
    /^127\.\d+\.\d+\.\d+$/.test(h) ||
    /^::ffff:127\.\d+\.\d+\.\d+$/.test(h)
  );
}

function refuse(api: string, target: string): never {
  const stack = new Error().stack?.split("\n").slice(3, 9).join("\n");
  record({ kind: "network", api, target, stack });
  const error = new Error(`a2d offline guard: ${api} to ${target} refused — a packed server must not use the network`);
  (error as NodeJS.ErrnoException).code = "A2D_OFFLINE";
  throw error;
}

record({ kind: "preload", argv: process.argv.slice(1) });

type ConnectArgs = [unknown, unknown?, unknown?];
function connectTarget(args: ConnectArgs): { host: string; port: string } | null {
  const [first, second] = args;
  // connect(options[, cb]), connect(port[, host][, cb]), connect(path[, cb]); the internal normalized form
  // is an array whose first element is the options object.
  const options = Array.isArray(first) ? first[0] : first;
  if (options && typeof options === "object") {
    const o = options as { path?: string; host?: string; port?: number | string };
    if (o.path !== undefined) return null;
    return { host: o.host ?? "localhost", port: String(o.port ?? "") };
  }
  if (typeof options === "number" || (typeof options === "string" && /^\d+$/.test(options))) {
    return { host: typeof second === "string" ? second : "localhost", port: String(options) };
  }
  return null; // a pipe path
}

const originalConnect = net.Socket.prototype.connect;
net.Socket.prototype.connect = function guardedConnect(this: net.Socket, ...args: unknown[]) {
  const target = connectTarget(args as ConnectArgs);
  if (target && !isLoopbackHost(target.host)) refuse("net connect", `${target.host}:${target.port}`);
  return (originalConnect as (...a: unknown[]) => net.Socket).apply(this, args);
} as typeof net.Socket.prototype.connect;

function guardLookup<T extends (...a: never[]) => unknown>(api: string, original: T): T {
  return function guarded(this: unknown, ...args: unknown[]) {
    const host = args[0];
    if (typeof host === "string" && !isLoopbackHost(host)) refuse(api, host);
    return (original as unknown as (...a: unknown[]) => unknown).apply(this, args);
  } as unknown as T;
}

dns.lookup = guardLookup("dns.lookup", dns.lookup);
dns.promises.lookup = guardLookup("dns.promises.lookup", dns.promises.lookup);
for (const name of ["resolve", "resolve4", "resolve6", "resolveAny", "resolveCname", "resolveMx", "resolveTxt", "resolveSrv"] as const) {
  (dns as unknown as Record<string, unknown>)[name] = guardLookup(`dns.${name}`, dns[name] as (...a: never[]) => unknown);
  (dns.promises as unknown as Record<string, unknown>)[name] = guardLookup(
    `dns.promises.${name}`,
    dns.promises[name] as (...a: never[]) => unknown,
  );
}

const originalSend = dgram.Socket.prototype.send;
dgram.Socket.prototype.send = function guardedSend(this: dgram.Socket, ...args: unknown[]) {
  // send(msg[, offset, length], port[, address][, cb]): the address is the first string after the message.
  const address = args.slice(1).find((a) => typeof a === "string") as string | undefined;
  if (address !== undefined && !isLoopbackHost(address)) refuse("udp send", address);
  return (originalSend as (...a: unknown[]) => void).apply(this, args);
} as typeof dgram.Socket.prototype.send;

const originalUdpConnect = dgram.Socket.prototype.connect;
dgram.Socket.prototype.connect = function guardedUdpConnect(this: dgram.Socket, ...args: unknown[]) {
  const address = typeof args[1] === "string" ? args[1] : "localhost";
  if (!isLoopbackHost(address)) refuse("udp connect", `${address}:${String(args[0])}`);
  return (originalUdpConnect as (...a: unknown[]) => void).apply(this, args);
} as typeof dgram.Socket.prototype.connect;

const originalDlopen = process.dlopen;
process.dlopen = function timedDlopen(...args: Parameters<typeof process.dlopen>) {
  const file = String(args[1]);
  record({ kind: "dlopen-start", file });
  try {
    const result = originalDlopen.apply(process, args);
    record({ kind: "dlopen-end", file, ok: true });
    return result;
  } catch (error) {
    record({ kind: "dlopen-end", file, ok: false, error: (error as Error).message });
    throw error;
  }
} as typeof process.dlopen;
