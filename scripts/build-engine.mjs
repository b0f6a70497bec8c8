#!/usr/bin/env node
// Configures and builds the native engine with plain CMake (no header downloads: Node-API headers come
// from node_modules). Usage: node scripts/build-engine.mjs [--tests] [--cuda] [--debug]
//   default   build/engine/a2d_cpu.node
//   --tests   also the C++ test suites in build/engine (run them with ctest --test-dir build/engine)
//   --cuda    build/engine-cuda/a2d_cuda.node (CPU + CUDA backends) with the CUDA 12 toolkit of
//             wheels/lock.json, fetched on first use (A2D_CUDA_TOOLKIT=DIR builds with another toolkit root;
//             its runtime's driver floor then applies, and `a2d pack` refuses one above CUDA 12)
//             and beside the addon a2d_cuda.build.json (toolkit and runtime versions, read by `a2d pack`)
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const args = new Set(process.argv.slice(2));
for (const arg of args) {
  if (!["--tests", "--cuda", "--debug"].includes(arg)) {
    console.error(`build-engine: unknown option ${arg} (use --tests, --cuda, --debug)`);
    process.exit(2);
  }
}
const cuda = args.has("--cuda");
const tests = args.has("--tests");
const buildDir = join(root, "build", cuda ? "engine-cuda" : "engine");
// Two cores are shared on the development machines; more parallel jobs only thrash.
const jobs = process.env.A2D_BUILD_JOBS ?? "2";

for (const header of ["node-api-headers/include/node_api.h", "node-addon-api/napi.h"]) {
  if (!existsSync(join(root, "node_modules", header))) {
    console.error(`build-engine: node_modules/${header} is missing; run \`npm ci\` first`);
    process.exit(1);
  }
}

function run(command, commandArgs) {
  console.log(`$ ${command} ${commandArgs.join(" ")}`);
  const result = spawnSync(command, commandArgs, { stdio: "inherit", cwd: root });
  if (result.error) {
    console.error(`build-engine: cannot run ${command}: ${result.error.message} (install cmake and g++)`);
    process.exit(1);
  }
  if (result.status !== 0) process.exit(result.status ?? 1);
}

/** The toolkit root and its versions: the pinned CUDA 12 one, or A2D_CUDA_TOOLKIT's. */
async function cudaToolkit() {
  if (process.env.A2D_CUDA_TOOLKIT) {
    const toolkitRoot = process.env.A2D_CUDA_TOOLKIT;
    const nvcc = join(toolkitRoot, "bin", "nvcc");
    const version = /V(\d+\.\d+\.\d+)/.exec(spawnSync(nvcc, ["--version"], { encoding: "utf8" }).stdout ?? "")?.[1];
    if (!version) {
      console.error(`build-engine: A2D_CUDA_TOOLKIT=${toolkitRoot} has no working bin/nvcc`);
      process.exit(1);
    }
    return { root: toolkitRoot, nvcc, version, runtime: version };
  }
  const locked = join(root, "dist", "pack", "locked.js");
  if (!existsSync(locked)) {
    console.error("build-engine: --cuda fetches the pinned CUDA toolkit through dist/pack/locked.js; run `npm run build:ts` first");
    process.exit(1);
  }
  const { ensureToolkit } = await import(locked);
  try {
    return await ensureToolkit({ log: (line) => console.log(`build-engine: ${line}`) });
  } catch (error) {
    console.error(`build-engine: ${error.message}`);
    process.exit(1);
  }
}

/** The CUDA compiler a CMakeCache.txt records, whatever type CMake gave the entry (STRING when set on the
 * command line, FILEPATH when found), or null. */
function configuredCudaCompiler(cacheText) {
  return /^CMAKE_CUDA_COMPILER:[A-Z]+=(.*)$/m.exec(cacheText)?.[1] ?? null;
}

const configure = [
  "-S", join(root, "engine"),
  "-B", buildDir,
  `-DCMAKE_BUILD_TYPE=${args.has("--debug") ? "Debug" : "Release"}`,
  `-DA2D_CUDA=${cuda ? "ON" : "OFF"}`,
  `-DA2D_TESTS=${tests ? "ON" : "OFF"}`,
];
let toolkit = null;
if (cuda) {
  toolkit = await cudaToolkit();
  // CMake keeps the first CUDA compiler it found: a build folder configured with another toolkit starts over.
  const cache = join(buildDir, "CMakeCache.txt");
  if (existsSync(cache) && configuredCudaCompiler(readFileSync(cache, "utf8")) !== toolkit.nvcc) {
    console.log(`build-engine: ${buildDir} was configured with another CUDA toolkit; configuring it again`);
    rmSync(buildDir, { recursive: true, force: true });
  }
  // No relocatable device code, so no device runtime library (the static runtime may be newer than nvlink).
  configure.push(`-DCMAKE_CUDA_COMPILER=${toolkit.nvcc}`, `-DCUDAToolkit_ROOT=${toolkit.root}`, "-DCMAKE_CUDA_FLAGS=-cudadevrt=none");
}
run("cmake", configure);
const targets = cuda ? ["a2d_cuda"] : ["a2d_cpu"];
if (tests) targets.push("a2d_tests", "a2d_bench_cpu");
run("cmake", ["--build", buildDir, "-j", jobs, "--target", ...targets]);
if (toolkit) {
  writeFileSync(
    join(buildDir, "a2d_cuda.build.json"),
    `${JSON.stringify({ toolkit: toolkit.version, runtime: toolkit.runtime, toolkit_root: toolkit.root }, null, 2)}\n`,
  );
}
