// The TCP sockets listening in this process's network namespace, read from /proc/net/tcp{,6}: how the
// simulator and selfcheck tell a server on 0.0.0.0 (reachable from outside) from one on 127.0.0.1 only.
import { readFileSync } from "node:fs";

export interface ListenAddress {
  address: string;
  port: number;
}

/** LISTEN sockets of this network namespace (hex address:port in /proc/net/tcp, state 0A). */
export function listeningSockets(): ListenAddress[] {
  const out: ListenAddress[] = [];
  for (const [file, v6] of [["/proc/net/tcp", false], ["/proc/net/tcp6", true]] as const) {
    let text = "";
    try {
      text = readFileSync(file, "utf8");
    } catch {
      continue;
    }
    for (const line of text.split("\n").slice(1)) {
      const fields = line.trim().split(/\s+/);
      if (fields.length < 4 || fields[3] !== "0A") continue;
      const [hex, portHex] = fields[1]!.split(":");
      out.push({ address: v6 ? ipv6(hex!) : ipv4(hex!), port: parseInt(portHex!, 16) });
    }
  }
  return out;
}

function ipv4(hex: string): string {
  return [3, 2, 1, 0].map((i) => parseInt(hex.slice(i * 2, i * 2 + 2), 16)).join(".");
}

function ipv6(hex: string): string {
  if (/^0{32}$/.test(hex)) return "::";
  if (hex === "00000000000000000000000001000000") return "::1";
  if (hex.startsWith("0000000000000000FFFF0000")) return `::ffff:${ipv4(hex.slice(24))}`;
  return hex.toLowerCase();
}

/** Listening on every address of the machine (IPv4 or dual-stack IPv6), not on loopback only. */
export function listensOnAllAddresses(address: string): boolean {
  return address === "0.0.0.0" || address === "::";
}
