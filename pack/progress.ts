// Progress for long steps: a cli-progress bar on a terminal, one start and one done line otherwise, so that
// logs of CI runs and of tests stay readable instead of filling with carriage-return frames.
import cliProgress from "cli-progress";

export type ProgressUnit = "bytes" | "files" | "packages";

export interface Progress {
  advance(amount: number): void;
  done(): void;
}

export function formatBytes(bytes: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${bytes} B` : `${value.toFixed(value >= 100 ? 0 : value >= 10 ? 1 : 2)} ${units[unit]}`;
}

function formatAmount(amount: number, unit: ProgressUnit): string {
  return unit === "bytes" ? formatBytes(amount) : `${amount} ${unit}`;
}

export function startProgress(label: string, total: number, unit: ProgressUnit): Progress {
  const started = performance.now();
  if (!process.stderr.isTTY) {
    process.stderr.write(`  ${label}: ${formatAmount(total, unit)}\n`);
    return {
      advance() {},
      done() {
        process.stderr.write(`  ${label}: done in ${((performance.now() - started) / 1000).toFixed(1)} s\n`);
      },
    };
  }
  const bar = new cliProgress.SingleBar(
    {
      format: `  ${label.padEnd(28)} [{bar}] {percentage}% | {shown} | {duration_formatted}`,
      hideCursor: true,
      clearOnComplete: false,
      stream: process.stderr,
      fps: 5,
    },
    cliProgress.Presets.shades_classic,
  );
  let value = 0;
  bar.start(Math.max(total, 1), 0, { shown: `0 / ${formatAmount(total, unit)}` });
  return {
    advance(amount: number) {
      value += amount;
      bar.update(value, { shown: `${formatAmount(value, unit)} / ${formatAmount(total, unit)}` });
    },
    done() {
      bar.update(Math.max(total, 1), { shown: formatAmount(total, unit) });
      bar.stop();
    },
  };
}
