// `--limit N`: a seeded sample that keeps each stratum (subject, domain, difficulty) in proportion,
// instead of the first N rows, which in the published files are sorted by subject or date. Strata get
// floor(N × share) items, and the items left over go to the largest remainders (ties: stratum name).
// Within a stratum the items with the smallest sha256(seed, benchmark, id) are taken, so an item's
// membership depends only on the seed and its id, and the sample keeps the file's order.
import { createHash } from "node:crypto";

import type { EvalItem } from "./benchmarks/types.js";

export function stratifiedSample<I extends EvalItem>(items: readonly I[], limit: number, seed: number, benchmark: string): I[] {
  if (limit >= items.length) return [...items];
  const strata = new Map<string, I[]>();
  for (const item of items) {
    const members = strata.get(item.stratum) ?? [];
    members.push(item);
    strata.set(item.stratum, members);
  }
  const names = [...strata.keys()].sort();
  const quota = new Map(names.map((name) => [name, (limit * strata.get(name)!.length) / items.length]));
  const taken = new Map(names.map((name) => [name, Math.floor(quota.get(name)!)]));
  let left = limit - [...taken.values()].reduce((sum, count) => sum + count, 0);
  const byRemainder = [...names].sort((a, b) => quota.get(b)! - taken.get(b)! - (quota.get(a)! - taken.get(a)!) || (a < b ? -1 : 1));
  for (const name of byRemainder) {
    if (left === 0) break;
    taken.set(name, taken.get(name)! + 1);
    left -= 1;
  }
  const rank = (item: I) => createHash("sha256").update(`${seed}\0${benchmark}\0${item.id}`).digest("hex");
  const chosen = new Set<I>();
  for (const name of names) {
    const ranked = [...strata.get(name)!].sort((a, b) => (rank(a) < rank(b) ? -1 : 1));
    for (const item of ranked.slice(0, taken.get(name))) chosen.add(item);
  }
  return items.filter((item) => chosen.has(item));
}
