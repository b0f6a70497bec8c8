// Rescaling of raw benchmark accuracy to the mission score (SPEC §1): chance maps to 0, the original
// AR model (MiniCPM5-2B) maps to 100, clamped to [0, 100]; the score is the mean of the rescaled values.

export const BENCHMARK_NAMES = ["gpqa_diamond", "math_500", "livecodebench_v6", "mmlu_pro"] as const;
export type BenchmarkName = (typeof BENCHMARK_NAMES)[number];

/** Accuracy (a fraction) that maps to 0 and to 100. */
export const NORMALIZATION: Readonly<Record<BenchmarkName, { zeroAt: number; hundredAt: number }>> = {
  gpqa_diamond: { zeroAt: 0.25, hundredAt: 0.6717 },
  math_500: { zeroAt: 0, hundredAt: 0.98 },
  livecodebench_v6: { zeroAt: 0, hundredAt: 0.6483 },
  mmlu_pro: { zeroAt: 0.1111, hundredAt: 0.6914 },
};

export function isBenchmarkName(name: string): name is BenchmarkName {
  return (BENCHMARK_NAMES as readonly string[]).includes(name);
}

export function normalizeAccuracy(benchmark: BenchmarkName, accuracy: number): number {
  if (!Number.isFinite(accuracy) || accuracy < 0 || accuracy > 1) {
    throw new RangeError(`accuracy for ${benchmark} must be a fraction in [0, 1], got ${accuracy}`);
  }
  const { zeroAt, hundredAt } = NORMALIZATION[benchmark];
  const scaled = ((accuracy - zeroAt) / (hundredAt - zeroAt)) * 100;
  return Math.min(100, Math.max(0, scaled));
}

export interface BenchmarkScore {
  accuracy: number;
  normalized: number;
  n: number;
}

export interface EvalReport {
  benchmarks: Partial<Record<BenchmarkName, BenchmarkScore>>;
  /** Mean of `normalized` over the benchmarks in the report. */
  mean: number;
}

/** Builds the report from per-benchmark (correct, total) counts, in the canonical benchmark order. */
export function buildReport(counts: Partial<Record<BenchmarkName, { correct: number; total: number }>>): EvalReport {
  const benchmarks: Partial<Record<BenchmarkName, BenchmarkScore>> = {};
  const normalized: number[] = [];
  for (const name of BENCHMARK_NAMES) {
    const count = counts[name];
    if (count === undefined) continue;
    if (count.total === 0) throw new Error(`${name} has no items to score`);
    const accuracy = count.correct / count.total;
    const score = { accuracy, normalized: normalizeAccuracy(name, accuracy), n: count.total };
    benchmarks[name] = score;
    normalized.push(score.normalized);
  }
  if (normalized.length === 0) throw new Error("no benchmark was scored");
  const mean = normalized.reduce((sum, value) => sum + value, 0) / normalized.length;
  return { benchmarks, mean };
}
