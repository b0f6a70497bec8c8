// Runs untrusted programs (model-written code) one process tree at a time, each in:
// - its own network namespace (no interfaces but a down loopback: every connection fails),
// - its own PID namespace with a private /proc, so it sees only its own processes, and killing the tree
//   is one kill: when the namespace's first process dies the kernel kills everything left inside,
//   including children that called setsid() or daemonized,
// - its own mount namespace pivoted into a minimal root: a read-only tmpfs holding /usr (read-only,
//   plus the /bin, /lib… links or read-only binds of the host layout), /dev/{null,zero,full,random,
//   urandom}, the private /proc, and /work: a small tmpfs that is its cwd, HOME and TMPDIR and the only
//   writable place. Nothing of the host's /tmp, /home, /root, /etc or the project is visible; what the
//   program needs is copied into /work, and the expected answers never are,
// - an unprivileged uid (`nobody`) with no capabilities and no_new_privs, so it cannot undo any of that,
// - rlimits: CPU seconds, address space, processes (RLIMIT_NPROC, which is what contains a fork bomb),
//   file size, open files, no core dumps,
// with a wall-clock timeout and an output cap enforced from here by SIGKILL to the process group.
// An optional channel (fd 3 from the program, fd 4 to it) lets a driver inside report one result at a
// time and wait to be told to go on (eval/sandbox_driver.py).
// Needs root (namespaces, mounts, pivot_root, setpriv) and util-linux.
import { spawn } from "node:child_process";
import { realpathSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import type { Readable, Writable } from "node:stream";

export interface SandboxLimits {
  /** Wall-clock limit of the whole run; CPU time is limited to the same, rounded up to whole seconds. */
  timeoutMs: number;
  /** RLIMIT_AS per process. */
  memoryBytes: number;
  /** RLIMIT_NPROC for the sandbox uid. */
  maxProcesses: number;
  /** stdout or stderr beyond this, or one channel message (one test's output) longer than this, kills the run. */
  maxOutputBytes: number;
  /** RLIMIT_FSIZE: the largest file the program may write. */
  maxFileBytes: number;
  /** Room in /work beyond the files copied there. */
  workBytes: number;
}

export const DEFAULT_LIMITS: SandboxLimits = {
  timeoutMs: 6_000,
  memoryBytes: 4 * 1024 ** 3,
  maxProcesses: 32,
  maxOutputBytes: 32 * 1024 ** 2,
  maxFileBytes: 64 * 1024 ** 2,
  workBytes: 64 * 1024 ** 2,
};

export interface SandboxRun {
  /** Files to create in /work (plain names) before the program starts. */
  files: Record<string, string>;
  /** The command, resolved inside the sandbox (PATH=/usr/local/bin:/usr/bin:/bin), run in /work. */
  argv: string[];
  stdin?: string;
  limits?: Partial<SandboxLimits>;
  /** Host directories to show read-only at the same path (an interpreter installed outside /usr). */
  readOnlyPaths?: string[];
}

export interface SandboxResult {
  /** Exit code of the program; null when it was killed by a signal. */
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  outputExceeded: boolean;
  wallMs: number;
}

/** The uid/gid the program runs as: `nobody` on Debian and most distributions. */
const SANDBOX_UID = 65534;
const SANDBOX_GID = 65534;

// Runs as root inside the new namespaces, then drops to the sandbox uid. `exit $?` keeps sh as PID 1
// (no exec), so the program is an ordinary process and the namespace dies with sh. The tools it calls
// after pivot_root come from the new root's read-only /usr.
const SETUP_SCRIPT = `set -eu
PATH=/usr/sbin:/usr/bin:/sbin:/bin
box=$1; uid=$2; gid=$3; nproc=$4; as=$5; cpu=$6; fsize=$7; worksize=$8; nbinds=$9; shift 9
root=$box/root
mount -t tmpfs -o size=256k,mode=0755,nosuid,nodev a2d-sandbox "$root"
mkdir "$root/usr" "$root/proc" "$root/dev" "$root/work" "$root/.old"
mount --bind /usr "$root/usr"
mount -o remount,bind,ro,nosuid,nodev "$root/usr"
for d in bin sbin lib lib32 lib64 libx32; do
  if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$root/$d"
  elif [ -d "/$d" ]; then mkdir "$root/$d"; mount --bind "/$d" "$root/$d"; mount -o remount,bind,ro,nosuid,nodev "$root/$d"
  fi
done
while [ "$nbinds" -gt 0 ]; do
  mkdir -p "$root$1"; mount --bind "$1" "$root$1"; mount -o remount,bind,ro,nosuid,nodev "$root$1"
  shift; nbinds=$((nbinds - 1))
done
for n in null zero full random urandom; do
  touch "$root/dev/$n"; mount --bind "/dev/$n" "$root/dev/$n"
done
mount -t tmpfs -o "size=$worksize,mode=0700,uid=$uid,gid=$gid,nosuid,nodev" a2d-work "$root/work"
cp -R "$box/files/." "$root/work/"
chown -R "$uid:$gid" "$root/work"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
cd "$root"
pivot_root . .old
umount -l /.old
rmdir /.old
mount -o remount,bind,ro /
cd /work
setpriv --reuid="$uid" --regid="$gid" --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs \\
  prlimit --nproc="$nproc" --as="$as" --cpu="$cpu" --fsize="$fsize" --nofile=256 --core=0 -- \\
  env -i HOME=/work TMPDIR=/work PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 "$@"
exit $?
`;

/** A running sandbox with the driver channel: `messages` are the lines it writes on fd 3. */
export interface SandboxSession {
  messages: AsyncIterableIterator<string>;
  /** Writes one line to the program's fd 4. */
  send(line: string): void;
  /** SIGKILLs the whole process tree. */
  kill(): void;
  result: Promise<SandboxResult>;
}

/** Runs a program to the end: stdin in, stdout and stderr out. */
export async function runSandboxed(run: SandboxRun): Promise<SandboxResult> {
  const session = await openSandbox(run, false);
  return session.result;
}

/** Starts a program with the fd 3 / fd 4 channel; the caller reads `messages` and awaits `result`. */
export function openSandboxSession(run: SandboxRun): Promise<SandboxSession> {
  return openSandbox(run, true);
}

async function openSandbox(run: SandboxRun, channel: boolean): Promise<SandboxSession> {
  const limits = { ...DEFAULT_LIMITS, ...run.limits };
  const box = await mkdtemp(join(tmpdir(), "a2d-sandbox-"));
  try {
    await mkdir(join(box, "files"));
    await mkdir(join(box, "root"));
    let fileBytes = 0;
    for (const [name, text] of Object.entries(run.files)) {
      if (name.includes("/") || name.startsWith(".")) throw new Error(`sandbox file name must be plain: ${name}`);
      await writeFile(join(box, "files", name), text);
      fileBytes += Buffer.byteLength(text);
    }
    const session = spawnSandboxed(box, run, limits, fileBytes, channel);
    const removeBox = () => rm(box, { recursive: true, force: true });
    return { ...session, result: session.result.finally(removeBox) };
  } catch (error) {
    await rm(box, { recursive: true, force: true });
    throw error;
  }
}

function spawnSandboxed(box: string, run: SandboxRun, limits: SandboxLimits, fileBytes: number, channel: boolean): SandboxSession {
  const cpuSeconds = Math.max(1, Math.ceil(limits.timeoutMs / 1000));
  const binds = (run.readOnlyPaths ?? []).map((path) => realpathSync(path));
  const args = [
    // If this process dies (Ctrl-C, a crash), unshare gets SIGKILL, and --kill-child takes the
    // namespace with it: no sandboxed program outlives the run that started it.
    "--pdeathsig",
    "KILL",
    "unshare",
    "--net",
    "--pid",
    "--fork",
    "--kill-child",
    "--mount",
    "--propagation",
    "private",
    "/bin/sh",
    "-c",
    SETUP_SCRIPT,
    "a2d-sandbox",
    box,
    String(SANDBOX_UID),
    String(SANDBOX_GID),
    String(limits.maxProcesses),
    String(limits.memoryBytes),
    String(cpuSeconds),
    String(limits.maxFileBytes),
    String(limits.workBytes + fileBytes),
    String(binds.length),
    ...binds,
    ...run.argv,
  ];
  const started = performance.now();
  // detached: the child leads a new process group, so one kill(-pid) reaches unshare and the
  // namespace's PID 1 even if the program is busy ignoring signals.
  const child = spawn("setpriv", args, { detached: true, stdio: channel ? ["pipe", "pipe", "pipe", "pipe", "pipe"] : ["pipe", "pipe", "pipe"] });
  let timedOut = false;
  let outputExceeded = false;
  const killTree = (): void => {
    if (child.pid === undefined) return;
    try {
      process.kill(-child.pid, "SIGKILL");
    } catch {
      // already gone
    }
  };
  const timer = setTimeout(() => {
    timedOut = true;
    killTree();
  }, limits.timeoutMs);
  const collect = (stream: Readable): Buffer[] => {
    const chunks: Buffer[] = [];
    let bytes = 0;
    stream.on("data", (chunk: Buffer) => {
      bytes += chunk.length;
      if (bytes > limits.maxOutputBytes) {
        outputExceeded = true;
        killTree();
      } else chunks.push(chunk);
    });
    return chunks;
  };
  const stdout = collect(child.stdout!);
  const stderr = collect(child.stderr!);
  // The program may exit without reading its input; the broken pipe is not an error of ours.
  child.stdin!.on("error", () => undefined);
  child.stdin!.end(run.stdin ?? "");

  let messages: AsyncIterableIterator<string>;
  let control: Writable | null = null;
  if (channel) {
    const fromProgram = child.stdio[3] as Readable;
    control = child.stdio[4] as Writable;
    control.on("error", () => undefined);
    // The cap is per message (one test's output), not for the run: a problem may have many tests.
    let lineBytes = 0;
    fromProgram.on("data", (chunk: Buffer) => {
      const first = chunk.indexOf(10);
      const longest = first < 0 ? lineBytes + chunk.length : Math.max(lineBytes + first, chunk.length - chunk.lastIndexOf(10) - 1);
      lineBytes = first < 0 ? lineBytes + chunk.length : chunk.length - chunk.lastIndexOf(10) - 1;
      if (longest > limits.maxOutputBytes) {
        outputExceeded = true;
        killTree();
      }
    });
    messages = createInterface({ input: fromProgram, crlfDelay: Infinity })[Symbol.asyncIterator]();
  } else {
    messages = (async function* () {})();
  }

  const result = new Promise<SandboxResult>((resolve, reject) => {
    child.on("error", (error) => {
      clearTimeout(timer);
      reject(new Error(`cannot start the sandbox (setpriv, unshare): ${error.message}; util-linux must be installed`));
    });
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      resolve({
        exitCode: code,
        signal,
        stdout: Buffer.concat(stdout).toString("utf8"),
        stderr: Buffer.concat(stderr).toString("utf8"),
        timedOut,
        outputExceeded,
        wallMs: performance.now() - started,
      });
    });
  });
  return {
    messages,
    send: (line) => {
      if (control !== null && control.writable) control.write(`${line}\n`);
    },
    kill: killTree,
    result,
  };
}

