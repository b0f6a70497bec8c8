// The predicted start as a range: every counted phase carries how far it may land from its figure (a
// measured host phase on another machine's CPU, a cold read on a disk nobody here measured, a GPU phase
// measured on another card), the range is the sum of the low ends to the sum of the high ends, and the
// budget is judged at the slow end. The cold read is the term the user can pin down (--disk-mbps); the
// report says down to which disk rate the budget still holds.
import type { Spread } from "./figures.js";

/** A phase measured by the CPU run here stands for the same work on the target's CPU. */
export const HOST_SPREAD: Spread = {
  low: 0.5,
  high: 2,
  why: "measured on this machine; the target's CPU and small-file reads may be twice as slow, or twice as fast",
};

/** The cold read's slow end when the target's disk rate is not given: a cloud block volume's baseline (AWS gp3: 125 MB/s). */
export const SLOW_DISK_MBPS = 100;

export interface Ranged {
  seconds: number;
  low_s: number;
  high_s: number;
  /** Why the range is what it is. */
  uncertainty: string;
}

const round3 = (x: number) => Math.round(x * 1000) / 1000;

export function spreadOf(seconds: number, spread: Spread): Ranged {
  return { seconds: round3(seconds), low_s: round3(seconds * spread.low), high_s: round3(seconds * spread.high), uncertainty: spread.why };
}

export interface DiskRead extends Ranged {
  name: string;
  kind: "measured" | "given" | "estimate";
}

/**
 * The cold read of the weights. Given a rate, that rate (the user knows their disk). Measured here, the
 * measurement is the fast end (on a VM the host may cache the disk: an upper bound) and SLOW_DISK_MBPS the
 * slow one. Neither: SLOW_DISK_MBPS.
 */
export function diskRead(weightBytes: number, rate: { givenMBps?: number; measuredMBps?: number }): DiskRead {
  const at = (mbps: number) => weightBytes / 1e6 / mbps;
  const size = `${(weightBytes / 1e9).toFixed(2)} GB`;
  if (rate.givenMBps !== undefined) {
    const seconds = at(rate.givenMBps);
    return { name: `weights read (cold, ${size} at ${rate.givenMBps} MB/s)`, kind: "given", seconds: round3(seconds), low_s: round3(seconds), high_s: round3(seconds), uncertainty: "at the rate given (--disk-mbps)" };
  }
  if (rate.measuredMBps !== undefined) {
    const slow = Math.min(rate.measuredMBps, SLOW_DISK_MBPS);
    return {
      name: `weights read (cold, ${size} at ${rate.measuredMBps.toFixed(0)} MB/s)`,
      kind: "measured",
      seconds: round3(at(rate.measuredMBps)),
      low_s: round3(at(rate.measuredMBps)),
      high_s: round3(at(slow)),
      uncertainty: `measured on this machine's disk; the target's is unknown: the slow end assumes ${slow.toFixed(0)} MB/s (give --disk-mbps)`,
    };
  }
  const seconds = at(SLOW_DISK_MBPS);
  return { name: `weights read (cold, ${size} at ${SLOW_DISK_MBPS} MB/s)`, kind: "estimate", seconds: round3(seconds), low_s: round3(seconds), high_s: round3(seconds), uncertainty: `not measured (weights under 64 MiB): ${SLOW_DISK_MBPS} MB/s assumed` };
}

export interface PredictionRange {
  low_s: number;
  high_s: number;
  /** Whether the start fits the budget even at the slow end of every term. */
  holds_at_slow_end: boolean;
  holds_at_fast_end: boolean;
  /**
   * With a cold read term: the slowest read at which the slow end of every other term still fits the
   * budget; null: no disk is fast enough.
   */
  slowest_disk_MBps?: number | null;
}

export function predictionRange(counted: Ranged[], read: Ranged | null, weightBytes: number, budgetS: number): PredictionRange {
  const low = counted.reduce((sum, p) => sum + p.low_s, 0) + (read?.low_s ?? 0);
  const high = counted.reduce((sum, p) => sum + p.high_s, 0) + (read?.high_s ?? 0);
  const room = budgetS - counted.reduce((sum, p) => sum + p.high_s, 0);
  return {
    low_s: round3(low),
    high_s: round3(high),
    holds_at_slow_end: high <= budgetS,
    holds_at_fast_end: low <= budgetS,
    ...(read ? { slowest_disk_MBps: room > 0 ? Number((weightBytes / 1e6 / room).toPrecision(3)) : null } : {}),
  };
}

export function describeRange(range: PredictionRange, budgetS: number): string {
  const span = `${range.low_s.toFixed(1)}–${range.high_s.toFixed(1)} s`;
  const verdict = range.holds_at_slow_end
    ? `the ${budgetS} s budget holds at the slow end`
    : range.holds_at_fast_end
      ? `the ${budgetS} s budget holds at the fast end only: over at the slow end`
      : `over the ${budgetS} s budget even at the fast end`;
  if (range.slowest_disk_MBps === undefined) return `${span}: ${verdict}`;
  const disk = range.slowest_disk_MBps === null ? "no disk is fast enough" : `it holds for cold reads down to ${range.slowest_disk_MBps} MB/s`;
  return `${span}: ${verdict}; ${disk}`;
}
