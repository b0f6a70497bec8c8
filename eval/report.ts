// The human-readable report: one row per benchmark, then the mean normalized score.
import type { EvalReport } from "./normalize.js";

export function formatReport(report: EvalReport, model: string): string {
  const rows = Object.entries(report.benchmarks).map(([name, score]) => [
    name,
    String(score.n),
    `${(score.accuracy * 100).toFixed(1)}%`,
    score.normalized.toFixed(1),
  ]);
  const header = ["benchmark", "n", "accuracy", "normalized"];
  const table = [header, ...rows];
  const widths = header.map((_, column) => Math.max(...table.map((row) => row[column]!.length)));
  const line = (row: string[]) => row.map((cell, column) => (column === 0 ? cell.padEnd(widths[column]!) : cell.padStart(widths[column]!))).join("  ");
  return [`model: ${model}`, line(header), ...rows.map(line), `mean normalized: ${report.mean.toFixed(1)}`].join("\n") + "\n";
}