/**
 * Host directories an interpreter needs inside the sandbox: none under /usr (always shown), else the
 * installation prefix it lives in (…/bin/python → …).
 */
export function interpreterPaths(python: string): string[] {
  const real = realpathSync(python);
  if (real.startsWith("/usr/")) return [];
  const prefix = real.replace(/\/bin\/[^/]+$/, "");
  return [prefix === real ? real.replace(/\/[^/]+$/, "") : prefix];
}

/**
 * Checks once that sandboxing works here and that `python` runs inside it, so a run fails up front with
 * the fix instead of marking every program wrong.
 */
export async function checkSandbox(python: string): Promise<void> {
  if (process.getuid?.() !== 0) {
    throw new Error(
      "running model-written code needs root (network, PID and mount namespaces, pivot_root, setpriv to nobody); " +
        "run as root, or leave livecodebench_v6 out with --bench",
    );
  }
  const result = await runSandboxed({
    files: {},
    argv: [python, "-c", "print('ok')"],
    limits: { timeoutMs: 20_000 },
    readOnlyPaths: interpreterPaths(python),
  });
  if (result.exitCode !== 0 || result.stdout.trim() !== "ok") {
    throw new Error(
      `the code sandbox cannot run ${python} as nobody (exit ${result.exitCode}): ${result.stderr.trim().slice(0, 500)}; ` +
        `pass --python with a CPython whose installation every user can read (e.g. /usr/bin/python3)`,
    );
  }
}
