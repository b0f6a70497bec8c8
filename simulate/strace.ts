// Reads an `strace -f -ttt` log into the events the simulator judges: program runs, file opens (with whether
// they write), directory and name changes, socket connects and sends with their addresses, and listen().

export type StraceEvent =
  | { kind: "exec"; pid: number; t: number; path: string; argv: string[]; ok: boolean }
  | { kind: "open"; pid: number; t: number; path: string; name: string; write: boolean; flags: string; ok: boolean; errno?: string }
  | { kind: "modify"; pid: number; t: number; call: string; path: string; name: string; ok: boolean; errno?: string }
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
  "chdir",
  "fchdir",
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

/** The quoted strings of an argument list, each with the argument before it (a dirfd for the *at calls). */
function quotedArgs(args: string): Array<{ value: string; before: string }> {
  const out: Array<{ value: string; before: string }> = [];
  let last = 0;
  for (const m of args.matchAll(/"((?:[^"\\]|\\.)*)"(\.\.\.)?/g)) {
    const before = args.slice(last, m.index).replace(/,\s*$/, "").split(",").pop()?.trim() ?? "";
    out.push({ value: unquote(m[1]!), before });
    last = m.index + m[0].length;
  }
  return out;
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

function join(base: string, path: string): string {
  const parts = (path.startsWith("/") ? path : `${base}/${path}`).split("/");
  const out: string[] = [];
  for (const part of parts) {
    if (part === "" || part === ".") continue;
    if (part === "..") out.pop();
    else out.push(part);
  }
  return `/${out.join("/")}`;
}

/**
 * Paths come out absolute: each process's working directory (chdir, inherited across clone/fork) and its
 * directory descriptors (from openat results) are followed, so `mkdir -p`'s mkdirat(3, "a") and a relative
 * open after `cd` land where they really are. Events whose directory cannot be known are dropped.
 */
export function parseStrace(text: string, initialCwd: string): StraceEvent[] {
  const events: StraceEvent[] = [];
  const pending = new Map<string, string>(); // pid -> the start of an "<unfinished ...>" line
  const cwd = new Map<number, string>();
  const fds = new Map<number, Map<number, string>>();
  const cwdOf = (pid: number) => cwd.get(pid) ?? initialCwd;
  const base = (pid: number, dirfd: string): string | null =>
    dirfd === "" || dirfd === "AT_FDCWD" || !/^\d+$/.test(dirfd) ? cwdOf(pid) : (fds.get(pid)?.get(Number(dirfd)) ?? null);
  const resolvePath = (pid: number, arg: { value: string; before: string }, atCall: boolean): string | null => {
    if (arg.value.startsWith("/")) return join("/", arg.value);
    const dir = atCall ? base(pid, arg.before) : cwdOf(pid);
    return dir === null ? null : join(dir, arg.value);
  };

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
    const result = Number(m[5]);
    const errno = m[6];
    const atCall = call.endsWith("at") || call === "renameat2";
    const quoted = quotedArgs(args);
    switch (call) {
      case "execve":
      case "execveat": {
        const [path, ...argv] = quoted.map((q) => q.value);
        if (path !== undefined) events.push({ kind: "exec", pid, t, path: join(cwdOf(pid), path), argv, ok });
        break;
      }
      case "chdir": {
        const path = quoted[0] && resolvePath(pid, quoted[0], false);
        if (ok && path) cwd.set(pid, path);
        break;
      }
      case "fchdir": {
        const dir = fds.get(pid)?.get(Number(args.trim()));
        if (ok && dir) cwd.set(pid, dir);
        break;
      }
      case "open":
      case "openat":
      case "creat": {
        // An empty name names no file (the kernel refuses it with ENOENT): nothing to judge.
        if (quoted[0]?.value === "") break;
        const path = quoted[0] && resolvePath(pid, quoted[0], atCall);
        if (!path) break;
        if (ok) {
          if (!fds.has(pid)) fds.set(pid, new Map());
          fds.get(pid)!.set(result, path);
        }
        const write = call === "creat" || WRITE_FLAGS.test(args);
        const flags = /\bO_[A-Z_|]+/.exec(args)?.[0] ?? "";
        events.push({ kind: "open", pid, t, path, name: quoted[0]!.value, write, flags, ok, ...(ok ? {} : { errno }) });
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
        const target = call.startsWith("rename") ? quoted[quoted.length - 1] : quoted[0];
        if (target?.value === "") break;  // names no file, as for open
        const path = target && resolvePath(pid, target, atCall);
        if (path) events.push({ kind: "modify", pid, t, call, path, name: target.value, ok, ...(ok ? {} : { errno }) });
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
        if (ok && m[5] !== "?") {
          const child = Number(m[5]);
          cwd.set(child, cwdOf(pid));
          fds.set(child, new Map(fds.get(pid)));
          events.push({ kind: "spawn", pid, t, child });
        }
        break;
    }
  }
  return events;
}
