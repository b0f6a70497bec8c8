// The human-readable report: one row per benchmark, the mean normalized score, then what was sent and
// to whom (the server, the sampling parameters, the data and any sample), so a number keeps its context.
import type { EvalReport } from "./normalize.js";
import type { RunRecord } from "./run-eval.js";

export function formatReport(report: EvalReport, record: RunRecord): string {
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
  const sent = (value: unknown) => (value === null ? "not sent (server default)" : JSON.stringify(value));
  const { sampling } = record;
  const lines = [
    `model: ${record.model} at ${record.url}`,
    line(header),
    ...rows.map(line),
    `mean normalized: ${report.mean.toFixed(1)}`,
    `sent: max_tokens ${sampling.max_tokens}, temperature ${sent(sampling.temperature)}, top_p ${sent(sampling.top_p)}, ` +
      `seed ${sent(sampling.seed)}, extra body ${sent(sampling.extra_body)}`,
    `concurrency: ${record.concurrency.used}${record.concurrency.reason ? ` (asked ${record.concurrency.requested}; ${record.concurrency.reason})` : ""}`,
  ];
  for (const [name, data] of Object.entries(record.data)) {
    const full = data.full_set_rows === null ? "" : data.rows === data.full_set_rows ? ", the full set" : `, NOT the full set of ${data.full_set_rows}`;
    lines.push(`data: ${name} ${data.file}, ${data.rows} items${full}${data.sample ? `; sample ${data.sample}` : ""}`);
  }
  if (record.lcb_window) lines.push(`livecodebench_v6 contest_date window: ${record.lcb_window.from}..${record.lcb_window.to}`);
  if (record.ttft_ms) {
    const s = (ms: number) => `${(ms / 1000).toFixed(2)} s`;
    lines.push(`time to first token: p50 ${s(record.ttft_ms.p50)}, p90 ${s(record.ttft_ms.p90)}, max ${s(record.ttft_ms.max)} over ${record.ttft_ms.requests} requests`);
  }
  return lines.join("\n") + "\n";
}
