// Runs untrusted programs (model-written code) one process tree at a time, each in:
// - its own network namespace (no interfaces but a down loopback: every connection fails),
// - its own PID namespace, so killing the tree is one kill: when the namespace's first process dies the
//   kernel kills everything left inside, including children that called setsid() or daemonized,
// - its own mount namespace where /, /tmp, /var/tmp, /run, /dev/shm… are read-only and only a fresh
//   temp dir (its cwd and HOME) is writable,
// - an unprivileged uid (`nobody`) with no capabilities and no_new_privs, so it cannot undo any of that,
// - rlimits: CPU seconds, address space, processes (RLIMIT_NPROC, which is what contains a fork bomb),
//   file size, open files, no core dumps,
// with a wall-clock timeout and an output cap enforced from here by SIGKILL to the process group.
// Needs root (namespaces, mounts, setpriv) and util-linux: unshare, setpriv, prlimit, mountpoint.
import { spawn } from "node:child_process";
import { chown, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

export interface SandboxLimits {
  /** Wall-clock limit; CPU time is limited to the same, rounded up to whole seconds. */
  timeoutMs: number;
  /** RLIMIT_AS per process. */
  memoryBytes: number;
  /** RLIMIT_NPROC for the sandbox uid. */
  maxProcesses: number;
  /** stdout or stderr beyond this kills the run. */
  maxOutputBytes: number;
  /** RLIMIT_FSIZE: the largest file the program may write. */
  maxFileBytes: number;
}

export const DEFAULT_LIMITS: SandboxLimits = {
  timeoutMs: 6_000,
  memoryBytes: 2 * 1024 ** 3,
  maxProcesses: 32,
  maxOutputBytes: 32 * 1024 ** 2,
  maxFileBytes: 64 * 1024 ** 2,
};

export interface SandboxRun {
  /** Files to create in the temp dir (relative names) before the program starts. */
  files: Record<string, string>;
  /** The command, resolved inside the sandbox (PATH=/usr/local/bin:/usr/bin:/bin). */
  argv: string[];
  stdin?: string;
  limits?: Partial<SandboxLimits>;
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

// Runs as root inside the new namespaces, then drops to the sandbox uid. The workdir is bind-mounted
// onto itself first so it stays a writable mount after its parents become read-only. Everything the
// program could write as `nobody` is on one of these mounts. `exit $?` keeps sh as PID 1 (no exec), so
// the program is an ordinary process and the namespace dies with sh.
const SETUP_SCRIPT = `set -eu
wd=$1; uid=$2; gid=$3; nproc=$4; as=$5; cpu=$6; fsize=$7; shift 7
mount --bind "$wd" "$wd"
for d in / /tmp /var/tmp /run /run/lock /run/shm /dev/shm /dev/mqueue; do
  if mountpoint -q "$d"; then mount -o remount,bind,ro "$d"; fi
done
cd "$wd"
setpriv --reuid="$uid" --regid="$gid" --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs \\
  prlimit --nproc="$nproc" --as="$as" --cpu="$cpu" --fsize="$fsize" --nofile=256 --core=0 -- \\
  env -i HOME="$wd" TMPDIR="$wd" PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 "$@"
exit $?
`;

export async function runSandboxed(run: SandboxRun): Promise<SandboxResult> {
  const limits = { ...DEFAULT_LIMITS, ...run.limits };
  const workdir = await mkdtemp(join(tmpdir(), "a2d-sandbox-"));
  try {
    for (const [name, text] of Object.entries(run.files)) {
      if (name.includes("/") || name.startsWith(".")) throw new Error(`sandbox file name must be plain: ${name}`);
      await writeFile(join(workdir, name), text);
      await chown(join(workdir, name), SANDBOX_UID, SANDBOX_GID);
    }
    await chown(workdir, SANDBOX_UID, SANDBOX_GID);
    return await spawnSandboxed(workdir, run, limits);
  } finally {
    await rm(workdir, { recursive: true, force: true });
  }
}

function spawnSandboxed(workdir: string, run: SandboxRun, limits: SandboxLimits): Promise<SandboxResult> {
  const cpuSeconds = Math.max(1, Math.ceil(limits.timeoutMs / 1000));
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
    workdir,
    String(SANDBOX_UID),
    String(SANDBOX_GID),
    String(limits.maxProcesses),
    String(limits.memoryBytes),
    String(cpuSeconds),
    String(limits.maxFileBytes),
    ...run.argv,
  ];
  return new Promise((resolve, reject) => {
    const started = performance.now();
    // detached: the child leads a new process group, so one kill(-pid) reaches unshare and the
    // namespace's PID 1 even if the program is busy ignoring signals.
    const child = spawn("setpriv", args, { detached: true, stdio: ["pipe", "pipe", "pipe"] });
    const stdout: Buffer[] = [];
    const stderr: Buffer[] = [];
    let outBytes = 0;
    let errBytes = 0;
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
    child.stdout.on("data", (chunk: Buffer) => {
      outBytes += chunk.length;
      if (outBytes > limits.maxOutputBytes) {
        outputExceeded = true;
        killTree();
      } else stdout.push(chunk);
    });
    child.stderr.on("data", (chunk: Buffer) => {
      errBytes += chunk.length;
      if (errBytes > limits.maxOutputBytes) {
        outputExceeded = true;
        killTree();
      } else stderr.push(chunk);
    });
    // The program may exit without reading its input; the broken pipe is not an error of ours.
    child.stdin.on("error", () => undefined);
    child.stdin.end(run.stdin ?? "");
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
}

/**
 * Checks once that sandboxing works here and that `python` runs inside it, so a run fails up front with
 * the fix instead of marking every program wrong.
 */
export async function checkSandbox(python: string): Promise<void> {
  if (process.getuid?.() !== 0) {
    throw new Error(
      "running model-written code needs root (network, PID and mount namespaces, setpriv to nobody); " +
        "run as root, or leave livecodebench_v6 out with --bench",
    );
  }
  const result = await runSandboxed({ files: {}, argv: [python, "-c", "print('ok')"], limits: { timeoutMs: 20_000 } });
  if (result.exitCode !== 0 || result.stdout.trim() !== "ok") {
    throw new Error(
      `the code sandbox cannot run ${python} as nobody (exit ${result.exitCode}): ${result.stderr.trim().slice(0, 500)}; ` +
        `pass --python with an interpreter that every user can execute (e.g. /usr/bin/python3), and keep the temp dir (${tmpdir()}) reachable by nobody`,
    );
  }
}
