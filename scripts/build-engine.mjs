#!/usr/bin/env node
// Configures and builds the native engine with plain CMake (no header downloads: Node-API headers come
// from node_modules). Usage: node scripts/build-engine.mjs [--tests] [--cuda] [--debug]
//   default   build/engine/a2d_cpu.node
//   --tests   also the C++ test suites in build/engine (run them with ctest --test-dir build/engine)
//   --cuda    build/engine-cuda/a2d_cuda.node (CPU + CUDA backends; needs nvcc)
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
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

run("cmake", [
  "-S", join(root, "engine"),
  "-B", buildDir,
  `-DCMAKE_BUILD_TYPE=${args.has("--debug") ? "Debug" : "Release"}`,
  `-DA2D_CUDA=${cuda ? "ON" : "OFF"}`,
  `-DA2D_TESTS=${tests ? "ON" : "OFF"}`,
]);
const targets = cuda ? ["a2d_cuda"] : ["a2d_cpu"];
if (tests) targets.push("a2d_tests", "a2d_bench_cpu");
run("cmake", ["--build", buildDir, "-j", jobs, "--target", ...targets]);
