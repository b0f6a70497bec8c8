// Answer extraction as the official harnesses do it, applied to the final answer only: the part of a
// response after the model's reasoning. Where a harness reads the answer, it is read the same way here
// (same patterns, same first/last match); the only additions are fallbacks for GPQA where simple-evals
// reads nothing (or reads a word as a letter), listed in docs/eval.md.

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

/** Python's `\b` for str patterns: word characters are Unicode letters, digits and the underscore. */
const NOT_AFTER_WORD = "(?<![\\p{L}\\p{N}_])";
const NOT_BEFORE_WORD = "(?![\\p{L}\\p{N}_])";

function firstMatch(text: string, pattern: RegExp): RegExpExecArray | null {
  return new RegExp(pattern.source, pattern.flags.replace("g", "")).exec(text);
}

function allMatches(text: string, pattern: RegExp): RegExpExecArray[] {
  return [...text.matchAll(new RegExp(pattern.source, pattern.flags.includes("g") ? pattern.flags : `${pattern.flags}g`))];
}

/** simple-evals' common.normalize_response: the markdown and LaTeX it strips before matching a letter. */
export function normalizeResponse(text: string): string {
  const removals = ["**", "$\\boxed{", "}$", "\\$", "$\\text{", "$", "\\mathrm{", "\\{", "\\text", "\\(", "\\mathbf{", "{", "\\boxed"];
  return removals.reduce((result, piece) => result.replaceAll(piece, ""), text);
}

/** simple-evals' ANSWER_PATTERN_MULTICHOICE, `(?i)Answer[ \t]*:[ \t]*\$?([A-D])\$?`, with the letter a whole word. */
const GPQA_ANSWER_LINE = new RegExp(`Answer[ \\t]*:[ \\t]*\\$?([A-D])${NOT_BEFORE_WORD}`, "iu");
/** `Answer:` with the letter on the next line or in brackets: `Answer:\n(C)`, `Answer: [C]`. */
const GPQA_ANSWER_LOOSE = new RegExp(`Answer\\s*:\\s*([(\\[])?\\s*([A-D])\\s*[)\\]]?${NOT_BEFORE_WORD}`, "giu");
/** `The answer is (C)`, `the correct option is C`, `The final answer is: C`. */
const GPQA_ANSWER_IS = new RegExp(
  `${NOT_AFTER_WORD}(?:answer|choice|option)\\s+is\\s*:?\\s*(?:option\\s+|choice\\s+)?([(\\[])?\\s*([A-D])\\s*[)\\]]?${NOT_BEFORE_WORD}`,
  "giu",
);
/** `\boxed{C}`, `\boxed{\text{C}}`, `\boxed{(C)}`. */
const GPQA_BOXED = /\\boxed\s*\{\s*(?:\\(?:text|textbf|mathrm|mathbf)\s*\{\s*)?\(?\s*([A-D])\s*\)?\s*\}/giu;

/** Last match whose letter is a capital, or any case when it stands in brackets. */
function lastLetter(matches: RegExpExecArray[], bracketGroup: number | null, letterGroup: number): string | null {
  for (const match of matches.reverse()) {
    const letter = match[letterGroup]!;
    const bracketed = bracketGroup !== null && match[bracketGroup] !== undefined;
    if (bracketed || bracketGroup === null || letter === letter.toUpperCase()) return letter.toUpperCase();
  }
  return null;
}

/**
 * GPQA (simple-evals): the first `Answer: X` in the response, as simple-evals reads it, except that the
 * letter must be a whole word (simple-evals reads `Answer: because` as B). Where that finds nothing,
 * fallbacks for how reasoning models end, each taking the last match: the same pattern after
 * simple-evals' own markdown/LaTeX normalization (`**Answer:** C`, `Answer: $\boxed{C}$`), `Answer:`
 * followed by a bracketed letter or one on the next line, "the answer is (C)", and a lone `\boxed{C}`.
 */
export function extractGpqaLetter(answer: string): string | null {
  const official = firstMatch(answer, GPQA_ANSWER_LINE);
  if (official) return official[1]!.toUpperCase();
  const normalized = normalizeResponse(answer);
  const afterNormalization = allMatches(normalized, GPQA_ANSWER_LINE).pop();
  if (afterNormalization) return afterNormalization[1]!.toUpperCase();
  return (
    lastLetter(allMatches(normalized, GPQA_ANSWER_LOOSE), 1, 2) ??
    lastLetter(allMatches(answer.replaceAll("**", ""), GPQA_ANSWER_IS), 1, 2) ??
    lastLetter(allMatches(answer, GPQA_BOXED), null, 1)
  );
}

const MMLU_ANSWER_IS = /answer is \(?([A-J])\)?/;
const MMLU_ANSWER_COLON = /[^\n]*[aA]nswer:\s*([A-J])/;
const MMLU_LONE_LETTER = new RegExp(`${NOT_AFTER_WORD}[A-J]${NOT_BEFORE_WORD}`, "gu");

/**
 * MMLU-Pro (TIGER-Lab's evaluate_from_api.py, markdown bold removed first as it does): the first
 * `answer is (X)`; else `Answer: X` read as its `.*[aA]nswer:\s*([A-J])` does (the last one on the first
 * line that has one); else the last standalone capital A–J. null when none matches: the caller then
 * guesses, as TIGER-Lab does.
 */
export function extractMmluProLetter(answer: string): string | null {
  const text = answer.replaceAll("**", "");
  return firstMatch(text, MMLU_ANSWER_IS)?.[1] ?? firstMatch(text, MMLU_ANSWER_COLON)?.[1] ?? allMatches(text, MMLU_LONE_LETTER).pop()?.[0] ?? null;
}

/**
 * LiveCodeBench (lcb_runner extract_code): the lines between the last two lines that contain ```.
 * Fewer than two such lines: no code.
 */
export function extractCode(answer: string): string | null {
  const lines = answer.split("\n");
  const fences = lines.flatMap((line, index) => (line.includes("```") ? [index] : []));
  if (fences.length < 2) return null;
  return lines.slice(fences[fences.length - 2]! + 1, fences[fences.length - 1]!).join("\n");
}
