// Reads an `strace -f -ttt` log into the events the simulator judges: program runs, file opens (with whether
// they write), directory and name changes, socket connects and sends with their addresses, and listen().

export type StraceEvent =
  | { kind: "exec"; pid: number; t: number; path: string; argv: string[]; ok: boolean }
  | { kind: "open"; pid: number; t: number; path: string; write: boolean; ok: boolean; errno?: string }
  | { kind: "modify"; pid: number; t: number; call: string; path: string; ok: boolean }
  | { kind: "net"; pid: number; t: number; call: string; family: string; address: string; port: number; ok: boolean }
  | { kind: "listen"; pid: number; t: number }
  | { kind: "spawn"; pid: number; t: number; child: number };

/** The syscalls to trace; keep in line with parseStrace. */
export const TRACED_SYSCALLS = [
  "execve",
  "execveat",
  "open",
  "openat",
  "creat",
  "mkdir",
  "mkdirat",
  "rename",
  "renameat",
  "renameat2",
  "unlink",
  "unlinkat",
  "truncate",
  "connect",
  "sendto",
  "sendmsg",
  "listen",
  "clone",
  "clone3",
  "fork",
  "vfork",
];

const LINE = /^(\d+)\s+(\d+\.\d+)\s+(\w+)\((.*)\)\s+=\s+(-?\d+|\?)(?:\s+(\w+))?/;

function unquote(quoted: string): string {
  return quoted.replace(/\\(x[0-9a-f]{2}|[0-7]{1,3}|.)/g, (_, esc: string) => {
    if (esc.startsWith("x")) return String.fromCharCode(parseInt(esc.slice(1), 16));
    if (/^[0-7]+$/.test(esc)) return String.fromCharCode(parseInt(esc, 8));
    return esc === "n" ? "\n" : esc === "t" ? "\t" : esc;
  });
}

function strings(args: string): string[] {
  return [...args.matchAll(/"((?:[^"\\]|\\.)*)"/g)].map((m) => unquote(m[1]!));
}

function sockaddr(args: string): { family: string; address: string; port: number } | null {
  const family = /sa_family=(AF_\w+)/.exec(args)?.[1];
  if (!family) return null;
  const port = Number(/sin6?_port=htons\((\d+)\)/.exec(args)?.[1] ?? 0);
  const v4 = /sin_addr=inet_addr\("([^"]+)"\)/.exec(args)?.[1];
  const v6 = /inet_pton\(AF_INET6,\s*"([^"]+)"/.exec(args)?.[1];
  const unix = /sun_path=(?:@)?"([^"]*)"/.exec(args)?.[1];
  return { family, address: v4 ?? v6 ?? unix ?? "", port };
}

const WRITE_FLAGS = /O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND/;

export function parseStrace(text: string): StraceEvent[] {
  const events: StraceEvent[] = [];
  const pending = new Map<string, string>(); // pid -> the start of an "<unfinished ...>" line
  for (const raw of text.split("\n")) {
    let line = raw;
    const unfinished = /^(\d+)\s+(.*)\s<unfinished \.\.\.>$/.exec(line);
    if (unfinished) {
      pending.set(unfinished[1]!, `${unfinished[1]} ${unfinished[2]}`);
      continue;
    }
    const resumed = /^(\d+)\s+\d+\.\d+\s+<\.\.\. \w+ resumed>(.*)$/.exec(line);
    if (resumed) {
      const start = pending.get(resumed[1]!);
      if (!start) continue;
      pending.delete(resumed[1]!);
      line = `${start}${resumed[2]}`;
    }
    const m = LINE.exec(line);
    if (!m) continue;
    const pid = Number(m[1]);
    const t = Number(m[2]);
    const call = m[3]!;
    const args = m[4]!;
    const ok = m[5] !== "-1";
    const errno = m[6];
    switch (call) {
      case "execve":
      case "execveat": {
        const [path = "", ...argv] = strings(args);
        events.push({ kind: "exec", pid, t, path, argv, ok });
        break;
      }
      case "open":
      case "openat":
      case "creat": {
        const path = strings(args)[0];
        if (path === undefined) break;
        const write = call === "creat" || WRITE_FLAGS.test(args);
        events.push({ kind: "open", pid, t, path, write, ok, ...(ok ? {} : { errno }) });
        break;
      }
      case "mkdir":
      case "mkdirat":
      case "rename":
      case "renameat":
      case "renameat2":
      case "unlink":
      case "unlinkat":
      case "truncate": {
        // For renames the destination is the last path.
        const paths = strings(args);
        const path = call.startsWith("rename") ? paths[paths.length - 1] : paths[0];
        if (path !== undefined) events.push({ kind: "modify", pid, t, call, path, ok });
        break;
      }
      case "connect":
      case "sendto":
      case "sendmsg": {
        const address = sockaddr(args);
        if (address) events.push({ kind: "net", pid, t, call, ...address, ok });
        break;
      }
      case "listen":
        if (ok) events.push({ kind: "listen", pid, t });
        break;
      case "clone":
      case "clone3":
      case "fork":
      case "vfork":
        if (ok && m[5] !== "?") events.push({ kind: "spawn", pid, t, child: Number(m[5]) });
        break;
    }
  }
  return events;
}
