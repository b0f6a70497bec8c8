// The code sandbox against hostile programs: each must be stopped, cut off or denied, and leave nothing
// running. Needs root (CI runs as root), like `a2d eval` on livecodebench_v6.
import { execFile, spawn } from "node:child_process";
import { chmodSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { createServer, type AddressInfo, type Server } from "node:net";
import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { runCodeTests } from "../eval/code-tests.js";
import { runSandboxed } from "../eval/sandbox.js";
import { ensureEvalBuilt } from "./eval-build.js";
import { ROOT } from "./server-harness.js";

const PYTHON = "/usr/bin/python3";

function processesOfNobody(): number {
  let count = 0;
  for (const pid of readdirSync("/proc").filter((name) => /^\d+$/.test(name))) {
    try {
      if (/^Uid:\s+65534\b/m.test(readFileSync(`/proc/${pid}/status`, "utf8"))) count += 1;
    } catch {
      // exited while listing
    }
  }
  return count;
}

function py(source: string, limits = {}) {
  return runSandboxed({ files: { "main.py": source }, argv: [PYTHON, "main.py"], limits });
}

describe("sandbox", () => {
  // Other software may run as nobody too; the sandbox must add nothing that outlives a run.
  const baseline = processesOfNobody();
  let server: Server;
  let port: number;
  beforeAll(async () => {
    server = createServer((socket) => {
      socket.on("error", () => undefined); // the client hangs up after reading
      socket.end("hello\n");
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    port = (server.address() as AddressInfo).port;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  it("runs a program with stdin, stdout and a writable cwd", async () => {
    const result = await runSandboxed({
      files: { "main.py": "import os\nopen('scratch.txt','w').write(input())\nprint(open('scratch.txt').read()[::-1], os.getuid())" },
      argv: [PYTHON, "main.py"],
      stdin: "abc\n",
    });
    expect(result).toMatchObject({ exitCode: 0, timedOut: false, stdout: "cba 65534\n" });
  });

  it("kills an infinite loop at the wall-clock limit, children included", async () => {
    const result = await py("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nwhile True: pass", {
      timeoutMs: 1500,
    });
    expect(result.timedOut).toBe(true);
    expect(result.wallMs).toBeLessThan(5000);
    expect(processesOfNobody()).toBeLessThanOrEqual(baseline);
  });

  it("denies the network, while the same program reaches the server outside the sandbox", async () => {
    const program = `import socket\ntry:\n    print(socket.create_connection(("127.0.0.1", ${port}), timeout=2).recv(5).decode())\nexcept OSError as e:\n    print("denied", e.errno)`;
    const outside = await promisify(execFile)(PYTHON, ["-c", program], { encoding: "utf8" });
    expect(outside.stdout.trim()).toBe("hello");
    const inside = await py(program);
    expect(inside.stdout).toMatch(/^denied \d+/);
  });

  it("contains a fork bomb to its process limit and leaves no process behind", async () => {
    const counter = await py(
      "import os, time\nn = 0\ntry:\n    for _ in range(1000):\n        if os.fork() == 0:\n            time.sleep(30); os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint(n)",
      { maxProcesses: 8, timeoutMs: 5000 },
    );
    expect(counter.exitCode).toBe(0);
    expect(Number(counter.stdout)).toBeLessThan(8);
    const bomb = await py("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", {
      maxProcesses: 8,
      timeoutMs: 1500,
    });
    expect(bomb.timedOut).toBe(true);
    // The kernel kills what is left in the PID namespace once its first process dies, but reaps it asynchronously:
    // a few forks may still be listed for a moment after the run has returned.
    for (let waited = 0; processesOfNobody() > baseline && waited < 5_000; waited += 100) await new Promise((resolve) => setTimeout(resolve, 100));
    expect(processesOfNobody()).toBeLessThanOrEqual(baseline);
  });

  it("leaves nothing running when the process that started it dies", async () => {
    ensureEvalBuilt();
    const script = `import { runSandboxed } from ${JSON.stringify(`${ROOT}/dist/eval/sandbox.js`)};
runSandboxed({ files: { "main.py": "import os, time\\nos.fork()\\nprint('up', flush=True)\\ntime.sleep(300)" }, argv: ["${PYTHON}", "main.py"], limits: { timeoutMs: 300000 } });`;
    // The dying parent cannot remove its temp dir; keep it in one this test removes.
    const scratch = mkdtempSync(join(tmpdir(), "a2d-sandbox-parent-"));
    chmodSync(scratch, 0o711); // nobody must be able to reach its workdir inside
    const parent = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: "ignore", env: { ...process.env, TMPDIR: scratch } });
    for (let waited = 0; processesOfNobody() < baseline + 2 && waited < 20_000; waited += 100) await new Promise((resolve) => setTimeout(resolve, 100));
    expect(processesOfNobody()).toBe(baseline + 2);
    parent.kill("SIGKILL");
    for (let waited = 0; processesOfNobody() > baseline && waited < 5_000; waited += 100) await new Promise((resolve) => setTimeout(resolve, 100));
    expect(processesOfNobody()).toBeLessThanOrEqual(baseline);
    rmSync(scratch, { recursive: true, force: true });
  });

  it("cannot write outside its temp dir", async () => {
    const tag = randomBytes(6).toString("hex");
    const targets = [`/tmp/a2d-escape-${tag}`, `/var/tmp/a2d-escape-${tag}`, `/dev/shm/a2d-escape-${tag}`, `${process.cwd()}/a2d-escape-${tag}`];
    const program = `import json\nout = {}\nfor p in ${JSON.stringify(targets)}:\n    try:\n        open(p, "w").write("x"); out[p] = "written"\n    except OSError as e:\n        out[p] = e.errno\nprint(json.dumps(out))`;
    const result = await py(program);
    const outcome = JSON.parse(result.stdout) as Record<string, unknown>;
    for (const target of targets) {
      expect(outcome[target]).not.toBe("written");
      expect(existsSync(target)).toBe(false);
    }
  });

  it("sees only its own processes in a private /proc", async () => {
    const result = await py(
      "import json, os\npids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n" +
        "print(json.dumps({'pids': pids, 'init': open('/proc/1/cmdline').read().split('\\0')[0]}))",
    );
    const seen = JSON.parse(result.stdout) as { pids: number[]; init: string };
    // sh (PID 1 of the namespace), setpriv/prlimit/env exec'd into python: two processes at most.
    expect(seen.pids.length).toBeLessThanOrEqual(3);
    expect(seen.pids).not.toContain(process.pid);
    expect(seen.init).toBe("/bin/sh");
  });

  it("sees a minimal read-only root: no host files, nothing writable but /work", async () => {
    const probe = [
      "import json, os",
      "out = {'root': sorted(os.listdir('/')), 'cwd': os.getcwd()}",
      `for p in ["/etc/passwd", "/root", "/home", ${JSON.stringify(ROOT)}, "/tmp"]:`,
      "    out[p] = os.path.exists(p)",
      "for p in ['/usr/x', '/x', '/dev/x', '/proc/x']:",
      "    try:",
      "        open(p, 'w'); out[p] = 'written'",
      "    except OSError as e:",
      "        out[p] = e.errno",
      "open('/work/scratch', 'w').write('ok'); out['work'] = open('/work/scratch').read()",
      "print(json.dumps(out))",
    ].join("\n");
    const seen = JSON.parse((await py(probe)).stdout) as Record<string, unknown>;
    expect(seen.root).toEqual(expect.arrayContaining(["dev", "proc", "usr", "work"]));
    expect((seen.root as string[]).filter((name) => !["bin", "dev", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "usr", "work"].includes(name))).toEqual([]);
    expect(seen.cwd).toBe("/work");
    for (const path of ["/etc/passwd", "/root", "/home", ROOT, "/tmp"]) expect(seen[path], path).toBe(false);
    for (const path of ["/usr/x", "/x", "/dev/x", "/proc/x"]) expect(seen[path], path).not.toBe("written");
    expect(seen.work).toBe("ok");
  });

  it("cannot read the expected output of a functional test: it is compared outside", async () => {
    const secret = `a2d-secret-${randomBytes(8).toString("hex")}`;
    // Looks everywhere it can for the expected answer, and returns it if found.
    const hunter = [
      "import os, re",
      "class Solution:",
      "    def answer(self, x):",
      "        for top, dirs, files in os.walk('/'):",
      "            if top.startswith(('/proc', '/sys', '/usr', '/dev')):",
      "                dirs[:] = []",
      "                continue",
      "            for name in files:",
      "                try:",
      "                    found = re.search(r'a2d-secret-[0-9a-f]{16}', open(os.path.join(top, name), errors='ignore').read())",
      "                except OSError:",
      "                    continue",
      "                if found:",
      "                    return found.group(0)",
      "        for pid in os.listdir('/proc'):",
      "            try:",
      "                found = re.search(r'a2d-secret-[0-9a-f]{16}', open(f'/proc/{pid}/cmdline', errors='ignore').read() + open(f'/proc/{pid}/environ', errors='ignore').read())",
      "            except OSError:",
      "                continue",
      "            if found:",
      "                return found.group(0)",
      "        return 'not found'",
    ].join("\n");
    const compared: string[] = [];
    const verdict = await runCodeTests(hunter, [{ input: "1", output: JSON.stringify(secret), testtype: "functional" }], "answer", {
      python: PYTHON,
      compare: async (produced, expected) => {
        compared.push(expected);
        const value = produced.kind === "functional" ? (produced.value as [string, string])[1] : null;
        return { pass: value === JSON.parse(expected) };
      },
    });
    expect(compared).toEqual([JSON.stringify(secret)]);
    expect(verdict).toEqual({ passed: false, testsRun: 1, failure: "test 1: wrong answer" });
  });

  it("caps memory and output", async () => {
    const memory = await py("x = bytearray(1 << 30)\nprint('allocated')", { memoryBytes: 256 * 1024 ** 2 });
    expect(memory.stdout).not.toContain("allocated");
    expect(memory.stderr).toContain("MemoryError");
    const flood = await py("while True: print('y' * 1000)", { maxOutputBytes: 1024 ** 2 });
    expect(flood.outputExceeded).toBe(true);
    expect(flood.stdout.length).toBeLessThanOrEqual(1024 ** 2);
  });
});
