// Splits a chat completion's text into reasoning (inside <think>…</think>) and the answer, as a stream.
// The reasoning block counts only at the start of the completion (or when the rendered prompt already
// opened it, as templates that pre-fill "<think>\n" do); later tags are ordinary text.

export const THINK_OPEN = "<think>";
export const THINK_CLOSE = "</think>";

export interface ReasoningDelta {
  reasoning: string;
  content: string;
}

type State = "start" | "reasoning" | "after-reasoning" | "content";

export class ReasoningSplitter {
  private state: State;
  private buffer = "";

  constructor(promptOpensReasoning: boolean) {
    this.state = promptOpensReasoning ? "reasoning" : "start";
  }

  /** True when the rendered prompt ends inside an open think block. */
  static promptOpensReasoning(renderedPrompt: string): boolean {
    return renderedPrompt.trimEnd().endsWith(THINK_OPEN);
  }

  push(delta: string): ReasoningDelta {
    const out: ReasoningDelta = { reasoning: "", content: "" };
    this.buffer += delta;
    // Each pass either changes state or returns; the loop ends after at most four passes.
    for (;;) {
      switch (this.state) {
        case "start": {
          const trimmed = this.buffer.trimStart();
          if (trimmed.startsWith(THINK_OPEN)) {
            this.buffer = trimmed.slice(THINK_OPEN.length);
            this.state = "reasoning";
            continue;
          }
          if (THINK_OPEN.startsWith(trimmed)) return out; // maybe the tag, not complete yet
          this.state = "content";
          continue;
        }
        case "reasoning": {
          const end = this.buffer.indexOf(THINK_CLOSE);
          if (end !== -1) {
            out.reasoning += this.buffer.slice(0, end);
            this.buffer = this.buffer.slice(end + THINK_CLOSE.length);
            this.state = "after-reasoning";
            continue;
          }
          const held = partialTagLength(this.buffer, THINK_CLOSE);
          out.reasoning += this.buffer.slice(0, this.buffer.length - held);
          this.buffer = this.buffer.slice(this.buffer.length - held);
          return out;
        }
        case "after-reasoning": {
          // The blank lines between </think> and the answer belong to neither.
          this.buffer = this.buffer.trimStart();
          if (this.buffer === "") return out;
          this.state = "content";
          continue;
        }
        case "content":
          out.content += this.buffer;
          this.buffer = "";
          return out;
      }
    }
  }

  /** End of the completion: held-back text goes where its state says (an unclosed block stays reasoning). */
  flush(): ReasoningDelta {
    const rest = this.buffer;
    this.buffer = "";
    if (this.state === "reasoning") return { reasoning: rest, content: "" };
    if (this.state === "after-reasoning") return { reasoning: "", content: "" };
    return { reasoning: "", content: rest };
  }
}

/** Length of the longest tail of `text` that `tag` starts with (a tag cut by a block boundary). */
function partialTagLength(text: string, tag: string): number {
  for (let length = Math.min(tag.length - 1, text.length); length > 0; length--) {
    if (tag.startsWith(text.slice(text.length - length))) return length;
  }
  return 0;
}
