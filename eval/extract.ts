// Answer extraction, as the standard harnesses do it, applied to the final answer only: the part of a
// response after the model's reasoning. Multiple-choice patterns take the *last* match, because the
// prompts ask for the answer line at the end and earlier matches are usually the model weighing options.

/**
 * The final answer of a chat response. Servers with a reasoning parser put the thinking in
 * `reasoning_content` and `content` is already the answer; servers without one leave `<think>…</think>`
 * inside `content`, so everything up to the last `</think>` is dropped. An unclosed `<think>` means the
 * response ran out of tokens while reasoning: there is no answer.
 */
export function finalAnswer(content: string): string {
  const close = content.lastIndexOf("</think>");
  if (close >= 0) return content.slice(close + "</think>".length).trim();
  if (/^\s*<think>/.test(content)) return "";
  return content.trim();
}

/** Undo the markup models wrap a letter in (`**B**`, `$\boxed{B}$`, `\text{B}`) before pattern matching. */
function unwrapLetterMarkup(text: string): string {
  return text
    .replace(/\*\*/g, "")
    .replace(/\\(?:boxed|text|textbf|mathrm)\{\s*([A-Za-z])\s*\}/g, "$1");
}

function lastCapture(text: string, pattern: RegExp): string | null {
  let last: string | null = null;
  for (const match of text.matchAll(pattern)) last = match[1] ?? last;
  return last;
}

/** GPQA (simple-evals): the last line reads `Answer: $LETTER` with LETTER one of A–D. */
export function extractGpqaLetter(answer: string): string | null {
  const letter = lastCapture(unwrapLetterMarkup(answer), /Answer[ \t]*:[ \t]*\$?([A-D])\$?/gi);
  return letter === null ? null : letter.toUpperCase();
}

/**
 * MMLU-Pro (TIGER-Lab's cascade): `answer is (X)`, else `Answer: X`, else the last standalone capital
 * A–J. The official script guesses at random when nothing matches; here no match is simply wrong, so a
 * run is deterministic.
 */
export function extractMmluProLetter(answer: string): string | null {
  const text = unwrapLetterMarkup(answer);
  return (
    lastCapture(text, /answer is \(?([A-J])\)?/g) ??
    lastCapture(text, /[aA]nswer:\s*\(?([A-J])\)?/g) ??
    lastCapture(text, /\b([A-J])\b/g)
  );
}

/**
 * LiveCodeBench: the code of the last complete fenced block. Lines holding ``` pair up in order
 * (open, close, open, close…); an unpaired trailing fence is a block cut off by the token limit. Earlier
 * blocks are drafts or the echoed starter code. No complete fenced block: no code.
 */
export function extractCode(answer: string): string | null {
  const lines = answer.split("\n");
  const fences: number[] = [];
  lines.forEach((line, index) => {
    if (line.includes("```")) fences.push(index);
  });
  const pairs = Math.floor(fences.length / 2);
  if (pairs === 0) return null;
  const open = fences[2 * pairs - 2]!;
  const close = fences[2 * pairs - 1]!;
  return lines.slice(open + 1, close).join("\n");
}
