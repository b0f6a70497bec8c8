// The decoding parameters as TypeScript reads them: names, ranges, choices and defaults from
// engine/decoding-params.json (the one definition the engine, the server and the converter share), the
// cross-field rules coded here and held to the file's shared cases by test/decoding-params.test.ts.
import table from "./decoding-params.json" with { type: "json" };

export interface ParamSpec {
  name: string;
  type: "integer" | "number" | "choice";
  min?: number;
  min_exclusive?: boolean;
  /** A number, "block_size" (the request's block size) or "2^64-1". */
  max?: number | string;
  choices?: string[];
  default?: number | string;
  doc: string;
}

export interface DecodingTable {
  parameters: ParamSpec[];
  request_parameters: ParamSpec[];
  rules: Array<{ id: string; fields: string[]; message: string }>;
  case_defaults: Record<string, number>;
  cases: Array<{ params: Record<string, unknown>; ok?: boolean; error?: string }>;
}

export const DECODING_TABLE = table as DecodingTable;
const SPECS = new Map([...DECODING_TABLE.parameters, ...DECODING_TABLE.request_parameters].map((s) => [s.name, s]));

/** The table entry named `name` (snake_case, as in the table and the API). */
export function paramSpec(name: string): ParamSpec {
  const spec = SPECS.get(name);
  if (spec === undefined) throw new Error(`engine/decoding-params.json has no parameter '${name}'`);
  return spec;
}

export function choicesOf(name: string): readonly string[] {
  return paramSpec(name).choices ?? [];
}

/** snake_case (the table, the API) -> camelCase (engine/types.ts). */
export function camelName(name: string): string {
  return name.replace(/_(\w)/g, (_, c: string) => c.toUpperCase());
}

const RETIRED_REMASKING = new Set(["verify", "tree"]);
const RETIRED_NOTE =
  "'verify' and 'tree' kept a token only when a causal reading of the tokens before it chose it too: left-to-right " +
  "decoding with a drafter, which a2d no longer does; decode by the denoiser's own confidence";

/** null when `value` fits the entry (block_size: the block size it is checked with), else what it must be. */
export function valueProblem(spec: ParamSpec, value: unknown, blockSize: number): string | null {
  if (spec.type === "choice") {
    if (typeof value === "string" && spec.choices?.includes(value)) return null;
    const retired = spec.name === "remasking" && typeof value === "string" && RETIRED_REMASKING.has(value) ? ` (${RETIRED_NOTE})` : "";
    return `one of ${(spec.choices ?? []).map((c) => `'${c}'`).join(", ")}${retired}`;
  }
  const low = spec.min ?? -Infinity;
  const high = spec.max === "block_size" ? blockSize : spec.max === "2^64-1" ? Number.MAX_SAFE_INTEGER : (spec.max as number | undefined) ?? Infinity;
  const bound = spec.max === "block_size" ? `block_size (${blockSize})` : String(spec.max);
  const kind = spec.type === "integer" ? "an integer" : "a number";
  const fits =
    typeof value === "number" &&
    Number.isFinite(value) &&
    (spec.type !== "integer" || Number.isInteger(value)) &&
    (spec.min_exclusive ? value > low : value >= low) &&
    value <= high;
  if (fits) return null;
  return spec.max === undefined ? `${kind} >= ${low}` : `${kind} in ${spec.min_exclusive ? "(" : "["}${low}, ${bound}]`;
}

export interface RuleInputs {
  blockSize: number;
  threshold: number;
  minPerStep: number;
  steps: number;
  remasking: string;
  advance: string;
  /** reveal_order; absent: "any". */
  revealOrder?: string;
}

/** The first cross-field rule of the table these (in-range) parameters break: { id, message }, or null. */
export function brokenRule(p: RuleInputs): { id: string; message: string } | null {
  const oneByOne = p.minPerStep === 1 && (p.steps === 0 || p.steps >= p.blockSize);
  let id: string | null = null;
  if ((p.remasking === "leftmost" || p.revealOrder === "prefix") && p.threshold >= 1 && oneByOne) id = "left_to_right";
  else if (p.advance === "slide" && p.steps > 0) id = "schedule_needs_blocks";
  if (id === null) return null;
  const rule = DECODING_TABLE.rules.find((r) => r.id === id);
  if (rule === undefined) throw new Error(`engine/decoding-params.json has no rule '${id}'`);
  return rule;
}

/**
 * Positions a generation may occupy: the prompt, max_tokens, and the window reaching block_size - 1 past the
 * last token it may reveal (engine/src/decode.cpp positions_needed, the same rule). The KV cache must hold
 * them; the server derives the room for max_tokens from it.
 */
export function positionsNeeded(promptTokens: number, maxTokens: number, blockSize: number): number {
  return promptTokens + maxTokens + blockSize - 1;
}

/** The largest max_tokens a prompt leaves room for in a context of `maxContext` positions (0: none). */
export function roomForTokens(promptTokens: number, blockSize: number, maxContext: number): number {
  return Math.max(0, maxContext - positionsNeeded(promptTokens, 0, blockSize));
}
