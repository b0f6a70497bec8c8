// Admission to the engine: one generation runs at a time (the engine has one decode thread), up to
// `maxWaiting` more wait in FIFO order, and past that a request is refused with 429 and a Retry-After
// estimated from recent generation times. A waiting request whose client goes away leaves the queue.
import { ApiError } from "./errors.js";

interface Waiter {
  start: () => void;
  fail: (reason: unknown) => void;
}

export class GenerationQueue {
  private active: Waiter | null = null;
  private readonly waiting: Waiter[] = [];
  /** Exponential moving average of generation wall time, for Retry-After. */
  private averageMs = 1000;

  constructor(readonly maxWaiting: number) {}

  get runningCount(): number {
    return this.active === null ? 0 : 1;
  }

  get waitingCount(): number {
    return this.waiting.length;
  }

  /**
   * Takes a place in line or throws rate_limit_exceeded. The returned promise resolves when it is this
   * request's turn (call the returned `done` afterwards, exactly once) and rejects if `signal` aborts first.
   */
  enter(signal: AbortSignal): { turn: Promise<void>; done: () => void } {
    if (this.active !== null && this.waiting.length >= this.maxWaiting) {
      const seconds = Math.min(600, Math.max(1, Math.ceil((this.averageMs * (this.waiting.length + 1)) / 1000)));
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
    if (this.active === null) {
      this.active = waiter;
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
      if (this.active !== waiter) return;
      this.averageMs = 0.8 * this.averageMs + 0.2 * (performance.now() - started);
      this.active = this.waiting.shift() ?? null;
      this.active?.start();
    };
    return { turn, done };
  }
}
