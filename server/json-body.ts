// JSON request bodies: fastify's own parser (prototype poisoning refused), plus the one number that must
// be read exactly. OpenAI seeds are 64-bit integers, and JSON.parse rounds any number past 2^53 to the
// nearest double, so two different seeds would sample the same completion. Node 20 has no access to a
// number's source text in JSON.parse, so the seed's digits are read back from the body text.
import type { App } from "./app.js";

/** The seed of a parsed body exactly as written, when it is an integer that a double cannot hold. */
const exactSeeds = new WeakMap<object, bigint>();

export function exactSeed(body: object): bigint | null {
  return exactSeeds.get(body) ?? null;
}

export function registerJsonParser(app: App): void {
  const parse = app.getDefaultJsonParser("error", "error");
  app.removeContentTypeParser("application/json");
  app.addContentTypeParser("application/json", { parseAs: "string" }, (request, text, done) => {
    parse(request, text as string, (error, body) => {
      if (error) return done(error);
      const seed = (body as { seed?: unknown } | null)?.seed;
      if (typeof seed === "number" && Number.isInteger(seed) && !Number.isSafeInteger(seed)) {
        const digits = topLevelNumberText(text as string, "seed");
        if (digits !== null && /^-?\d+$/.test(digits)) exactSeeds.set(body as object, BigInt(digits));
      }
      done(null, body);
    });
  });
}

/**
 * The source text of the number held by the top-level member `key` of the JSON object `json` (the last
 * such member, as JSON.parse keeps the last), or null when there is none or it is not a number. `json` is
 * valid JSON: JSON.parse has already accepted it.
 */
export function topLevelNumberText(json: string, key: string): string | null {
  const number = /-?\d+(\.\d+)?([eE][+-]?\d+)?/y;
  let depth = 0;
  let found: string | null = null;
  for (let i = 0; i < json.length; i++) {
    const c = json[i];
    if (c === "{" || c === "[") depth++;
    else if (c === "}" || c === "]") depth--;
    else if (c === '"') {
      const start = i;
      for (i++; json[i] !== '"'; i++) if (json[i] === "\\") i++;
      if (depth !== 1) continue;
      let after = i + 1;
      while (/\s/.test(json[after] ?? "")) after++;
      // A string followed by ':' at depth 1 is a top-level key (the top level being an object).
      if (json[after] !== ":" || JSON.parse(json.slice(start, i + 1)) !== key) continue;
      after++;
      while (/\s/.test(json[after] ?? "")) after++;
      number.lastIndex = after;
      const match = number.exec(json);
      found = match === null ? null : match[0];
    }
  }
  return found;
}
