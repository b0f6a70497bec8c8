// Stop strings over a text stream: text is released only once it cannot be the start of a stop string,
// so a stop string split across two blocks is still caught and nothing after it is ever sent.

export class StopMatcher {
  private pending = "";
  private stoppedFlag = false;
  private readonly longest: number;

  constructor(private readonly stops: readonly string[]) {
    this.longest = Math.max(0, ...stops.map((stop) => stop.length));
  }

  get stopped(): boolean {
    return this.stoppedFlag;
  }

  /** Feeds a delta; returns the text now safe to send (cut before the stop string once one appears). */
  push(delta: string): string {
    if (this.stoppedFlag) return "";
    this.pending += delta;
    let cut = -1;
    for (const stop of this.stops) {
      const at = this.pending.indexOf(stop);
      if (at !== -1 && (cut === -1 || at < cut)) cut = at;
    }
    if (cut !== -1) {
      this.stoppedFlag = true;
      const out = this.pending.slice(0, cut);
      this.pending = "";
      return out;
    }
    const held = this.heldBackLength();
    const out = this.pending.slice(0, this.pending.length - held);
    this.pending = this.pending.slice(this.pending.length - held);
    return out;
  }

  /** End of generation: a held-back partial match was not a stop after all. */
  flush(): string {
    const out = this.stoppedFlag ? "" : this.pending;
    this.pending = "";
    return out;
  }

  /** The longest tail of the pending text that some stop string starts with. */
  private heldBackLength(): number {
    for (let length = Math.min(this.longest - 1, this.pending.length); length > 0; length--) {
      const tail = this.pending.slice(this.pending.length - length);
      if (this.stops.some((stop) => stop.startsWith(tail))) return length;
    }
    return 0;
  }
}
