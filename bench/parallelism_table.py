"""Renders bench/parallelism-table.sh's reports (DIR/<set>-<rule>-<min>.json and their details) as the markdown
of docs/conversion.md's accuracy-under-parallelism table: per decoding, accuracy / share of the base's / tokens
per forward on the built-in probes and the held-out prompts, tokens per forward on the open prompts; then five
held-out answers beside the base's and the code prompt's answer at the model's default threshold (THRESHOLD,
where the reports hold it; otherwise the lowest threshold that keeps 90 % of the base on the held-out prompts).

    python3 bench/parallelism_table.py DIR [THRESHOLD]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(folder: Path, name: str):
    path = folder / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def details(folder: Path, name: str) -> list[dict]:
    path = folder / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def main(folder: Path, default: str | None = None) -> int:
    combos = sorted({p.stem.split("-", 1)[1] for p in folder.glob("*-*-*.json")}, key=lambda c: (c.rsplit("-", 1)[1], c))
    lines = ["| top-up, at least | threshold | built-in probes: accuracy (share of base) / tokens per forward | held-out prompts: accuracy (share) / tokens per forward | open text: tokens per forward |",
             "|---|---|---|---|---|"]
    bases = {}
    for combo in combos:
        rule, least = combo.rsplit("-", 1)
        reports = {s: load(folder, f"{s}-{combo}") for s in ("builtin", "heldout", "open")}
        for s, r in reports.items():
            if r is not None:
                bases[s] = r["base"]
        thresholds = sorted({t for r in reports.values() if r for t in r["model"]}, key=float)
        for t in thresholds:
            cells = []
            for s in ("builtin", "heldout"):
                m = (reports[s] or {}).get("model", {}).get(t)
                cells.append("-" if m is None else f"{m['accuracy']:.3f} ({m['accuracy_vs_base']:.2f}) / {m['tokens_per_forward']:.2f}")
            m = (reports["open"] or {}).get("model", {}).get(t)
            cells.append("-" if m is None else f"{m['tokens_per_forward']:.2f}")
            lines.append(f"| {rule}, {least} | {t} | " + " | ".join(cells) + " |")
    header = ", ".join(f"{s} {b['accuracy']:.3f}" for s, b in bases.items() if s != "open")
    print(f"Base accuracy: {header}.\n")
    print("\n".join(lines))
    # Answers beside the base's at the model's default threshold; without it, the first combo's lowest threshold that
    # keeps >= 90 % of the base (else the highest).
    first = next((c for c in combos if c.startswith("leftmost-1")), combos[0] if combos else None)
    if first is None:
        return 1
    report = load(folder, f"heldout-{first}")
    if report:
        ok = [t for t, m in report["model"].items() if m["accuracy_vs_base"] >= 0.9]
        given = [t for t in report["model"] if default is not None and float(t) == float(default)]
        pick = given[0] if given else min(ok, key=float) if ok else max(report["model"], key=float)
        rows = details(folder, f"heldout-{first}")
        base = {r["prompt"]: r for r in rows if r["kind"] == "base"}
        model = [r for r in rows if r["kind"] == f"model@{pick}"]
        print(f"\nFive held-out answers beside the base's ({first.replace('-', ' top-up, at least ')} a step, threshold {pick}):\n")
        print("| prompt | model (tokens / forwards) | base |\n|---|---|---|")
        seen = set()
        for r in model:
            if r["family"] in seen or len(seen) == 5:
                continue
            seen.add(r["family"])
            b = base.get(r["prompt"], {})
            clean = lambda text: text.replace("|", "\\|").replace("\n", " ")[:160]
            print(f"| {clean(r['prompt'])} | {clean(r['text'])} ({r['tokens']} / {r['forward_passes']}) | {clean(b.get('text', ''))} |")
    code = [r for r in details(folder, f"open-{first}") if "Python" in r["prompt"] and r["kind"].startswith("model@")]
    if code:
        at_default = [r for r in code if default is not None and float(r["kind"][6:]) == float(default)]
        r = at_default[0] if at_default else max(code, key=lambda r: float(r["kind"][6:]))
        where = first.replace("-", " top-up, at least ") + " a step"
        print(f"\nThe code prompt ({where}, threshold {r['kind'][6:]}: {r['tokens']} tokens in {r['forward_passes']} forwards): {r['prompt']}\n")
        print("~~~\n" + r["text"] + "\n~~~")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None))
