// The four scored benchmarks, by name (SPEC §1).
import type { BenchmarkName } from "../normalize.js";
import { gpqaDiamond } from "./gpqa-diamond.js";
import { liveCodeBench } from "./livecodebench.js";
import { math500 } from "./math-500.js";
import { mmluPro } from "./mmlu-pro.js";
import type { Benchmark } from "./types.js";

export const BENCHMARKS: Record<BenchmarkName, Benchmark> = {
  gpqa_diamond: gpqaDiamond,
  math_500: math500,
  livecodebench_v6: liveCodeBench,
  mmlu_pro: mmluPro,
};
