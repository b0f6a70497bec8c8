// Admission to the engine: up to `maxRunning` generations run at once (the engine decodes them together,
// one forward serving them all: `a2d serve --max-batch`), up to `maxWaiting` more wait in FIFO order, and
// past that a request is refused with 429 and a Retry-After estimated from recent generation times. A
// waiting request whose client goes away leaves the queue.
import { ApiError } from "./errors.js";

interface Waiter {
  start: () => void;
  fail: (reason: unknown) => void;
}

export class GenerationQueue {
  private readonly active = new Set<Waiter>();
  private readonly waiting: Waiter[] = [];
  /** Exponential moving average of generation wall time, for Retry-After. */
  private averageMs = 1000;

  constructor(
    readonly maxWaiting: number,
    /** Generations that may run at once; the server sets it to the engine's batch size once it has loaded. */
    public maxRunning = 1,
  ) {}

  get runningCount(): number {
    return this.active.size;
  }

  get waitingCount(): number {
    return this.waiting.length;
  }

  /**
   * Takes a place in line or throws rate_limit_exceeded. The returned promise resolves when it is this
   * request's turn (call the returned `done` afterwards, exactly once) and rejects if `signal` aborts first.
   */
  enter(signal: AbortSignal): { turn: Promise<void>; done: () => void } {
    if (this.active.size >= this.maxRunning && this.waiting.length >= this.maxWaiting) {
      // The waiting ones start as places free up, maxRunning at a time.
      const rounds = Math.ceil((this.waiting.length + 1) / Math.max(1, this.maxRunning));
      const seconds = Math.min(600, Math.max(1, Math.ceil((this.averageMs * rounds) / 1000)));
      throw new ApiError(
        "rate_limit_exceeded",
        `The server is busy: ${this.waiting.length} requests are already waiting. Retry after ${seconds} s.`,
        null,
        { "retry-after": String(seconds) },
      );
    }
    let started = 0;
    let finished = false;
    let waiter!: Waiter;
    const turn = new Promise<void>((resolve, reject) => {
      waiter = {
        start: () => {
          started = performance.now();
          resolve();
        },
        fail: reject,
      };
    });
    // Nobody may await `turn` if the caller gives up early; that rejection is expected, not unhandled.
    turn.catch(() => {});
    if (this.active.size < this.maxRunning) {
      this.active.add(waiter);
      waiter.start();
    } else {
      this.waiting.push(waiter);
      signal.addEventListener(
        "abort",
        () => {
          const index = this.waiting.indexOf(waiter);
          if (index === -1) return;
          this.waiting.splice(index, 1);
          finished = true;
          waiter.fail(signal.reason);
        },
        { once: true },
      );
    }
    const done = () => {
      if (finished) return;
      finished = true;
      const index = this.waiting.indexOf(waiter);
      if (index !== -1) this.waiting.splice(index, 1);
      if (!this.active.delete(waiter)) return;
      this.averageMs = 0.8 * this.averageMs + 0.2 * (performance.now() - started);
      this.admitWaiting();
    };
    return { turn, done };
  }

  /** Raises or lowers the number of generations that may run at once; waiting ones start if there is room. */
  setMaxRunning(maxRunning: number): void {
    this.maxRunning = maxRunning;
    this.admitWaiting();
  }

  private admitWaiting(): void {
    while (this.active.size < this.maxRunning && this.waiting.length > 0) {
      const next = this.waiting.shift()!;
      this.active.add(next);
      next.start();
    }
  }
}
