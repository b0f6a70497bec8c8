// The CUDA addon on a machine without a GPU: it must load as a module (sm_90 machine code, static cudart,
// no libcudart on the machine) and refuse a cuda load with the message that names the fix — the path a
// packed folder takes in the cold-start simulator. Runs where `npm run build:cuda` built the addon
// (scripts/setup.sh does when nvcc exists) and no NVIDIA device is present.
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { addonPath, loadEngine } from "../engine/index.js";

const root = resolve(import.meta.dirname, "..");
const built = existsSync(addonPath("cuda"));
const gpuPresent = existsSync("/dev/nvidia0");
const work = mkdtempSync(join(tmpdir(), "a2d-cuda-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

describe.runIf(built)("CUDA addon build", () => {
  it("builds again without compiling anything when nothing changed", () => {
    // The build folder records its CUDA compiler; reading that record wrong used to configure the folder
    // from scratch on every call, recompiling every kernel (minutes) before each test run and demo.
    const output = execFileSync(process.execPath, [join(root, "scripts", "build-engine.mjs"), "--cuda"], {
      cwd: root,
      encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"],
    });
    expect(output).not.toMatch(/configured with another CUDA toolkit/);
    expect(output).not.toMatch(/Building (CUDA|CXX) object|Linking/);
  }, 600_000);
});

describe.runIf(built && !gpuPresent)("CUDA addon without a GPU", () => {
  it("depends on nothing beyond glibc and libstdc++ (cudart is static, libcuda is opened at run time)", () => {
    const deps = execFileSync("ldd", [addonPath("cuda")], { encoding: "utf8" });
    expect(deps).not.toMatch(/libcudart|libcublas|not found/);
  });

  it("refuses a cuda load with a clear message naming the cpu device", async () => {
    const py = join(root, ".venv", "bin", "python");
    execFileSync(py, ["-m", "a2d_convert", "tiny-base", "--out", join(work, "base")], { stdio: "ignore" });
    execFileSync(py, ["-m", "a2d_convert", "init", "--base", join(work, "base"), "--out", join(work, "m")], { stdio: "ignore" });
    await expect(loadEngine({ modelDir: join(work, "m"), device: "cuda" })).rejects.toThrow(/no CUDA device.*device 'cpu'/s);
  });
});
