// The root the simulated start sees: a bubblewrap sandbox holding the folder, an empty HOME and TMPDIR, and a
// minimal root built for the purpose (the programs a bare Linux machine has, the libraries they and glibc's
// family load, libstdc++ for Node, a tiny /etc), run as an unprivileged user. Anything else the start reads
// (/usr/share/..., /root/..., /usr/local/cuda, a Python) is not there, so the start fails the way it would on
// a fresh machine. The network namespace is the caller's (simulate/inner.ts makes one with only loopback).
// Run by root, bwrap mounts with root's own rights and the start drops to the unprivileged user inside
// (setpriv), so file permissions are checked as for any other user: a folder packed under umask 077 fails.
// Run by anyone else, bwrap maps that user into a user namespace and the start runs as them.
import { execa } from "execa";
import { existsSync, readdirSync, realpathSync } from "node:fs";
import { chown, copyFile, mkdir, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";

import { isHostLibrary } from "../pack/floors.js";

/** The unprivileged user of the sandbox (nobody on Debian and Ubuntu). */
export const SANDBOX_UID = 65534;

const PATH_DIRS = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"];

/** Programs any Linux box has, that serve.sh or the driver may run. */
export const BARE_PROGRAMS = new Set(
  (
    "bash sh dash env ldconfig ldconfig.real ldd nvidia-smi cat cp mv rm mkdir rmdir ln ls dirname basename readlink " +
    "realpath pwd date sleep mktemp tee uname id whoami printf echo true false test [ head tail cut tr wc sort uniq " +
    "nproc stat touch chmod du df timeout nice nohup stdbuf grep egrep fgrep sed awk gawk mawk find xargs which getconf"
  ).split(" "),
);

/** Where /lib, /lib64, /bin and /sbin point on a merged-/usr system, which the sandbox root is. */
function usrPath(path: string): string {
  return path.replace(/^\/(lib64|lib|bin|sbin)\//, "/usr/$1/");
}

export interface SandboxPaths {
  folder: string;
  home: string;
  tmp: string;
  /** The simulator's own files (the Node guard, its report): readable and writable by the sandbox user. */
  instrument: string;
  /** Scratch for the sandbox's /etc. */
  etc: string;
}

async function libraryClosure(programs: string[]): Promise<string[]> {
  const libraries = new Set<string>();
  for (const program of programs) {
    const result = await execa("ldd", [program], { reject: false, env: { LC_ALL: "C" } });
    for (const line of result.stdout.split("\n")) {
      const path = /=>\s+(\/\S+)\s+\(0x/.exec(line)?.[1] ?? /^\s*(\/\S+)\s+\(0x/.exec(line)?.[1];
      if (path) libraries.add(path);
    }
  }
  return [...libraries];
}

/** glibc's family and the C++ runtime (pack/floors.ts's host libraries) as this machine has them; with `gpu`, the driver's too. */
async function hostRuntimeLibraries(gpu: boolean): Promise<string[]> {
  const result = await execa("ldconfig", ["-p"], { reject: false, env: { LC_ALL: "C" } });
  const paths: string[] = [];
  for (const line of result.stdout.split("\n")) {
    const match = /^\s*(\S+)\s+\(libc6,x86-64[^)]*\)\s+=>\s+(\S+)$/.exec(line);
    if (match && isHostLibrary(match[1]!) && (gpu || !/^lib(cuda|nvidia|nvcuvid|cudadebugger)/.test(match[1]!))) paths.push(match[2]!);
  }
  return paths;
}

function findProgram(name: string): string | null {
  for (const dir of PATH_DIRS) if (existsSync(join(dir, name))) return join(dir, name);
  return null;
}

const asRoot = () => process.getuid?.() === 0;

/** `bwrap` arguments up to the command, which `insideCommand` then prefixes. */
export async function sandboxArgs(paths: SandboxPaths, env: Record<string, string>, gpu = false): Promise<string[]> {
  const args = [...(asRoot() ? [] : ["--unshare-user"]), "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent"];
  args.push("--tmpfs", "/");
  // Folders bwrap makes on the way to a mount point are private to root (0700): every one is made first,
  // world-readable, as on any machine.
  const dirs = new Set<string>(["/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib64"]);
  const binds: string[] = [];
  for (const [link, target] of [["/bin", "usr/bin"], ["/sbin", "usr/sbin"], ["/lib", "usr/lib"], ["/lib64", "usr/lib64"]]) binds.push("--symlink", target!, link!);

  const programs = [...BARE_PROGRAMS, "setpriv"].map((name) => [name, findProgram(name)] as const).filter((p): p is [string, string] => p[1] !== null);
  const bound = new Set<string>();
  const addParents = (path: string) => {
    for (let d = dirname(path); d !== "/" && !dirs.has(d); d = dirname(d)) dirs.add(d);
  };
  const bind = (from: string, to: string) => {
    if (bound.has(to)) return;
    bound.add(to);
    addParents(to);
    binds.push("--ro-bind", from, to);
  };
  for (const [name, path] of programs) {
    const dest = usrPath(path);
    // The program where the bare PATH finds it (/usr/bin), and where the host keeps it (ldconfig in /sbin).
    bind(realpathSync(path), dest.startsWith("/usr/local/") ? `/usr/bin/${name}` : dest);
  }
  const libraries = [...(await libraryClosure(programs.map(([, path]) => path))), ...(await hostRuntimeLibraries(gpu))];
  for (const library of libraries) {
    const real = realpathSync(library);
    bind(real, usrPath(real));
    const seen = usrPath(library);
    if (seen !== usrPath(real) && !bound.has(seen)) {
      bound.add(seen);
      addParents(seen);
      binds.push("--symlink", usrPath(real), seen);
    }
  }

  await mkdir(paths.etc, { recursive: true });
  await writeFile(join(paths.etc, "passwd"), `root:x:0:0:root:/root:/bin/sh\nnobody:x:${SANDBOX_UID}:${SANDBOX_UID}:nobody:/nonexistent:/usr/sbin/nologin\n`);
  await writeFile(join(paths.etc, "group"), `root:x:0:\nnogroup:x:${SANDBOX_UID}:\n`);
  await writeFile(join(paths.etc, "hosts"), "127.0.0.1 localhost\n::1 localhost\n");
  // The loader finds the multiarch library folders through its cache (it lists libraries the sandbox lacks too).
  if (existsSync("/etc/ld.so.cache")) await copyFile("/etc/ld.so.cache", join(paths.etc, "ld.so.cache"));
  binds.push("--ro-bind", paths.etc, "/etc", "--proc", "/proc", "--dev", "/dev");
  // A machine with the driver has its device files; a container run with --gpus gets them the same way.
  if (gpu) {
    for (const name of existsSync("/dev") ? readdirSync("/dev").filter((n) => /^nvidia/.test(n)) : []) binds.push("--dev-bind", `/dev/${name}`, `/dev/${name}`);
  }
  for (const dir of [paths.home, paths.tmp, paths.instrument, paths.folder]) {
    addParents(dir);
    binds.push("--bind", dir, dir);
  }
  for (const dir of [...dirs].sort((a, b) => a.split("/").length - b.split("/").length || (a < b ? -1 : 1))) args.push("--perms", "0755", "--dir", dir);
  args.push(...binds, "--chdir", paths.tmp, "--clearenv");
  for (const [key, value] of Object.entries(env)) args.push("--setenv", key, value);
  return args;
}

/** The sandbox user owns its HOME, TMPDIR and the guard's report. */
export async function handToSandboxUser(dirs: string[]): Promise<void> {
  if (!asRoot()) return;
  for (const dir of dirs) await chown(dir, SANDBOX_UID, SANDBOX_UID);
}

/** Inside the sandbox, before the start: drop root to the unprivileged user (nothing when not root, or without setpriv). */
export function insideCommand(): string[] {
  return asRoot() && findProgram("setpriv") ? ["/usr/bin/setpriv", `--reuid=${SANDBOX_UID}`, `--regid=${SANDBOX_UID}`, "--clear-groups"] : [];
}
