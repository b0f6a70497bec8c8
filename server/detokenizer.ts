// Streaming detokenization: turns committed token ids into text deltas whose concatenation equals the
// decode of the whole completion. Each push decodes only a short window (the previous delta's tokens
// plus the new ones), so a 32k-token generation costs linear, not quadratic, decoding time.

const REPLACEMENT = "\uFFFD";

export class IncrementalDecoder {
  private readonly ids: number[] = [];
  private prefixOffset = 0;
  private readOffset = 0;

  constructor(private readonly decode: (ids: readonly number[]) => string) {}

  /** Text made final by these ids; "" while a multi-byte character is still incomplete. */
  push(newIds: readonly number[]): string {
    this.ids.push(...newIds);
    return this.advance(false);
  }

  /** Whatever is left at the end of the generation, incomplete characters included. */
  flush(): string {
    return this.advance(true);
  }

  private advance(final: boolean): string {
    if (this.readOffset === this.ids.length) return "";
    // Decoding from prefixOffset gives the decoder the context it needs for the first new token
    // (a leading-space rule, bytes of one character split across tokens).
    const prefix = this.decode(this.ids.slice(this.prefixOffset, this.readOffset));
    const full = this.decode(this.ids.slice(this.prefixOffset));
    if (!final && (full.length <= prefix.length || full.endsWith(REPLACEMENT))) return "";
    this.prefixOffset = this.readOffset;
    this.readOffset = this.ids.length;
    return full.slice(prefix.length);
  }
}
