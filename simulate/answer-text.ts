// Is a chat answer text at all? A server can answer in the right JSON shape with nothing a reader could use:
// an empty string, token bytes that are not UTF-8 (U+FFFD where characters should be), control characters,
// or one token over and over. These are the signs of broken weights, a wrong tokenizer or a decode loop
// that ignores the model, and no schema check sees them.

/** Not printable: control characters other than tab and newlines, surrogates, private use, unassigned. */
const UNPRINTABLE = /[\p{Cc}\p{Cs}\p{Co}\p{Cn}]/gu;
const LINE_CONTROLS = /[\t\n\r]/g;

export interface AnswerText {
  /** Problems, each naming what is wrong and how much of it; [] when the answer reads as text. */
  problems: string[];
}

/**
 * `ids`: the answer as the model's tokenizer encodes it (the server's own token ids are not in the
 * response). Thresholds leave room for real answers: one U+FFFD can be a multi-byte character cut by
 * max_tokens, a stray control character can be quoted, and code or tables repeat tokens, but never one
 * token for most of an answer.
 */
export function judgeAnswerText(text: string, ids: readonly number[]): AnswerText {
  const problems: string[] = [];
  if (text.trim().length === 0) return { problems: [`the answer is empty (${JSON.stringify(text.slice(0, 20))})`] };
  const chars = [...text];
  const replacement = chars.filter((c) => c === "\uFFFD").length;
  if (replacement > 1) problems.push(`${replacement} of its ${chars.length} characters are U+FFFD: it holds bytes that do not decode as UTF-8 characters`);
  const unprintable = text.replace(LINE_CONTROLS, "").match(UNPRINTABLE) ?? [];
  if (unprintable.length / chars.length > 0.02) {
    const which = [...new Set(unprintable)].slice(0, 4).map((c) => `U+${c.codePointAt(0)!.toString(16).toUpperCase().padStart(4, "0")}`);
    problems.push(`${unprintable.length} of its ${chars.length} characters are not printable (${which.join(", ")}…): it is not text`);
  }
  if (ids.length >= 8) {
    const counts = new Map<number, number>();
    for (const id of ids) counts.set(id, (counts.get(id) ?? 0) + 1);
    const [top, times] = [...counts].sort((a, b) => b[1] - a[1])[0]!;
    if (times / ids.length > 0.5) {
      problems.push(`one token (id ${top}) is ${times} of its ${ids.length} tokens: the answer repeats a single token`);
    }
  }
  return { problems };
}

/** A short, safe view of an answer for a report line. */
export function preview(text: string, length = 60): string {
  return JSON.stringify(text.length > length ? `${text.slice(0, length)}…` : text);
}
